"""Unit tests of certification logic without an engine: settings, judging, NCCL log
parsing, certificate shape and writing, the table, and the launcher's pure helpers."""

from __future__ import annotations

import copy
import io
import json
import re

import docker.errors
import pytest
from rich.console import Console

from builder import certify, compat, nccl_log
from builder.errors import EnvbuildError, ExitCode
from builder.launchers.base import LaunchResult, LaunchSpec
from builder.launchers import local

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

NCCL_LOCK = copy.deepcopy(CPU_LOCK)
NCCL_LOCK["recipe"] = "cuda12-torch2"
NCCL_LOCK["certify"].update(
    backend="nccl",
    gpus_per_node=1,
    thresholds={"busbw_size": 1073741824, "min_busbw_gbps": 10.0},
)
NCCL_LOCK["certify"]["allreduce"]["sizes"] = [1048576, 16777216]

PROBE = {
    "schema": "envbuild.probe/1",
    "hostname": "node-0",
    "os": {"id": "debian", "version_id": "12", "pretty_name": "Debian GNU/Linux 12 (bookworm)"},
    "glibc": "2.36",
    "python": {"version": "3.11.2", "executable": "/opt/venv/bin/python3"},
    "torch": {"version": "2.13.0+cpu", "cuda": None, "cuda_available": False, "cudnn": None,
              "nccl_compiled": None},
    "nccl": {"loaded": None, "found": [], "pip_packages": {}},
    "gpus": [],
    "driver": None,
    "env": {},
    "errors": [],
}


def rank_doc(rank, world=2, *, sizes=(8, 1024, 65536), wrong=0, times=None, identical=True,
             mismatched=(), checksum="aa", probe=None, backend="gloo", busbw=0.05, ddp=True):
    """A hand-written envbuild.rank-result/1 document."""
    times = times or [100.0 + r for r in range(world)]
    entries = []
    for size in sizes:
        wbr = [0] * world
        wbr[rank] = wrong
        entries.append({
            "size_bytes": size, "count": size // 4, "type": "float32", "redop": "sum",
            "time_us": max(times), "rank_time_us": list(times),
            "algbw_gbps": busbw, "busbw_gbps": busbw, "wrong": wrong, "wrong_by_rank": wbr,
        })
    doc = {
        "schema": "envbuild.rank-result/1", "rank": rank, "local_rank": 0, "world_size": world,
        "node_rank": rank, "hostname": f"node-{rank}", "backend": backend, "device": "cpu",
        "dtype": "float32", "options": {}, "allreduce": entries,
        "ddp": None,
        "probe": copy.deepcopy(PROBE if probe is None else probe),
        "fault": None, "errors": [],
        "started_at": "2026-05-12T10:00:00.000Z", "finished_at": "2026-05-12T10:00:05.000Z",
        "elapsed_s": 5.0,
    }
    doc["probe"]["hostname"] = f"node-{rank}"
    if ddp:
        doc["ddp"] = {
            "model": "resnet18", "source": "builtin", "steps": 3, "batch_size": 8,
            "image_size": 64, "wall_s": 2.0, "images_per_s": 12.0 + rank, "final_loss": 6.9,
            "param_checksum": checksum, "checksums_by_rank": [checksum] * world,
            "params_identical": identical, "mismatched_ranks": list(mismatched),
        }
    return doc


def launch(results, world=2, **kw):
    base = dict(
        rank_results={d["rank"]: d for d in results},
        node_logs={n: "" for n in range(world)},
        node_exit_codes={n: 0 for n in range(world)},
        timed_out=False,
        missing_ranks=sorted(set(range(world)) - {d["rank"] for d in results}),
        started_at="2026-05-12T10:00:00Z",
        finished_at="2026-05-12T10:00:09Z",
    )
    base.update(kw)
    return LaunchResult(**base)


def settings(lock=CPU_LOCK, **kw):
    kw.setdefault("gpu_visible", False)
    return certify.resolve_settings(lock, **kw)


# --------------------------------------------------------------------------- settings


