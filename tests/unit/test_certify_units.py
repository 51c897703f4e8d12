"""Unit tests of certification logic without an engine: settings, judging, NCCL log
parsing, certificate shape and writing, the table, and the launcher's pure helpers."""

from __future__ import annotations

import copy
import io
import json
import os
import re

import msgspec
import pytest
from rich.console import Console

from builder.certify import certificate, nccl_log, source, table, verdict
from builder.certify import settings as certify_settings
from builder.certify.settings import Overrides
from builder.core.certificate import SocketSetting, load_certificate
from builder.core.documents import RankResult
from builder.core.errors import EnvbuildError, ExitCode, ManyErrors
from builder.core.model import convert
from builder.image import engine, probecheck
from builder.launchers import base, local, output
from builder.launchers.base import LaunchResult, LaunchSpec
from builder.recipe.lock import lock_hash, validate_lock

from certify_helpers import certify_image
from factories import CPU_REPORT, lock_of, node_report, profiles_result, rank_result

# --------------------------------------------------------------------------- fixtures

CPU_LOCK = {
    "schema": "envbuild.lock/1",
    "recipe": "cpu-torch2",
    "python": "3.11",
    "os": {"glibc": "2.36", "id": "debian", "version_id": "12"},
    "torch": {"local": "2.13.0+cpu", "variant": "cpu", "version": "2.13.0"},
    "cuda": None,
    "cudnn": None,
    "nccl": None,
    "certify": {
        "allreduce": {"iters": 10, "sizes": [8, 1024, 65536], "warmup": 2},
        "backend": "gloo",
        "ddp": {"batch_size": 8, "image_size": 64, "steps": 3},
        "gpus_per_node": 0,
        "nodes": 2,
        "port": 29500,
        "shm_size": "256m",
        "thresholds": {"busbw_size": None, "min_busbw_gbps": None},
        "timeout_s": 60,
    },
}

# the rest of a whole lock document (labels are checked against the lock schema)
CPU_LOCK.update({
    "apt": [], "base_image": "debian:bookworm-slim", "driver": {"min": None, "minor_compat_min": None},
    "env": {"OMP_NUM_THREADS": "1"}, "nccl_package": None, "pip": ["torch==2.13.0+cpu"],
    "index": {"torch_url": "https://download.pytorch.org/whl/cpu", "url": "https://pypi.org/simple"},
})

NCCL_LOCK = copy.deepcopy(CPU_LOCK)
NCCL_LOCK["recipe"] = "cuda12-torch2"
NCCL_LOCK["certify"].update(
    backend="nccl",
    gpus_per_node=1,
    thresholds={"busbw_size": 1073741824, "min_busbw_gbps": 10.0},
)
NCCL_LOCK["certify"]["allreduce"]["sizes"] = [1048576, 16777216]

PROBE = node_report(CPU_REPORT)


RUN_ID = "0123456789ab"


def rank_doc(rank, world=2, *, sizes=(8, 1024, 65536), wrong=0, times=None, match=True,
             probe=None, backend="gloo", busbw=0.05, run_id=RUN_ID):
    """A passing rank result (tests/factories.py) with these changes."""
    doc = rank_result(rank, world, run_id=run_id, backend=backend,
                      profiles=profiles_result(rank, world, sizes, wrong=wrong, times=times, busbw=busbw,
                                               match=match))
    doc["probe"] = copy.deepcopy(PROBE if probe is None else probe)
    doc["probe"]["hostname"] = f"node-{rank}"
    return doc


def launch(results, world=2, **kw):
    fields = dict(
        rank_results={d["rank"]: convert(d, RankResult) for d in results},
        node_logs={n: "" for n in range(world)},
        node_exit_codes={n: 0 for n in range(world)},
        timed_out=False,
        missing_ranks=sorted(set(range(world)) - {d["rank"] for d in results}),
        started_at="2026-05-12T10:00:00Z",
        finished_at="2026-05-12T10:00:09Z",
    )
    fields.update(kw)
    return LaunchResult(**fields)


def typed(lock):
    """A lock document as the model (None: no lock, a foreign image)."""
    return validate_lock(lock, "lock") if lock else None


def settings(lock=CPU_LOCK, gpu_visible=False, **kw):
    """Resolved settings (the ddp profile unless ``profiles=`` is given)."""
    return certify_settings.resolve(typed(lock), Overrides(**kw), gpu_visible=gpu_visible)


def judge(s, res, lock, *args, **kw):
    """The verdict as plain data (as the certificate holds it)."""
    return verdict.judge(s, res, typed(lock), *args, **kw).to_dict()


# --------------------------------------------------------------------------- settings


def test_settings_from_lock_and_overrides():
    s = settings(nodes=3, timeout_s=40, sizes=[8, 16])
    assert (s.nodes, s.gpus_per_node, s.world_size, s.backend, s.recipe_backend) == (3, 0, 3, "gloo", "gloo")
    assert s.timeout_s == 40 and s.sizes == [8, 16] and s.ddp_steps == 3 and s.ddp_batch == 8
    assert s.iters == 10 and s.port == 29500 and s.shm_size == "256m"
    assert s.min_busbw_gbps is None and s.busbw_size == 16
    args = s.bench_args()
    assert args[args.index("--sizes") + 1] == "8,16"
    assert args[args.index("--backend") + 1] == "gloo"
    assert args[args.index("--pg-timeout-s") + 1] == "40"


def test_nccl_without_gpus_is_refused():
    with pytest.raises(EnvbuildError) as e:
        settings(NCCL_LOCK, gpu_visible=False)
    assert e.value.exit_code == ExitCode.CHECK_FAILED
    assert "recipe backend nccl needs GPUs; none visible" in str(e.value)
    assert "--backend gloo" in str(e.value)
    with pytest.raises(EnvbuildError, match="needs GPUs"):
        settings(CPU_LOCK, backend="nccl", gpu_visible=True)  # gpus_per_node 0


def test_nccl_recipe_certified_on_gloo_without_gpus():
    s = settings(NCCL_LOCK, backend="gloo", gpu_visible=False)
    assert (s.backend, s.recipe_backend, s.gpus_per_node) == ("gloo", "nccl", 0)
    assert s.min_busbw_gbps is None  # the recipe floor does not gate gloo
    assert any("not applied on gloo" in w for w in s.warnings)
    assert s.sizes == [1048576, 16777216]  # gate size not added when nothing gates


def test_gpus_without_runtime_refused():
    with pytest.raises(EnvbuildError, match="none visible"):
        settings(CPU_LOCK, gpus_per_node=1, gpu_visible=False)


def test_nccl_floor_from_recipe_adds_gate_size():
    s = settings(NCCL_LOCK, gpu_visible=True)
    assert s.min_busbw_gbps == 10.0 and s.busbw_source == "recipe"
    assert s.busbw_size == 1073741824 and 1073741824 in s.sizes
    s = settings(CPU_LOCK, min_busbw_gbps=0.5)
    assert s.min_busbw_gbps == 0.5 and s.busbw_source == "argument" and s.busbw_size == 65536


@pytest.mark.parametrize("kw", [{"nodes": 0}, {"port": 70000}, {"timeout_s": 0}, {"sizes": [6]},
                                {"backend": "mpi"}])
def test_bad_values_are_usage_errors(kw):
    with pytest.raises(EnvbuildError) as e:
        settings(**kw)
    assert e.value.exit_code == ExitCode.USAGE


# --------------------------------------------------------------------------- judging


@pytest.mark.parametrize("text", [" 8", "8 ", "8, 16", " 1K:4K", "1K: 4K", "\u00a08"])
def test_sizes_are_validated_whole(text):
    with pytest.raises(ValueError, match="is not a number of bytes"):
        certify_settings.parse_sizes(text)


def test_sizes_without_blanks_twin():
    assert [certify_settings.parse_sizes(t) for t in ("8", "8,16", "1K:4K")] == [[8], [8, 16], [1024, 2048, 4096]]


def test_judge_pass():
    v = judge(settings(), launch([rank_doc(0), rank_doc(1)]), CPU_LOCK)
    assert v == {"passed": True, "exit_code": 0, "failures": [], "warnings": [], "failure_class": None,
                 "next_step": None}  # the passing twin: no class, no next step


def _other_torch():
    other = copy.deepcopy(PROBE)
    other["torch"]["version"] = "2.12.0+cpu"
    return other


