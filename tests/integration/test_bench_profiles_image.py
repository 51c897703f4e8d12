"""The profile checks run for real: 2 gloo ranks under torchrun inside the cpu-torch2 image
(torch 2.13, CPU, numpy pinned by the recipe), and once in a derived image without numpy.

One container (read-only root, /tmp on tmpfs, no network but loopback, an arbitrary
UID, builder/agent/bench mounted read-only as in certification) runs several torchrun jobs
of ``tests/bench_profiles_driver.py`` one after the other:

- ``pass``: every profile, float32 and bfloat16, scaling and the numpy features: the
  passing twin of every fault below;
- ``faults``: a corrupted element in each of the six collectives (on alternating ranks),
  a perturbed DDP gradient, perturbed FSDP and TP shards, an altered pipeline message, a
  perturbed expert;
- ``drop``: a dropped pipeline message, and a corrupted bfloat16/float32 reduce-scatter
  next to an untouched all-gather and FSDP check in the same run;
- ``badfault``: an invalid fault spec, refused on every rank before any collective;
- ``world1``: one rank, where gloo cannot run the send/recv ring (reported unsupported).

The image without numpy (cpu-torch2 with numpy's package removed in a layer on top) runs
the pipeline profile and the numpy features: what needs numpy is reported unsupported.
"""

from __future__ import annotations

import json
import os
import shlex
import textwrap
from pathlib import Path

import pytest

from builder.agent.bench import collectives as coll
from builder.image import engine

REPO = Path(__file__).resolve().parents[2]
DRIVER = REPO / "tests" / "bench_profiles_driver.py"
SIZES = "8,1000,65536"
ALL_FAULTS = ("collective-corrupt:all_reduce@1,collective-corrupt:all_gather@0,"
              "collective-corrupt:reduce_scatter@1,collective-corrupt:broadcast@1,"
              "collective-corrupt:all_to_all@0,collective-corrupt:send_recv@1,"
              "ddp-grad-perturb@1,fsdp-shard-perturb@1,tp-shard-perturb@0,"
              "pipeline-message-alter@1,moe-expert-perturb@1")
CORRUPTED_RANK = {"all_reduce": 1, "all_gather": 0, "reduce_scatter": 1, "broadcast": 1,
                  "all_to_all": 0, "send_recv": 1}
TRAINING = ("ddp", "fsdp", "tp", "pipeline", "moe")

# name -> (fault spec or "", nproc, driver arguments)
JOBS = {
    "pass": ("", 2, f"--profiles all --dtypes float32,bfloat16 --sizes {SIZES}"),
    "faults": (ALL_FAULTS, 2, f"--profiles all --sizes {SIZES} --no-scaling --no-features"),
    "drop": ("pipeline-message-drop@1,collective-corrupt:reduce_scatter@1", 2,
             f"--profiles fsdp,pipeline --dtypes float32,bfloat16 --sizes {SIZES} "
             "--no-scaling --no-features"),
    "badfault": ("explode@1", 2, "--profiles ddp --no-scaling --no-features"),
    "world1": ("", 1, f"--profiles all --sizes {SIZES} --no-features"),
}


def job_script(jobs: dict) -> str:
    """sh script running each job with a timeout; /out/<job>/{log,rc,rank-R.json}."""
    lines = ["set -u"]
    for i, (name, (fault, nproc, args)) in enumerate(jobs.items()):
        env = f"ENVBUILD_BENCH_PROFILE_FAULT={shlex.quote(fault)} " if fault else ""
        lines.append(
            f"mkdir -p /out/{name}; {env}timeout 150 python3 -W ignore::UserWarning "
            f"-m torch.distributed.run --nproc-per-node {nproc} --master-addr 127.0.0.1 "
            f"--master-port {29611 + i} /opt/driver.py --out /out/{name} {args} "
            f"> /out/{name}/log 2>&1; echo $? > /out/{name}/rc")
    return "\n".join(lines) + "\n"