def test_settings_from_lock_and_overrides():
    s = settings(nodes=3, timeout_s=40, sizes=[8, 16], ddp_steps=1)
    assert (s.nodes, s.gpus_per_node, s.world_size, s.backend, s.recipe_backend) == (3, 0, 3, "gloo", "gloo")
    assert s.timeout_s == 40 and s.sizes == [8, 16] and s.ddp_steps == 1
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


def test_judge_pass():
    v = certify.judge(settings(), launch([rank_doc(0), rank_doc(1)]), CPU_LOCK)
    assert v == {"passed": True, "exit_code": 0, "failures": [], "warnings": []}


def test_judge_wrong_allreduce_names_rank_and_sizes():
    v = certify.judge(settings(), launch([rank_doc(0), rank_doc(1, wrong=1)]), CPU_LOCK)
    assert not v["passed"] and v["exit_code"] == 2
    assert len(v["failures"]) == 1
    assert v["failures"][0].startswith("rank 1: all-reduce sum wrong at 8 B (1 wrong element)")
    assert "65536 B" in v["failures"][0]


def test_judge_ddp_mismatch_names_rank():
    docs = [rank_doc(r, identical=False, mismatched=[1], checksum="ab"[r]) for r in (0, 1)]
    v = certify.judge(settings(), launch(docs), CPU_LOCK)
    assert v["exit_code"] == 2
    assert v["failures"] == ["DDP parameters differ after 3 step(s): rank 1 differs from the others"]


def test_judge_timeout_is_exit_3():
    res = launch([], timed_out=True, node_exit_codes={0: None, 1: None})
    v = certify.judge(settings(), res, CPU_LOCK)
    assert v["exit_code"] == 3
    assert v["failures"] == ["rank 0 did not finish within 60 s (timeout)",
                             "rank 1 did not finish within 60 s (timeout)"]


def test_judge_rank_exit_code():
    res = launch([], node_exit_codes={0: 1, 1: 1}, rank_exit_codes={0: 1, 1: 3})
    v = certify.judge(settings(), res, CPU_LOCK)
    assert v["exit_code"] == 2
    assert "rank 1 exited with 3" in v["failures"]


def test_judge_killed_after_grace_and_signal():
    res = launch([rank_doc(0, world=3), rank_doc(1, world=3)], world=3,
                 node_exit_codes={0: 0, 1: None, 2: None}, rank_exit_codes={2: -9},
                 killed_after_s=20.0)
    res.rank_results.pop(1)
    v = certify.judge(settings(nodes=3), res, CPU_LOCK)
    assert "rank 1 did not finish: killed 20 s after another node failed" in v["failures"]
    assert "rank 2 was killed by signal 9" in v["failures"]
    assert v["exit_code"] == 2


def test_judge_unreadable_result_is_exit_3():
    res = launch([rank_doc(0)], rank_problems={1: "unreadable result file: JSONDecodeError"})
    v = certify.judge(settings(), res, CPU_LOCK)
    assert v["failures"] == ["rank 1: unreadable result file: JSONDecodeError"]
    assert v["exit_code"] == 3


def test_judge_definite_failure_beats_timeout():
    res = launch([rank_doc(0, wrong=2)], timed_out=True, node_exit_codes={0: 0, 1: None})
    v = certify.judge(settings(), res, CPU_LOCK)
    assert v["exit_code"] == 2
    assert "rank 1 did not finish within 60 s (timeout)" in v["failures"]


def test_judge_probe_against_lock_and_across_ranks():
    other = copy.deepcopy(PROBE)
    other["torch"]["version"] = "2.12.0+cpu"
    v = certify.judge(settings(), launch([rank_doc(0), rank_doc(1, probe=other)]), CPU_LOCK)
    assert v["exit_code"] == 2
    assert any(f.startswith("rank 1: image differs from the lock: ") and "2.12.0+cpu" in f
               for f in v["failures"])
    assert "ranks differ in torch: rank 0 2.13.0+cpu, rank 1 2.12.0+cpu" in v["failures"]
    assert not any(f.startswith("rank 0") for f in v["failures"])


