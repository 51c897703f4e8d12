"""envbuild gate on this host against a real certificate of the cpu-torch2 image: the host probe,
the image probed on the node (kept per image ID), doctor's fast local checks, the history folder,
and the Slurm Prolog (scripts/slurm/prolog-gate.sh) on the real one-node Slurm: every row of its
policy (docs/slurm-gate.md) with a real job, the job run or held and the node drained with
envbuild's reason."""

from __future__ import annotations

import fcntl
import itertools
import json
import shutil
import socket
import subprocess
import time
from pathlib import Path

import pytest
from fixtures_gate import rank_probe, write_cert
from test_gate_units import gate  # noqa: F401

from builder.nodes import report as nodereport

from fixtures_nodes import ROOT, run_envbuild

pytest_plugins = ["fixtures_gate", "fixtures_nodes"]  # the certificate, nodes_factory, slurm_node

HOST = socket.gethostname()

#: The class and next step ending a failing line (builder/core/errors.py NEXT_STEPS).
IMAGE = " [image] next: fix the image (or the node image) and run again"
WORKLOAD = " [workload] next: look at the job that ran (an application fault); the GPU stays usable"


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
    proc = gate("--against", str(path), "--image", cert["image"]["id"], "--no-history", session=test_session_id)
    assert proc.returncode == 0, proc.stdout + proc.stderr  # the twin: the certified image as it is
    torch = rank_probe(cert)["torch"]["version"]
    drifted = write_cert(tmp_path, cert, **{"probe.0.torch.version": "2.5.1+cpu"})
    proc = gate("--against", drifted, "--image", cert["image"]["id"], "--no-history", session=test_session_id)
    assert proc.returncode == 2
    assert proc.stdout.splitlines()[0] == f"fail: must-match: torch.version: certified 2.5.1+cpu; {torch} on {HOST}{IMAGE}"
    assert last_line(proc) == f"gate: {HOST} against {drifted}: 1 failed, 0 warnings -> exit 2"


@pytest.fixture(scope="session")
def relabelled_torch_image(docker_client, torch_image, test_labels, test_session_id, tmp_path_factory) -> str:
    """``torch_image`` with one more label: the same software, another image ID."""

    ctx = tmp_path_factory.mktemp("relabelled")
    (ctx / "Dockerfile").write_text(f"FROM {torch_image}\nLABEL envbuild.test-relabelled=1\n")
    tag = f"envbuild-test/torch-relabelled:{test_session_id}"
    docker_client.build(ctx, tag, labels=test_labels)
    return tag


def test_gate_refuses_another_image_than_certified(certificate, relabelled_torch_image, torch_image, docker_client,
                                                   test_session_id):
    cert, path = certificate
    other = docker_client.sdk.images.get(relabelled_torch_image).id
    proc = gate("--against", str(path), "--image", other, "--no-history", session=test_session_id)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert proc.stdout.splitlines()[0] == (f"fail: must-match: image.id: certified {cert['image']['id']}; "
                                           f"{other} on {HOST}{IMAGE}")
    # a plain tag of the certified image passes but warns that a tag moves
    proc = gate("--against", str(path), "--image", torch_image, "--no-history", session=test_session_id)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert proc.stdout.splitlines()[0] == (f"warn: image-ref: --image {torch_image} is a plain tag, which moves: "
                                           "pin it as REF@sha256:DIGEST (or the image ID) in the job and the gate" + IMAGE)
    # a plain tag of another image is refused
    proc = gate("--against", str(path), "--image", relabelled_torch_image, "--no-history", session=test_session_id)
    assert proc.returncode == 2, proc.stdout
    assert last_line(proc) == f"gate: {HOST} against {path}: 1 failed, 1 warnings -> exit 2"


