# envbuild quick start. Both targets install what they need first (scripts/setup.sh:
# Debian's Docker engine when none answers, debootstrap, a .venv with envbuild).
.PHONY: run test unit lint golden render clean-test bench

run:            ## install, then check, render, build and certify the default recipe
	bash scripts/setup.sh
	.venv/bin/envbuild make cpu-torch2; rc=$$?; [ $$rc -le 1 ] || exit $$rc  # 1: done with warnings only (a bootstrapped base)

# Both run on every core with pytest-xdist. `make test` keeps each test module on one worker
# (its module fixtures run once) and the one-node Slurm's tests (fixed ports) together on one,
# then runs the timed `serial` tests alone in a second pass of the same run (tests/conftest.py):
# the images the workers share are built once and removed at the end. PYTEST_ARGS and SERIAL_ARGS
# add options to the passes (.ci/run: durations and JUnit XML files under reports/). The parallel
# pass runs one worker more than there are cores: its tests wait on containers, timeouts and
# Slurm much of the time, and the extra worker fills those waits.
PYTEST_ARGS ?=
SERIAL_ARGS ?=

test:           ## install the test tools, then run the default test suite (unit and integration, one xdist worker per core and one more, then the serial tests)
	bash scripts/setup.sh --test
	export ENVBUILD_TEST_RUN=$$(.venv/bin/python -c 'import uuid; print(uuid.uuid4().hex[:12])'); status=0; \
	ENVBUILD_TEST_KEEP=1 .venv/bin/python -m pytest -n $$(( $$(nproc) + 1 )) --dist loadgroup -m 'not gpu and not serial' $(PYTEST_ARGS) || status=1; \
	.venv/bin/python -m pytest -m 'serial and not gpu' $(SERIAL_ARGS); rc=$$?; [ $$rc = 0 ] || [ $$rc = 5 ] || status=1; \
	exit $$status  # 5: no serial test selected

# make unit: the unit tests' CPU time is about 110 s; its wall time depends on the load of the cores.
unit:           ## the unit tests alone (tests/unit/, -n auto): no Docker engine, Slurm or network (installs the test extra)
	test -x .venv/bin/python || python3 -m venv .venv
	.venv/bin/python -c 'import pytest, xdist' 2>/dev/null || .venv/bin/pip install -q -e '.[test]'
	.venv/bin/python -m pytest tests/unit -q -n auto $(PYTEST_ARGS)

lint:           ## ruff over builder/ and tests/, then mypy over builder/ (both always run; installs them: the test extra, into .venv)
	test -x .venv/bin/python || python3 -m venv .venv
	.venv/bin/pip install -q -e '.[test]'
	status=0; .venv/bin/ruff check builder tests || status=1; .venv/bin/mypy builder || status=1; exit $$status

golden:         ## regenerate golden files, the committed rendered files and the JSON schemas; review the diff
	.venv/bin/envbuild --recipes-dir tests/recipes --images-dir tests/golden render --all
	.venv/bin/envbuild render --all
	.venv/bin/python scripts/schemas.py  # schemas/: every published JSON Schema, from the models (the one generator)
	.venv/bin/python scripts/goldens.py  # tests/golden/k8s/ and tests/golden/slurm/: Kubernetes manifests, sbatch scripts

bench:          ## measure every benchmark figure against its reference; writes benchmarks/RESULTS.md (not a test)
	bash scripts/setup.sh
	.venv/bin/python benchmarks/bench.py
