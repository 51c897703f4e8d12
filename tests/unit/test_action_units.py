"""The steps' script of the GitHub Action (scripts/action/step.py, run by action.yml): the job
summary and outputs of a real certificate (a certify run of cpu-torch2 with every profile) and of
a failing one, the annotations of real ``envbuild check`` and ``envbuild audit --json`` runs, and
envbuild's output kept from acting as workflow commands."""

from __future__ import annotations

import copy
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from builder.core.certificate import load_certificate

ROOT = Path(__file__).resolve().parents[2]
STEP = ROOT / "scripts/action/step.py"
CERT = ROOT / "tests/fixtures/certificate-profiles.json"


def step(tmp_path: Path, *args: str, env: dict[str, str] | None = None,
         cwd: Path = ROOT) -> tuple[subprocess.CompletedProcess, str, str]:
    """Run the script as the action does; its stdout, the summary and the outputs written."""
    summary, outputs = tmp_path / "summary.md", tmp_path / "output.txt"
    env = {**{k: v for k, v in os.environ.items() if not k.startswith(("GITHUB_", "ENVBUILD_ACTION_"))},
           "GITHUB_STEP_SUMMARY": str(summary), "GITHUB_OUTPUT": str(outputs), **(env or {})}
    res = subprocess.run([sys.executable, str(STEP), *args], capture_output=True, text=True, env=env, cwd=cwd,
                         timeout=300)
    read = lambda p: p.read_text() if p.exists() else ""  # noqa: E731
    return res, read(summary), read(outputs)


def passing(tmp_path: Path) -> tuple[str, str]:
    """The real certificate, as certify leaves it: the JSON and its HTML report beside it (names
    relative to ``tmp_path``, where the summary tests run)."""
    cert = "cpu-torch2-20261130T101500Z-5f1c.json"
    (tmp_path / cert).write_text(CERT.read_text())
    (tmp_path / cert).with_suffix(".html").write_text("<!doctype html><title>report</title>")
    return cert, cert.replace(".json", ".html")


def failing(tmp_path: Path) -> str:
    """The same run failing: a wrong all-reduce element, tp off its reference, rank 1's probe off
    the lock, the busbw and scaling floors missed; hostile strings where a node or image puts them."""
    doc = copy.deepcopy(load_certificate(json.loads(CERT.read_text())).to_dict())
    doc["image"]["ref"] = "evil/<script>alert(1)</script>|x"
    doc["collectives"]["all_reduce"][1]["wrong"] = 3
    doc["training"]["tp"]["reference_match"] = False
    doc["ranks"]["1"]["lock_mismatches"] = ["torch: 2.12.0+cpu, lock 2.13.0+cpu"]
    doc["settings"].update(min_busbw_gbps=5.0, busbw_source="argument", min_scaling_efficiency=0.5)
    doc["verdict"] = {"passed": False, "exit_code": 2, "warnings": ["numpy is not installed\n::error::planted"],
                      "failures": ["all_reduce: 3 wrong element(s) at 1024 B float32 | *rank 1* [x](http://e)",
                                   "tp: losses differ from the single-process reference"]}
    cert = "cpu-torch2-20261130T101500Z-bad1.json"
    (tmp_path / cert).write_text(json.dumps(doc))
    return cert


