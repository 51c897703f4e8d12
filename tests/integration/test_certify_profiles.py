"""Certify with the parallelism profiles (issue 10) on the real engine, 2 gloo nodes.

- a FOREIGN image (``docker export`` of the session's cpu-torch2 image, ``docker import``ed
  with its environment but none of its labels) certified through the command line with
  ``--profile all``: the probe's stack is the reference, no lock is recorded, the
  certificate goes to ``<images-dir>/<ref made path-safe>/certificates/``, every collective
  exact, every training check matching its reference, the scaling efficiency gated with a
  low floor, the missing numpy one warning line. It is the passing twin of:
- the same image with ``--recipe cpu-torch2`` and an injected fault in each of the six
  collectives and the five training checks, plus an unreachable scaling floor: the
  verdict fails naming each of them, and the recipe's lock is the reference that still
  matches (the in-image faults themselves are tested below the container level in
  tests/test_bench_profiles_image.py);
- images without python3 or without torch: refused in one line, exit 2, nothing run.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
import uuid
from pathlib import Path

import jsonschema
import msgspec
import pytest

from builder.certify import run
from builder.certify.settings import Overrides
from builder.certify.source import EngineImage, recipe_lock
from builder.core.errors import ExitCode
from builder.recipe.lock import lock_hash

ROOT = Path(__file__).resolve().parents[2]
COLLECTIVES = ("all_reduce", "all_gather", "reduce_scatter", "broadcast", "all_to_all", "send_recv")
TRAINING = ("ddp", "fsdp", "tp", "pipeline", "moe")
SIZES = [8, 1024, 65536]
CORRUPTED_RANK = {"all_reduce": 1, "all_gather": 0, "reduce_scatter": 1, "broadcast": 1, "all_to_all": 0,
                  "send_recv": 1}
ALL_FAULTS = ",".join([*(f"collective-corrupt:{n}@{r}" for n, r in CORRUPTED_RANK.items()),
                       "ddp-grad-perturb@1", "fsdp-shard-perturb@1", "tp-shard-perturb@0",
                       "pipeline-message-alter@1", "moe-expert-perturb@1"])
NUMPY_WARNING = ("numpy is not installed in the image on rank(s) 0,1: all_gather_object, pipeline_shape_inference, "
                 "dcp_save reported unsupported (a training image without numpy breaks jobs that use them)")


def envbuild(*args, env=None, timeout=900):
    return subprocess.run([sys.executable, "-m", "builder.cli", *args], cwd=ROOT, capture_output=True, text=True,
                          env={**os.environ, **(env or {})}, timeout=timeout)


def label_env(labels: dict[str, str]) -> dict[str, str]:
    return {"ENVBUILD_EXTRA_LABELS": ",".join(f"{k}={v}" for k, v in labels.items())}


@pytest.mark.parametrize("args, message", [
    (["--profile", "zero"], "argument --profile: unknown profile 'zero' (allowed: ddp, fsdp, tp, pipeline, moe, all)"),
    (["--profile", "ddp,"], "argument --profile: empty profile name in 'ddp,'"),
    (["--sizes", "6"], "argument --sizes: size 6 is not a multiple of 4 bytes"),
    (["--dtype", "int8"], "argument --dtype: unsupported dtype 'int8'"),
    (["--min-scaling-efficiency", "0"], "argument --min-scaling-efficiency"),
    (["--min-scaling-efficiency", "1.5"], "argument --min-scaling-efficiency"),
    (["--iters", "0"], "argument --iters"),
    (["--profile", "ddp\n"], "argument --profile: 'ddp\\n' holds a control character"),
    (["--sizes", "8\n"], "argument --sizes: '8\\n' holds a control character"),
    (["--dtype", "float32\n"], "argument --dtype: 'float32\\n' holds a control character")])
def test_bad_profile_options_are_usage_errors(args, message):
    res = envbuild("certify", "img:1", *args)
    assert res.returncode == ExitCode.USAGE, res.stderr
    assert message in res.stderr and "Traceback" not in res.stderr


def test_recipe_option_refused_before_the_engine(tmp_path):
    res = envbuild("--images-dir", str(tmp_path), "certify", "img:1", "--recipe", "nosuch")
    assert (res.returncode, res.stdout) == (ExitCode.CHECK_FAILED, "")
    assert res.stderr == (f"error: {tmp_path}/nosuch/envbuild.lock.json: recipe nosuch has no lock there; "
                          "write it with `envbuild render nosuch`\n")
    res = envbuild("certify", "img:1", "--recipe", "Bad..")
    assert res.returncode == ExitCode.USAGE
    assert res.stderr == "error: recipe: 'Bad..' is not a recipe name ([a-z0-9][a-z0-9._-]*)\n"


# --------------------------------------------------------------------------- engine


@pytest.fixture(scope="module")
def foreign_image(docker_client, torch_image, test_labels, test_session_id):
    """``envbuild-test/foreign:<session>``: the files of ``torch_image`` imported as a new
    image with its Env and Cmd but no envbuild label (only the session's, for cleanup), and
    without numpy (removed before the export: what needs numpy is then reported unsupported,
    with the one warning line; the recipe's image, which has numpy, is the fault run's)."""
    env = docker_client.sdk.images.get(torch_image).attrs["Config"]["Env"]
    tag = f"envbuild-test/foreign:{test_session_id}"
    changes = [*(f"ENV {e.split('=', 1)[0]}={e.split('=', 1)[1]}" for e in env), 'CMD ["python3"]',
               *(f"LABEL {k}={v}" for k, v in test_labels.items())]
    c = docker_client.sdk.containers.create(torch_image, labels=test_labels, user="root", entrypoint=["sh", "-c"], command=[
        'd=$(python3 -c "import numpy, os; print(os.path.dirname(os.path.dirname(numpy.__file__)))") && '
        'rm -rf "$d"/numpy "$d"/numpy-*.dist-info "$d"/numpy.libs'])
    try:
        c.start()
        assert c.wait(timeout=120)["StatusCode"] == 0, c.logs()[-2000:]
        exp = subprocess.Popen(["docker", "export", c.id], stdout=subprocess.PIPE)
        imp = subprocess.run(["docker", "import", *(x for ch in changes for x in ("--change", ch)), "-", tag],
                             stdin=exp.stdout, capture_output=True, text=True, timeout=600)
        assert exp.wait(timeout=60) == 0 and imp.returncode == 0, imp.stderr
    finally:
        c.remove(force=True)
    labels = docker_client.sdk.images.get(tag).labels
    assert not any(k.startswith("envbuild.") and k != "envbuild.test-session" for k in labels), labels
    yield tag
    docker_client.sdk.images.remove(tag, force=True)


def test_foreign_image_with_every_profile(tmp_path, docker_client, foreign_image, test_labels):
    """The passing twin of every fault below, through the command line."""
    images = tmp_path / "images"
    t0 = time.monotonic()
    prom, log = tmp_path / "certify.prom", tmp_path / "events.jsonl"
    res = envbuild("--images-dir", str(images), "certify", foreign_image, "--profile", "all",
                   "--sizes", "8,1K,64K", "--iters", "3", "--warmup", "1", "--min-scaling-efficiency", "0.001",
                   "--metrics-file", str(prom), "--log-json", str(log), env=label_env({**test_labels, "envbuild.test-case": uuid.uuid4().hex[:12]}))
    elapsed = time.monotonic() - t0
    assert res.returncode == 1, res.stdout[-3000:] + res.stderr[-3000:]  # its one warning: no numpy
    assert "verdict: PASSED" in res.stdout and "Traceback" not in res.stderr
    assert [w.split(":")[1].strip() for w in res.stdout.splitlines() if w.strip().startswith("warning:")] == [
        "numpy is not installed in the image on rank(s) 0,1"]
    safe = re.sub(r"[^A-Za-z0-9._-]", "_", foreign_image)
    certs = list((images / safe / "certificates").glob("*.json"))
    assert len(certs) == 1 and f"certificate: {certs[0]}" in res.stdout
    assert certs[0].name.startswith(safe + "-")
    assert f"{foreign_image}: no recipe lock (reference: rank 0's probe: torch 2.13.0+cpu" in res.stdout
    cert = json.loads(certs[0].read_text())
    assert cert["verdict"] == {"passed": True, "exit_code": 0, "failures": [], "warnings": [NUMPY_WARNING],
                               "failure_class": None, "next_step": None}
    assert (cert["lock"], cert["lock_hash"], cert["recipe"]) == (None, None, None)
    assert cert["stack"] == {"source": "probe", "recipe": None, "reference_rank": 0, "python": "3.11.2",
                             "torch": "2.13.0+cpu", "cuda": None, "nccl": None, "glibc": "2.36", "os": "debian 12"}
    assert all(r["lock_mismatches"] is None for r in cert["ranks"].values())
    assert cert["settings"]["overrides"] == {"sizes": SIZES, "iters": 3, "warmup": 1, "profiles": list(TRAINING),
                                 "min_scaling_efficiency": 0.001}
    assert cert["settings"]["profiles"] == list(TRAINING) and cert["settings"]["dtypes"] == ["float32"]
    assert cert["settings"]["min_scaling_efficiency"] == 0.001
    assert list(cert["collectives"]) == list(COLLECTIVES)
    for name, rows in cert["collectives"].items():
        assert [(r["size_bytes"], r["type"]) for r in rows] == [(s, "float32") for s in SIZES], name
        assert all(r["wrong"] == 0 and r["wrong_ranks"] == [] and r["time_us"] > 0 for r in rows), name
    assert list(cert["training"]) == list(TRAINING)
    for name, t in cert["training"].items():
        assert t["reference_match"] is True and t["max_param_diff"] < 1e-6, (name, t)
        assert t["tolerance"]["rtol"] == 1e-5 and len(t["losses"]) == len(t["reference_losses"]) == 3
        assert t["samples_per_s"] > 0
    sc = cert["scaling"]
    assert sc["world_size"] == 2 and sc["efficiency"] == pytest.approx(sc["throughput_n"] / (2 * sc["throughput_1"]))
    assert cert["features"]["numpy"]["available"] is False
    _assert_metrics_and_events(prom, log, cert, foreign_image, res.stdout)
    print(f"foreign --profile all: {elapsed:.1f} s")


def _assert_metrics_and_events(prom: Path, log: Path, cert: dict, image: str, stdout: str) -> None:
    """``--metrics-file`` (promtool accepts it) and ``--log-json`` (the published schema) of a passed run; the
    plain phases line and the JSON phase events name the same phases, from the one list of the certificate."""
    lines = prom.read_text().splitlines()
    run = f'image="{image}",run="{cert["run_id"]}"'
    assert f"envbuild_certify_passed{{{run}}} 1.0" in lines
    assert f"envbuild_scaling_efficiency{{{run}}} {cert['scaling']['efficiency']!r}" in lines
    assert len([ln for ln in lines if ln.startswith("envbuild_busbw_gbps{")]) == len(COLLECTIVES) * len(SIZES)
    assert subprocess.run(["promtool", "check", "metrics"], input=prom.read_bytes()).returncode == 0
    schema = json.loads((ROOT / "schemas" / "log-event.schema.json").read_text())
    events = [json.loads(ln) for ln in log.read_text().splitlines()]
    for e in events:
        jsonschema.validate(e, schema)
    assert [(e["event"], e["rank"], e["msg"]) for e in events if e["event"] != "phase"] == [
        ("rank-result", 0, "reported"), ("rank-result", 1, "reported"), ("finding", None, NUMPY_WARNING),
        ("run-end", None, f"certify {image}: passed")]
    assert {e["run"] for e in events} == {cert["run_id"]}
    names = [p["name"] for p in cert["phases"]]
    assert len(names) >= 3 and [e["msg"].rsplit(": ", 1)[0] for e in events if e["event"] == "phase"] == names
    [plain] = [ln for ln in stdout.splitlines() if ln.startswith("phases: ")]
    assert re.findall(r"(?:phases: |, )(.+?) \d+\.\d s", plain) == names


def test_every_fault_fails_the_verdict_naming_it(tmp_path, docker_client, foreign_image, test_labels):
    """One run, every fault (the foreign run above is the twin), compared with a recipe's lock."""
    recipe = recipe_lock(ROOT / "images", "cpu-torch2")
    p = run.plan(EngineImage(docker_client, foreign_image, recipe=recipe),
                 Overrides(profiles=list(TRAINING), sizes=SIZES, iters=3, warmup=1, min_scaling_efficiency=1.0),
                 labels={**test_labels, "envbuild.test-case": uuid.uuid4().hex[:12]},
                 extra_env={"ENVBUILD_BENCH_PROFILE_FAULT": ALL_FAULTS})
    t0 = time.monotonic()
    cert, path = run.run(p, images_dir=tmp_path)
    elapsed = time.monotonic() - t0
    assert path.parent == tmp_path / "cpu-torch2" / "certificates"
    v = cert.verdict
    assert not v.passed and v.exit_code == ExitCode.CHECK_FAILED
    expected = [f"collective {n} wrong at " + ", ".join(
        f"{s} B float32 (1 wrong element on rank {r})" for s in SIZES) for n, r in CORRUPTED_RANK.items()]
    assert v.failures[:6] == expected, v.failures
    training = v.failures[6:11]
    for name, line in zip(TRAINING, training, strict=True):
        assert line.startswith(f"training {name} does not match its single-process reference: losses "), line
        assert "parameters differ" in line and line.endswith("rtol 1e-05, atol 1e-06)"), line
    assert re.fullmatch(r"scaling efficiency 0\.\d{3} is below the floor of 1 \(argument\): .*", v.failures[11])
    assert len(v.failures) == 12, v.failures
    assert v.warnings == [NUMPY_WARNING]  # the foreign image has no numpy (removed)
    # the recipe's lock is the reference, and the image matches it
    assert cert.stack is not None and (cert.stack.source, cert.stack.recipe) == ("recipe", "cpu-torch2")
    assert cert.lock == msgspec.json.decode(msgspec.json.encode(recipe[1])) and cert.lock_hash == lock_hash(recipe[1]) and cert.recipe == "cpu-torch2"
    assert all(r.lock_mismatches == [] for r in cert.ranks.values())
    assert all(cert.training[n].reference_match is False for n in TRAINING)
    print(f"faults --profile all: {elapsed:.1f} s")


@pytest.mark.parametrize("which, missing", [("bootstrap_image", "it has no python3"),
                                            ("python_image", "it has no torch (ModuleNotFoundError: No module "
                                                             "named 'torch')")])
def test_image_without_python_or_torch_refused(request, tmp_path, docker_client, test_labels, which, missing):
    image = request.getfixturevalue(which)
    case = uuid.uuid4().hex[:12]
    res = envbuild("--images-dir", str(tmp_path / "images"), "certify", image,
                   env=label_env({**test_labels, "envbuild.test-case": case}))
    assert res.returncode == ExitCode.CHECK_FAILED, res.stdout + res.stderr
    assert res.stderr == f"error: image: {image!r} cannot be certified: {missing}" + (
        " (envbuild runs python3 >= 3.8 with torch in it)" if "python3" in missing else "") + "\n"
    assert res.stdout == "" and not (tmp_path / "images").exists()
    assert docker_client.sdk.containers.list(all=True, filters={"label": f"envbuild.test-case={case}"}) == []