def test_judge_missing_probe():
    doc = rank_doc(1)
    doc["probe"] = None
    doc["errors"] = ["probe failed: OSError: boom"]
    v = certify.judge(settings(), launch([rank_doc(0), doc]), CPU_LOCK)
    assert "rank 1: probe failed: OSError: boom" in v["failures"]


def test_busbw_not_gated_on_gloo_by_default():
    v = certify.judge(settings(), launch([rank_doc(0, busbw=1e-6), rank_doc(1, busbw=1e-6)]), CPU_LOCK)
    assert v["passed"]


def test_busbw_floor_names_slowest_rank():
    s = settings(min_busbw_gbps=1e9)
    times = [120.0, 340.5]
    v = certify.judge(s, launch([rank_doc(0, times=times), rank_doc(1, times=times)]), CPU_LOCK)
    assert v["exit_code"] == 2
    (f,) = v["failures"]
    assert "at 65536 B is below the floor of 1e+09 GB/s (argument)" in f
    assert f.endswith("slowest rank 1 (340.5 us)")


def test_busbw_floor_from_nccl_recipe():
    s = settings(NCCL_LOCK, gpu_visible=True)
    sizes = s.sizes
    ok = [rank_doc(r, sizes=sizes, backend="nccl", busbw=11.0, times=[9.0, 8.0]) for r in (0, 1)]
    assert certify.judge(s, launch(ok), NCCL_LOCK)["failures"] == []
    slow = [rank_doc(r, sizes=sizes, backend="nccl", busbw=9.0, times=[9.0, 8.0]) for r in (0, 1)]
    (f,) = certify.judge(s, launch(slow), NCCL_LOCK)["failures"]
    assert "(recipe); slowest rank 0" in f


def test_judge_nccl_without_transport_lines_warns():
    s = settings(NCCL_LOCK, gpu_visible=True, min_busbw_gbps=0)
    docs = [rank_doc(r, sizes=s.sizes, backend="nccl") for r in (0, 1)]
    res = launch(docs, node_logs={0: NCCL_NODE0, 1: ""})
    v = certify.judge(s, res, NCCL_LOCK)
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


def _cert(verdict=None, results=None, s=None, **launch_kw):
    s = s or settings()
    res = launch([rank_doc(0), rank_doc(1)] if results is None else results, **launch_kw)
    v = verdict or certify.judge(s, res, CPU_LOCK)
    labels = {
        "envbuild.recipe": "cpu-torch2",
        "envbuild.lock-hash": "sha256:a0d76dd47f233ebba933a62d27f20c99af5f57613d4a8877dfaf3df561831414",
        "envbuild.lock": json.dumps(CPU_LOCK),
        "envbuild.backend": "gloo",
        "envbuild.base.used": "debian:bookworm-slim@sha256:abc",
        "org.opencontainers.image.title": "envbuild/cpu-torch2",
        "maintainer": "someone",
    }
    return certify.build_certificate(
        image_ref="envbuild/cpu-torch2:a0d76dd47f23", image_id="sha256:" + "1" * 64,
        repo_digests=[], labels=labels, lock=CPU_LOCK, settings=s, launch=res, verdict=v,
        run_id="0123456789ab", host={"hostname": "h", "docker_server_version": "20.10.24"},
    )


