"""What a user sees without a terminal (CI logs, ``| tee``): certify's plain timestamped progress
lines as they happen, none with --quiet; doctor without nodes is 64; and verify --image counting only the containers envbuild
started unless --any-container."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import uuid
from pathlib import Path

from builder.launchers import base

from fixtures_nodes import nodes_factory, run_envbuild, run_json  # noqa: F401 - pytest fixtures

REPO = Path(__file__).resolve().parents[2]
STAMPED = re.compile(r"\d\d:\d\d:\d\d \+\d+\.\d s run [0-9a-f]+: .*")


def _certify(image: str, tmp_path: Path, labels: dict[str, str], *flags: str) -> subprocess.CompletedProcess:
    env = {**os.environ, base.EXTRA_LABELS_ENV: ",".join(f"{k}={v}" for k, v in labels.items())}
    return subprocess.run([sys.executable, "-m", "builder.cli", *flags, "--images-dir", str(tmp_path), "certify",
                           image, "--backend", "gloo", "--nodes", "2", "--sizes", "8,1024", "--iters", "2",
                           "--warmup", "1", "--timeout", "180"],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=400)


def test_certify_without_a_terminal_prints_phase_lines(torch_image, tmp_path, test_labels):
    proc = _certify(torch_image, tmp_path, {**test_labels, "envbuild.test-case": uuid.uuid4().hex[:12]})
    assert proc.returncode in (0, 1), proc.stderr
    stamped = [x for x in proc.stderr.splitlines() if STAMPED.fullmatch(x)]
    assert any("phase start" in x for x in stamped), proc.stderr
    assert len({x.split("phase ", 1)[1].split(",")[0] for x in stamped if "phase " in x}) >= 2, proc.stderr
    assert stamped[-1].endswith(": 2/2 rank result(s)"), proc.stderr
    quiet = _certify(torch_image, tmp_path, {**test_labels, "envbuild.test-case": uuid.uuid4().hex[:12]}, "--quiet")
    assert quiet.returncode in (0, 1), quiet.stderr
    assert [x for x in quiet.stderr.splitlines() if STAMPED.fullmatch(x) or "rank result" in x] == []
    assert "verdict: PASSED" in quiet.stdout


def test_verify_image_counts_only_envbuild_containers(torch_image, nodes_factory):
    seed = nodes_factory.start(torch_image, "seed")  # a fresh image ID no other test runs
    image = f"envbuild-test/{nodes_factory.case}:v"
    seed.commit(repository=image.split(":")[0], tag="v", conf={"Labels": {**nodes_factory.labels}})
    mine = nodes_factory.start(image, "mine", labels={"envbuild": "1"})  # removed with the image, by label
    nodes_factory.start(image, "theirs", labelled=False)
    code, doc = run_json("verify", "--image", image)
    assert (code, [n["name"] for n in doc["nodes"]]) == (0, [mine.name]), doc
    code, doc = run_json("verify", "--image", image, "--any-container")
    assert (code, sorted(n["name"] for n in doc["nodes"])) == (0, sorted([mine.name, nodes_factory.name("theirs")]))


def test_doctor_without_nodes_is_a_usage_error():
    res = run_envbuild("doctor")
    assert res.returncode == 64
    assert res.stderr.endswith("; or --checks stale-containers for this engine alone\n")
    alone = run_envbuild("doctor", "--checks", "stale-containers")  # this engine alone: no nodes needed
    assert alone.returncode in (0, 1, 2) and "give report files" not in alone.stderr, alone.stderr
