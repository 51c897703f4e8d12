"""A three-node Slurm cluster of containers (scripts/setup-slurm-cluster.sh, fixture
``slurm_cluster``; docs/slurm-cluster.md): slurmctld and three slurmd machines on their own
network, built FROM the certified torch image, envbuild installed there from wheels offline.
The host's Slurm clients submit (``SLURM_CONF`` of the cluster); the one-node Slurm of
test_slurm.py keeps running beside it.

- ``certify --launcher slurm --nodes 3 --container-runtime none`` passes: each rank runs the
  bench with the node's own Python, on three hosts with three addresses;
- a node stopped mid-job is named in the verdict (exit 3) and nothing of the run is left on
  the other two;
- ``verify --slurm`` and ``doctor --slurm`` pass on the three alike; verify names the one whose
  torch version drifted, ``doctor --checks straggler`` the one whose CPUs are capped.

The cluster is started once per session and torn down at its end (``down``).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from builder.launchers import slurm

from certify_helpers import certify_image
from fixtures_engine import TEST_SESSION_LABEL

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "setup-slurm-cluster.sh"
NODES = ("ebc-n1", "ebc-n2", "ebc-n3")
SHORT = dict(sizes=[8, 1024], iters=2, warmup=1, nodes=3, backend="gloo")
#: The recipe's ENV (OMP_NUM_THREADS=1): a node-native run takes the submitter's environment.
NODE_ENV = {"OMP_NUM_THREADS": "1"}
pytestmark = pytest.mark.serial  # fixed container names, network and munge socket


@dataclass(frozen=True)
class Cluster:
    conf: str
    shared: Path


def _sh(*argv: str, timeout: float = 60, **kw) -> subprocess.CompletedProcess:
    return subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout, **kw)


@pytest.fixture(scope="session")
def slurm_cluster(torch_image, run_labels, tmp_path_factory):
    state = tmp_path_factory.mktemp("slurm-cluster")
    env = {**os.environ, "ENVBUILD_CLUSTER_STATE": str(state), "ENVBUILD_PYTHON": sys.executable,
           "ENVBUILD_CLUSTER_LABELS": f"{TEST_SESSION_LABEL}={run_labels[TEST_SESSION_LABEL]}"}
    env.pop("SLURM_CONF", None)
    t0 = time.monotonic()
    proc = _sh("bash", str(SCRIPT), "up", torch_image, timeout=900, env=env)
    if proc.returncode != 0:
        _sh("bash", str(SCRIPT), "down", env=env)
        pytest.fail(f"setup-slurm-cluster.sh up failed: {(proc.stdout + proc.stderr)[-1500:]}", pytrace=False)
    print(f"slurm cluster up in {time.monotonic() - t0:.0f} s")
    yield Cluster(conf=str(state / "etc" / "slurm.conf"), shared=state / "shared")
    _sh("bash", str(SCRIPT), "down", env=env)


@pytest.fixture
def on_cluster(slurm_cluster, monkeypatch) -> Cluster:
    monkeypatch.setenv("SLURM_CONF", slurm_cluster.conf)
    return slurm_cluster


def node_states() -> dict[str, str]:
    out = _sh("sinfo", "-h", "-N", "-o", "%N %t").stdout
    return dict(line.split() for line in out.splitlines() if line.strip())


def wait_idle(timeout_s: float = 120) -> None:
    deadline = time.monotonic() + timeout_s
    while (states := node_states()) != dict.fromkeys(NODES, "idle"):
        assert time.monotonic() < deadline, states
        for n, s in states.items():
            if s.startswith(("down", "drain", "fail")):
                _sh("scontrol", "update", f"NodeName={n}", "State=RESUME")
        time.sleep(2)


def launcher(cluster: Cluster) -> slurm.SlurmLauncher:
    return slurm.SlurmLauncher(cluster.shared, slurm.SlurmOptions(runtime="none", pending_timeout_s=120),
                               poll_s=1.0)


def run_processes(node: str, run_id: str) -> list[str]:
    """The processes on ``node`` whose command line names the run (its folder)."""
    out = _sh("docker", "exec", node, "ps", "-eo", "args").stdout
    return [line for line in out.splitlines() if f"slurm-{run_id}" in line and "ps -eo" not in line]


def test_certify_three_nodes_with_their_own_python(on_cluster, docker_client, torch_image, tmp_path):
    wait_idle()
    cert, _ = certify_image(docker_client, torch_image, images_dir=tmp_path, launcher=launcher(on_cluster),
                            extra_env=NODE_ENV, timeout_s=400, port=29500, **SHORT)
    assert cert["verdict"]["passed"], cert["verdict"]
    probes = cert["probe"]
    assert sorted(p["hostname"] for p in probes.values()) == list(NODES)
    addresses = {r: p["network"]["hostname_addresses"] for r, p in probes.items()}
    assert sorted(a for v in addresses.values() for a in v if a.startswith("10.213.")) == \
        sorted({a for v in addresses.values() for a in v if a.startswith("10.213.")}) and \
        len({tuple(v) for v in addresses.values()}) == 3, addresses
    # no image was run on the nodes: each probe says so; the certificate names the image whose
    # lock the nodes' stacks were compared against
    assert {p["image"]["ref"] for p in probes.values()} == {None}
    assert cert["image"]["ref"] == torch_image and cert["settings"]["nodes"] == 3
    assert cert["stack"]["torch"] == "2.13.0+cpu", cert["stack"]


def test_node_stopped_mid_job_is_named_and_the_others_are_clean(on_cluster, docker_client, torch_image, tmp_path):
    wait_idle()
    la = launcher(on_cluster)
    box: dict = {}
    run_id = "lost" + os.urandom(4).hex()

    def go() -> None:
        box["cert"], _ = certify_image(docker_client, torch_image, images_dir=tmp_path, launcher=la,
                                       run_id=run_id, timeout_s=400, port=29501,
                                       extra_env={**NODE_ENV, "ENVBUILD_BENCH_FAULT": "sleep@2"}, **SHORT)

    t = threading.Thread(target=go)
    t.start()
    try:
        deadline = time.monotonic() + 180
        while not run_processes("ebc-n3", run_id):
            assert time.monotonic() < deadline and t.is_alive(), "the job never ran on ebc-n3"
            time.sleep(1)
        time.sleep(3)
        assert _sh("docker", "stop", "-t", "1", "ebc-n3").returncode == 0
        t.join(300)
        assert not t.is_alive()
        v = box["cert"]["verdict"]
        assert not v["passed"] and v["exit_code"] == 3, v
        text = " ".join(v["failures"])
        assert "ebc-n3" in text, v
        # Slurm ends the step's processes on the other nodes itself (SIGTERM, SIGKILL after KillWait)
        deadline = time.monotonic() + 60
        while (left := [run_processes(n, run_id) for n in NODES[:2]]) != [[], []]:
            assert time.monotonic() < deadline, left
            time.sleep(2)
    finally:
        t.join(300)
        _sh("docker", "start", "ebc-n3")
        wait_idle(180)


TORCH_VERSION_PY = "/opt/venv/lib/python3.11/site-packages/torch/version.py"


def _drift(node: str, old: str, new: str) -> None:
    """Rewrite torch's version on ``node`` (``torch/version.py``), as a node that drifted."""
    cmd = (f"sed -i \"s/^__version__ = '{old}'$/__version__ = '{new}'/\" {TORCH_VERSION_PY} && "
           f"grep -qx \"__version__ = '{new}'\" {TORCH_VERSION_PY}")
    assert _sh("docker", "exec", node, "sh", "-c", cmd).returncode == 0