def run_jobs(client, image: str, out: Path, labels: dict, jobs: dict) -> dict:
    """Run ``jobs`` in one container of ``image``; {job: {"rc", "log", "ranks": [doc]}}."""
    out.mkdir(parents=True, exist_ok=True)
    os.chmod(out, 0o777)
    container = client.sdk.containers.create(
        image, command=["sh", "-c", job_script(jobs)], labels=labels,
        user=f"{os.getuid() or 4242}:{os.getgid() or 4242}", read_only=True,
        tmpfs={"/tmp": "rw,exec,mode=1777"}, network_mode="none",
        environment={"PYTHONPATH": "/opt/envbuild", "HOME": "/tmp", "GLOO_SOCKET_IFNAME": "lo"},
        volumes={str(REPO / "builder" / "agent" / "bench"): {"bind": "/opt/envbuild/bench", "mode": "ro"},
                 str(DRIVER): {"bind": "/opt/driver.py", "mode": "ro"},
                 str(out): {"bind": "/out", "mode": "rw"}},
        cap_drop=["ALL"], security_opt=["no-new-privileges"])
    try:
        container.start()
        status = container.wait(timeout=600)
        assert status["StatusCode"] == 0, container.logs().decode()[-3000:]
    finally:
        container.remove(force=True)
    found = {}
    for name, (_, nproc, _) in jobs.items():
        d = out / name
        ranks = [json.loads((d / f"rank-{r}.json").read_text())
                 for r in range(nproc) if (d / f"rank-{r}.json").is_file()]
        found[name] = {"rc": int((d / "rc").read_text()), "log": (d / "log").read_text(),
                       "ranks": ranks}
    return found


@pytest.fixture(scope="module")
def client():
    return engine.connect(timeout_s=120)


@pytest.fixture(scope="module")
def runs(client, torch_image, test_labels, tmp_path_factory):
    return run_jobs(client, torch_image, tmp_path_factory.mktemp("profiles"), test_labels, JOBS)


@pytest.fixture(scope="module")
def nonumpy_image(client, torch_image, test_labels, test_session_id, tmp_path_factory):
    """``torch_image`` with numpy's package removed (its files, its .dist-info, numpy.libs)."""
    ctx = tmp_path_factory.mktemp("nonumpy-image")
    (ctx / "Dockerfile").write_text(textwrap.dedent(f"""\
        FROM {torch_image}
        USER root
        RUN d=$(python3 -c "import numpy, os; print(os.path.dirname(os.path.dirname(numpy.__file__)))") \\
            && rm -rf "$d"/numpy "$d"/numpy-*.dist-info "$d"/numpy.libs \\
            && ! python3 -c "import numpy" 2>/dev/null
        """))
    tag = f"envbuild-test/torch-nonumpy:{test_session_id}"
    client.build(ctx, tag, labels=test_labels)
    return tag


@pytest.fixture(scope="module")
def nonumpy_run(client, nonumpy_image, test_labels, tmp_path_factory):
    jobs = {"nonumpy": ("", 2, f"--profiles pipeline --sizes {SIZES} --no-scaling")}
    return run_jobs(client, nonumpy_image, tmp_path_factory.mktemp("nonumpy"), test_labels, jobs)["nonumpy"]


def shared(doc: dict) -> dict:
    """The part of a rank's result that every rank must hold alike (run_profiles)."""
    out = {k: v for k, v in doc.items() if k not in ("wall_s", "features")}
    out["training"] = {p: {k: v for k, v in t.items() if k != "check_wall_s"}
                       for p, t in doc["training"].items()}
    out["collectives"] = {n: [{k: v for k, v in r.items() if not k.startswith("own_")} for r in rows]
                          if isinstance(rows, list) else rows for n, rows in doc["collectives"].items()}
    return out


def own_wrong(job: dict, name: str) -> list[list[int]]:
    """Per row of ``name``, each rank's own wrong count (index = rank)."""
    return [[doc["collectives"][name][i]["own_wrong"] for doc in job["ranks"]]
            for i in range(len(job["ranks"][0]["collectives"][name]))]