@pytest.mark.parametrize(("res", "kw", "cls", "step"), [
    (lambda: launch([rank_doc(0)], node_exit_codes={0: 0, 1: None}, rank_exit_codes={1: -9}), {}, "hardware",
     "drain the node and open a vendor case (attach nvidia-bug-report.sh output)"),
    (lambda: launch([rank_doc(0), rank_doc(1, probe=_other_torch())]), {}, "image",
     "fix the image (or the node image) and run again"),
    (lambda: launch([], timed_out=True, node_exit_codes={0: None, 1: None}), {}, "network",
     "fix the network config (the interface NCCL/gloo use, its MTU, the firewall between the nodes)"),
    (lambda: launch([rank_doc(0), rank_doc(1)]), {"min_busbw_gbps": 100.0}, "threshold",
     "raise the threshold if the value is expected (--gpu-thresholds, the recipe's certify floors)"),
    (lambda: launch([rank_doc(0), rank_doc(1, wrong=1)]), {}, "workload",
     "look at the job that ran (an application fault); the GPU stays usable"),
])
def test_a_failing_verdict_has_its_class_and_next_step(res, kw, cls, step):
    v = verdict.judge(settings(**kw), res(), typed(CPU_LOCK))
    assert (v.passed, v.failure_class, v.next_step) == (False, cls, step)


def test_judge_wrong_allreduce_names_rank_and_sizes():
    v = judge(settings(), launch([rank_doc(0), rank_doc(1, wrong=1)]), CPU_LOCK)
    assert not v["passed"] and v["exit_code"] == 2
    assert len(v["failures"]) == 1
    assert v["failures"][0].startswith("collective all_reduce wrong at 8 B float32 (1 wrong element on rank 1)")
    assert "65536 B" in v["failures"][0]


def test_judge_ddp_mismatch_is_the_profile_check():
    docs = [rank_doc(r, match=False) for r in (0, 1)]
    v = judge(settings(), launch(docs), CPU_LOCK)
    assert v["exit_code"] == 2
    assert v["failures"] == ["training ddp does not match its single-process reference: losses match, "
                             "parameters differ (max difference 0.5; rtol 1e-05, atol 1e-08)"]


def test_judge_timeout_is_exit_3():
    res = launch([], timed_out=True, node_exit_codes={0: None, 1: None})
    v = judge(settings(), res, CPU_LOCK)
    assert v["exit_code"] == 3
    assert v["failures"] == ["rank 0 did not finish within 60 s (timeout)",
                             "rank 1 did not finish within 60 s (timeout)"]


def test_judge_rank_exit_code():
    res = launch([], node_exit_codes={0: 1, 1: 1}, rank_exit_codes={0: 1, 1: 3})
    v = judge(settings(), res, CPU_LOCK)
    assert v["exit_code"] == 2
    assert "rank 1 exited with 3" in v["failures"]


def test_judge_killed_after_grace_and_signal():
    res = launch([rank_doc(0, world=3), rank_doc(1, world=3)], world=3,
                 node_exit_codes={0: 0, 1: None, 2: None}, rank_exit_codes={2: -9},
                 killed_after_s=20.0)
    res.rank_results.pop(1)
    v = judge(settings(nodes=3), res, CPU_LOCK)
    assert v["failures"] == ["rank 1 did not finish: killed 20 s after another node failed",
                             "rank 2 killed by SIGKILL (exit 137)"]
    assert v["exit_code"] == 2


def test_judge_unreadable_result_is_exit_3():
    res = launch([rank_doc(0)], rank_problems={1: "unreadable result file: JSONDecodeError"})
    v = judge(settings(), res, CPU_LOCK)
    assert v["failures"] == ["rank 1: unreadable result file: JSONDecodeError"]
    assert v["exit_code"] == 3


def test_judge_definite_failure_beats_timeout():
    res = launch([rank_doc(0, wrong=2)], timed_out=True, node_exit_codes={0: 0, 1: None})
    v = judge(settings(), res, CPU_LOCK)
    assert v["exit_code"] == 2
    assert "rank 1 did not finish within 60 s (timeout)" in v["failures"]


def test_judge_probe_against_lock_and_across_ranks():
    other = copy.deepcopy(PROBE)
    other["torch"]["version"] = "2.12.0+cpu"
    v = judge(settings(), launch([rank_doc(0), rank_doc(1, probe=other)]), CPU_LOCK)
    assert v["exit_code"] == 2
    assert any(f.startswith("rank 1: image differs from the lock: ") and "2.12.0+cpu" in f
               for f in v["failures"])
    assert "ranks differ in torch: rank 0 2.13.0+cpu, rank 1 2.12.0+cpu" in v["failures"]
    assert not any(f.startswith("rank 0") for f in v["failures"])


def test_judge_foreign_image_ranks_must_match_the_reference_probe():
    """No lock (a foreign image): no lock comparison; every rank must match rank 0's stack."""
    other = copy.deepcopy(PROBE)
    other["torch"]["version"] = "2.12.0+cpu"
    v = judge(settings(lock={}, sizes=[8, 1024, 65536]), launch([rank_doc(0), rank_doc(1, probe=other)]), None)
    assert v["failures"] == ["ranks differ in torch: rank 0 2.13.0+cpu, rank 1 2.12.0+cpu"]
    # the twin: the same stack everywhere passes, whatever a lock would have said
    assert judge(settings(lock={}, sizes=[8, 1024, 65536]), launch([rank_doc(0, probe=other), rank_doc(1, probe=other)]),
                 None) == {
        "passed": True, "exit_code": 0, "failures": [], "warnings": [], "failure_class": None, "next_step": None}


def test_judge_missing_probe():
    doc = rank_doc(1)
    doc["probe"] = None
    doc["errors"] = ["probe failed: OSError: boom"]
    v = judge(settings(), launch([rank_doc(0), doc]), CPU_LOCK)
    assert "rank 1: probe failed: OSError: boom" in v["failures"]


def test_busbw_not_gated_on_gloo_by_default():
    v = judge(settings(), launch([rank_doc(0, busbw=1e-6), rank_doc(1, busbw=1e-6)]), CPU_LOCK)
    assert v["passed"]


def test_busbw_floor_names_slowest_rank():
    s = settings(min_busbw_gbps=1e9)
    times = [120.0, 340.5]
    v = judge(s, launch([rank_doc(0, times=times), rank_doc(1, times=times)]), CPU_LOCK)
    assert v["exit_code"] == 2
    (f,) = v["failures"]
    assert "at 65536 B is below the floor of 1e+09 GB/s (argument)" in f
    assert f.endswith("slowest rank 1 (340.5 us)")


def test_busbw_floor_from_nccl_recipe():
    s = settings(NCCL_LOCK, gpu_visible=True)
    sizes = s.sizes
    ok = [rank_doc(r, sizes=sizes, backend="nccl", busbw=11.0, times=[9.0, 8.0]) for r in (0, 1)]
    assert judge(s, launch(ok), NCCL_LOCK)["failures"] == []
    slow = [rank_doc(r, sizes=sizes, backend="nccl", busbw=9.0, times=[9.0, 8.0]) for r in (0, 1)]
    (f,) = judge(s, launch(slow), NCCL_LOCK)["failures"]
    assert "(recipe); slowest rank 0" in f


def test_judge_nccl_without_transport_lines_warns():
    s = settings(NCCL_LOCK, gpu_visible=True, min_busbw_gbps=0)
    docs = [rank_doc(r, sizes=s.sizes, backend="nccl") for r in (0, 1)]
    res = launch(docs, node_logs={0: NCCL_NODE0, 1: ""})
    v = judge(s, res, NCCL_LOCK)
    assert v["passed"]
    # rank 1 appears in node 0's lines only as the peer: its own lines are missing
    assert v["warnings"] == ["no NCCL transport lines (NCCL_DEBUG=INFO) for rank 1"]


# --------------------------------------------------------------------------- NCCL logs

NCCL_NODE0 = """\
node-0:45:45 [0] NCCL INFO Bootstrap : Using eth0:172.18.0.2<0>
node-0:45:45 [0] NCCL INFO NCCL version 2.27.3+cuda12.9
node-0:45:60 [0] NCCL INFO NET/Plugin: Could not find: libnccl-net.so.
node-0:45:60 [0] NCCL INFO NET/IB : No device found.
node-0:45:60 [0] NCCL INFO NET/Socket : Using [0]eth0:172.18.0.2<0>
node-0:45:60 [0] NCCL INFO Using network Socket
node-0:45:60 [0] NCCL INFO ncclCommInitRank comm 0x5581c8a0 rank 0 nranks 2 cudaDev 0 nvmlDev 0 busId 1b000 commId 0x8d7e - Init START
node-0:45:60 [0] NCCL INFO comm 0x5581c8a0 rank 0 nRanks 2 nNodes 2 localRanks 1 localRank 0 MNNVL 0
node-0:45:60 [0] NCCL INFO Channel 00/02 :    0   1
node-0:45:60 [0] NCCL INFO Channel 00/0 : 1[0] -> 0[0] [receive] via NET/Socket/0
node-0:45:60 [0] NCCL INFO Channel 01/0 : 1[0] -> 0[0] [receive] via NET/Socket/0
node-0:45:60 [0] NCCL INFO Channel 00/0 : 0[0] -> 1[0] [send] via NET/Socket/0
"""

