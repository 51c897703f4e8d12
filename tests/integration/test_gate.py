"""envbuild gate (issue 11) on this host against a real certificate of the cpu-torch2 image: the
host probe, the image probed on the node, doctor's fast local checks, the history folder, and
the Slurm Prolog (scripts/slurm/prolog-gate.sh) on the real one-node Slurm: a passing node runs
the job, a failing one is drained with the gate's reason and the job does not run there."""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import time
from pathlib import Path

import pytest
from fixtures_gate import rank_probe, write_cert

from builder.nodes import report as nodereport
from builder.nodes.gate import history_dir

from fixtures_nodes import ROOT, run_envbuild

pytest_plugins = ["fixtures_gate", "fixtures_nodes"]  # the certificate, nodes_factory, slurm_node

HOST = socket.gethostname()


def gate(*args: str, session: str, timeout: float = 300) -> subprocess.CompletedProcess:
    """``envbuild gate ARGS``, stale containers looked for among this test session's only."""
    return run_envbuild("gate", *args, "--stale-label", f"envbuild.test-session={session}", timeout=timeout)


def last_line(proc: subprocess.CompletedProcess) -> str:
    return proc.stdout.strip().splitlines()[-1]


def test_gate_passes_on_this_host_and_appends_its_report(certificate, tmp_path, test_session_id):
    _, path = certificate
    hist = tmp_path / "hist"
    for _ in range(2):
        proc = gate("--against", str(path), "--history", str(hist), session=test_session_id)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        assert last_line(proc) == f"gate: {HOST} against {path}: 0 failed, 0 warnings -> exit 0"
    files = sorted((hist / HOST).glob("*.json"))
    assert len(files) == 2
    report = nodereport.load_file(str(files[-1]))
    assert report.scope == "host" and report.hostname == HOST and report.probed_at is not None
    # the history is what verify --against reads back as one node with its drift
    proc = run_envbuild("verify", "--against", str(path), *map(str, files), "--json")
    doc = json.loads(proc.stdout)
    assert proc.returncode == 0, doc["findings"]
    assert [d["node"] for d in doc["drift"]] == [HOST]


def test_gate_image_drifted_from_its_certificate_fails(certificate, tmp_path, torch_image, test_session_id):
    cert, path = certificate
    proc = gate("--against", str(path), "--image", torch_image, "--no-history", session=test_session_id)
    assert proc.returncode == 0, proc.stdout + proc.stderr  # the twin: the certified image as it is
    torch = rank_probe(cert)["torch"]["version"]
    drifted = write_cert(tmp_path, cert, **{"probe.0.torch.version": "2.5.1+cpu"})
    proc = gate("--against", drifted, "--image", torch_image, "--no-history", session=test_session_id)
    assert proc.returncode == 2
    assert proc.stdout.splitlines()[0] == f"fail: must-match: torch.version: certified 2.5.1+cpu; {torch} on {HOST}"
    assert last_line(proc) == f"gate: {HOST} against {drifted}: 1 failed, 0 warnings -> exit 2"


def test_gate_json_prints_only_its_document(certificate, test_session_id):
    _, path = certificate
    proc = gate("--against", str(path), "--no-history", "--json", session=test_session_id)
    doc = json.loads(proc.stdout)
    assert proc.returncode == 0
    assert (doc["schema"], doc["node"], doc["exit_code"], doc["lines"]) == ("envbuild.gate/1", HOST, 0, [])
    assert [c["name"] for c in doc["checks"]] == ["shm", "gpu-uuid", "gpu-processes", "interface",
                                                  "stale-containers"]
    assert doc["verify"]["schema"] == "envbuild.verify/1"


def test_gate_shm_check_fails_below_the_floor(certificate, test_session_id):
    _, path = certificate
    proc = gate("--against", str(path), "--no-history", "--min-shm", "100000g", "--checks", "shm",
                session=test_session_id)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert proc.stdout.splitlines()[0].startswith(f"fail: shm: {HOST}: /dev/shm is ")
    assert proc.stdout.splitlines()[0].endswith(", below 97.7 TiB")


