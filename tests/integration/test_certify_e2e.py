"""End-to-end certification on the real Docker engine (gloo, CPU, 2 container nodes).

Needs two fixtures from ``tests/conftest.py``: ``torch_image`` (the ref of an image built
by envbuild from ``cpu-torch2``) and ``test_labels`` (labels to put on everything a test
creates, e.g. ``{"envbuild.test-session": "<uuid>"}``). For development without that
conftest, set ``ENVBUILD_TEST_IMAGE=<ref>`` (any image carrying envbuild's labels, e.g.
``envbuild-dev/cpu-torch2:dev``): it takes precedence over ``torch_image``, and a fresh
session label is made up when ``test_labels`` is missing.

Every run is kept short (small sizes, 1 DDP step) and every test checks that nothing
labelled with its run (containers, networks, a host folder, processes) is left.
The fault injection uses the TEST-ONLY ``extra_env={"ENVBUILD_BENCH_FAULT": ...}``.
"""

from __future__ import annotations

import glob
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path

import docker.errors
import pytest

from builder.certify.verdict import compare_probe_to_lock
from builder.core.errors import EnvbuildError, ExitCode
from builder.image import engine
from builder.launchers import base

from certify_helpers import certify_image
from helpers import tmpfs

SHORT = dict(sizes=[8, 1024, 65536], iters=3, warmup=1, ddp_steps=1, nodes=2, backend="gloo")
REPO = Path(__file__).resolve().parents[2]


# --------------------------------------------------------------------------- fixtures


@pytest.fixture(scope="module")
def image(request) -> str:
    ref = os.environ.get("ENVBUILD_TEST_IMAGE")
    if ref:
        return ref
    try:
        return request.getfixturevalue("torch_image")
    except pytest.FixtureLookupError:
        pytest.skip("no torch_image fixture and ENVBUILD_TEST_IMAGE is unset")


@pytest.fixture(scope="module")
def client():
    try:
        return engine.connect(timeout_s=120)
    except EnvbuildError as e:
        pytest.skip(str(e))


@pytest.fixture
def labels(request) -> dict[str, str]:
    """The session's test labels plus one naming this test case."""
    try:
        base = dict(request.getfixturevalue("test_labels"))
    except pytest.FixtureLookupError:
        base = {"envbuild.test-session": uuid.uuid4().hex}
    return {**base, "envbuild.test-case": uuid.uuid4().hex[:16]}


# --------------------------------------------------------------------------- helpers


def _leftovers(client, label: str) -> list[str]:
    found = [f"container {c.name}" for c in client.containers.list(all=True, filters={"label": label})]
    found += [f"network {n.name}" for n in client.networks.list(filters={"label": label})]
    return found


def _processes_of_run(run_id: str) -> list[int]:
    """Host PIDs whose environment holds ENVBUILD_RUN_ID=<run_id> (the nodes' processes)."""
    needle = f"ENVBUILD_RUN_ID={run_id}".encode()
    pids = []
    for env_file in glob.glob("/proc/[0-9]*/environ"):
        try:
            with open(env_file, "rb") as f:
                if needle in f.read().split(b"\0"):
                    pids.append(int(env_file.split("/")[2]))
        except OSError:
            continue
    return pids


def assert_nothing_left(client, run_id: str, labels: dict[str, str]) -> None:
    assert _leftovers(client, f"{engine.RUN_LABEL}={run_id}") == []
    assert _leftovers(client, f"envbuild.test-case={labels['envbuild.test-case']}") == []
    assert glob.glob(os.path.join(tempfile.gettempdir(), f"envbuild-{run_id}-*")) == []  # no host folder
    assert _processes_of_run(run_id) == []


def run_certify(client, image, tmp_path, labels, **kw):
    args = {**SHORT, "timeout_s": 120, **kw}
    t0 = time.monotonic()
    cert, path = certify_image(client, image, images_dir=tmp_path, labels=labels, **args)
    elapsed = time.monotonic() - t0
    assert path.is_file() and json.loads(path.read_text()) == cert
    assert path.parent == tmp_path / cert["recipe"] / "certificates"
    h = cert["lock_hash"].split(":")[-1][:12]
    assert re.fullmatch(rf"{re.escape(cert['recipe'])}-{h}-\d{{8}}T\d{{6}}Z-{cert['run_id']}\.json", path.name)
    assert_nothing_left(client, cert["run_id"], labels)
    return cert, elapsed


