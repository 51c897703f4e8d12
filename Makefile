# envbuild quick start. Both targets install what they need first (scripts/setup.sh:
# Debian's Docker engine when none answers, debootstrap, a .venv with envbuild).
.PHONY: run test unit lint golden render clean-test bench

run:            ## install, then check, render, build and certify the default recipe
	bash scripts/setup.sh
	.venv/bin/envbuild make cpu-torch2

test:           ## install the test tools, then run the default test suite
	bash scripts/setup.sh --test
	.venv/bin/python -m pytest

unit:           ## the unit tests alone: no Docker engine, Slurm or network; under 60 s (tests/unit/)
	.venv/bin/python -m pytest tests/unit -q

lint:           ## ruff over builder/ and tests/, then mypy over builder/ (both always run; installs them: the test extra, into .venv)
	test -x .venv/bin/python || python3 -m venv .venv
	.venv/bin/pip install -q -e '.[test]'
	status=0; .venv/bin/ruff check builder tests || status=1; .venv/bin/mypy builder || status=1; exit $$status

golden:         ## regenerate golden files, the committed rendered files and the JSON schemas; review the diff
	.venv/bin/envbuild --recipes-dir tests/recipes --images-dir tests/golden render --all
	.venv/bin/envbuild render --all
	.venv/bin/python scripts/schemas.py  # schemas/: every published JSON Schema, from the models (the one generator)
	.venv/bin/python scripts/goldens.py  # tests/golden/k8s/ and tests/golden/slurm/: Kubernetes manifests, sbatch scripts
	.venv/bin/python tests/unit/test_fast_paths.py --regen  # builder/recipe/data/compat.json: the facts as JSON

bench:          ## measure every figure of issue 13 against its reference; writes benchmarks/RESULTS.md (not a test)
	bash scripts/setup.sh
	.venv/bin/python benchmarks/bench.py