NCCL_NODE1_IB = """\
[rank1]:node-1:46:61 [0] NCCL INFO NET/IB : Using [0]mlx5_0:1/IB [1]mlx5_1:1/RoCE ; OOB eth0:172.18.0.3<0>
node-1:46:61 [0] NCCL INFO Using network IB
node-1:46:61 [0] NCCL INFO NCCL version 2.27.3+cuda12.9
node-1:46:61 [0] NCCL INFO ncclCommInitRank comm 0x55aa rank 1 nranks 4 cudaDev 0 nvmlDev 2 busId 2a000 commId 0x1 - Init START
node-1:46:61 [0] NCCL INFO Channel 00/0 : 0[0] -> 1[0] [receive] via NET/IB/0/GDRDMA
node-1:46:61 [0] NCCL INFO Channel 00/0 : 1[0] -> 2[1] via P2P/CUMEM/read
node-1:47:62 [1] NCCL INFO Channel 00 : 2[1] -> 3[2] via SHM/direct/direct
node-1:47:62 [1] NCCL INFO Channel 01/0 : 2[1] -> 1[0] via P2P/IPC
node-1:48:63 [2] NCCL INFO Channel 00/0 : 3[2] -> 0[0] [send] via NET/IB/0
node-1:48:63 [2] NCCL INFO Channel 01/0 : 3[2] -> 2[1] via P2P/direct pointer/read
some unrelated line
"""


def test_nccl_socket_transports():
    parsed = nccl_log.parse(NCCL_NODE0)
    assert parsed.transports == {0: ["NET/Socket"]}
    assert parsed.networks == {0: "Socket"}
    assert parsed.versions == {0: "2.27.3+cuda12.9"}


def test_nccl_mixed_transports_over_nodes():
    parsed = nccl_log.parse([NCCL_NODE0, NCCL_NODE1_IB])
    assert parsed.transports == {
        0: ["NET/Socket"],
        1: ["NET/IB", "P2P/CUMEM"],
        2: ["P2P/IPC", "SHM"],
        3: ["NET/IB", "P2P/direct"],
    }
    assert parsed.networks == {0: "Socket", 1: "IB"}  # ranks 2, 3 never said which rank they are
    assert parsed.ib_devices == {1: ["mlx5_0:1", "mlx5_1:1"]}
    assert nccl_log.transports_by_rank(NCCL_NODE1_IB)[2] == ["P2P/IPC", "SHM"]


@pytest.mark.parametrize("via,want", [
    ("NET/Socket/0", "NET/Socket"), ("NET/IB/0/GDRDMA", "NET/IB"), ("P2P/CUMEM/read", "P2P/CUMEM"),
    ("P2P/NVLink", "P2P/NVLink"), ("P2P", "P2P"), ("SHM/direct/direct", "SHM"),
    ("P2P/direct pointer", "P2P/direct"), ("NVLS", "NVLS"), ("NET/AWS Libfabric/0", "NET/AWS"),
])
def test_normalize_transport(via, want):
    assert nccl_log.normalize_transport(via) == want


def test_nccl_plugin_line_is_fallback_for_network():
    text = ("h:1:1 [0] NCCL INFO NET/IB : Using [0]mlx5_0:1/IB ; OOB eth0:1.2.3.4<0>\n"
            "h:1:1 [0] NCCL INFO comm 0x1 rank 5 nRanks 8 nNodes 2 localRanks 4 localRank 1\n")
    parsed = nccl_log.parse(text)
    assert parsed.networks == {5: "IB"} and parsed.transports == {}


# --------------------------------------------------------------------------- certificate


def _cert_model(results=None, s=None, **launch_kw):
    s = s or settings()
    res = launch([rank_doc(0), rank_doc(1)] if results is None else results, **launch_kw)
    v = verdict.judge(s, res, typed(CPU_LOCK))
    labels = {
        "envbuild.recipe": "cpu-torch2",
        "envbuild.lock-hash": "sha256:a0d76dd47f233ebba933a62d27f20c99af5f57613d4a8877dfaf3df561831414",
        "envbuild.lock": json.dumps(CPU_LOCK),
        "envbuild.backend": "gloo",
        "envbuild.base.used": "debian:bookworm-slim@sha256:abc",
        "org.opencontainers.image.title": "envbuild/cpu-torch2",
        "maintainer": "someone",
    }
    image = source.ImageFacts("envbuild/cpu-torch2:a0d76dd47f23", labels, typed(CPU_LOCK), image_id="sha256:" + "1" * 64)
    return certificate.build_certificate(
        image=image, settings=s, launch=res, verdict=v,
        run_id="0123456789ab", host={"hostname": "h", "docker_server_version": "20.10.24"},
    )


def _cert(results=None, s=None, **launch_kw):
    """The certificate as plain data (as written)."""
    return _cert_model(results, s, **launch_kw).to_dict()


def test_certificate_shape():
    cert = _cert()
    assert cert["schema"] == "envbuild.certificate/2"
    assert cert["recipe"] == "cpu-torch2"
    assert cert["lock_hash"].startswith("sha256:a0d76dd47f23")
    assert cert["lock"] == CPU_LOCK
    assert cert["base_used"] == "debian:bookworm-slim@sha256:abc"
    assert cert["backend"] == {"used": "gloo", "recipe": "gloo"}
    assert (cert["world_size"], cert["nodes"], cert["gpus_per_node"]) == (2, 2, 0)
    assert set(cert["image"]["labels"]) == {"envbuild.recipe", "envbuild.lock-hash", "envbuild.backend",
                                            "envbuild.base.used", "org.opencontainers.image.title"}
    assert cert["image"]["id"].startswith("sha256:")
    assert "allreduce" not in cert and "ddp" not in cert and "thresholds" not in cert
    assert [r["size_bytes"] for r in cert["collectives"]["all_reduce"]] == [8, 1024, 65536]
    row = cert["collectives"]["all_reduce"][0]
    assert row["wrong"] == 0 and row["wrong_ranks"] == [] and row["wrong_rank_count"] == 0
    assert (row["min_time_us"], row["median_time_us"], row["time_us"], row["slowest_rank"]) == (100.0, 100.5, 101.0, 1)
    assert row["own_time_us"] is None and row["rank_time_us"] is None  # a certificate holds no rank's own
    assert cert["training"]["ddp"]["reference_match"] is True
    assert cert["settings"]["ddp_batch"] == 8 and cert["settings"]["iters"] == 10
    assert cert["probe"]["0"]["schema"] == "envbuild.probe/1" and set(cert["probe"]) == {"0", "1"}
    assert cert["transports"] is None and cert["nccl"] is None
    assert cert["verdict"]["passed"] is True
    assert cert["settings"]["min_busbw_gbps"] is None
    assert cert["host"]["docker_server_version"] == "20.10.24"
    assert cert["started_at"] == "2026-05-12T10:00:00Z"
    json.dumps(cert)  # plain JSON


def test_certificate_per_rank_wrong_from_each_rank():
    cert = _cert(results=[rank_doc(0), rank_doc(1, wrong=3)])
    row = cert["collectives"]["all_reduce"][0]
    assert (row["wrong_ranks"], row["wrong_rank_count"], row["wrong"]) == ([1], 1, 3)
    assert "collective all_reduce wrong at 8 B float32 (3 wrong elements on rank 1)" in cert["verdict"]["failures"][0]
    assert not cert["verdict"]["passed"]
    assert "log_tail" in cert["node_status"]["0"]


def test_a_certificate_names_at_most_64_wrong_ranks_and_counts_the_rest():
    """Each rank reports its own wrong count; the host names the first 64 ranks and the count."""
    world = 100
    s = settings(nodes=world)
    docs = [rank_doc(r, world, wrong=1 if r % 2 else 0, times=[100.0] * world) for r in range(world)]
    cert = _cert(results=docs, s=s, world=world)
    row = cert["collectives"]["all_reduce"][0]
    assert (row["wrong_ranks"], row["wrong_rank_count"], row["wrong"]) == (list(range(1, 100, 2)), 50, 50)
    docs = [rank_doc(r, world, wrong=2, times=[100.0] * world) for r in range(world)]
    cert = _cert(results=docs, s=s, world=world)
    row = cert["collectives"]["all_reduce"][0]
    assert (row["wrong_ranks"], row["wrong_rank_count"], row["wrong"]) == (list(range(64)), 100, 200)
    assert ("collective all_reduce wrong at 8 B float32 (200 wrong elements on ranks "
            + ",".join(map(str, range(64))) + " and 36 more)") in cert["verdict"]["failures"][0]


def test_certificate_with_nccl_transports():
    s = settings(NCCL_LOCK, gpu_visible=True)
    res_docs = [rank_doc(r, sizes=s.sizes, backend="nccl") for r in (0, 1)]
    cert = _cert(results=res_docs, s=s, node_logs={0: NCCL_NODE0, 1: ""})
    assert cert["transports"] == {"0": ["NET/Socket"], "1": None}
    assert cert["nccl"]["networks"] == {"0": "Socket"}


def test_certificate_for_missing_rank():
    cert = _cert(results=[rank_doc(0)], rank_exit_codes={1: 3}, node_exit_codes={0: 1, 1: 1})
    assert cert["ranks"]["1"] == {"node": 1, "reported": False, "exit_code": 3}
    assert cert["verdict"]["failures"][0] == "rank 1 exited with 3"