def test_gate_keeps_the_image_probe_per_image_id(certificate, relabelled_torch_image, docker_client, tmp_path,
                                                test_session_id):
    cert, path = certificate
    torch = rank_probe(cert)["torch"]["version"]
    env = {"ENVBUILD_CACHE_DIR": str(tmp_path / "cache")}
    image_id = cert["image"]["id"]
    proc = gate("--against", str(path), "--image", image_id, "--no-history", session=test_session_id, env=env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    entry = tmp_path / "cache" / "probes" / f"{image_id.removeprefix('sha256:')}.json"
    doc = json.loads(entry.read_text())
    # the kept probe, changed: a second run that reads it (and does not probe again) reports the change
    doc["probe"]["torch"]["version"] = "9.9.9+kept"
    entry.write_text(json.dumps(doc))
    proc = gate("--against", str(path), "--image", image_id, "--no-history", session=test_session_id, env=env)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert proc.stdout.splitlines()[0] == (f"fail: must-match: torch.version: certified {torch}; 9.9.9+kept on {HOST}"
                                           + IMAGE)
    # another image ID is probed anew: its own entry, its true torch version
    other = docker_client.image(relabelled_torch_image).id
    proc = gate("--against", str(path), "--image", other, "--no-history", session=test_session_id, env=env)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert proc.stdout.splitlines()[:-1] == [f"fail: must-match: image.id: certified {image_id}; {other} on {HOST}{IMAGE}"]
    kept = json.loads((tmp_path / "cache" / "probes" / f"{other.removeprefix('sha256:')}.json").read_text())
    assert kept["probe"]["torch"]["version"] == torch


def test_gate_refuses_a_loopback_socket_setting(certificate, test_session_id):
    _, path = certificate
    env = {"GLOO_SOCKET_IFNAME": "lo"}
    proc = gate("--against", str(path), "--no-history", "--checks", "shm", session=test_session_id, env=env)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert proc.stdout.splitlines()[0].startswith(f"fail: interface: GLOO_SOCKET_IFNAME=lo on {HOST} selects the "
                                                  "loopback interface lo (127.0.0.1): other nodes cannot reach it")
    iface = nodereport.validate(json.loads(run_envbuild("probe", "--host").stdout), "host").network
    name = next(i.name for i in iface.interfaces if not i.loopback and i.addresses)
    proc = gate("--against", str(path), "--no-history", "--checks", "shm", session=test_session_id,
                env={"GLOO_SOCKET_IFNAME": name})  # the twin: the host's own interface
    assert proc.returncode == 0, proc.stdout


def test_gate_without_an_engine_warns_that_a_check_did_not_run(certificate, test_session_id):
    _, path = certificate
    proc = gate("--against", str(path), "--no-history", session=test_session_id,
                env={"DOCKER_HOST": "unix:///nonexistent/docker.sock"})
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert proc.stdout.splitlines()[0] == "warn: stale-containers: not checked: no Docker engine here" + WORKLOAD


def test_gate_json_prints_only_its_document(certificate, test_session_id):
    _, path = certificate
    proc = gate("--against", str(path), "--no-history", "--json", session=test_session_id)
    doc = json.loads(proc.stdout)
    assert proc.returncode == 0
    assert (doc["schema"], doc["node"], doc["exit_code"], doc["lines"]) == ("envbuild.gate/1", HOST, 0, [])
    assert [c["name"] for c in doc["checks"]] == ["shm", "gpu-uuid", "gpu-processes", "interface",
                                                  "stale-containers", "gpu-health"]
    assert doc["verify"]["schema"] == "envbuild.verify/1"


def test_gate_shm_check_fails_below_the_floor(certificate, test_session_id):
    _, path = certificate
    proc = gate("--against", str(path), "--no-history", "--min-shm", "100000g", "--checks", "shm",
                session=test_session_id)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert proc.stdout.splitlines()[0].startswith(f"fail: shm: {HOST}: /dev/shm is ")
    assert proc.stdout.splitlines()[0].endswith(", below 97.7 TiB" + IMAGE)


def test_gate_finds_a_stale_envbuild_container(certificate, torch_image, nodes_factory, test_session_id):
    _, path = certificate
    c = nodes_factory.start(torch_image, "stale", labels={"envbuild": "1", "envbuild.run": "c11stale0001"})
    time.sleep(2.5)
    proc = gate("--against", str(path), "--no-history", "--checks", "stale-containers", "--stale-after", "1s",
                session=test_session_id)
    assert proc.returncode == 2, proc.stdout
    assert proc.stdout.splitlines()[0] == f"fail: stale-containers: 1 stale envbuild containers: {c.name}{WORKLOAD}"
    proc = gate("--against", str(path), "--no-history", "--checks", "stale-containers", "--stale-after", "1h",
                session=test_session_id)  # its twin: the same container, young enough
    assert proc.returncode == 0, proc.stdout


# --- Slurm Prolog --------------------------------------------------------------------------------

SLURM_CONF = Path("/etc/slurm/slurm.conf")
HELD = "PENDING launch failed requeued held"
JOBS = itertools.count()
#: Drained, without or with others' jobs still running; up (others' jobs may run on the shared node).
DRAINED, UP = ("drain", "drng"), ("idle", "mix", "alloc")


def node_state(node: str) -> tuple[str, str]:
    """``(state, reason)`` of the node, from ``sinfo``."""
    out = subprocess.run(["sinfo", "-h", "-n", node, "-o", "%t|%E"], capture_output=True, text=True,
                         timeout=30).stdout.strip()
    state, _, reason = out.partition("|")
    return state, reason


def wait_node(node: str, want: tuple[str, ...], timeout: float = 60) -> tuple[str, str]:
    """Wait until the node's state is one of ``want``; its ``(state, reason)`` then (or last seen)."""
    deadline = time.monotonic() + timeout
    seen = node_state(node)
    while seen[0] not in want and time.monotonic() < deadline:
        time.sleep(1)
        seen = node_state(node)
    return seen


def wait_job(job: str, timeout: float = 120) -> str:
    """Wait until the job has ended (gone from squeue) or is held; its last state and reason."""
    deadline = time.monotonic() + timeout
    last = ""
    while time.monotonic() < deadline:
        proc = subprocess.run(["squeue", "-h", "-j", job, "-o", "%T %r"], capture_output=True, text=True, timeout=30)
        last = proc.stdout.strip()
        if proc.returncode == 0 and (not last or "held" in last):  # a busy slurmctld answers nothing: ask again
            return last
        time.sleep(1)
    raise AssertionError(f"job {job} still {last!r} after {timeout} s")


@pytest.fixture
def prolog(slurm_node, tmp_path, test_session_id):
    """The Prolog (scripts/slurm/prolog-gate.sh) of the real one-node Slurm, gating only the
    jobs that run in ``tmp_path``; yields ``configure(args, conf=..., required=...)``, which
    writes its gate.conf (``args`` None: none). slurm.conf and the node are restored after."""
    yield from gate_script(slurm_node, tmp_path, test_session_id, ("Prolog",))


def gate_script(slurm_node: str, tmp_path: Path, test_session_id: str, keys: tuple[str, ...]):
    """The body of :func:`prolog`: the script set as each of ``keys`` of slurm.conf (Prolog, Epilog)."""
    script, conf = tmp_path / "prolog-gate.sh", tmp_path / "gate.conf"
    text = (ROOT / "scripts" / "slurm" / "prolog-gate.sh").read_text()
    text = (text.replace("CONF=/etc/envbuild/gate.conf", f"CONF={conf}")
            .replace("LOG=/var/log/envbuild-gate.log", f"LOG={tmp_path / 'gate.log'}")
            .replace("#!/bin/sh\n", f'#!/bin/sh\n[ "$SLURM_JOB_WORK_DIR" = "{tmp_path}" ] || exit 0\n', 1))

    def configure(args: str | None, conf_lines: str = "", required: bool = False) -> None:
        script.write_text(text.replace('"${ENVBUILD_GATE_REQUIRED:-0}"', "1") if required else text)
        script.chmod(0o755)
        conf.unlink(missing_ok=True)
        if args is not None:
            conf.write_text(f"ENVBUILD={ROOT / '.venv' / 'bin' / 'envbuild'}\n{conf_lines}"
                            f"GATE_ARGS=\"{args} --history {tmp_path / 'hist'} "
                            f"--stale-label envbuild.test-session={test_session_id}\"\n")

    configure(None)
    lock = open("/tmp/envbuild-test-slurm-prolog.lock", "w")  # one Prolog test on this host at a time
    fcntl.flock(lock, fcntl.LOCK_EX)
    saved = SLURM_CONF.read_text()
    SLURM_CONF.write_text(saved.rstrip("\n") + "".join(f"\n{key}={script}" for key in keys) + "\n")
    subprocess.run(["scontrol", "reconfigure"], check=True, timeout=60)
    try:
        yield configure
    finally:
        SLURM_CONF.write_text(saved)
        subprocess.run(["scontrol", "reconfigure"], timeout=60)
        subprocess.run(["scontrol", "update", f"NodeName={slurm_node}", "State=RESUME"], capture_output=True,
                       timeout=30)
        lock.close()
        shutil.rmtree(tmp_path / "hist", ignore_errors=True)


def submit(tmp_path: Path, name: str) -> tuple[str, Path]:
    """Submit a job in ``tmp_path`` that writes ``tmp_path/name``; ``(job id, that file)``."""
    marker = tmp_path / name
    job = subprocess.run(["sbatch", "--parsable", "-p", "debug", "-D", str(tmp_path), "-o",
                          str(tmp_path / f"{name}.out"), "--wrap", f"echo ran > {marker}"],
                         capture_output=True, text=True, check=True, timeout=60).stdout.strip()
    return job, marker


def gate_log(tmp_path: Path) -> list[str]:
    """The Prolog's own lines of its log (the gate's output left out), their time stamps cut."""
    text = (tmp_path / "gate.log").read_text()
    return [line.split(" envbuild-gate: ", 1)[1] for line in text.splitlines() if " envbuild-gate: job " in line]


def assert_runs(tmp_path: Path, slurm_node: str) -> str:
    """The job submitted now runs; the Prolog's last log line."""
    job, marker = submit(tmp_path, f"ran-{next(JOBS)}")
    try:
        assert wait_job(job) == "", gate_log(tmp_path)
    finally:
        subprocess.run(["scancel", job], timeout=30)
    assert marker.read_text() == "ran\n"
    assert node_state(slurm_node)[0].rstrip("*") in UP
    return gate_log(tmp_path)[-1].replace(f"job {job} on {slurm_node}: ", "")


def assert_held(tmp_path: Path, slurm_node: str, reason: str) -> None:
    """The job submitted now is held, not run; the node drained with ``reason``, which the
    job's Comment repeats; then the node is resumed."""
    job, marker = submit(tmp_path, f"ran-{next(JOBS)}")
    try:
        assert wait_job(job) == HELD, gate_log(tmp_path)
        assert not marker.exists()
        assert wait_node(slurm_node, DRAINED) in [(state, reason) for state in DRAINED]
        listed = subprocess.run(["sinfo", "-R", "-h", "-n", slurm_node, "-o", "%n %E"], capture_output=True,
                                text=True, timeout=30).stdout.strip()
        assert listed == f"{slurm_node} {reason}"
        comment = subprocess.run(["squeue", "-h", "-j", job, "-o", "%k"], capture_output=True, text=True,
                                 timeout=30).stdout.strip()
        assert comment == reason
    finally:
        subprocess.run(["scancel", job], timeout=30)
        subprocess.run(["scontrol", "update", f"NodeName={slurm_node}", "State=RESUME"], capture_output=True,
                       timeout=30)
    assert node_state(slurm_node)[0].rstrip("*") in UP  # '*': not yet answered since slurm.conf changed


def test_slurm_prolog_runs_the_job_on_a_passing_node(prolog, slurm_node, certificate, tmp_path, torch_image):
    cert, path = certificate
    prolog(f"--against {path} --image {cert['image']['id']}")
    assert assert_runs(tmp_path, slurm_node) == "gate exit 0: the job runs"
    assert f"gate: {slurm_node} against {path}: 0 failed, 0 warnings -> exit 0" in (tmp_path / "gate.log").read_text()


def test_slurm_prolog_with_warnings_only_runs_the_job(prolog, slurm_node, certificate, tmp_path):
    cert, _ = certificate
    old = write_cert(tmp_path, cert, name="old.json", finished_at="2026-01-01T00:00:00Z")
    prolog(f"--against {old}")
    assert assert_runs(tmp_path, slurm_node) == "gate exit 1: the job runs"
    assert "0 failed, 1 warnings -> exit 1" in (tmp_path / "gate.log").read_text()


def test_slurm_prolog_drains_a_failing_node_and_the_job_does_not_run(prolog, slurm_node, certificate, tmp_path,
                                                                      torch_image):
    cert, _ = certificate
    torch = rank_probe(cert)["torch"]["version"]
    drifted = write_cert(tmp_path, cert, name="drifted.json", **{"probe.0.torch.version": "2.5.1+cpu"})
    prolog(f"--against {drifted} --image {cert['image']['id']}")
    assert_held(tmp_path, slurm_node, f"torch.version {torch}: envbuild gate: fail: must-match: torch.version: "
                                      f"certified 2.5.1+cpu; {torch} on {slurm_node}")


def test_slurm_prolog_drains_a_node_without_the_image(prolog, slurm_node, certificate, tmp_path):
    _, path = certificate
    missing = "envbuild-test/no-such-image:gate"
    prolog(f"--against {path} --image {missing}")
    assert_held(tmp_path, slurm_node, f"image envbuild-test/..: envbuild gate: unknown: image: '{missing}' "
                                      "no such image")


def test_slurm_prolog_without_a_config_runs_the_job_unless_required(prolog, slurm_node, tmp_path):
    conf = tmp_path / "gate.conf"
    assert assert_runs(tmp_path, slurm_node) == (f"not gated, the job runs: no readable {conf} "
                                                 "(set ENVBUILD_GATE_REQUIRED=1 to drain instead)")
    assert len(gate_log(tmp_path)) == 1
    prolog(None, required=True)
    assert_held(tmp_path, slurm_node, f"gate.conf missing: envbuild gate: no readable {conf}, "
                                      "ENVBUILD_GATE_REQUIRED=1")


def test_slurm_prolog_without_envbuild_runs_the_job_unless_required(prolog, slurm_node, tmp_path):
    prolog("--against x.json", conf_lines="ENVBUILD=/nonexistent/envbuild\n")
    assert assert_runs(tmp_path, slurm_node) == ("not gated, the job runs: /nonexistent/envbuild: not found "
                                                 "(set ENVBUILD_GATE_REQUIRED=1 to drain instead)")
    prolog("--against x.json", conf_lines="ENVBUILD=/nonexistent/envbuild\n", required=True)
    assert_held(tmp_path, slurm_node, "envbuild missing: envbuild gate: /nonexistent/envbuild: not found, "
                                      "ENVBUILD_GATE_REQUIRED=1")


def test_slurm_prolog_with_bad_gate_arguments_runs_the_job_unless_required(prolog, slurm_node, tmp_path):
    conf = tmp_path / "gate.conf"
    prolog("--against x.json --checks nope")
    assert assert_runs(tmp_path, slurm_node) == (f"not gated, the job runs: GATE_ARGS of {conf} refused (exit 64) "
                                                 "(set ENVBUILD_GATE_REQUIRED=1 to drain instead)")
    prolog("--against x.json --checks nope", required=True)
    assert_held(tmp_path, slurm_node, f"gate.args 64: envbuild gate: GATE_ARGS of {conf} refused (exit 64), "
                                      "ENVBUILD_GATE_REQUIRED=1")


def test_slurm_prolog_with_a_broken_config_runs_the_job_unless_required(prolog, slurm_node, tmp_path):
    conf = tmp_path / "gate.conf"
    prolog("--against x.json", conf_lines="if then\n")  # not shell
    assert assert_runs(tmp_path, slurm_node) == (f"not gated, the job runs: {conf} does not run as a shell file "
                                                 "(set ENVBUILD_GATE_REQUIRED=1 to drain instead)")
    prolog("--against x.json", conf_lines="if then\n", required=True)
    assert_held(tmp_path, slurm_node, f"gate.conf invalid: envbuild gate: {conf} does not run as a shell file, "
                                      "ENVBUILD_GATE_REQUIRED=1")


def test_slurm_prolog_drains_a_node_whose_gate_overruns_its_bound(prolog, slurm_node, certificate, tmp_path):
    cert, path = certificate
    # an empty probe cache: the image is probed in a container, which takes longer than 1 s
    slow = f"export ENVBUILD_CACHE_DIR={tmp_path / 'cache'}\n"
    prolog(f"--against {path} --image {cert['image']['id']}", conf_lines=slow + "GATE_TIMEOUT_S=1\n")
    assert_held(tmp_path, slurm_node, "gate.timeout 1s: envbuild gate: ran over GATE_TIMEOUT_S, killed")
    prolog(f"--against {path} --image {cert['image']['id']}", conf_lines=slow + "GATE_TIMEOUT_S=120\n")
    assert assert_runs(tmp_path, slurm_node) == "gate exit 0: the job runs"  # the twin: time enough


def test_a_drain_that_fails_keeps_the_summary(slurm_node, certificate, tmp_path, test_session_id):
    cert, _ = certificate
    drifted = write_cert(tmp_path, cert, **{"probe.0.torch.version": "2.5.1+cpu"})
    proc = gate("--against", drifted, "--image", cert["image"]["id"], "--no-history", "--drain",
                "--node", "no-such-node", session=test_session_id)
    assert proc.returncode == 3, proc.stdout + proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0].startswith("fail: must-match: torch.version: certified 2.5.1+cpu; ")
    assert lines[-2].startswith("unknown: drain: --drain: cannot drain no-such-node: scontrol exited 1: ")
    assert lines[-1] == f"gate: {HOST} against {drifted}: 1 failed, 0 warnings -> exit 3"
    # its twin: the node Slurm knows is drained, the summary the same
    proc = gate("--against", drifted, "--image", cert["image"]["id"], "--no-history", "--drain",
                "--node", slurm_node, session=test_session_id)
    try:
        assert proc.returncode == 2, proc.stdout + proc.stderr
        assert proc.stdout.splitlines()[-2].startswith("drained: torch.version ")
    finally:
        subprocess.run(["scontrol", "update", f"NodeName={slurm_node}", "State=RESUME"], timeout=30)
