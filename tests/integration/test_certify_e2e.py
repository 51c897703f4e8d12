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

from builder.core.documents import NodeReport
from builder.core.errors import EnvbuildError, ExitCode
from builder.core.model import convert
from builder.image import engine
from builder.image.probecheck import compare_probe_to_lock
from builder.launchers import base
from builder.launchers.local import LocalDockerLauncher
from builder.recipe.lock import validate_lock

from certify_helpers import certify_image
from helpers import tmpfs

SHORT = dict(sizes=[8, 1024, 65536], iters=3, warmup=1, nodes=2, backend="gloo")
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
    found = [f"container {c.name}" for c in client.sdk.containers.list(all=True, filters={"label": label})]
    found += [f"network {n.name}" for n in client.sdk.networks.list(filters={"label": label})]
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
    assert cert["schema"] == "envbuild.certificate/2"
    assert "allreduce" not in cert and "ddp" not in cert  # each measurement once: the profile's
    assert cert["world_size"] == 2 and cert["nodes"] == 2 and cert["gpus_per_node"] == 0
    assert cert["backend"]["used"] == "gloo"
    assert [r["size_bytes"] for r in cert["collectives"]["all_reduce"]] == SHORT["sizes"]
    for row in cert["collectives"]["all_reduce"]:
        assert row["wrong"] == 0 and row["wrong_ranks"] == []
        assert row["busbw_gbps"] >= 0 and row["time_us"] > 0
    ddp = cert["training"]["ddp"]
    assert ddp["reference_match"] is True
    # the recipe's certify.ddp sets the check and scaling (the image's lock: 4 images of 32 px)
    s = cert["settings"]
    assert (ddp["batch_per_rank"], ddp["image_size"], ddp["steps"]) == (s["ddp_batch"], s["ddp_image_size"],
                                                                      s["ddp_steps"]) == (4, 32, 3)
    assert (cert["scaling"]["batch_per_rank"], cert["scaling"]["image_size"]) == (4, 32)
    assert set(cert["probe"]) == {"0", "1"}
    for r, probe in cert["probe"].items():
        assert probe["hostname"] == f"node-{r}"
        assert compare_probe_to_lock(convert(probe, NodeReport), validate_lock(cert["lock"], "lock")) == []
    assert cert["transports"] is None and cert["nccl"] is None
    assert cert["image"]["labels"]["envbuild.lock-hash"] == cert["lock_hash"]
    assert cert["node_status"] == {"0": {"name": "node-0", "exit_code": 0},
                                   "1": {"name": "node-1", "exit_code": 0}}
    # the image sets no socket interface and neither did envbuild: the libraries chose
    assert cert["socket"] == {"source": "default", "override": None, "GLOO_SOCKET_IFNAME": None,
                              "NCCL_SOCKET_IFNAME": None,
                              "seen_by_ranks": {r: {"GLOO_SOCKET_IFNAME": None, "NCCL_SOCKET_IFNAME": None}
                                                for r in ("0", "1")}}
    # host-side phase times, in order, covering the run's wall time (but for writing the files)
    assert [p["name"] for p in cert["phases"]] == ["containers up", "ranks up", "import torch", "init", "profiles",
                                                   "probe", "write", "exit", "teardown", "other"]
    assert all(p["seconds"] >= 0 for p in cert["phases"])
    # the phases cover the run: all but the caller's planning and inspection (2 s, or 5% under load)
    assert elapsed - max(2.0, 0.05 * elapsed) < sum(p["seconds"] for p in cert["phases"]) <= elapsed, \
        (elapsed, cert["phases"])
    print(f"pass: {elapsed:.1f} s")


def test_corrupt_allreduce_names_rank_1(client, image, tmp_path, labels):
    cert, elapsed = run_certify(client, image, tmp_path, labels,
                                extra_env={"ENVBUILD_BENCH_PROFILE_FAULT": "collective-corrupt:all_reduce@1"})
    v = cert["verdict"]
    assert not v["passed"] and v["exit_code"] == ExitCode.CHECK_FAILED
    assert len(v["failures"]) == 1
    assert v["failures"][0].startswith("collective all_reduce wrong at 8 B float32 (1 wrong element on rank 1)")
    assert all(row["wrong_ranks"] == [1] for row in cert["collectives"]["all_reduce"])
    print(f"allreduce-corrupt: {elapsed:.1f} s")