def test_write_certificate(tmp_path):
    model = _cert_model()
    cert = model.to_dict()
    p1 = certificate.write_certificate(model, tmp_path)
    assert p1 == (tmp_path / "cpu-torch2" / "certificates"
                  / "cpu-torch2-a0d76dd47f23-20260512T100009Z-0123456789ab.json")
    assert json.loads(p1.read_text()) == cert
    p2 = certificate.write_certificate(model, tmp_path)
    assert p2.name == "cpu-torch2-a0d76dd47f23-20260512T100009Z-0123456789ab-2.json"
    assert sorted(x.name for x in p1.parent.iterdir()) == sorted([p1.name, p2.name])  # no temp files
    assert json.loads(p1.read_text()) == cert  # the first was not overwritten


def _write_many(images_dir, run_ids, barrier_n):
    """Processes writing at the same instant (a barrier), each one certificate; the names
    of the files they wrote."""
    import multiprocessing

    ctx = multiprocessing.get_context("fork")
    barrier, out = ctx.Barrier(barrier_n), ctx.Queue()

    def write(run_id):
        cert = msgspec.structs.replace(_cert_model(), run_id=run_id)
        barrier.wait(timeout=60)
        out.put(certificate.write_certificate(cert, images_dir).name)

    procs = [ctx.Process(target=write, args=(r,)) for r in run_ids]
    for p in procs:
        p.start()
    names = [out.get(timeout=60) for _ in procs]
    for p in procs:
        p.join(timeout=60)
        assert p.exitcode == 0
    return names


@pytest.mark.parametrize("same_run", [True, False], ids=["same-run-id", "own-run-ids"])
def test_forty_simultaneous_certificates_are_forty_files(tmp_path, same_run):
    """40 writers in the same second (the same stamp): 40 files, none overwritten, no
    temporary file left; with one run id, the names are made unique by -2, -3..."""
    run_ids = [RUN_ID] * 40 if same_run else [f"{i:012x}" for i in range(40)]
    names = _write_many(tmp_path, run_ids, 40)
    folder = tmp_path / "cpu-torch2" / "certificates"
    files = sorted(p.name for p in folder.iterdir())
    assert len(set(names)) == 40 and sorted(names) == files
    stem = "cpu-torch2-a0d76dd47f23-20260512T100009Z-"
    if same_run:
        assert set(files) == {f"{stem}{RUN_ID}.json"} | {f"{stem}{RUN_ID}-{n}.json" for n in range(2, 41)}
    else:
        assert set(files) == {f"{stem}{r}.json" for r in run_ids}
    assert sorted(json.loads((folder / f).read_text())["run_id"] for f in files) == sorted(run_ids)


def test_certificate_name_parts_are_sanitized(tmp_path):
    cert = msgspec.structs.replace(_cert_model(), recipe="../x y", run_id="a/b\n")
    assert certificate.certificate_path(tmp_path, cert) == (
        tmp_path / "_x_y" / "certificates" / "_x_y-a0d76dd47f23-20260512T100009Z-a_b_.json")


def test_print_table():
    buf = io.StringIO()
    con = Console(file=buf, width=140, color_system=None)
    cert = _cert_model(results=[rank_doc(0), rank_doc(1, wrong=1)])
    table.print_table(cert, con)
    text = buf.getvalue()
    for col in ("size (B)", "count", "type", "min (us)", "median (us)", "time (us)", "slowest", "rank 1",
                "algbw (GB/s)", "busbw (GB/s)", "#wrong",
                "verdict: FAILED (exit 2)", "collective all_reduce wrong at 8 B float32"):
        assert col in text, col
    # the header names the sizes the checks use (the lock's: 8 images of 64 px)
    assert "collectives 10 iters (+2 warmup) per size; DDP check and scaling 8 images of 64 px per rank, 3 steps" \
        in " ".join(text.split())


def test_the_table_head_escapes_a_hostile_certificate():
    """A certificate read from a file (report, gate) or a registry (pull) is input: its strings
    reach the terminal escaped, one line."""
    buf = io.StringIO()
    cert = msgspec.structs.replace(_cert_model(results=[rank_doc(0), rank_doc(1)]),
                                   recipe="cpu-torch2\nverdict: PASSED\x1b[2J", lock_hash="sha256:\x1b]0;t\x07")
    table.print_table(cert, Console(file=buf, width=400, color_system=None))
    head = buf.getvalue().splitlines()[0]
    text = buf.getvalue()
    assert "\x1b" not in text
    assert [line for line in text.splitlines() if line.startswith("verdict:")] == ["verdict: PASSED"]  # the real one
    assert r"recipe cpu-torch2\x0averdict: PASSED\x1b[2J, lock \x1b]0;t\x07, backend gloo" in head, head


def test_the_table_head_of_a_plain_certificate_twin():
    buf = io.StringIO()
    table.print_table(_cert_model(results=[rank_doc(0), rank_doc(1)]), Console(file=buf, width=400, color_system=None))
    assert ": recipe cpu-torch2, lock " in buf.getvalue().splitlines()[0]


NODE0_LOG = """\
[rank0]: Traceback (most recent call last):
[rank0]:   File "/opt/envbuild/bench/allreduce.py", line 88, in busbw
[rank0]:     return int(size / t)
[rank0]: OverflowError: cannot convert float infinity to integer
E1129 15:51:48.123000 8 torch/distributed/elastic/multiprocessing/api.py:869] failed (exitcode: 1) local_rank: 0
Traceback (most recent call last):
  File "/opt/venv/bin/torchrun", line 8, in <module>
    sys.exit(main())
torch.distributed.elastic.multiprocessing.errors.ChildFailedError:
============================================================
bench FAILED
============================================================
"""
NODE1_LOG = "".join(f"gloo: step {i}\n" for i in range(1, 8)) + "\n"


def _verdict_lines(cert, path=None):
    con = Console(record=True, width=120, file=io.StringIO())
    table.print_table(cert, con, path)
    lines = con.export_text().splitlines()
    return lines[next(i for i, ln in enumerate(lines) if ln.startswith("verdict:")):]


def test_failing_verdict_shows_each_failing_node_log():
    cert = _cert_model(results=[], rank_exit_codes={0: 1}, node_exit_codes={0: 1, 1: None}, killed_after_s=0.0,
                       node_logs={0: NODE0_LOG, 1: NODE1_LOG})
    assert _verdict_lines(cert, "images/c.json") == [
        "verdict: FAILED (exit 2)",
        "  fail: rank 0 exited with 1",
        "  fail: rank 1 did not finish: killed 0 s after another node failed",
        "  next: look at the job that ran (an application fault); the GPU stays usable [workload]",
        "  node 0 log: [rank0]: OverflowError: cannot convert float infinity to integer",
        "  (full tail: node_status.0.log_tail in the certificate images/c.json)",
        "  node 1 log (last 5 lines):",
        "    gloo: step 3",
        "    gloo: step 4",
        "    gloo: step 5",
        "    gloo: step 6",
        "    gloo: step 7",
        "  (full tail: node_status.1.log_tail in the certificate images/c.json)",
    ]


def test_failing_verdict_without_failing_nodes_shows_no_log():
    # both nodes exited 0 and reported: the failure line is the whole story
    cert = _cert_model(results=[rank_doc(0), rank_doc(1, wrong=1)], node_logs={0: NODE0_LOG, 1: NODE1_LOG})
    assert _verdict_lines(cert) == [
        "verdict: FAILED (exit 2)",
        "  fail: collective all_reduce wrong at 8 B float32 (1 wrong element on rank 1), 1024 B float32 (1 "
        "wrong element on rank 1), 65536 B float32 (1 wrong element on rank 1)",
        "  next: look at the job that ran (an application fault); the GPU stays usable [workload]",
    ]


# --------------------------------------------------------------------------- lock label vs its hash


def test_lock_label_matching_its_hash_is_read():
    assert source.lock_from_labels(_labels(CPU_LOCK), "img:1").to_dict() == CPU_LOCK


def test_edited_lock_label_is_refused():
    edited = copy.deepcopy(CPU_LOCK)
    edited["certify"]["nodes"] = "lots"
    labels = {**_labels(CPU_LOCK), "envbuild.lock": json.dumps(edited)}  # rebuilt FROM it, lock label edited
    with pytest.raises(EnvbuildError) as e:
        source.lock_from_labels(labels, "img:1")
    assert e.value.exit_code == ExitCode.CHECK_FAILED
    assert str(e.value) == (
        "image: 'img:1' label envbuild.lock was changed after the build: it hashes to "
        "sha256:259edb4fd81727188b214669ae12ab175821efc05bc5083fcadb0b77accdd852, label envbuild.lock-hash says "
        "sha256:79fd2df3e37826b8a88aef4adeff8b804fcbe7785a6c39faa3c909736ba82b37; rebuild the image with "
        "`envbuild build RECIPE`")