def test_verify_and_doctor_compare_the_three_nodes(on_cluster):
    wait_idle()
    exe = str(Path(sys.executable).parent / "envbuild")
    ok = _sh(exe, "verify", "--slurm", "--nodes", "3", timeout=300)
    assert ok.returncode == 0, ok.stdout[-2000:] + ok.stderr[-2000:]
    assert "3 nodes agree in every compared field: ebc-n1, ebc-n2, ebc-n3" in ok.stdout, ok.stdout
    # every check but the timed one (on this shared machine a pair may be slow for a moment)
    doc = _sh(exe, "doctor", "--slurm", "--nodes", "3", "--checks", "nodes,port,interface,shm,stale-containers",
              timeout=400)
    assert doc.returncode == 0, doc.stdout[-3000:] + doc.stderr[-2000:]
    _drift("ebc-n2", "2.13.0+cpu", "2.12.9+cpu")
    try:
        bad = _sh(exe, "verify", "--slurm", "--nodes", "3", timeout=300)
        assert bad.returncode == 2, bad.stdout[-2000:] + bad.stderr[-2000:]
        assert "  1 node: torch.version 2.12.9+cpu: ebc-n2\n" in bad.stdout, bad.stdout[-3000:]
        assert "2 nodes agree in every compared field: ebc-n1, ebc-n3" in bad.stdout, bad.stdout[-3000:]
    finally:
        _drift("ebc-n2", "2.12.9+cpu", "2.13.0+cpu")
    # a straggler: ebc-n3's CPUs capped (a cgroup limit, as on a node sharing its cores)
    assert _sh("docker", "update", "--cpus", "0.05", "ebc-n3").returncode == 0
    try:
        slow = _sh(exe, "doctor", "--slurm", "--nodes", "3", "--checks", "straggler", "--straggler-ratio", "4",
                   timeout=400)
        assert slow.returncode == 2, slow.stdout[-3000:] + slow.stderr[-2000:]
        # the node named (a line "  ebc-n3's ..."), then every node's and pair's timings
        named = re.findall(r"^  (ebc-n[0-9])'s ", slow.stdout, re.M)
        assert named and set(named) == {"ebc-n3"}, slow.stdout[-3000:]
    finally:
        _sh("docker", "update", "--cpus", str(os.cpu_count()), "ebc-n3")