def test_gate_finds_a_stale_envbuild_container(certificate, torch_image, nodes_factory, test_session_id):
    _, path = certificate
    c = nodes_factory.start(torch_image, "stale", labels={"envbuild": "1", "envbuild.run": "c11stale0001"})
    time.sleep(2.5)
    proc = gate("--against", str(path), "--no-history", "--checks", "stale-containers", "--stale-after", "1s",
                session=test_session_id)
    assert proc.returncode == 2, proc.stdout
    assert proc.stdout.splitlines()[0] == f"fail: stale-containers: 1 stale envbuild containers: {c.name}"
    proc = gate("--against", str(path), "--no-history", "--checks", "stale-containers", "--stale-after", "1h",
                session=test_session_id)  # its twin: the same container, young enough
    assert proc.returncode == 0, proc.stdout


def test_gate_usage_errors_exit_64(tmp_path):
    for args, text in [(["--node", "a b"], "is not a Slurm node name"), (["--checks", "shm,nope"], "choose from"),
                       (["--history", str(tmp_path), "--no-history"], "do not go together")]:
        proc = run_envbuild("gate", "--against", str(tmp_path / "c.json"), *args)
        assert proc.returncode == 64, (args, proc.stderr)
        assert text in proc.stderr


def test_gate_without_a_certificate_exits_3(tmp_path):
    proc = run_envbuild("gate", "--against", str(tmp_path / "none.json"), "--no-history")
    assert proc.returncode == 3
    assert proc.stderr.strip() == f"error: {tmp_path / 'none.json'}: no such certificate or node report"


def test_history_folder_default():
    assert history_dir({"XDG_STATE_HOME": "/s"}, uid=1000) == Path("/s/envbuild/gate")
    assert history_dir({"HOME": "/home/u"}, uid=1000) == Path("/home/u/.local/state/envbuild/gate")
    assert history_dir({"XDG_STATE_HOME": "/s"}, uid=0) == Path("/var/lib/envbuild/gate")


# --- Slurm Prolog --------------------------------------------------------------------------------

SLURM_CONF = Path("/etc/slurm/slurm.conf")


def node_state(node: str) -> tuple[str, str]:
    """``(state, reason)`` of the node, from ``sinfo``."""
    out = subprocess.run(["sinfo", "-h", "-n", node, "-o", "%t|%E"], capture_output=True, text=True,
                         timeout=30).stdout.strip()
    state, _, reason = out.partition("|")
    return state, reason


def wait_node(node: str, want: str, timeout: float = 60) -> tuple[str, str]:
    """Wait until the node's state is ``want``; its ``(state, reason)`` then (or last seen)."""
    deadline = time.monotonic() + timeout
    seen = node_state(node)
    while seen[0] != want and time.monotonic() < deadline:
        time.sleep(1)
        seen = node_state(node)
    return seen


def wait_job(job: str, timeout: float = 120) -> str:
    """Wait until the job has ended (gone from squeue) or is held; its last state and reason."""
    deadline = time.monotonic() + timeout
    last = ""
    while time.monotonic() < deadline:
        last = subprocess.run(["squeue", "-h", "-j", job, "-o", "%T %r"], capture_output=True, text=True,
                              timeout=30).stdout.strip()
        if not last or "held" in last:
            return last
        time.sleep(1)
    raise AssertionError(f"job {job} still {last!r} after {timeout} s")