# --------------------------------------------------------------------------- tests


def test_two_nodes_pass(client, image, tmp_path, labels):
    cert, elapsed = run_certify(client, image, tmp_path, labels)
    v = cert["verdict"]
    assert v["passed"] and v["exit_code"] == 0 and v["failures"] == [], v
    assert cert["schema"] == "envbuild.certificate/1"
    assert cert["world_size"] == 2 and cert["nodes"] == 2 and cert["gpus_per_node"] == 0
    assert cert["backend"]["used"] == "gloo"
    assert [r["size_bytes"] for r in cert["allreduce"]] == SHORT["sizes"]
    for row in cert["allreduce"]:
        assert row["wrong"] == 0 and row["wrong_by_rank"] == [0, 0]
        assert row["busbw_gbps"] >= 0 and row["time_us"] > 0
    ddp = cert["ddp"]
    assert ddp["params_identical"] and ddp["mismatched_ranks"] == []
    assert set(ddp["ranks"]) == {"0", "1"}
    assert len({r["param_checksum"] for r in ddp["ranks"].values()}) == 1
    assert set(cert["probe"]) == {"0", "1"}
    for r, probe in cert["probe"].items():
        assert probe["hostname"] == f"node-{r}"
        assert compare_probe_to_lock(probe, cert["lock"]) == []
    assert cert["transports"] is None and cert["nccl"] is None
    assert cert["image"]["labels"]["envbuild.lock-hash"] == cert["lock_hash"]
    assert cert["node_status"] == {"0": {"name": "node-0", "exit_code": 0},
                                   "1": {"name": "node-1", "exit_code": 0}}
    # the image sets no socket interface and neither did envbuild: the libraries chose
    assert cert["socket"] == {"source": "default", "override": None, "GLOO_SOCKET_IFNAME": None,
                              "NCCL_SOCKET_IFNAME": None,
                              "seen_by_ranks": {r: {"GLOO_SOCKET_IFNAME": None, "NCCL_SOCKET_IFNAME": None}
                                                for r in ("0", "1")}}
    # host-side phase times (issue 13 item 3), in order, within the run's own wall time
    assert [p["name"] for p in cert["phases"]] == ["containers up", "ranks up", "init", "all-reduce", "ddp", "profiles",
                                                   "probe", "write", "exit", "teardown"]
    assert all(p["seconds"] >= 0 for p in cert["phases"]) and sum(p["seconds"] for p in cert["phases"]) <= elapsed
    print(f"pass: {elapsed:.1f} s")


def test_corrupt_allreduce_names_rank_1(client, image, tmp_path, labels):
    cert, elapsed = run_certify(client, image, tmp_path, labels,
                                extra_env={"ENVBUILD_BENCH_FAULT": "allreduce-corrupt@1"})
    v = cert["verdict"]
    assert not v["passed"] and v["exit_code"] == ExitCode.CHECK_FAILED
    assert len(v["failures"]) == 1 and v["failures"][0].startswith("rank 1: all-reduce sum wrong at 8 B")
    assert all(row["wrong_by_rank"] == [0, 1] for row in cert["allreduce"])
    print(f"allreduce-corrupt: {elapsed:.1f} s")


def test_perturbed_ddp_names_rank_1(client, image, tmp_path, labels):
    cert, elapsed = run_certify(client, image, tmp_path, labels,
                                extra_env={"ENVBUILD_BENCH_FAULT": "ddp-perturb@1"})
    v = cert["verdict"]
    assert v["exit_code"] == ExitCode.CHECK_FAILED
    assert v["failures"] == ["DDP parameters differ after 1 step(s): rank 1 differs from the others"]
    assert cert["ddp"]["mismatched_ranks"] == [1] and not cert["ddp"]["params_identical"]
    print(f"ddp-perturb: {elapsed:.1f} s")


