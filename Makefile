# envbuild quick start. Both targets install what they need first (scripts/setup.sh:
# Debian's Docker engine when none answers, debootstrap, a .venv with envbuild).
.PHONY: run test golden render clean-test bench

run:            ## install, then check, render, build and certify the default recipe
	bash scripts/setup.sh
	.venv/bin/envbuild make cpu-torch2

test:           ## install the test tools, then run the default test suite
	bash scripts/setup.sh --test
	.venv/bin/python -m pytest

golden:         ## regenerate golden files, the committed rendered files and the JSON schemas; review the diff
	.venv/bin/envbuild --recipes-dir tests/recipes --images-dir tests/golden render --all
	.venv/bin/envbuild render --all
	.venv/bin/python scripts/schemas.py          # schemas/: JSON Schemas of the documents (models)
	.venv/bin/python tests/test_k8s.py --regen   # tests/golden/k8s/: Kubernetes manifests
	.venv/bin/python tests/test_slurm.py --regen # tests/golden/slurm/: sbatch scripts
	.venv/bin/python tests/test_audit_schema.py --regen # schemas/audit.schema.json
	.venv/bin/python tests/test_fast_paths.py --regen   # builder/recipe/data/compat.json: the facts as JSON

bench:          ## measure every figure of issue 13 against its reference; writes benchmarks/RESULTS.md (not a test)
	bash scripts/setup.sh
	.venv/bin/python benchmarks/bench.py