def test_summary_and_outputs_of_a_passing_certificate(tmp_path):
    cert, report = passing(tmp_path)
    res, summary, outputs = step(tmp_path, "summary", cert, "--report", report, cwd=tmp_path)
    assert res.returncode == 0, res.stdout + res.stderr
    assert summary == """### envbuild certify: PASSED

| | value | threshold | result |
|---|---|---|---|
| image | envbuild/cpu-torch2:683d6b792e39 |  | - |
| stack | torch 2.13.0+cpu, python 3.11.2, os debian 12 | every rank equal to the lock of cpu-torch2 | pass |
| ranks | 2 of 2 reported (2 node(s) x 1, backend gloo) | 2 | pass |
| all-reduce busbw at 1048576 B | 0.735 GB/s | not gated | - |
| \\#wrong | 0 in 6 collective(s) | 0 | pass |
| training checks | ddp yes, fsdp yes, tp yes, pipeline yes, moe yes | match the single-process reference | pass |
| scaling efficiency | 0.283 (12.1 images/s at 2) | not gated | - |

certificate: cpu-torch2-20261130T101500Z-5f1c.json, report: cpu-torch2-20261130T101500Z-5f1c.html
"""
    assert outputs == (f"verdict=passed\nexit-code=0\ncertificate={cert}\nreport={report}\n"
                       "artifact=envbuild-cpu-torch2-20261130T101500Z-5f1c\n")


def test_summary_and_outputs_of_a_failing_certificate(tmp_path):
    cert = failing(tmp_path)
    res, summary, outputs = step(tmp_path, "summary", cert, "--exit-code", "2", cwd=tmp_path)
    assert res.returncode == 2
    lines = summary.splitlines()
    assert lines[0] == "### envbuild certify: FAILED (exit 2)"
    assert lines[4:11] == [
        "| image | evil/&lt;script&gt;alert(1)&lt;/script&gt;\\|x |  | - |",
        "| stack | torch 2.13.0+cpu, python 3.11.2, os debian 12 | every rank equal to the lock of cpu-torch2 | FAIL |",
        "| ranks | 2 of 2 reported (2 node(s) x 1, backend gloo) | 2 | pass |",
        "| all-reduce busbw at 1048576 B | 0.735 GB/s | >= 5 GB/s (argument) | FAIL |",
        "| \\#wrong | 3 in 6 collective(s) | 0 | FAIL |",
        "| training checks | ddp yes, fsdp yes, tp NO, pipeline yes, moe yes | match the single-process reference | FAIL |",
        "| scaling efficiency | 0.283 (12.1 images/s at 2) | >= 0.5 | FAIL |",
    ]
    assert lines[11:16] == [
        "",
        "- fail: all\\_reduce: 3 wrong element(s) at 1024 B float32 \\| \\*rank 1\\* \\[x\\](http://e)",
        "- fail: tp: losses differ from the single-process reference",
        "- warning: numpy is not installed\\\\x0a::error::planted",
        "",
    ]
    assert "<" not in summary and "\n::" not in summary
    assert outputs == (f"verdict=failed\nexit-code=2\ncertificate={cert}\nreport=\n"
                       "artifact=envbuild-cpu-torch2-20261130T101500Z-bad1\n")


def test_warnings_only_pass_the_step_unless_refused(tmp_path):
    cert, _ = passing(tmp_path)
    assert step(tmp_path, "summary", cert, "--exit-code", "1", cwd=tmp_path)[0].returncode == 0
    res, _, outputs = step(tmp_path, "summary", cert, "--exit-code", "1", cwd=tmp_path,
                           env={"ENVBUILD_ACTION_ALLOW_WARNINGS": "false"})
    assert res.returncode == 1 and "exit-code=1\n" in outputs


def test_a_node_report_is_not_a_certificate(tmp_path):
    bad = tmp_path / "node.json"
    bad.write_text(json.dumps({"schema": "envbuild.probe/1", "hostname": "node-0"}))
    res, summary, outputs = step(tmp_path, "summary", str(bad))
    assert res.returncode == 2
    assert summary.startswith("### envbuild: no certificate (exit 2)\n\n- ")
    assert outputs == "verdict=error\nexit-code=2\n"


def test_certify_without_recipe_or_image_is_a_usage_error(tmp_path):
    res, summary, outputs = step(tmp_path, "certify")
    assert res.returncode == 64 and "give the input recipe or image" in res.stderr
    assert summary == outputs == ""