def done(job: dict, nproc: int = 2) -> dict:
    """Rank 0's result after checking the job exited 0 and all ranks agree."""
    assert job["rc"] == 0, job["log"][-4000:]
    assert len(job["ranks"]) == nproc
    for doc in job["ranks"][1:]:
        assert shared(doc) == shared(job["ranks"][0])
    return job["ranks"][0]


# --------------------------------------------------------------------------- passing twin


def test_every_collective_is_exact_in_both_types(runs):
    res = done(runs["pass"])
    assert list(res["collectives"]) == list(coll.COLLECTIVES)
    assert res["unsupported_types"] == {}
    for name, rows in res["collectives"].items():
        assert [(r["type"], r["size_bytes"]) for r in rows] == \
            [(t, s) for t in ("float32", "bfloat16") for s in (8, 1000, 65536)], name
        for r in rows:
            assert r["wrong"] == 0 and r["own_wrong"] == 0, (name, r)
            assert r["time_us"] >= r["median_time_us"] >= r["min_time_us"] > 0 and r["slowest_rank"] in (0, 1)
            assert r["algbw_gbps"] == pytest.approx(r["size_bytes"] / r["time_us"] / 1e3)
            assert r["busbw_gbps"] == pytest.approx(r["algbw_gbps"] * coll.bus_factor(name, 2))
        own = [[doc["collectives"][name][i]["own_time_us"] for doc in runs["pass"]["ranks"]] for i in range(len(rows))]
        assert [(r["min_time_us"], r["time_us"], r["slowest_rank"]) for r in rows] == \
            [(min(t), max(t), t.index(max(t))) for t in own], name  # rank 0 reduced every rank's own


def test_rows_use_nccl_tests_columns(runs):
    res = done(runs["pass"])
    ag = {(r["type"], r["size_bytes"]): r for r in res["collectives"]["all_gather"]}
    assert (ag["float32", 1000]["count"], ag["bfloat16", 1000]["count"]) == (125, 250)
    assert ag["float32", 1000]["api"] == "all_gather_single"  # torch 2.13's preferred name
    ar = {(r["type"], r["size_bytes"]): r for r in res["collectives"]["all_reduce"]}
    assert (ar["float32", 65536]["count"], ar["float32", 65536]["redop"]) == (16384, "sum")
    bc = res["collectives"]["broadcast"][0]
    assert (bc["root"], bc["redop"], bc["api"]) == (0, "none", "broadcast")
    assert res["collectives"]["send_recv"][0]["api"] == "batch_isend_irecv"
    assert res["collectives"]["all_to_all"][0]["api"] == "all_to_all_single"
    assert res["collectives"]["reduce_scatter"][0]["api"] == "reduce_scatter_single"


def test_every_training_check_matches_its_reference(runs):
    res = done(runs["pass"])
    assert list(res["training"]) == list(TRAINING)
    for name, t in res["training"].items():
        assert t["reference_match"] is True, (name, t)
        assert t["losses_match"] and t["params_match"]
        assert len(t["losses"]) == len(t["reference_losses"]) == t["steps"] == 3
        assert t["max_param_diff"] < 1e-6
        assert t["tolerance"]["rtol"] == 1e-5 and t["tolerance"]["atol"] == 1e-6
        assert t["samples_per_s"] > 0 and t["wall_s"] > 0
    assert res["training"]["ddp"]["dtype"] == "float64"
    assert res["training"]["pipeline"]["stages"] == 2
    assert sum(res["training"]["moe"]["routed"]) == 3 * 8 * 2  # every token went somewhere


def test_scaling_and_timing(runs):
    res = done(runs["pass"])
    s = res["scaling"]
    assert s["world_size"] == 2 and s["throughput_1"] > 0 and s["throughput_n"] > 0
    assert s["efficiency"] == pytest.approx(s["throughput_n"] / (2 * s["throughput_1"]))
    assert 0 < s["efficiency"] < 2
    assert set(res["wall_s"]["training"]) == set(TRAINING)
    # the total holds each check's time (how fast is benchmarks/' business, not a test's)
    assert res["wall_s"]["total"] >= sum(res["wall_s"]["training"].values()) > 0


