"""``--json`` of the commands that need the engine (build, certify, make on the session's cpu-torch2
image; doctor, whose checks may ask it): one document on stdout that validates against its schema,
for a passing and a failing case, the exit code unchanged (the others: tests/unit/test_json_units.py;
push and pull: tests/integration/test_registry.py)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import uuid
from pathlib import Path

import jsonschema

from builder.launchers import base

from fixtures_nodes import gpu_report, write_reports

ROOT = Path(__file__).resolve().parents[2]
#: A run on the bootstrapped base prints its one warning line: done with warnings only.
REUSED = 1
CERTIFY = ("--backend", "gloo", "--nodes", "1", "--sizes", "8,1024", "--iters", "2", "--warmup", "1",
           "--timeout", "180")


def envbuild_json(tmp_path: Path, labels: dict[str, str], *args: str, schema: str) -> tuple[int, dict, str]:
    """``envbuild --recipes-dir R --images-dir I ARGS --json`` in ``tmp_path``: (exit code, the one
    document on stdout, valid against ``schemas/<schema>.schema.json``, stderr)."""
    env = {**os.environ, "ENVBUILD_CACHE_DIR": str(tmp_path / "cache"),
           base.EXTRA_LABELS_ENV: ",".join(f"{k}={v}" for k, v in labels.items())}
    proc = subprocess.run([sys.executable, "-m", "builder.cli", "--recipes-dir", str(tmp_path / "recipes"),
                           "--images-dir", str(tmp_path / "images"), *args, "--json"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=600)
    doc = json.loads(proc.stdout)
    jsonschema.Draft202012Validator(json.loads((ROOT / "schemas" / f"{schema}.schema.json").read_text())).validate(doc)
    return proc.returncode, doc, proc.stderr


def _site(tmp_path: Path) -> Path:
    (tmp_path / "recipes").mkdir()
    shutil.copy(ROOT / "recipes" / "cpu-torch2.yaml", tmp_path / "recipes" / "cpu-torch2.yaml")
    shutil.copytree(ROOT / "images" / "cpu-torch2", tmp_path / "images" / "cpu-torch2")
    return tmp_path


def _case(test_labels: dict[str, str]) -> dict[str, str]:
    return {**test_labels, "envbuild.test-case": uuid.uuid4().hex[:12]}


def test_build(tmp_path, torch_image, test_labels):
    site = _site(tmp_path)
    code, doc, err = envbuild_json(site, test_labels, "build", "cpu-torch2", schema="build")
    assert (code, doc["recipe"], doc["tag"], doc["reused"]) == (REUSED, "cpu-torch2", torch_image, True), err
    with open(site / "images" / "cpu-torch2" / "Dockerfile", "a") as f:
        f.write("# local edit\n")
    code, doc, _ = envbuild_json(site, test_labels, "build", "cpu-torch2", schema="error")
    assert (code, doc["exit_code"]) == (2, 2)
    assert doc["errors"][0]["message"] == "rendered files are stale (Dockerfile); run `envbuild render cpu-torch2`"


def test_certify(tmp_path, torch_image, test_labels):
    code, doc, err = envbuild_json(_site(tmp_path), _case(test_labels), "certify", torch_image, *CERTIFY,
                                   schema="certify")
    assert (code, doc["certificate"]["verdict"]["passed"]) == (0, True), err
    assert json.loads(Path(doc["certificate_path"]).read_text()) == doc["certificate"]
    assert Path(doc["report"]).is_file() and doc["bisection"] is None
    code, doc, err = envbuild_json(tmp_path, _case(test_labels), "certify", torch_image, *CERTIFY,
                                   "--min-busbw", "1000000", schema="certify")
    assert (code, doc["certificate"]["verdict"]["passed"]) == (2, False), err
    assert any("busbw" in f for f in doc["certificate"]["verdict"]["failures"]), doc["certificate"]["verdict"]


def test_make(tmp_path, torch_image, test_labels):
    site = _site(tmp_path)
    code, doc, err = envbuild_json(site, _case(test_labels), "make", "cpu-torch2", *CERTIFY, schema="make")
    assert code == REUSED, err
    assert (doc["check"]["ok"], doc["build"]["tag"], doc["certify"]["certificate"]["verdict"]["passed"]) == (
        True, torch_image, True)
    assert set(doc["render"]["files"].values()) == {"unchanged"}
    text = (site / "recipes" / "cpu-torch2.yaml").read_text()
    (site / "recipes" / "bad.yaml").write_text(text.replace('python: "3.11"', 'python: "2.7"', 1))
    code, doc, _ = envbuild_json(site, _case(test_labels), "make", "bad", *CERTIFY, schema="make")
    assert (code, doc["check"]["ok"], doc["render"], doc["build"], doc["certify"]) == (2, False, None, None, None)
    assert [(f["fields"], f["value"]) for f in doc["check"]["findings"]] == [(["python"], "2.7")]


def test_doctor(tmp_path):
    paths = write_reports(tmp_path, {"a.json": gpu_report(1), "b.json": gpu_report(2)})
    code, doc, _ = envbuild_json(tmp_path, {}, "doctor", *paths, "--checks", "shm", schema="doctor")
    assert (code, doc["exit_code"], [(c["name"], c["status"]) for c in doc["checks"]]) == (0, 0, [("shm", "pass")])
    code, doc, _ = envbuild_json(tmp_path, {}, "doctor", *paths, "--checks", "shm", "--min-shm", "1000g",
                                 schema="doctor")
    assert (code, doc["exit_code"], [(c["name"], c["status"]) for c in doc["checks"]]) == (2, 2, [("shm", "fail")])