def test_lock_label_that_is_not_json_is_one_line():
    labels = {**_labels(CPU_LOCK), "envbuild.lock": "{not json"}
    with pytest.raises(EnvbuildError) as e:
        source.lock_from_labels(labels, "img:1")
    assert e.value.exit_code == ExitCode.CHECK_FAILED
    assert str(e.value) == ("image: 'img:1' label envbuild.lock is not a JSON object (Expecting property name "
                            "enclosed in double quotes: line 1 column 2 (char 1))")


# --------------------------------------------------------------------------- certify() with fakes


class FakeClient(engine.Engine):
    """An engine that answers image inspects only (the launcher is FakeLauncher)."""

    def __init__(self, labels, env=("PATH=/usr/bin",)):
        super().__init__(env={"DOCKER_HOST": "tcp://127.0.0.1:9"})
        self._labels, self._env = labels, list(env)

    def inspect_image(self, ref):
        if self._labels is None:
            return None
        return engine.Image.of({"Id": "sha256:" + "2" * 64, "RepoDigests": [],
                                "Config": {"Env": self._env, "Labels": self._labels}})

    def info(self):
        return {"Runtimes": {"runc": {}}}

    def version(self):
        return {"Version": "20.10.24"}


class FakeLauncher:
    def __init__(self, docs, **kw):
        self.docs, self.kw, self.specs = docs, kw, []

    def run(self, spec, on_progress=None):
        self.specs.append(spec)
        if on_progress:
            on_progress("running")
        return launch(self.docs, **self.kw)


def _labels(lock):
    return {"envbuild.lock": json.dumps(lock), "envbuild.lock-hash": lock_hash(lock),
            "envbuild.recipe": lock["recipe"], "envbuild.backend": lock["certify"]["backend"]}


def test_certify_with_fake_launcher(tmp_path):
    fl = FakeLauncher([rank_doc(0, run_id="r1"), rank_doc(1, run_id="r1")])
    buf = io.StringIO()
    cert, path = certify_image(
        FakeClient(_labels(CPU_LOCK)), "img:1", images_dir=tmp_path, launcher=fl, run_id="r1",
        console=Console(file=buf), extra_env={"ENVBUILD_BENCH_FAULT": "exit@1"}, labels={"a": "b"},
    )
    assert cert["verdict"]["passed"] and path.exists()
    (spec,) = fl.specs
    assert spec.env == {"ENVBUILD_BENCH_FAULT": "exit@1"} and spec.labels == {"a": "b"}
    assert spec.run_id == "r1" and spec.world_size == 2 and spec.timeout_s == 60
    assert "run r1" in buf.getvalue()
    assert path.parent == tmp_path / "cpu-torch2" / "certificates"
    assert spec.socket_ifname is None
    assert cert["socket"] == {"source": "default", "override": None, "GLOO_SOCKET_IFNAME": None,
                              "NCCL_SOCKET_IFNAME": None, "seen_by_ranks": {}}


def test_certify_refuses_a_result_of_another_run(tmp_path):
    """A planted or stale result (another run id) is refused and named, whatever launcher
    read it; the twin (this run's) passed above."""
    fl = FakeLauncher([rank_doc(0, run_id="r1"), rank_doc(1, run_id="0ld0ld0ld0ld")])
    cert, _ = certify_image(FakeClient(_labels(CPU_LOCK)), "img:1", images_dir=tmp_path, launcher=fl,
                              run_id="r1")
    assert cert["verdict"]["failures"] == [
        "rank 1: result of rank 1 is from run '0ld0ld0ld0ld', not this run r1: refused (stale or planted)"]
    assert cert["verdict"]["exit_code"] == 3 and cert["ranks"]["1"]["reported"] is False


def test_certify_records_the_image_socket_setting_and_the_override(tmp_path):
    env = ("PATH=/usr/bin", "GLOO_SOCKET_IFNAME=lo")
    fl = FakeLauncher([rank_doc(0, run_id="r1"), rank_doc(1, run_id="r1")])
    cert, _ = certify_image(FakeClient(_labels(CPU_LOCK), env), "img:1", images_dir=tmp_path, launcher=fl,
                              run_id="r1")
    assert cert["socket"]["source"] == "image" and cert["socket"]["GLOO_SOCKET_IFNAME"] == "lo"
    cert, _ = certify_image(FakeClient(_labels(CPU_LOCK), env), "img:1", images_dir=tmp_path, launcher=fl,
                              run_id="r1", socket_ifname="eth0")
    assert fl.specs[-1].socket_ifname == "eth0"
    assert {k: cert["socket"][k] for k in ("source", "override", "GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME")} == {
        "source": "--socket-ifname", "override": "eth0", "GLOO_SOCKET_IFNAME": "eth0", "NCCL_SOCKET_IFNAME": "eth0"}


@pytest.mark.parametrize("bad", ["eth0\n", "eth0;rm", "", "a" * 16, "eth0,", "^", "eth 0", "eth0\x1b[31m", "^^lo"])
def test_bad_socket_ifname_is_a_usage_error(tmp_path, bad):
    with pytest.raises(EnvbuildError) as e:
        base.check_socket_ifname(bad)
    assert e.value.exit_code == ExitCode.USAGE and "\n" not in str(e.value)
    fl = FakeLauncher([])
    with pytest.raises(EnvbuildError):
        certify_image(FakeClient(_labels(CPU_LOCK)), "img:1", images_dir=tmp_path, launcher=fl, socket_ifname=bad)
    assert fl.specs == []


@pytest.mark.parametrize("good", ["eth0", "^lo,docker", "=ib0", "^=lo", "eth0:1", "enp1s0f0np0"])
def test_good_socket_ifname(good):
    assert base.check_socket_ifname(good) == good


def test_certify_refuses_nccl_before_launching(tmp_path):
    fl = FakeLauncher([])
    with pytest.raises(EnvbuildError) as e:
        certify_image(FakeClient(_labels(NCCL_LOCK)), "img:1", images_dir=tmp_path, launcher=fl)
    assert e.value.exit_code == 2 and "needs GPUs" in str(e.value)
    assert fl.specs == [] and not any(tmp_path.iterdir())


def test_certify_refuses_image_with_half_the_envbuild_labels(tmp_path):
    # no label at all is a foreign image (tests/test_certify_profiles.py); one of the two is refused
    with pytest.raises(EnvbuildError) as e:
        certify_image(FakeClient({"envbuild.lock-hash": "sha256:" + "0" * 64}), "img:1", images_dir=tmp_path,
                      launcher=FakeLauncher([]))
    assert e.value.exit_code == 2 and "was not built by envbuild (no envbuild.lock label)" in str(e.value)
    with pytest.raises(EnvbuildError, match="no such image"):
        certify_image(FakeClient(None), "img:1", images_dir=tmp_path, launcher=FakeLauncher([]))


# --------------------------------------------------------------------------- launcher helpers


def _spec(**kw):
    base = dict(image="img:1", nodes=2, gpus_per_node=0, backend="gloo", port=29511,
                shm_size="256m", timeout_s=60, bench_args=["--iters", "3"], env={"X": "1"},
                run_id="abc123def456", labels={"envbuild.test-session": "s"})
    base.update(kw)
    return LaunchSpec(**base)


@pytest.mark.parametrize("argv", [["../etc", "5"], ["abc123def456", "nan"], ["abc123def456", "-1"],
                                  ["abc123def456", "1e9"], ["abc123def456"], ["abc123def456\n", "5"]])
def test_reaper_refuses_bad_arguments_before_waiting(argv, capsys):
    from builder.launchers import reaper

    assert reaper.main(argv) == 64
    assert capsys.readouterr().err == "usage: python -m builder.launchers.reaper RUN_ID SECONDS\n"


def test_container_kwargs_cpu(tmp_path):
    spec = _spec()
    kw = local.container_kwargs(spec, 1, network="net", labels=base.labels_for(spec, {}), code_dir=tmp_path / "agent")
    assert kw["command"] == ["python3", "-m", "bench.node", "--deadline-s", "70", "--",
                             "python3", "-m", "torch.distributed.run", "--nnodes", "2", "--nproc-per-node", "1",
                             "--node-rank", "1", "--master-addr", "node-0", "--master-port", "29511",
                             "--max-restarts", "0", "-m", "bench", "--out", "/results", "--iters", "3",
                             "--result-to-stdout"]
    assert kw["name"] == "envbuild-abc123def456-node-1" and kw["hostname"] == "node-1"
    assert kw["user"] == "12345:12345" and kw["read_only"] is True and kw["auto_remove"] is True
    assert kw["tmpfs"] == {"/tmp": "rw,exec,mode=1777", "/tmp/home": "rw,mode=1777", "/results": "rw,mode=1777"}
    env = kw["environment"]
    assert env["HOME"] == "/tmp/home" and env["PYTHONPATH"] == "/opt/envbuild" and env["X"] == "1"
    # the image's own socket settings are certified: nothing forces an interface
    assert "GLOO_SOCKET_IFNAME" not in env and "NCCL_SOCKET_IFNAME" not in env
    assert "NCCL_DEBUG" not in env and kw["gpus"] == [] and kw["aliases"] == ["node-1"]
    assert kw["labels"]["envbuild"] == "1" and kw["labels"]["envbuild.run"] == "abc123def456"
    assert kw["labels"]["envbuild.test-session"] == "s"
    # nothing on the host is writable by the nodes: the code only (the one payload), read-only
    mounts = {src: (v["bind"], v["mode"]) for src, v in kw["volumes"].items()}
    assert mounts == {str(tmp_path / "agent"): ("/opt/envbuild", "ro")}
    assert kw["shm_size"] == "256m"