def test_certificate_shape():
    cert = _cert()
    assert cert["schema"] == "envbuild.certificate/1"
    assert cert["recipe"] == "cpu-torch2"
    assert cert["lock_hash"].startswith("sha256:a0d76dd47f23")
    assert cert["lock"] == CPU_LOCK
    assert cert["base_used"] == "debian:bookworm-slim@sha256:abc"
    assert cert["backend"] == {"used": "gloo", "recipe": "gloo"}
    assert (cert["world_size"], cert["nodes"], cert["gpus_per_node"]) == (2, 2, 0)
    assert set(cert["image"]["labels"]) == {"envbuild.recipe", "envbuild.lock-hash", "envbuild.backend",
                                            "envbuild.base.used", "org.opencontainers.image.title"}
    assert cert["image"]["id"].startswith("sha256:")
    assert [r["size_bytes"] for r in cert["allreduce"]] == [8, 1024, 65536]
    row = cert["allreduce"][0]
    assert set(row) >= {"size_bytes", "count", "type", "time_us", "algbw_gbps", "busbw_gbps",
                        "wrong", "wrong_by_rank"}
    assert row["wrong"] == 0 and row["wrong_by_rank"] == [0, 0]
    assert cert["ddp"]["params_identical"] is True
    assert cert["ddp"]["ranks"]["1"]["images_per_s"] == 13.0
    assert cert["probe"]["0"]["schema"] == "envbuild.probe/1" and set(cert["probe"]) == {"0", "1"}
    assert cert["transports"] is None and cert["nccl"] is None
    assert cert["verdict"]["passed"] is True
    assert cert["thresholds"]["min_busbw_gbps"] is None
    assert cert["host"]["docker_server_version"] == "20.10.24"
    assert cert["started_at"] == "2026-05-12T10:00:00Z"
    json.dumps(cert)  # plain JSON


def test_certificate_per_rank_wrong_from_each_rank():
    cert = _cert(results=[rank_doc(0), rank_doc(1, wrong=3)])
    assert cert["allreduce"][0]["wrong_by_rank"] == [0, 3]
    assert cert["allreduce"][0]["wrong"] == 3
    assert not cert["verdict"]["passed"]
    assert "log_tail" in cert["node_status"]["0"]


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
    cert = _cert()
    p1 = certify.write_certificate(cert, tmp_path)
    assert p1 == tmp_path / "cpu-torch2" / "certificates" / "cpu-torch2-a0d76dd47f23-20260512T100009Z.json"
    assert json.loads(p1.read_text()) == cert
    p2 = certify.write_certificate(cert, tmp_path)
    assert p2.name == "cpu-torch2-a0d76dd47f23-20260512T100009Z-2.json"
    assert sorted(x.name for x in p1.parent.iterdir()) == sorted([p1.name, p2.name])  # no temp files


def test_print_table():
    buf = io.StringIO()
    con = Console(file=buf, width=140, color_system=None)
    cert = _cert(results=[rank_doc(0), rank_doc(1, wrong=1)])
    certify.print_table(cert, con)
    text = buf.getvalue()
    for col in ("size (B)", "count", "type", "time (us)", "algbw (GB/s)", "busbw (GB/s)", "#wrong",
                "images/s", "verdict: FAILED (exit 2)", "rank 1: all-reduce sum wrong"):
        assert col in text, col


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
    certify.print_table(cert, con, path)
    lines = con.export_text().splitlines()
    return lines[next(i for i, l in enumerate(lines) if l.startswith("verdict:")):]