def test_certify_refused_before_the_engine_has_no_certificate(tmp_path):
    res, summary, outputs = step(tmp_path, "certify", env={"ENVBUILD_ACTION_IMAGE": "img:1",
                                                           "ENVBUILD_ACTION_NODES": "0"})
    assert res.returncode == 64
    assert summary == "### envbuild: no certificate (exit 64)\n\n- envbuild certify: argument --nodes: '0' is not an integer in 1..1024\n"
    assert outputs == "verdict=error\nexit-code=64\n"


def test_certify_args_with_an_unbalanced_quote_is_a_usage_error(tmp_path):
    res, summary, _ = step(tmp_path, "certify", env={"ENVBUILD_ACTION_RECIPE": "cpu-torch2",
                                                     "ENVBUILD_ACTION_ARGS": "--sbatch-arg '--qos=high"})
    assert res.returncode == 64 and summary == ""
    assert res.stderr == "error: envbuild action: input args: No closing quotation: --sbatch-arg '--qos=high\n"


def test_certify_command_line_of_the_inputs():
    sys.path.insert(0, str(STEP.parent))
    try:
        import step as action_step
    finally:
        sys.path.remove(str(STEP.parent))
    assert action_step.certify_argv({"ENVBUILD_ACTION_RECIPE": "cpu-torch2"}) == ["make", "cpu-torch2"]
    assert action_step.certify_argv({
        "ENVBUILD_ACTION_RECIPE": "cpu-torch2", "ENVBUILD_ACTION_IMAGE": "my/img:1", "ENVBUILD_ACTION_NODES": "3",
        "ENVBUILD_ACTION_PROFILE": "ddp,fsdp", "ENVBUILD_ACTION_SIZES": "8,1K", "ENVBUILD_ACTION_MIN_BUSBW": "2.5",
        "ENVBUILD_ACTION_BACKEND": "gloo", "ENVBUILD_ACTION_IMAGES_DIR": "out dir",
        "ENVBUILD_ACTION_ARGS": "--launcher slurm --sbatch-arg '--qos=high; rm -rf /'"}) == [
        "--images-dir", "out dir", "certify", "my/img:1", "--recipe", "cpu-torch2", "--profile", "ddp,fsdp",
        "--nodes", "3", "--backend", "gloo", "--sizes", "8,1K", "--min-busbw", "2.5",
        "--launcher", "slurm", "--sbatch-arg", "--qos=high; rm -rf /"]


def commands_off(stdout: str) -> tuple[list[str], list[str]]:
    """envbuild's lines (between ``::stop-commands::TOKEN`` and ``::TOKEN::``) and the lines after."""
    m = re.fullmatch(r"::stop-commands::([0-9a-f]{32})\n(.*)::\1::\n(.*)", stdout, re.S)
    assert m, stdout
    return m[2].splitlines(), m[3].splitlines()


BAD_RECIPE = """description: bad
base:
  image: debian:bookworm-slim
os:
  id: debian
  version: "12"
python: "3.11"
torch:
  version: "2.13;rm -rf /"
  varient: cpu
"""


def test_check_annotates_each_error_at_its_field(tmp_path):
    (tmp_path / "bad.yaml").write_text(BAD_RECIPE)
    res, summary, _ = step(tmp_path, "check", "bad.yaml", cwd=tmp_path)
    assert res.returncode == 2
    shown, after = commands_off(res.stdout)
    assert [x for x in shown if x.startswith("error: ")] == [
        "error: bad.yaml: torch.version: '2.13;rm -rf /' is not a version",
        "error: bad.yaml: torch.varient: unknown key; did you mean 'variant'?"]
    assert after == [
        "::error file=bad.yaml,line=9,title=envbuild check%3A schema::torch.version: '2.13;rm -rf /' is not a version",
        "::error file=bad.yaml,line=10,title=envbuild check%3A schema::torch.varient: unknown key; did you mean 'variant'?"]
    assert summary == ""