def test_rank_exits_early(client, image, tmp_path, labels):
    cert, elapsed = run_certify(client, image, tmp_path, labels, extra_env={"ENVBUILD_BENCH_FAULT": "exit@1"})
    v = cert["verdict"]
    assert v["exit_code"] == ExitCode.CHECK_FAILED
    assert "rank 1 exited with 3" in v["failures"]
    assert cert["ranks"]["1"]["reported"] is False
    assert elapsed < 60  # no waiting for the 120 s timeout
    # no bench phase that rank 1 never finished is timed: the host's own spans only
    assert [p["name"] for p in cert["phases"]] == ["containers up", "ranks up", "teardown"]
    print(f"exit: {elapsed:.1f} s")


def test_hung_rank_times_out(client, image, tmp_path, labels):
    timeout = 30
    cert, elapsed = run_certify(client, image, tmp_path, labels, timeout_s=timeout,
                                extra_env={"ENVBUILD_BENCH_FAULT": "sleep@1"})
    v = cert["verdict"]
    assert v["exit_code"] == ExitCode.UNREACHABLE and cert["timed_out"]
    # rank 1 (alive, sleeping outside any collective) is the hung one; rank 0 waits for it
    hung, waiting = v["failures"]
    assert re.fullmatch(rf"rank 1 did not finish within {timeout} s \(timeout\): hung: stopped making progress "
                        r"in test fault sleep 3600 s for \d+(\.\d)? s \(alive, outside any collective\)", hung), hung
    assert waiting == (f"rank 0 did not finish within {timeout} s (timeout): blocked in all-reduce 8 B, "
                       "waiting for rank 1")
    assert timeout <= elapsed < timeout + 45
    print(f"sleep: {elapsed:.1f} s")


def test_unreachable_busbw_floor_names_slowest_rank(client, image, tmp_path, labels):
    cert, elapsed = run_certify(client, image, tmp_path, labels, min_busbw_gbps=1e9)
    v = cert["verdict"]
    assert v["exit_code"] == ExitCode.CHECK_FAILED
    gate = cert["thresholds"]
    assert gate["min_busbw_gbps"] == 1e9 and gate["busbw_size"] == 65536 and gate["source"] == "argument"
    row = next(r for r in cert["allreduce"] if r["size_bytes"] == 65536)
    slowest = max(range(2), key=lambda i: row["rank_time_us"][i])
    (f,) = v["failures"]
    assert "below the floor of 1e+09 GB/s" in f and f"slowest rank {slowest} (" in f
    print(f"busbw floor: {elapsed:.1f} s")


def test_nccl_refused_without_gpus(client, image, tmp_path, labels):
    with pytest.raises(EnvbuildError) as e:
        certify_image(client, image, images_dir=tmp_path, labels=labels, backend="nccl")
    assert e.value.exit_code == ExitCode.CHECK_FAILED
    assert "needs GPUs; none visible" in str(e.value) and "--backend gloo" in str(e.value)
    assert _leftovers(client, f"envbuild.test-case={labels['envbuild.test-case']}") == []
    assert list(tmp_path.iterdir()) == []


def _node0_log(client, case_label: str) -> str:
    for c in client.containers.list(all=True, filters={"label": [case_label, "envbuild.node=0"]}):
        try:
            return c.logs().decode("utf-8", "replace")
        except Exception:  # noqa: BLE001 - removed meanwhile
            return ""
    return ""


@pytest.mark.parametrize("sig,when", [(signal.SIGINT, "sweep"), (signal.SIGTERM, "created")],
                         ids=["SIGINT-mid-sweep", "SIGTERM-at-creation"])