@pytest.mark.parametrize("ifname,gloo,nccl", [("eth0", "eth0", "eth0"), ("=ib0,ib1", "ib0,ib1", "=ib0,ib1"),
                                              ("^lo,docker", "", "^lo,docker")])
def test_socket_ifname_override_sets_both(tmp_path, ifname, gloo, nccl):
    env = base.node_env(_spec(socket_ifname=ifname), 0)
    assert (env["GLOO_SOCKET_IFNAME"], env["NCCL_SOCKET_IFNAME"]) == (gloo, nccl)


def test_container_kwargs_gpus(tmp_path):
    spec = _spec(gpus_per_node=2, backend="nccl")
    kw = local.container_kwargs(spec, 1, network="net", labels={}, code_dir=tmp_path)
    assert kw["gpus"] == ["2", "3"]
    assert kw["environment"]["NCCL_DEBUG"] == "INFO"
    assert "--nproc-per-node" in kw["command"] and kw["command"][kw["command"].index("--nproc-per-node") + 1] == "2"
    assert spec.world_size == 4 and spec.ranks_of_node(1) == [2, 3]


def test_extra_labels_env():
    assert base.parse_extra_labels(None) == {}
    assert base.parse_extra_labels(" a=1, envbuild.test-session=xyz ,c=") == {
        "a": "1", "envbuild.test-session": "xyz", "c": ""}
    with pytest.raises(EnvbuildError):
        base.parse_extra_labels("novalue")
    spec = _spec(labels={"envbuild.run": "spoof"})
    labels = base.labels_for(spec, {base.EXTRA_LABELS_ENV: "k=v"})
    assert labels == {"k": "v", "envbuild": "1", "envbuild.run": "abc123def456"}


TORCHRUN_FAILURE = """\
torch.distributed.elastic.multiprocessing.errors.ChildFailedError:
============================================================
bench FAILED
------------------------------------------------------------
Failures:
[1]:
  time      : 2026-11-29_15:51:48
  host      : node-1
  rank      : 3 (local_rank: 1)
  exitcode  : -9 (pid: 9)
  error_file: <N/A>
  traceback : Signal 9 (SIGKILL) received by PID 9
------------------------------------------------------------
Root Cause (first observed failure):
[0]:
  time      : 2026-11-29_15:51:48
  host      : node-1
  rank      : 2 (local_rank: 0)
  exitcode  : 3 (pid: 8)
  error_file: <N/A>
  traceback : To enable traceback see: https://pytorch.org/docs/stable/elastic/errors.html
============================================================
"""


def test_parse_torchrun_failures():
    assert output.parse_torchrun_failures(TORCHRUN_FAILURE) == {3: -9, 2: 3}
    assert output.parse_torchrun_failures("all fine\n") == {}


def test_names():
    assert local.network_name("r") == "envbuild-r"
    assert re.fullmatch(r"envbuild-r-node-3", local.node_name("r", 3))


# --------------------------------------------------------------------------- hung ranks, signals


def _state(phase, detail=None, collective=True, seq=2, silent=0.5, in_phase=25.0, state="S"):
    return {"phase": phase, "detail": detail, "collective": collective, "seq": seq, "state": state,
            "silent_s": silent, "in_phase_s": in_phase}


def _timed_out(progress, world=2, **kw):
    return launch([], world=world, timed_out=True, node_exit_codes={n: None for n in range(world)},
                  progress=progress, **kw)


def test_paused_rank_is_named_apart_from_the_rank_waiting_for_it():
    res = _timed_out({0: _state("all-reduce", "1024 B", seq=3),
                      1: _state("all-reduce", "8 B", seq=2, silent=24.6, state="S")})
    v = judge(settings(), res, CPU_LOCK)
    assert v["failures"] == [
        "rank 1 did not finish within 60 s (timeout): hung: no heartbeat for 24.6 s (frozen or gone); "
        "last in all-reduce 8 B",
        "rank 0 did not finish within 60 s (timeout): blocked in all-reduce 1024 B, waiting for rank 1",
    ]
    assert v["exit_code"] == 3


def test_stopped_rank_is_named_by_its_process_state():
    res = _timed_out({0: _state("ddp", "step 1"), 1: _state("ddp", "step 1", state="T", silent=1.0)})
    assert judge(settings(), res, CPU_LOCK)["failures"] == [
        "rank 1 did not finish within 60 s (timeout): hung: stopped by a signal (process state T) in ddp step 1",
        "rank 0 did not finish within 60 s (timeout): blocked in ddp step 1, waiting for rank 1",
    ]


def test_rank_alive_outside_a_collective_is_the_hung_one():
    res = _timed_out({0: _state("all-reduce", "8 B"), 1: _state("test fault", "sleep 3600 s", collective=False)})
    assert judge(settings(), res, CPU_LOCK)["failures"] == [
        "rank 1 did not finish within 60 s (timeout): hung: stopped making progress in test fault sleep 3600 s "
        "for 25 s (alive, outside any collective)",
        "rank 0 did not finish within 60 s (timeout): blocked in all-reduce 8 B, waiting for rank 1",
    ]


def test_rank_behind_the_others_is_the_hung_one():
    res = _timed_out({0: _state("all-reduce", "8 B", seq=2), 1: _state("all-reduce", "1024 B", seq=3),
                      2: _state("all-reduce", "1024 B", seq=3)}, world=3)
    assert judge(settings(nodes=3), res, CPU_LOCK)["failures"] == [
        "rank 0 did not finish within 60 s (timeout): hung: stopped making progress in all-reduce 8 B for 25 s; "
        "ranks 1, 2 got further",
        "rank 1 did not finish within 60 s (timeout): blocked in all-reduce 1024 B, waiting for rank 0",
        "rank 2 did not finish within 60 s (timeout): blocked in all-reduce 1024 B, waiting for rank 0",
    ]


def test_no_rank_singled_out_when_all_wait_in_the_same_phase():
    res = _timed_out({0: _state("init", "process group (gloo)", seq=1),
                      1: _state("init", "process group (gloo)", seq=1)})
    assert judge(settings(), res, CPU_LOCK)["failures"] == [
        "rank 0 did not finish within 60 s (timeout): blocked in init process group (gloo) for 25 s "
        "(no rank got further)",
        "rank 1 did not finish within 60 s (timeout): blocked in init process group (gloo) for 25 s "
        "(no rank got further)",
    ]


def test_rank_that_never_reported_progress_is_hung():
    res = _timed_out({0: _state("init", "process group (gloo)", seq=1)})
    assert judge(settings(), res, CPU_LOCK)["failures"] == [
        "rank 1 did not finish within 60 s (timeout): hung: never reported progress",
        "rank 0 did not finish within 60 s (timeout): blocked in init process group (gloo), waiting for rank 1",
    ]


@pytest.mark.parametrize("code,text", [(-9, "killed by SIGKILL (exit 137)"), (137, "killed by SIGKILL (exit 137)"),
                                       (-15, "killed by SIGTERM (exit 143)"), (139, "killed by SIGSEGV (exit 139)"),
                                       (124, "ended by its watchdog at the deadline (exit 124)"),
                                       (3, "exited with 3"), (1, "exited with 1")])
def test_signal_text(code, text):
    assert verdict.signal_text(code) == text


def test_node_killed_by_a_signal_is_named():
    res = launch([rank_doc(0)], node_exit_codes={0: 0, 1: 137})
    assert judge(settings(), res, CPU_LOCK)["failures"] == [
        "rank 1 wrote no result: node 1 killed by SIGKILL (exit 137)"]


def test_foreign_text_stays_one_line():
    res = launch([rank_doc(0)], rank_problems={1: "bad\nsecond line \x1b[31m"}, notes=["job\nended"])
    v = judge(settings(), res, CPU_LOCK)
    assert v["failures"] == ["job ended", "rank 1: bad second line \\x1b[31m"]


# --------------------------------------------------------------------------- socket settings


def _sock(source="image", gloo=None, nccl=None, override=None):
    return SocketSetting(source=source, override=override, GLOO_SOCKET_IFNAME=gloo, NCCL_SOCKET_IFNAME=nccl)


IFACES = {0: {"eth0": False, "lo": True}, 1: {"eth0": False, "lo": True}}