def test_check_annotates_a_missing_field_at_its_parent(tmp_path):
    (tmp_path / "bad.yaml").write_text(BAD_RECIPE.replace('  version: "12"\n', ""))
    res, _, _ = step(tmp_path, "check", "bad.yaml", cwd=tmp_path)
    assert res.returncode == 2
    assert commands_off(res.stdout)[1][0] == "::error file=bad.yaml,line=4,title=envbuild check%3A schema::os.version: is required"


def test_check_of_good_recipes_annotates_nothing(tmp_path):
    res, _, _ = step(tmp_path, "check", "recipes/*.yaml")
    assert res.returncode == 0, res.stdout
    assert "::error" not in res.stdout and "::warning" not in res.stdout
    assert res.stdout.count("::stop-commands::") == 2  # one check per recipe the glob found
    assert "recipes/cpu-torch2.yaml: ok: " in res.stdout and "recipes/cuda12-torch2.yaml: ok: " in res.stdout


def test_audit_annotates_errors_and_warnings_at_their_lines(tmp_path):
    res, _, _ = step(tmp_path, "audit", "tests/audit/conflict.Dockerfile", "tests/audit/arg-pins*.Dockerfile")
    assert res.returncode == 3  # the malformed file: could not audit it
    shown, after = commands_off(res.stdout)
    assert shown[0] == "error: tests/audit/conflict.Dockerfile: line 2: unresolved merge-conflict marker '<<<<<<< HEAD'"
    assert after == [
        "::error file=tests/audit/conflict.Dockerfile,line=2,title=envbuild audit%3A malformed::unresolved "
        "merge-conflict marker '<<<<<<< HEAD'",
        "::warning file=tests/audit/arg-pins.Dockerfile,line=4,title=envbuild audit%3A no-torch::no torch install "
        "found in the stages the final image uses (audit reads pip, uv and conda installs; requirement files are not "
        "followed)",
        "::warning file=tests/audit/arg-pins.Dockerfile,line=7,title=envbuild audit%3A unexpanded::a pip install "
        "argument cannot be expanded: ARG TORCH_VERSION (line 3) is declared before FROM only: declare it again in "
        "the stage (ARG TORCH_VERSION) to use it there; audited without it"]


@pytest.mark.parametrize("allow, code", [("true", 0), ("false", 1)])
def test_audit_warnings_only(tmp_path, allow, code):
    res, _, _ = step(tmp_path, "audit", "tests/audit/arg-pins.Dockerfile",
                     env={"ENVBUILD_ACTION_ALLOW_WARNINGS": allow})
    assert res.returncode == code
    assert commands_off(res.stdout)[1][0].startswith("::warning file=tests/audit/arg-pins.Dockerfile,line=4,")


def test_audit_of_a_clean_file_annotates_nothing(tmp_path):
    res, _, _ = step(tmp_path, "audit", "tests/audit/conflict.ok.Dockerfile")
    assert res.returncode == 0, res.stdout
    assert commands_off(res.stdout)[1] == []


def test_annotation_properties_are_escaped(tmp_path):
    recipe = tmp_path / "a,b:c%.yaml"
    recipe.write_text("torch: {version: '1'}\n")
    res, _, _ = step(tmp_path, "check", str(recipe), cwd=tmp_path)
    assert res.returncode == 2
    assert "\n::error file=a%2Cb%3Ac%25.yaml,line=1,title=envbuild check%3A schema::" in res.stdout


def test_annotations_name_files_outside_the_workspace_as_given(tmp_path):
    (tmp_path / "bad.yaml").write_text(BAD_RECIPE)
    res, _, _ = step(tmp_path, "check", str(tmp_path / "bad.yaml"))  # run from the repository root
    assert f"\n::error file={tmp_path}/bad.yaml,line=9,title=envbuild check%3A schema::torch.version: " in res.stdout