@pytest.fixture
def prolog(slurm_node, tmp_path, test_session_id):
    """The gate as the Prolog of the real one-node Slurm; yields a function that sets its
    arguments (``GATE_ARGS``); slurm.conf and the node's state are restored afterwards."""
    script = tmp_path / "prolog-gate.sh"
    conf = tmp_path / "gate.conf"
    text = (ROOT / "scripts" / "slurm" / "prolog-gate.sh").read_text()
    script.write_text(text.replace("CONF=/etc/envbuild/gate.conf", f"CONF={conf}")
                      .replace("LOG=/var/log/envbuild-gate.log", f"LOG={tmp_path / 'gate.log'}"))
    script.chmod(0o755)
    saved = SLURM_CONF.read_text()

    def set_args(args: str) -> None:
        conf.write_text(f"ENVBUILD={ROOT / '.venv' / 'bin' / 'envbuild'}\n"
                        f"GATE_ARGS=\"{args} --history {tmp_path / 'hist'} "
                        f"--stale-label envbuild.test-session={test_session_id}\"\n")

    SLURM_CONF.write_text(saved.rstrip("\n") + f"\nProlog={script}\n")
    subprocess.run(["scontrol", "reconfigure"], check=True, timeout=60)
    try:
        yield set_args
    finally:
        SLURM_CONF.write_text(saved)
        subprocess.run(["scontrol", "reconfigure"], timeout=60)
        subprocess.run(["scontrol", "update", f"NodeName={slurm_node}", "State=RESUME"], capture_output=True,
                       timeout=30)
        shutil.rmtree(tmp_path / "hist", ignore_errors=True)


def submit(tmp_path: Path, name: str) -> tuple[str, Path]:
    """Submit a job that writes ``tmp_path/name``; ``(job id, that file)``."""
    marker = tmp_path / name
    job = subprocess.run(["sbatch", "--parsable", "-p", "debug", "-o", str(tmp_path / f"{name}.out"),
                          "--wrap", f"echo ran > {marker}"], capture_output=True, text=True, check=True,
                         timeout=60).stdout.strip()
    return job, marker


def test_slurm_prolog_runs_the_job_on_a_passing_node(prolog, slurm_node, certificate, tmp_path, torch_image):
    _, path = certificate
    prolog(f"--against {path} --image {torch_image}")
    job, marker = submit(tmp_path, "ran")
    assert wait_job(job) == ""
    assert marker.read_text() == "ran\n"
    assert node_state(slurm_node)[0].rstrip("*") in ("idle", "mix", "alloc")
    assert f"gate: {slurm_node} against {path}: 0 failed, 0 warnings -> exit 0" in (tmp_path / "gate.log").read_text()


def test_slurm_prolog_with_warnings_only_runs_the_job(prolog, slurm_node, certificate, tmp_path):
    cert, _ = certificate
    old = write_cert(tmp_path, cert, name="old.json", finished_at="2026-01-01T00:00:00Z")
    prolog(f"--against {old}")
    job, marker = submit(tmp_path, "ran")
    assert wait_job(job) == ""
    assert marker.read_text() == "ran\n"
    assert node_state(slurm_node)[0].rstrip("*") in ("idle", "mix", "alloc")
    assert "0 failed, 1 warnings -> exit 1" in (tmp_path / "gate.log").read_text()


def test_slurm_prolog_drains_a_failing_node_and_the_job_does_not_run(prolog, slurm_node, certificate, tmp_path,
                                                                      torch_image):
    cert, _ = certificate
    torch = rank_probe(cert)["torch"]["version"]
    drifted = write_cert(tmp_path, cert, name="drifted.json", **{"probe.0.torch.version": "2.5.1+cpu"})
    prolog(f"--against {drifted} --image {torch_image}")
    job, marker = submit(tmp_path, "ran")
    try:
        state = wait_job(job)
        log = (tmp_path / "gate.log").read_text()
        assert state == "PENDING launch failed requeued held", log
        assert not marker.exists()
        assert wait_node(slurm_node, "drain") == (
            "drain", f"envbuild gate: fail: must-match: torch.version: certified 2.5.1+cpu; {torch} on {slurm_node}")
    finally:
        subprocess.run(["scancel", job], timeout=30)
    # resume as the README says, and the node takes jobs again
    subprocess.run(["scontrol", "update", f"NodeName={slurm_node}", "State=RESUME"], check=True, timeout=30)
    assert node_state(slurm_node)[0].rstrip("*") == "idle"  # '*': not yet answered since slurm.conf changed