def test_failing_verdict_shows_each_failing_node_log():
    cert = _cert(results=[], rank_exit_codes={0: 1}, node_exit_codes={0: 1, 1: None}, killed_after_s=0.0,
                 node_logs={0: NODE0_LOG, 1: NODE1_LOG})
    assert _verdict_lines(cert, "images/c.json") == [
        "verdict: FAILED (exit 2)",
        "  fail: rank 0 exited with 1",
        "  fail: rank 1 did not finish: killed 0 s after another node failed",
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
    cert = _cert(results=[rank_doc(0), rank_doc(1, wrong=1)], node_logs={0: NODE0_LOG, 1: NODE1_LOG})
    assert _verdict_lines(cert) == [
        "verdict: FAILED (exit 2)",
        "  fail: rank 1: all-reduce sum wrong at 8 B (1 wrong element), 1024 B (1 wrong element), 65536 B (1 "
        "wrong element)",
    ]


# --------------------------------------------------------------------------- lock label vs its hash


def test_lock_label_matching_its_hash_is_read():
    assert certify.lock_from_labels(_labels(CPU_LOCK), "img:1") == CPU_LOCK


def test_edited_lock_label_is_refused():
    edited = copy.deepcopy(CPU_LOCK)
    edited["certify"]["nodes"] = "lots"
    labels = {**_labels(CPU_LOCK), "envbuild.lock": json.dumps(edited)}  # rebuilt FROM it, lock label edited
    with pytest.raises(EnvbuildError) as e:
        certify.lock_from_labels(labels, "img:1")
    assert e.value.exit_code == ExitCode.CHECK_FAILED
    assert str(e.value) == (
        "image: 'img:1' label envbuild.lock was changed after the build: it hashes to "
        "sha256:2d9230c75d480dd79ed286ae6cfb9f44f53f68e4260f315e4dc9e121fa1fae4e, label envbuild.lock-hash says "
        "sha256:c78a01f5276ede5fef4d2d4272cd704c331ab97e1f0545e652a266a2c81e670e; rebuild the image with "
        "`envbuild build RECIPE`")


def test_lock_label_that_is_not_json_is_one_line():
    labels = {**_labels(CPU_LOCK), "envbuild.lock": "{not json"}
    with pytest.raises(EnvbuildError) as e:
        certify.lock_from_labels(labels, "img:1")
    assert e.value.exit_code == ExitCode.CHECK_FAILED
    assert str(e.value) == ("image: 'img:1' label envbuild.lock is not a JSON object (Expecting property name "
                            "enclosed in double quotes: line 1 column 2 (char 1))")


# --------------------------------------------------------------------------- certify() with fakes


class _Img:
    def __init__(self, labels):
        self.labels = labels
        self.id = "sha256:" + "2" * 64
        self.attrs = {"RepoDigests": []}


class _Images:
    def __init__(self, labels):
        self._labels = labels

    def get(self, ref):
        if self._labels is None:
            raise docker.errors.ImageNotFound("nope")
        return _Img(self._labels)


class FakeClient:
    def __init__(self, labels):
        self.images = _Images(labels)

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
    return {"envbuild.lock": json.dumps(lock), "envbuild.lock-hash": compat.lock_hash(lock),
            "envbuild.recipe": lock["recipe"], "envbuild.backend": lock["certify"]["backend"]}


def test_certify_with_fake_launcher(tmp_path):
    fl = FakeLauncher([rank_doc(0), rank_doc(1)])
    buf = io.StringIO()
    cert, path = certify.certify(
        FakeClient(_labels(CPU_LOCK)), "img:1", images_dir=tmp_path, launcher=fl, run_id="r1",
        console=Console(file=buf), extra_env={"ENVBUILD_BENCH_FAULT": "exit@1"}, labels={"a": "b"},
        ddp_steps=3,
    )
    assert cert["verdict"]["passed"] and path.exists()
    (spec,) = fl.specs
    assert spec.env == {"ENVBUILD_BENCH_FAULT": "exit@1"} and spec.labels == {"a": "b"}
    assert spec.run_id == "r1" and spec.world_size == 2 and spec.timeout_s == 60
    assert "run r1" in buf.getvalue()
    assert path.parent == tmp_path / "cpu-torch2" / "certificates"


def test_certify_refuses_nccl_before_launching(tmp_path):
    fl = FakeLauncher([])
    with pytest.raises(EnvbuildError) as e:
        certify.certify(FakeClient(_labels(NCCL_LOCK)), "img:1", images_dir=tmp_path, launcher=fl)
    assert e.value.exit_code == 2 and "needs GPUs" in str(e.value)
    assert fl.specs == [] and not any(tmp_path.iterdir())


def test_certify_refuses_image_not_built_by_envbuild(tmp_path):
    with pytest.raises(EnvbuildError) as e:
        certify.certify(FakeClient({"maintainer": "x"}), "img:1", images_dir=tmp_path, launcher=FakeLauncher([]))
    assert e.value.exit_code == 2 and "not built by envbuild" in str(e.value)
    with pytest.raises(EnvbuildError, match="no such image"):
        certify.certify(FakeClient(None), "img:1", images_dir=tmp_path, launcher=FakeLauncher([]))


# --------------------------------------------------------------------------- launcher helpers


def _spec(**kw):
    base = dict(image="img:1", nodes=2, gpus_per_node=0, backend="gloo", port=29511,
                shm_size="256m", timeout_s=60, bench_args=["--iters", "3"], env={"X": "1"},
                run_id="abc123def456", labels={"envbuild.test-session": "s"})
    base.update(kw)
    return LaunchSpec(**base)


def test_container_kwargs_cpu(tmp_path):
    spec = _spec()
    kw = local.container_kwargs(spec, 1, results_dir=str(tmp_path), network="net", labels=local.labels_for(spec, {}),
                                bench_dir=tmp_path / "bench", probe_path=tmp_path / "probe.py")
    assert kw["command"] == ["python3", "-m", "torch.distributed.run", "--nnodes", "2", "--nproc-per-node", "1",
                             "--node-rank", "1", "--master-addr", "node-0", "--master-port", "29511",
                             "--max-restarts", "0", "-m", "bench", "--out", "/results", "--iters", "3"]
    assert kw["name"] == "envbuild-abc123def456-node-1" and kw["hostname"] == "node-1"
    assert kw["user"] == "12345:12345" and kw["read_only"] is True
    assert set(kw["tmpfs"]) == {"/tmp", "/tmp/home"}
    env = kw["environment"]
    assert env["HOME"] == "/tmp/home" and env["PYTHONPATH"] == "/opt/envbuild" and env["X"] == "1"
    assert env["GLOO_SOCKET_IFNAME"] == "eth0" and env["NCCL_SOCKET_IFNAME"] == "eth0"
    assert "NCCL_DEBUG" not in env and "device_requests" not in kw
    assert kw["labels"]["envbuild"] == "1" and kw["labels"]["envbuild.run"] == "abc123def456"
    assert kw["labels"]["envbuild.test-session"] == "s"
    mounts = {v["bind"]: v["mode"] for v in kw["volumes"].values()}
    assert mounts == {"/opt/envbuild/bench": "ro", "/opt/envbuild/probe.py": "ro", "/results": "rw"}
    assert kw["shm_size"] == "256m"


def test_container_kwargs_gpus(tmp_path):
    spec = _spec(gpus_per_node=2, backend="nccl")
    kw = local.container_kwargs(spec, 1, results_dir=str(tmp_path), network="net", labels={},
                                bench_dir=tmp_path, probe_path=tmp_path / "p.py")
    (req,) = kw["device_requests"]
    assert req["DeviceIDs"] == ["2", "3"] and req["Capabilities"] == [["gpu"]]
    assert kw["environment"]["NCCL_DEBUG"] == "INFO"
    assert "--nproc-per-node" in kw["command"] and kw["command"][kw["command"].index("--nproc-per-node") + 1] == "2"
    assert spec.world_size == 4 and spec.ranks_of_node(1) == [2, 3]


def test_extra_labels_env():
    assert local.parse_extra_labels(None) == {}
    assert local.parse_extra_labels(" a=1, envbuild.test-session=xyz ,c=") == {
        "a": "1", "envbuild.test-session": "xyz", "c": ""}
    with pytest.raises(EnvbuildError):
        local.parse_extra_labels("novalue")
    spec = _spec(labels={"envbuild.run": "spoof"})
    labels = local.labels_for(spec, {local.EXTRA_LABELS_ENV: "k=v"})
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
    assert local.parse_torchrun_failures(TORCHRUN_FAILURE) == {3: -9, 2: 3}
    assert local.parse_torchrun_failures("all fine\n") == {}


def test_read_results(tmp_path):
    (tmp_path / "rank-0.json").write_text(json.dumps(rank_doc(0)))
    (tmp_path / "rank-1.json").write_text("{not json")
    (tmp_path / "rank-2.json").write_text(json.dumps({"schema": "other"}))
    results, problems = local.read_results(tmp_path, 4)
    assert set(results) == {0}
    assert set(problems) == {1, 2} and "unreadable" in problems[1] and "other" in problems[2]


def test_names():
    assert local.network_name("r") == "envbuild-r"
    assert re.fullmatch(r"envbuild-r-node-3", local.node_name("r", 3))