def test_loopback_only_socket_setting_explains_a_failing_run():
    seen = {r: {"GLOO_SOCKET_IFNAME": "lo", "NCCL_SOCKET_IFNAME": None} for r in (0, 1)}
    res = launch([], rank_exit_codes={0: 1}, node_exit_codes={0: 1, 1: None}, killed_after_s=20.0,
                 socket_seen=seen, interfaces_seen=IFACES)
    v = judge(settings(), res, CPU_LOCK, _sock(gloo="lo"))
    assert v["failures"] == [
        "GLOO_SOCKET_IFNAME=lo (from the image's ENV) selects only the loopback interface on ranks 0, 1: ranks "
        "on 2 nodes cannot reach each other over it; set it to the nodes' network interface (or leave it unset) "
        "in the image, or pass --socket-ifname IF",
        "rank 0 exited with 1",
        "rank 1 did not finish: killed 20 s after another node failed",
    ]
    assert v["exit_code"] == 2 and v["warnings"] == []


def test_network_interface_setting_adds_nothing_and_a_passing_run_stays_passed():
    seen = {r: {"GLOO_SOCKET_IFNAME": "eth0", "NCCL_SOCKET_IFNAME": "eth0"} for r in (0, 1)}
    res = launch([], rank_exit_codes={0: 1}, node_exit_codes={0: 1, 1: 1}, socket_seen=seen, interfaces_seen=IFACES)
    sock = _sock("--socket-ifname", "eth0", "eth0", override="eth0")
    assert judge(settings(), res, CPU_LOCK, sock)["failures"] == ["rank 0 exited with 1",
                                                                         "rank 1 wrote no result: node 1 exited with 1"]
    # loopback on one node only (a single-node run) passes as it ran
    seen1 = {0: {"GLOO_SOCKET_IFNAME": "lo", "NCCL_SOCKET_IFNAME": None}}
    res = launch([rank_doc(0, world=1)], world=1, socket_seen=seen1, interfaces_seen={0: IFACES[0]})
    assert judge(settings(nodes=1), res, CPU_LOCK, _sock(gloo="lo"))["passed"]


def test_nccl_setting_uses_nccl_prefix_syntax():
    s = settings(NCCL_LOCK, gpu_visible=True)
    seen = {r: {"GLOO_SOCKET_IFNAME": None, "NCCL_SOCKET_IFNAME": "^eth"} for r in (0, 1)}
    res = launch([], rank_exit_codes={0: 1, 1: 1}, socket_seen=seen, interfaces_seen=IFACES)
    f = judge(s, res, NCCL_LOCK, _sock(nccl="^eth"))["failures"]
    assert f[0].startswith("NCCL_SOCKET_IFNAME=^eth (from the image's ENV) selects only the loopback interface")


def test_rank_that_saw_another_setting_is_a_warning():
    seen = {0: {"GLOO_SOCKET_IFNAME": "eth1", "NCCL_SOCKET_IFNAME": None},
            1: {"GLOO_SOCKET_IFNAME": "eth0", "NCCL_SOCKET_IFNAME": None}}
    res = launch([rank_doc(0), rank_doc(1)], socket_seen=seen, interfaces_seen=IFACES)
    v = judge(settings(), res, CPU_LOCK, _sock(gloo="eth0"))
    assert v["passed"] and v["warnings"] == ["rank 0 ran with GLOO_SOCKET_IFNAME='eth1', not 'eth0' "
                                             "(from the image's ENV)"]


def test_socket_settings_sources():
    assert certify_settings.socket_settings({"PATH": "/bin"}, None) == _sock("default")
    assert certify_settings.socket_settings({"NCCL_SOCKET_IFNAME": "ib"}, None) == _sock("image", None, "ib")
    assert certify_settings.socket_settings({"NCCL_SOCKET_IFNAME": "ib"}, "^lo").to_dict() == {
        "source": "--socket-ifname", "override": "^lo", "GLOO_SOCKET_IFNAME": "", "NCCL_SOCKET_IFNAME": "^lo", "seen_by_ranks": {}}


# --------------------------------------------------------------------------- progress tracking


class Clock:
    def __init__(self):
        self.t = 100.0

    def __call__(self):
        return self.t


def _line(**doc):
    return "@@envbuild-progress " + json.dumps({"run": RUN_ID, **doc})


def test_progress_tracker_keeps_phase_and_heartbeat_apart():
    from builder.launchers.progress import ProgressTracker

    clock = Clock()
    t = ProgressTracker(2, RUN_ID, clock=clock)
    assert t.feed(_line(rank=0, seq=0, phase="start", socket={"GLOO_SOCKET_IFNAME": "lo"},
                        interfaces={"lo": True, "eth0": 0}))
    assert t.feed(_line(rank=0, beat=1, state="S"))  # a beat in the start phase keeps the socket data
    clock.t = 105.0
    assert t.feed(_line(rank=0, seq=1, phase="init", detail="process group (gloo)", collective=True))
    clock.t = 110.0
    assert t.feed(_line(rank=0, beat=2, state="R"))
    assert not t.feed(_line(rank=2, seq=0, phase="start"))  # no such rank
    assert not t.feed(_line(rank=1, seq=0, phase="start", run="ffffffffffff"))  # another run
    assert not t.feed("@@envbuild-progress {not json")
    assert not t.feed(_line(rank=1, seq="0", phase="start"))  # not an integer
    assert not t.feed("@@envbuild-progress " + json.dumps({"rank": 1, "seq": 0, "phase": "x", "d": [[[[[1]]]]]}))
    clock.t = 130.0
    assert t.snapshot() == {0: {"phase": "init", "detail": "process group (gloo)", "collective": True, "seq": 1,
                                "state": "R", "silent_s": 20.0, "in_phase_s": 25.0}}
    assert t.socket == {0: {"GLOO_SOCKET_IFNAME": "lo", "NCCL_SOCKET_IFNAME": None}}
    assert t.interfaces == {0: {"lo": True, "eth0": False}}


# --------------------------------------------------------------------------- usage errors first


@pytest.fixture
def dead_engine(tmp_path, monkeypatch):
    """DOCKER_HOST at a socket nobody listens on: a command that contacts the engine exits 3."""
    monkeypatch.setenv("DOCKER_HOST", f"unix://{tmp_path}/dead.sock")
    return tmp_path


IMG = "envbuild/cpu-torch2@sha256:" + "0" * 64


@pytest.mark.parametrize("argv", [
    ["certify", IMG, "--socket-ifname", "eth0\n"],
    ["certify", IMG, "--socket-ifname", "eth0;reboot"],
    ["certify", IMG, "--partition", "debug"],
    ["certify", IMG, "--launcher", "slurm", "--partition", "bad;x"],
    ["certify", IMG, "--launcher", "slurm", "--pending-timeout", "-1"],
    ["make", "cpu-torch2", "--partition", "debug"],
    ["make", "cpu-torch2", "--socket-ifname", ""],
    ["k8s", "render", IMG, "--out", "OUT", "--ttl", "-1"],
    ["k8s", "render", IMG, "--out", "OUT", "--socket-ifname", "eth 0"],
    ["k8s", "render", IMG, "--out", "OUT", "--run-id", "UPPER"],
], ids=lambda a: " ".join(a)[:60])
def test_usage_errors_come_before_the_engine(dead_engine, argv, capsys):
    from builder.cli import app as cli

    argv = [a.replace("OUT", str(dead_engine / "out")) for a in argv]
    code = cli.main(["--images-dir", str(dead_engine / "images"), *argv])
    err = capsys.readouterr().err
    assert code == 64, err
    assert len(err.strip().splitlines()) == 1 and "Docker engine" not in err
    assert not (dead_engine / "images").exists() and not (dead_engine / "out").exists()


@pytest.mark.parametrize("argv", [["certify", IMG, "--socket-ifname", "eth0"],
                                  ["certify", IMG, "--launcher", "slurm", "--partition", "debug"],
                                  ["k8s", "render", IMG, "--out", "OUT", "--socket-ifname", "^lo"]])
def test_valid_options_go_on_to_the_engine(dead_engine, argv, capsys):
    """The twins: the same options, valid, reach the engine (which is dead here: exit 3)."""
    from builder.cli import app as cli

    argv = [a.replace("OUT", str(dead_engine / "out")) for a in argv]
    assert cli.main(["--images-dir", str(dead_engine / "images"), *argv]) == 3
    assert "no Docker engine answers at unix://" in capsys.readouterr().err


# --------------------------------------------------------------------------- models and schemas

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _schema_files():
    from scripts import schemas as generator

    for name, data in generator.files().items():
        if name in ("certificate.schema.json", "rank-result.schema.json"):
            yield os.path.join(ROOT, "schemas", name), json.loads(data)


def test_schemas_are_current():
    """schemas/certificate.schema.json and schemas/rank-result.schema.json are what the
    models give (regenerate: `make golden`, scripts/schemas.py)."""
    for path, schema in _schema_files():
        with open(path) as f:
            assert f.read() == json.dumps(schema, indent=2) + "\n", f"{path} is stale"