def test_without_numpy_what_needs_it_is_unsupported(nonumpy_run):
    for doc in nonumpy_run["ranks"]:
        f = doc["features"]
        assert f["numpy"] == {"available": False, "problem": "RuntimeError: Numpy is not available",
                              "ranks_without": [0, 1]}
        assert f["all_gather_object"] == {"unsupported": "RuntimeError: Numpy is not available",
                                          "ran": True, "needs_numpy": True}
        for name in ("pipeline_shape_inference", "dcp_save"):
            assert f[name] == {
                "unsupported": "needs numpy, missing on every rank (not run: it would fail on one "
                               "side only): RuntimeError: Numpy is not available",
                "needs_numpy": True, "ran": False}


def test_with_numpy_the_features_run(runs):
    res = done(runs["pass"])
    assert res["features"]["numpy"] == {"available": True, "problem": None, "ranks_without": []}
    assert [res["features"][k] for k in ("all_gather_object", "pipeline_shape_inference",
                                         "dcp_save")] == ["ok", "ok", "ok"]
    assert res["training"]["pipeline"]["reference_match"] is True
    assert [r["wrong"] for r in res["collectives"]["send_recv"]] == [0, 0, 0, 0, 0, 0]  # 3 sizes x float32, bfloat16


# --------------------------------------------------------------------------- faults


def test_each_corrupted_collective_is_seen_on_its_rank(runs):
    res = done(runs["faults"])
    assert res["faults"] == ALL_FAULTS.split(",")
    for name, rows in res["collectives"].items():
        want = [0, 0]
        want[CORRUPTED_RANK[name]] = 1
        assert own_wrong(runs["faults"], name) == [want] * 3, name
        assert all(r["wrong"] == 1 for r in rows)


def test_each_training_fault_breaks_the_reference_match(runs):
    res = done(runs["faults"])
    for name, t in res["training"].items():
        assert t["reference_match"] is False and t["params_match"] is False, (name, t)
        assert t["max_param_diff"] > 1e-4  # > 9x the tolerance of a parameter of 1.0
    # The DDP fault keeps the replicas identical (all ranks average the same wrong
    # gradient): only the reference sees it. Its first loss is still the reference's.
    ddp = res["training"]["ddp"]
    assert ddp["losses"][0] == ddp["reference_losses"][0]
    assert res["scaling"] is None and res["features"] is None


def test_dropped_message_and_bfloat16_corruption(runs):
    res = done(runs["drop"])
    assert res["training"]["pipeline"]["reference_match"] is False
    assert res["training"]["fsdp"]["reference_match"] is True  # untouched in the same run
    rs = res["collectives"]["reduce_scatter"]
    assert [r["type"] for r in rs] == [t for t in ("float32", "bfloat16") for _ in range(3)]
    assert own_wrong(runs["drop"], "reduce_scatter") == [[0, 1]] * 6 and all(r["wrong"] == 1 for r in rs)
    assert all(r["wrong"] == 0 for r in res["collectives"]["all_gather"])


def test_invalid_fault_spec_is_refused_on_every_rank(runs):
    job = runs["badfault"]
    assert job["rc"] == 1 and job["ranks"] == []  # torchrun: a worker exited non-zero
    assert job["log"].count("driver: error: ENVBUILD_BENCH_PROFILE_FAULT: unknown kind "
                            "'explode' (one of collective-corrupt, ") == 2


def test_one_rank_reports_what_it_cannot_run(runs):
    res = done(runs["world1"], nproc=1)
    assert res["collectives"]["send_recv"] == {
        "unsupported": "send_recv on one rank sends to itself, which gloo does not do"}
    for name in ("all_reduce", "all_gather", "reduce_scatter", "broadcast", "all_to_all"):
        rows = res["collectives"][name]
        assert [r["wrong"] for r in rows] == [0, 0, 0]
        assert all(r["busbw_gbps"] == (r["algbw_gbps"] if name == "broadcast" else 0.0) for r in rows)
    assert all(t["reference_match"] for t in res["training"].values())
    assert res["scaling"]["world_size"] == 1