def node_log_events(tmp_path: Path, cert: dict) -> list[dict]:
    """The node logs gathered beside the certificate (``.logs.jsonl``, 0600), each line checked
    against the published log-event schema."""
    import jsonschema

    [logs] = (tmp_path / cert["recipe"] / "certificates").glob("*.logs.jsonl")
    assert logs.name.removesuffix(".logs.jsonl") + ".json" in os.listdir(logs.parent)
    assert logs.stat().st_mode & 0o777 == 0o600
    schema = json.loads((REPO / "schemas/log-event.schema.json").read_text())
    evs = [json.loads(line) for line in logs.read_text().splitlines()]
    for e in evs:
        jsonschema.validate(e, schema)
    return evs


def test_rank_exits_early(client, image, tmp_path, labels):
    cert, elapsed = run_certify(client, image, tmp_path, labels, extra_env={"ENVBUILD_BENCH_FAULT": "exit@1"})
    v = cert["verdict"]
    assert v["exit_code"] == ExitCode.CHECK_FAILED
    assert "rank 1 exited with 3" in v["failures"]
    assert cert["ranks"]["1"]["reported"] is False
    # every node's log gathered into the run folder: node-1's tail in the certificate is the end of its events
    evs = node_log_events(tmp_path, cert)
    assert {(e["run"], e["event"]) for e in evs} == {(cert["run_id"], "log")}
    node1 = [e for e in evs if e["node"] == "node-1"]
    tail = [line for line in cert["node_status"]["1"]["log_tail"] if line.strip()]
    assert tail and [e["msg"] for e in node1][-len(tail):] == tail
    assert {e["rank"] for e in node1} == {1} and "error" in {e["level"] for e in node1}, node1
    assert elapsed < 60  # no waiting for the 120 s timeout
    # the phase rank 1 left the run in is the last bench span; the spans cover the wall time
    assert [p["name"] for p in cert["phases"]] == ["containers up", "ranks up", "import torch", "init (cut short)",
                                                   "teardown", "other"]
    # the phases cover the run: all but the caller's planning and inspection (2 s, or 5% under load)
    assert elapsed - max(2.0, 0.05 * elapsed) < sum(p["seconds"] for p in cert["phases"]) <= elapsed, \
        (elapsed, cert["phases"])
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
    assert waiting == (f"rank 0 did not finish within {timeout} s (timeout): blocked in profiles ddp, "
                       "waiting for rank 1")
    assert timeout <= elapsed < timeout + 45
    # the phase that hung is named, and it holds the time up to the deadline
    names = [p["name"] for p in cert["phases"]]
    assert names == ["containers up", "ranks up", "import torch", "init", "test fault (hung)", "teardown", "other"]
    # from the nodes' start to the end of the hung phase: the deadline, plus killing the nodes
    assert timeout - 1 <= sum(p["seconds"] for p in cert["phases"][1:5]) <= timeout + 15, cert["phases"]
    # the phases cover the run: all but the caller's planning and inspection (2 s, or 5% under load)
    assert elapsed - max(2.0, 0.05 * elapsed) < sum(p["seconds"] for p in cert["phases"]) <= elapsed, \
        (elapsed, cert["phases"])
    print(f"sleep: {elapsed:.1f} s")


def test_unreachable_busbw_floor_names_slowest_rank(client, image, tmp_path, labels):
    cert, elapsed = run_certify(client, image, tmp_path, labels, min_busbw_gbps=1e9)
    v = cert["verdict"]
    assert v["exit_code"] == ExitCode.CHECK_FAILED
    gate = cert["settings"]
    assert gate["min_busbw_gbps"] == 1e9 and gate["busbw_size"] == 65536 and gate["busbw_source"] == "argument"
    row = next(r for r in cert["collectives"]["all_reduce"] if r["size_bytes"] == 65536 and r["type"] == "float32")
    slowest = row["slowest_rank"]
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
    for c in client.sdk.containers.list(all=True, filters={"label": [case_label, "envbuild.node=0"]}):
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
            seen = client.sdk.containers.list(all=True, filters={"label": case})
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


def _derived_image(client, request, ctx: Path, name: str, dockerfile: str):
    """Build ``envbuild-test/NAME:<random>`` from ``dockerfile`` with the session's label; yield
    its tag, then remove it (the session cleanup removes it too)."""
    (ctx / "Dockerfile").write_text(dockerfile)
    try:
        session = dict(request.getfixturevalue("test_labels"))
    except pytest.FixtureLookupError:
        session = {"envbuild.test-session": uuid.uuid4().hex}
    tag = f"envbuild-test/{name}:{uuid.uuid4().hex[:12]}"
    client.build(ctx, tag, labels=session)
    yield tag
    try:
        client.sdk.images.remove(tag, force=True)
    except Exception:  # noqa: BLE001
        pass