def _validator(stem):
    import jsonschema

    with open(os.path.join(ROOT, "schemas", f"{stem}.schema.json")) as f:
        return jsonschema.Draft202012Validator(json.load(f))


def test_certificate_validates_against_its_schema_and_reads_back(tmp_path):
    model = _cert_model(results=[rank_doc(0), rank_doc(1, wrong=1)], rank_exit_codes={1: 3})
    path = certificate.write_certificate(model, tmp_path)
    doc = json.loads(path.read_text())
    assert list(_validator("certificate").iter_errors(doc)) == []
    assert load_certificate(doc, str(path)) == model  # the file reads back as the same model
    # the fault twins: an unknown key, a value out of its bounds
    for bad in ({**doc, "extra": 1}, {**doc, "verdict": {**doc["verdict"], "exit_code": 256}}):
        assert list(_validator("certificate").iter_errors(bad)) != []
        with pytest.raises(ManyErrors):
            load_certificate(bad, "c.json")


def test_rank_result_schema_and_model_agree():
    good = rank_doc(0)
    assert list(_validator("rank-result").iter_errors(good)) == [] and convert(good, RankResult).rank == 0
    rows = good["profiles"]["collectives"]["all_reduce"]
    bad = {**good, "profiles": {**good["profiles"], "collectives": {"all_reduce": [{**rows[0], "wrong": -1}]}}}
    assert list(_validator("rank-result").iter_errors(bad)) != []
    result, why = output.check_result(bad, 0, "result", run_id=RUN_ID, world_size=2)
    assert result is None and why.startswith("result of rank 0 is not a valid envbuild.rank-result/3: "
                                             "profiles.collectives.all_reduce: ")
    assert why.endswith("Expected `int` >= 0")
    assert output.check_result(good, 0, "result", run_id=RUN_ID, world_size=2)[1] is None



# --------------------------------------------------------------------------- image labels, local capacity
_GOOD_LABELS = {"envbuild.recipe": "cpu-torch2", "envbuild.lock-hash": "sha256:" + "a" * 64,
                "org.opencontainers.image.title": "envbuild/cpu-torch2", "com.example.other": "x\ny"}


@pytest.mark.parametrize("change, lock, expected", [
    ({"envbuild.recipe": "cpu-torch2\nverdict: PASSED\x1b[2J"}, "cpu-torch2",
     r"label envbuild.recipe='cpu-torch2\nverdict: PASSED\x1b[2J' is not one line of at most 4096 printable characters"),
    ({"envbuild.recipe": "cuda12-torch2"}, "cpu-torch2",
     "label envbuild.recipe='cuda12-torch2' is not its lock's recipe 'cpu-torch2'; rebuild the image with "
     "`envbuild build RECIPE`"),
    ({}, None, "label envbuild.recipe='cpu-torch2' names a recipe without a lock label; rebuild the image with "
             "`envbuild build RECIPE`"),
    ({"envbuild.x\x1b[2J": "1"}, "cpu-torch2",
     r"label envbuild.x\x1b[2J='1' is not one line of at most 4096 printable characters"),
    ({"org.opencontainers.image.title": "\u202ex"}, "cpu-torch2",
     r"label org.opencontainers.image.title='\u202ex' is not one line of at most 4096 printable characters"),
    ({"envbuild.base.used": "x" * 4097}, "cpu-torch2",
     "label envbuild.base.used='" + "x" * 96 + "... is not one line of at most 4096 printable characters"),
])
def test_a_hostile_image_label_is_refused(change, lock, expected):
    with pytest.raises(EnvbuildError) as e:
        source.check_labels({**_GOOD_LABELS, **change}, lock and lock_of(recipe=lock), "img:1")
    assert (str(e.value), e.value.exit_code) == (f"image: 'img:1' {expected}", 2)


def test_the_images_own_labels_are_accepted_twin():
    source.check_labels(_GOOD_LABELS, lock_of(), "img:1")  # other prefixes are not recorded
    source.check_labels({"org.opencontainers.image.title": "torch"}, None, "foreign:1")
    source.check_labels({**_GOOD_LABELS, "envbuild.base.used": "x" * 4096}, lock_of(), "img:1")


@pytest.mark.parametrize("nodes, nproc, info, expected", [
    (1024, 1, {"NCPU": 2, "MemTotal": 24 << 30}, "1024 local node(s) of 1 rank(s) are more than this Docker engine "
     "runs: at most 8 (4 ranks per CPU of its 2, 1024 MiB of its 24576 MiB memory per rank); give --nodes 8 or "
     "fewer, or run on a cluster (--launcher slurm or k8s)"),
    (3, 1, {"NCPU": 16, "MemTotal": 2 << 30}, "3 local node(s) of 1 rank(s) are more than this Docker engine runs: "
     "at most 2 (4 ranks per CPU of its 16, 1024 MiB of its 2048 MiB memory per rank); give --nodes 2 or fewer, "
     "or run on a cluster (--launcher slurm or k8s)"),
    (3, 4, {"NCPU": 2, "MemTotal": 24 << 30}, "3 local node(s) of 4 rank(s) are more than this Docker engine runs: "
     "at most 2 (4 ranks per CPU of its 2, 1024 MiB of its 24576 MiB memory per rank); give --nodes 2 or fewer, "
     "or run on a cluster (--launcher slurm or k8s)"),
])
def test_more_local_nodes_than_the_engine_runs_are_refused(nodes, nproc, info, expected):
    with pytest.raises(EnvbuildError) as e:
        local.check_capacity(nodes, nproc, info)
    assert (str(e.value), e.value.exit_code) == (expected, 3)


def test_local_nodes_within_the_engine_twin():
    for nodes, nproc, info in [(8, 1, {"NCPU": 2, "MemTotal": 24 << 30}), (2, 1, {"NCPU": 16, "MemTotal": 2 << 30}),
                               (1, 64, {"NCPU": 1, "MemTotal": 1 << 30}), (4, 1, {})]:
        local.check_capacity(nodes, nproc, info)


def test_a_run_without_results_prints_and_reports_no_placeholder():
    """No rank reported: one line says what is missing and why; no None, no '-', no empty
    table, in the terminal and in the report (the twin: test_print_table)."""
    from builder.certify import report

    cert = _cert_model(results=[], rank_exit_codes={0: 1}, node_exit_codes={0: 1, 1: None}, killed_after_s=20.0,
                       node_logs={0: NODE0_LOG, 1: ""})
    cert = msgspec.structs.replace(cert, profiles=["ddp"])
    con = Console(record=True, width=300, file=io.StringIO())
    table.print_table(cert, con)
    text = con.export_text()
    assert "None" not in text and "┏" not in text, text
    assert ("collectives and training checks of ddp: no results, 0 of 2 rank(s) reported a result "
            "(see the failures)") in text.splitlines()
    page = report.render_html(cert.to_dict())
    assert "None" not in page and not re.search(r"<td[^>]*>\s*-\s*</td>", page)
    assert "no rank&#39;s probe reported: 0 of 2 rank(s) reported a result" in page
    assert '<p class="note" id="stack-reference">reference: the image&#39;s recipe lock</p>' in page
    assert "<th>size (B)</th>" not in page  # the legacy all-reduce table had no row


def test_a_probe_that_breaks_the_node_report_refuses_its_rank_result():
    bad = rank_doc(0)
    bad["probe"]["hostname"] = "node-0\n"
    result, why = output.check_result(bad, 0, "result", run_id=RUN_ID, world_size=2)
    assert result is None and why == ("result of rank 0 is not a valid envbuild.rank-result/3: "
                                      "probe.hostname: 'node-0\\n' is not a host name (letters, digits, _ . -)")
    result, why = output.check_result(rank_doc(0), 0, "result", run_id=RUN_ID, world_size=2)
    assert why is None and (result.probe.hostname, result.probe.python.version) == ("node-0", "3.11.2")


def test_the_probe_is_compared_with_the_lock_once_per_rank(monkeypatch):
    calls = []
    compare = probecheck.compare_probe_to_lock
    monkeypatch.setattr(probecheck, "compare_probe_to_lock",
                        lambda p, lock: calls.append(p.hostname) or compare(p, lock))
    other = copy.deepcopy(PROBE)
    other["torch"]["version"] = "2.99.0+cpu"
    cert = _cert_model([rank_doc(0), rank_doc(1, probe=other)])
    assert sorted(calls) == ["node-0", "node-1"]
    assert (cert.ranks["0"].lock_mismatches, cert.ranks["1"].lock_mismatches) == (
        [], ["torch.version: lock '2.13.0+cpu', image '2.99.0+cpu'"])
    assert cert.verdict.failures == ["rank 1: image differs from the lock: torch.version: lock '2.13.0+cpu', "
                                     "image '2.99.0+cpu'", "ranks differ in torch: rank 0 2.13.0+cpu, rank 1 2.99.0+cpu"]
