"""``--json`` of the commands that need no engine (check, audit, render, lock, report, verify,
gate): one document on stdout that validates against its schema, for a passing and a
failing case, the exit code unchanged; an error is the envbuild.error/1 document. Shell
completion through bash and argcomplete, as a shell runs it."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import jsonschema
import pytest

from builder.cli import output
from builder.cli.parser import build_parser

from fixtures_nodes import gpu_report, write_reports

ROOT = Path(__file__).resolve().parents[2]


def envbuild(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("ENVBUILD_")}
    return subprocess.run([sys.executable, "-m", "builder.cli", *args], cwd=cwd, capture_output=True, text=True,
                          env={**clean, "XDG_CONFIG_HOME": str(cwd / "xdg")}, timeout=300)


def run_json(*args: str, schema: str, cwd: Path = ROOT) -> tuple[int, dict, str]:
    """``envbuild ARGS --json``: (exit code, the one document on stdout, stderr); the document is
    valid against ``schemas/<schema>.schema.json``."""
    proc = envbuild(*args, "--json", cwd=cwd)
    doc = json.loads(proc.stdout)  # the whole of stdout is one document
    jsonschema.Draft202012Validator(json.loads((ROOT / "schemas" / f"{schema}.schema.json").read_text())).validate(doc)
    return proc.returncode, doc, proc.stderr


@pytest.fixture
def work(tmp_path) -> Path:
    shutil.copy(ROOT / "recipes" / "cpu-torch2.yaml", tmp_path / "r.yaml")
    text = (tmp_path / "r.yaml").read_text()
    (tmp_path / "bad.yaml").write_text(text.replace('python: "3.11"', 'python: "2.7"', 1))
    assert (tmp_path / "bad.yaml").read_text() != text
    return tmp_path


def test_every_command_with_a_result_has_json_and_a_schema():
    sub = next(a for a in build_parser()._actions if a.dest == "command")
    for command, stem in output.JSON_SCHEMAS.items():
        flags = {f for a in sub.choices[command].filled()._actions for f in a.option_strings}
        assert "--json" in flags and (ROOT / "schemas" / f"{stem}.schema.json").is_file(), command
    assert "--json" not in {f for a in sub.choices["probe"].filled()._actions for f in a.option_strings}
    assert (envbuild("--version").returncode, envbuild("--version").stdout) == (0, "envbuild 0.1.0\n")


def test_check(work):
    code, doc, err = run_json("check", "r.yaml", schema="check", cwd=work)
    assert (code, doc["ok"], doc["findings"], doc["stack"]) == (
        0, True, [], {"torch": "2.13.0+cpu", "python": "3.11", "cuda": None, "nccl": None})
    assert err == ""
    code, doc, err = run_json("check", "bad.yaml", schema="check", cwd=work)
    assert (code, doc["ok"], doc["stack"]) == (2, False, None)
    assert [(f["level"], f["rule"], f["file"], f["fields"], f["value"], f["message"]) for f in doc["findings"]] == [
        ("error", "schema", "bad.yaml", ["python"], "2.7", "must be a Python minor version such as '3.11'")]
    assert err == "error: bad.yaml: python: '2.7' must be a Python minor version such as '3.11'\n"  # as without --json
    code, doc, err = run_json("check", "nope", schema="error", cwd=work)
    assert (code, doc["exit_code"]) == (3, 3)
    assert [(f["file"], f["message"]) for f in doc["errors"]] == [("recipes/nope.yaml", "no such recipe")]


def test_audit():
    code, doc, _ = run_json("audit", "images/cpu-torch2/Dockerfile", schema="audit")
    assert (code, [f["verdict"] for f in doc["files"]]) == (0, ["clean"])
    code, doc, _ = run_json("audit", "tests/audit/cu-mismatch.Dockerfile", schema="audit")
    assert (code, [f["verdict"] for f in doc["files"]]) == (2, ["errors"])
    assert [(f["level"], f["file"], f["line"], f["rule"]) for f in doc["files"][0]["findings"]][0] == (
        "error", "tests/audit/cu-mismatch.Dockerfile", 5, "wheel-cuda-base")


def test_render_and_render_check(work):
    code, doc, _ = run_json("render", "r.yaml", schema="render", cwd=work)
    names = ["images/r/Dockerfile", "images/r/Singularity.def", "images/r/envbuild.lock.json"]
    assert (code, doc["files"]) == (0, {p: "written" for p in names})
    code, doc, _ = run_json("render", "--check", "r.yaml", schema="render", cwd=work)
    assert (code, doc["files"]) == (0, {p: "unchanged" for p in names})
    with open(work / "images" / "r" / "Dockerfile", "a") as f:
        f.write("# local edit\n")
    code, doc, err = run_json("render", "--check", "r.yaml", schema="render", cwd=work)
    assert (code, list(doc["files"].values())) == (2, ["stale", "unchanged", "unchanged"])
    assert err == "images/r/Dockerfile: stale; run `envbuild render r`\n"  # the diff is not on stdout


def test_lock(work):
    code, doc, _ = run_json("lock", "r.yaml", "--no-base", "--no-pip", "--no-apt", schema="resolved", cwd=work)
    assert (code, doc["schema"], doc["recipe"], doc["base"]) == (
        0, "envbuild.resolved/1", "r", {"ref": "debian:bookworm-slim", "digest": None, "source": "none"})
    code, doc, _ = run_json("lock", "bad.yaml", "--no-base", "--no-pip", "--no-apt", schema="error", cwd=work)
    assert (code, [(f["file"], f["fields"], f["value"]) for f in doc["errors"]]) == (2, [("bad.yaml", ["python"], "2.7")])


def test_report(work):
    cert = json.loads((ROOT / "tests" / "fixtures" / "certificate-allreduce-ddp.json").read_text())
    (work / "c.json").write_text(json.dumps(cert))
    code, doc, _ = run_json("report", "c.json", schema="report", cwd=work)
    assert (code, doc) == (0, {"schema": "envbuild.report/1", "certificate": "c.json", "report": "c.html",
                               "passed": True})
    cert["verdict"] = {**cert["verdict"], "passed": False, "exit_code": 2, "failures": ["allreduce: wrong"]}
    (work / "f.json").write_text(json.dumps(cert))
    code, doc, _ = run_json("report", "f.json", "--out", "f-report.html", schema="report", cwd=work)
    assert (code, doc["report"], doc["passed"]) == (0, "f-report.html", False)
    (work / "n.json").write_text('{"schema": "envbuild.probe/1"}')
    code, doc, _ = run_json("report", "n.json", schema="error", cwd=work)
    assert (code, doc["errors"][0]["message"]) == (2, "not a certificate (schema 'envbuild.probe/1'; want "
                                                      "envbuild.certificate/2)")
    code, doc, _ = run_json("report", "c.json", "--out", "-", schema="error", cwd=work)  # HTML and JSON: one stdout
    assert (code, doc["errors"][0]["rule"]) == (64, "UsageError")


def test_verify(tmp_path):
    same = write_reports(tmp_path, {"a.json": gpu_report(1), "b.json": gpu_report(2)})
    code, doc, _ = run_json("verify", *same, schema="verify-result")
    assert (code, doc["exit_code"], [n["name"] for n in doc["nodes"]]) == (0, 0, ["node-1", "node-2"])
    other = write_reports(tmp_path, {"c.json": gpu_report(3, **{"torch.version": "2.7.1+cu128"})})
    code, doc, _ = run_json("verify", *same, *other, schema="verify-result")
    assert (code, doc["exit_code"]) == (2, 2)
    assert ("fail", "torch.version") in [(f["level"], f["field"]) for f in doc["findings"]]


def test_gate(tmp_path):
    (tmp_path / "host.json").write_text(envbuild("probe", "--host").stdout)
    gate = ("gate", "--against", str(tmp_path / "host.json"), "--checks", "shm", "--no-history")
    code, doc, _ = run_json(*gate, schema="gate")
    assert (code, doc["exit_code"], doc["lines"], doc["checks"][0]["status"]) == (0, 0, [], "pass")
    code, doc, _ = run_json(*gate, "--min-shm", "1000g", schema="gate")
    assert (code, doc["exit_code"], doc["checks"][0]["status"]) == (2, 2, "fail")
    assert doc["lines"][0].startswith("fail: shm: ")
    code, doc, err = run_json(*gate, "--metrics-file", str(tmp_path), schema="gate")  # an error after it: no second
    assert (code, doc["exit_code"]) == (3, 0) and err.startswith(f"error: {tmp_path}: "), err
    code, doc, _ = run_json(*gate, "--min-shm", "1t", schema="error")  # refused by the parser: a document too
    assert (code, doc["exit_code"], doc["errors"][0]["message"]) == (
        64, 64, "envbuild gate: argument --min-shm: '1t' is not a size such as 256m or 1g")


def complete(line: str, tmp_path: Path) -> list[str]:
    """The candidates bash's completion function gives for ``line`` (the cursor at its end), with the
    script of ``envbuild completion bash`` loaded, as a shell runs it (``COMP_*``, ``COMPREPLY``)."""
    script = ('source <(envbuild completion bash)\nCOMP_LINE="$1"; COMP_POINT=${#COMP_LINE}\n'
              'read -ra COMP_WORDS <<< "$COMP_LINE"; [[ "$COMP_LINE" == *" " ]] && COMP_WORDS+=("")\n'
              'COMP_CWORD=$(( ${#COMP_WORDS[@]} - 1 ))\n'
              '_python_argcomplete envbuild "${COMP_WORDS[COMP_CWORD]}" "${COMP_WORDS[COMP_CWORD-1]}"\n'
              'printf "%s\\n" "${COMPREPLY[@]}"\n')
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
    proc = subprocess.run(["bash", "-c", script, "bash", line], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.split("\n")[:-1]


def test_bash_completes_recipe_names_commands_and_options(tmp_path):
    (tmp_path / "recipes").mkdir()
    for name in ("cpu-torch2", "cuda12-torch2", "cpu-old"):
        (tmp_path / "recipes" / f"{name}.yaml").write_text("name: x\n")
    assert complete("envbuild check cpu", tmp_path) == ["cpu-old", "cpu-torch2"]
    assert complete("envbuild make cu", tmp_path) == ["cuda12-torch2 "]
    assert complete("envbuild ver", tmp_path) == ["verify "]
    # the twin: a subcommand's options, not its recipes
    assert complete("envbuild certify --min-", tmp_path) == ["--min-busbw", "--min-scaling-efficiency"]
    assert complete("envbuild doctor --js", tmp_path) == ["--json "]
    for shell, first in (("zsh", "#compdef envbuild"), ("fish", "")):
        proc = envbuild("completion", shell)
        assert proc.returncode == 0 and proc.stdout.startswith(first) and "envbuild" in proc.stdout