@pytest.fixture(scope="module")
def lo_image(client, image, tmp_path_factory, request) -> str:
    """An image FROM the certified one whose own ENV selects loopback for gloo (it keeps
    envbuild's labels: the same lock); removed at the end of the module."""
    yield from _derived_image(client, request, tmp_path_factory.mktemp("lo-image"), "lo",
                              f"FROM {image}\nENV GLOO_SOCKET_IFNAME=lo\n")


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


@pytest.fixture(scope="module")
def lo_foreign_image(client, image, tmp_path_factory, request) -> str:
    """The loopback image without envbuild's lock labels (a foreign image: the probe would be
    the reference, but no rank gets as far as reporting one); removed at the end of the module."""
    yield from _derived_image(client, request, tmp_path_factory.mktemp("lo-foreign-image"), "lo-foreign",
                              f'FROM {image}\nENV GLOO_SOCKET_IFNAME=lo\n'
                              'LABEL envbuild.lock="" envbuild.lock-hash="" envbuild.recipe=""\n')


def test_failed_run_prints_and_reports_no_placeholder(client, lo_foreign_image, tmp_path, labels):
    """No rank reports (loopback): the terminal and the HTML report say in one line what is
    missing and why, with no None, no '-' placeholder and no empty table (the twin:
    test_two_nodes_pass prints every table)."""
    env = {**os.environ, base.EXTRA_LABELS_ENV: ",".join(f"{k}={v}" for k, v in labels.items()), "COLUMNS": "300"}
    proc = subprocess.run(
        [sys.executable, "-m", "builder.cli", "--images-dir", str(tmp_path), "certify", lo_foreign_image,
         "--backend", "gloo", "--nodes", "2", "--timeout", "60"],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    out = proc.stdout
    assert proc.returncode == 2, (out, proc.stderr)
    assert f"{lo_foreign_image}: no recipe lock, and no rank's probe reported a stack, backend gloo" in out, out
    assert ("collectives and training checks of ddp: no results, 0 of 2 rank(s) reported a result "
            "(see the failures)") in out, out
    assert "None" not in out and "┏" not in out, out  # no table at all: each would be empty
    assert "fail: GLOO_SOCKET_IFNAME=lo (from the image's ENV)" in out
    (report_line,) = [x for x in out.splitlines() if x.startswith("report: ")]
    page = Path(report_line.removeprefix("report: ")).read_text()
    text = re.sub(r"<[^>]+>", " ", re.sub(r"<(style|svg)\b.*?</\1>", "", page, flags=re.S))
    assert "None" not in text and "rank -" not in text
    assert not re.search(r"<td[^>]*>\s*-\s*</td>", page), page
    for table in re.findall(r"<table\b.*?</table>", page, flags=re.S):  # a header and at least one row
        assert len(re.findall(r"<td\b", table)) > 0, table
    assert "no recipe lock, and no rank&#39;s probe reported a stack" in page
    assert "no rank&#39;s probe reported: 0 of 2 rank(s) reported a result" in page
    assert ("This certificate holds no collective results: 0 of 2 rank(s) reported a result "
            "(see the failures).") in page
    assert "no result; last in init process group (gloo)" in page
    case = f"envbuild.test-case={labels['envbuild.test-case']}"
    assert _leftovers(client, case) == []


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
    found = client.sdk.containers.list(filters={"label": [case_label, f"envbuild.node={node}"]})
    return found[0] if found else None


def _rank_started(client, case_label: str, node: int) -> bool:
    """Whether the bench on ``node`` printed its first progress line (before it imports
    torch: any moment from then until the end of the run finds the rank still running)."""
    try:
        for c in client.sdk.api.containers(all=True, filters={"label": [case_label, f"envbuild.node={node}"]}):
            if b'"phase": "start"' in client.sdk.api.logs(c["Id"]):
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


@pytest.mark.parametrize("fault", ["oom@1", None], ids=["oom", "twin-within-the-limit"])
def test_oom_killed_rank_is_named_from_the_engine(client, image, tmp_path, labels, fault):
    """Nodes with a 1536 MiB memory limit: rank 1 allocating 2 GiB is named as killed by the
    kernel's OOM killer (Docker's oom event), not as a plain SIGKILL; without the fault the
    same limit passes."""
    launcher = LocalDockerLauncher(client, memory="1536m")
    cert, elapsed = run_certify(client, image, tmp_path, labels, launcher=launcher,
                                extra_env={"ENVBUILD_BENCH_FAULT": fault} if fault else None)
    v = cert["verdict"]
    if fault is None:
        assert v["passed"], v
        return
    assert v["exit_code"] == ExitCode.CHECK_FAILED
    assert "rank 1 killed by the kernel's OOM killer (memory limit 1610612736 bytes)" in v["failures"], v
    assert not any("SIGKILL" in f for f in v["failures"]), v
    print(f"oom: {elapsed:.1f} s")


# --------------------------------------------------------------------------- envbuild itself killed


def _start_certify(image: str, tmp_path, labels: dict, timeout: int):
    """``(case label filter, start time, process)`` of a real `envbuild certify` of 2 gloo nodes
    started in the background (its output discarded)."""
    case = f"envbuild.test-case={labels['envbuild.test-case']}"
    env = {**os.environ, base.EXTRA_LABELS_ENV: ",".join(f"{k}={v}" for k, v in labels.items())}
    t0 = time.monotonic()
    proc = subprocess.Popen(
        [sys.executable, "-m", "builder.cli", "--images-dir", str(tmp_path), "certify", image,
         "--backend", "gloo", "--nodes", "2", "--timeout", str(timeout)],
        cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    return case, t0, proc


def test_envbuild_killed_with_sigkill_leaves_nothing_running(client, image, tmp_path, labels):
    """kill -9 of a real `envbuild certify` while one rank is stopped (so the run would
    hang): the node containers end and are removed by themselves within timeout + 30 s;
    the network, which cannot remove itself, carries its deadline and the next run
    removes it, naming it."""
    timeout = 20
    case, t0, proc = _start_certify(image, tmp_path, labels, timeout)
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
        return client.sdk.containers.list(all=True, filters={"label": case})

    assert len(containers()) == 2, "the nodes were gone before envbuild was killed: nothing tested"
    while containers() and time.monotonic() - t0 < timeout + 60:
        time.sleep(0.5)
    gone_after = time.monotonic() - t0
    assert containers() == []
    assert gone_after < timeout + 30, gone_after
    assert _processes_of_run(run_id) == []
    (net,) = client.sdk.networks.list(filters={"label": f"{engine.RUN_LABEL}={run_id}"})
    deadline_text = net.attrs["Labels"][engine.DEADLINE_LABEL]
    assert net.name == f"envbuild-{run_id}"
    wait = engine._parse_deadline(deadline_text) - time.time()
    time.sleep(max(0.0, wait) + 1)
    cert, _ = run_certify(client, image, tmp_path, labels)  # the next run removes it
    assert (f"removed network envbuild-{run_id} of run {run_id}, left behind by an envbuild that did not "
            f"clean up (its deadline {deadline_text} passed)") in cert["verdict"]["warnings"]
    assert client.sdk.networks.list(filters={"label": f"{engine.RUN_LABEL}={run_id}"}) == []
    print(f"sigkill envbuild: containers gone after {gone_after:.1f} s")


def test_envbuild_killed_with_a_paused_node_leaves_nothing_running(client, image, tmp_path, labels):
    """kill -9 of `envbuild certify` while node 1 is frozen by `docker pause` (its watchdog
    frozen with it): the paused node and the running node 0 are both ended and removed
    within timeout + 30 s."""
    timeout = 20
    case, t0, proc = _start_certify(image, tmp_path, labels, timeout)
    try:
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline and not (_node_container(client, case, 0)
                                                   and _node_container(client, case, 1)):
            time.sleep(0.05)
        c1 = _node_container(client, case, 1)
        for _ in range(20):  # runc may fail to freeze a tree that is busy forking: try again
            try:
                c1.pause()
                break
            except docker.errors.APIError:
                time.sleep(0.2)
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=10)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()

    def containers():
        return {c.labels["envbuild.node"]: c.status for c in client.sdk.containers.list(all=True, filters={"label": case})}

    assert containers() == {"0": "running", "1": "paused"}, "nothing tested"
    while containers() and time.monotonic() - t0 < timeout + 60:
        time.sleep(0.5)
    gone_after = time.monotonic() - t0
    assert containers() == {}
    assert gone_after < timeout + 30, gone_after
    assert _processes_of_run(c1.labels[engine.RUN_LABEL]) == []
    print(f"sigkill envbuild, paused node: containers gone after {gone_after:.1f} s")


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