def test_cli_interrupted_leaves_nothing(client, image, tmp_path, labels, sig, when):
    """SIGINT once the ranks joined and the sweep began; SIGTERM as soon as the first node
    container exists (the launcher may still be creating the others)."""
    case = f"envbuild.test-case={labels['envbuild.test-case']}"
    env = {**os.environ, base.EXTRA_LABELS_ENV: ",".join(f"{k}={v}" for k, v in labels.items())}
    t0 = time.monotonic()
    proc = subprocess.Popen(
        [sys.executable, "-m", "builder.cli", "--images-dir", str(tmp_path), "certify", image,
         "--backend", "gloo", "--nodes", "2", "--timeout", "300"],
        cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    run_id = None
    try:
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline and proc.poll() is None:
            seen = client.containers.list(all=True, filters={"label": case})
            if seen and run_id is None:
                run_id = seen[0].labels.get(engine.RUN_LABEL)
            if run_id and when == "created":
                break
            if run_id and "# envbuild bench:" in _node0_log(client, case):
                break  # the ranks joined and the sweep has begun
            time.sleep(0.05 if when == "created" else 0.2)
        assert proc.poll() is None, f"certify ended before the signal: {proc.communicate()}"
        assert run_id, "no node container seen"
        proc.send_signal(sig)
        out, err = proc.communicate(timeout=90)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    elapsed = time.monotonic() - t0
    assert proc.returncode == 130, (out, err)
    assert "interrupted" in err and "Traceback" not in err, err
    assert _leftovers(client, case) == []
    assert_nothing_left(client, run_id, labels)
    assert not (tmp_path / "cpu-torch2").exists() or not any((tmp_path / "cpu-torch2").rglob("*.json"))
    print(f"cli {sig.name}: {elapsed:.1f} s")


# --------------------------------------------------------------------------- the image's own socket settings


@pytest.fixture(scope="module")
def lo_image(client, image, tmp_path_factory, request) -> str:
    """An image FROM the certified one whose own ENV selects loopback for gloo (it keeps
    envbuild's labels: the same lock); removed at the end of the module."""
    ctx = tmp_path_factory.mktemp("lo-image")
    (ctx / "Dockerfile").write_text(f"FROM {image}\nENV GLOO_SOCKET_IFNAME=lo\n")
    try:
        session = dict(request.getfixturevalue("test_labels"))
    except pytest.FixtureLookupError:
        session = {"envbuild.test-session": uuid.uuid4().hex}
    tag = f"envbuild-test/lo:{uuid.uuid4().hex[:12]}"
    engine.build_image(ctx, tag, labels=session, client=client)
    yield tag
    try:
        client.images.remove(tag, force=True)
    except Exception:  # noqa: BLE001 - the session cleanup removes it too
        pass


def test_image_whose_env_selects_loopback_fails(client, lo_image, tmp_path, labels):
    """Certify what the image really does: its GLOO_SOCKET_IFNAME=lo joins no rank to
    another (the twins: test_two_nodes_pass, and the override below)."""
    cert, elapsed = run_certify(client, lo_image, tmp_path, labels, timeout_s=60)
    v = cert["verdict"]
    assert not v["passed"] and v["exit_code"] == ExitCode.CHECK_FAILED
    assert v["failures"][0] == (
        "GLOO_SOCKET_IFNAME=lo (from the image's ENV) selects only the loopback interface on ranks 0, 1: ranks "
        "on 2 nodes cannot reach each other over it; set it to the nodes' network interface (or leave it unset) "
        "in the image, or pass --socket-ifname IF")
    assert cert["socket"]["source"] == "image" and cert["socket"]["GLOO_SOCKET_IFNAME"] == "lo"
    assert cert["socket"]["seen_by_ranks"] == {r: {"GLOO_SOCKET_IFNAME": "lo", "NCCL_SOCKET_IFNAME": None}
                                               for r in ("0", "1")}
    print(f"lo: {elapsed:.1f} s")


def test_socket_ifname_override_passes_and_is_recorded(client, lo_image, tmp_path, labels):
    cert, elapsed = run_certify(client, lo_image, tmp_path, labels, socket_ifname="eth0")
    assert cert["verdict"]["passed"], cert["verdict"]
    assert cert["socket"] == {"source": "--socket-ifname", "override": "eth0", "GLOO_SOCKET_IFNAME": "eth0",
                              "NCCL_SOCKET_IFNAME": "eth0",
                              "seen_by_ranks": {r: {"GLOO_SOCKET_IFNAME": "eth0", "NCCL_SOCKET_IFNAME": "eth0"}
                                                for r in ("0", "1")}}
    print(f"override: {elapsed:.1f} s")


# --------------------------------------------------------------------------- hung and killed ranks


def _node_container(client, case_label: str, node: int):
    found = client.containers.list(filters={"label": [case_label, f"envbuild.node={node}"]})
    return found[0] if found else None


def _rank_started(client, case_label: str, node: int) -> bool:
    """Whether the bench on ``node`` printed its first progress line (before it imports
    torch: any moment from then until the end of the run finds the rank still running)."""
    try:
        for c in client.api.containers(all=True, filters={"label": [case_label, f"envbuild.node={node}"]}):
            if b'"phase": "start"' in client.api.logs(c["Id"]):
                return True
    except docker.errors.APIError:  # removed meanwhile
        pass
    return False


def _when_rank_started(client, case_label: str, node: int, act, timeout: float = 120) -> threading.Thread:
    """A thread that calls ``act()`` once the bench on ``node`` started."""
    def watch():
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if _rank_started(client, case_label, node):
                act()
                return
            time.sleep(0.05)
    t = threading.Thread(target=watch, daemon=True)
    t.start()
    return t


def _rank_pid(run_id: str, rank: int) -> int:
    """Host PID of the worker process of ``rank`` (not its heartbeat process, a fork of it)."""
    found = {}
    for pid in _processes_of_run(run_id):
        try:
            with open(f"/proc/{pid}/environ", "rb") as f:
                env = dict(x.split(b"=", 1) for x in f.read().split(b"\0") if b"=" in x)
            with open(f"/proc/{pid}/stat") as f:
                ppid = int(f.read().rpartition(")")[2].split()[1])
        except (OSError, ValueError):
            continue
        if env.get(b"RANK") == str(rank).encode():
            found[pid] = ppid
    (pid,) = [p for p, pp in found.items() if pp not in found]
    return pid


def test_paused_rank_is_named_apart_from_the_rank_waiting_for_it(client, image, tmp_path, labels):
    case = f"envbuild.test-case={labels['envbuild.test-case']}"
    seen = {}

    def pause():
        c = _node_container(client, case, 1)
        # nothing on the host is writable by a node: the code read-only, the rest tmpfs
        seen["mounts"] = sorted((m["Destination"], m["RW"]) for m in c.attrs["Mounts"])
        seen["tmpfs"] = sorted(c.attrs["HostConfig"]["Tmpfs"])
        c.pause()
    t = _when_rank_started(client, case, 1, pause)
    cert, elapsed = run_certify(client, image, tmp_path, labels, timeout_s=40)
    t.join(1)
    assert seen["mounts"] == [("/opt/envbuild", False)]  # the one payload, read-only
    assert seen["tmpfs"] == ["/results", "/tmp", "/tmp/home"]
    v = cert["verdict"]
    assert v["exit_code"] == ExitCode.UNREACHABLE
    hung, waiting = v["failures"]
    assert re.fullmatch(r"rank 1 did not finish within 40 s \(timeout\): hung: no heartbeat for \d+(\.\d)? s "
                        r"\(frozen or gone\); last in .+", hung), hung
    assert re.fullmatch(r"rank 0 did not finish within 40 s \(timeout\): blocked in .+, waiting for rank 1",
                        waiting), waiting
    assert cert["ranks"]["1"]["last_progress"]["silent_s"] > 10
    print(f"paused: {elapsed:.1f} s")


def test_rank_killed_by_sigkill_is_named_with_the_signal(client, image, tmp_path, labels):
    case = f"envbuild.test-case={labels['envbuild.test-case']}"

    def kill():
        c = _node_container(client, case, 1)
        os.kill(_rank_pid(c.labels[engine.RUN_LABEL], 1), signal.SIGKILL)
    t = _when_rank_started(client, case, 1, kill)
    cert, elapsed = run_certify(client, image, tmp_path, labels)
    t.join(1)
    v = cert["verdict"]
    assert v["exit_code"] == ExitCode.CHECK_FAILED
    assert "rank 1 killed by SIGKILL (exit 137)" in v["failures"], v
    assert all("\n" not in f for f in v["failures"])
    print(f"sigkill rank: {elapsed:.1f} s")


# --------------------------------------------------------------------------- envbuild itself killed


def test_envbuild_killed_with_sigkill_leaves_nothing_running(client, image, tmp_path, labels):
    """kill -9 of a real `envbuild certify` while one rank is stopped (so the run would
    hang): the node containers end and are removed by themselves within timeout + 30 s;
    the network, which cannot remove itself, carries its deadline and the next run
    removes it, naming it."""
    timeout = 20
    case = f"envbuild.test-case={labels['envbuild.test-case']}"
    env = {**os.environ, base.EXTRA_LABELS_ENV: ",".join(f"{k}={v}" for k, v in labels.items())}
    t0 = time.monotonic()
    proc = subprocess.Popen(
        [sys.executable, "-m", "builder.cli", "--images-dir", str(tmp_path), "certify", image,
         "--backend", "gloo", "--nodes", "2", "--timeout", str(timeout)],
        cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline and not _rank_started(client, case, 1):
            time.sleep(0.05)
        c1 = _node_container(client, case, 1)
        run_id = c1.labels[engine.RUN_LABEL]
        os.kill(_rank_pid(run_id, 1), signal.SIGSTOP)
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=10)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    def containers():
        return client.containers.list(all=True, filters={"label": case})

    assert len(containers()) == 2, "the nodes were gone before envbuild was killed: nothing tested"
    while containers() and time.monotonic() - t0 < timeout + 60:
        time.sleep(0.5)
    gone_after = time.monotonic() - t0
    assert containers() == []
    assert gone_after < timeout + 30, gone_after
    assert _processes_of_run(run_id) == []
    (net,) = client.networks.list(filters={"label": f"{engine.RUN_LABEL}={run_id}"})
    deadline_text = net.attrs["Labels"][engine.DEADLINE_LABEL]
    assert net.name == f"envbuild-{run_id}"
    wait = engine._parse_deadline(deadline_text) - time.time()
    time.sleep(max(0.0, wait) + 1)
    cert, _ = run_certify(client, image, tmp_path, labels)  # the next run removes it
    assert (f"removed network envbuild-{run_id} of run {run_id}, left behind by an envbuild that did not "
            f"clean up (its deadline {deadline_text} passed)") in cert["verdict"]["warnings"]
    assert client.networks.list(filters={"label": f"{engine.RUN_LABEL}={run_id}"}) == []
    print(f"sigkill envbuild: containers gone after {gone_after:.1f} s")


# --------------------------------------------------------------------------- a full disk


@pytest.fixture
def tiny_disk(tmp_path):
    """A tmpfs of 4 KiB (root only; one page): room for the folders, not for a certificate (~10 KiB)."""
    with tmpfs(tmp_path / "tiny", "4k") as mnt:
        yield mnt


def test_full_disk_names_the_file_and_still_prints_the_verdict(client, image, tiny_disk, labels):
    env = {**os.environ, base.EXTRA_LABELS_ENV: ",".join(f"{k}={v}" for k, v in labels.items())}
    proc = subprocess.run(
        [sys.executable, "-m", "builder.cli", "--images-dir", str(tiny_disk), "certify", image,
         "--backend", "gloo", "--nodes", "2", "--timeout", "120"],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=300,
    )
    assert proc.returncode == 3, (proc.stdout, proc.stderr)
    assert "verdict: PASSED" in proc.stdout
    (line,) = [x for x in proc.stderr.splitlines() if x.startswith("error: ")]
    assert re.fullmatch(rf"error: {re.escape(str(tiny_disk))}/cpu-torch2/certificates/cpu-torch2-[0-9a-f]{{12}}-"
                        r"\d{8}T\d{6}Z-[0-9a-f]{12}\.json: cannot write the certificate: No space left on device",
                        line), line
    assert "Traceback" not in proc.stderr
    assert list((tiny_disk / "cpu-torch2" / "certificates").iterdir()) == []  # nothing half-written
