"""``envbuild gate --epilog`` as Slurm's Epilog and ``envbuild gate --resume`` on the real one-node Slurm,
the host's GPUs being the stand-in ``libnvidia-ml.so.1`` (tests/fixtures/nvml/fake_nvml.c): a job that
leaves its GPUs sick drains the node with envbuild's reason, its twin leaves the node up; a drained node
resumes only once its checks pass."""

from __future__ import annotations

import fcntl
import json
import os
import socket
import subprocess
from pathlib import Path

import pytest
from test_gate import UP, gate_log, gate_script, node_state, wait_job, wait_node
from test_gate_units import gate
from test_gpu_health import fake_lib  # noqa: F401 - a fixture

from fixtures_nodes import ROOT

pytest_plugins = ["fixtures_nodes"]  # slurm_node

HOST = socket.gethostname()
GPU0 = "GPU 0 (GPU-00000000-0000-0000-0000-000000000000, 00000000:18:00.0)"
GPU1 = "GPU 1 (GPU-00000000-0000-0000-0000-000000000001, 00000000:19:00.0)"
CHECKS = "gpu-processes,gpu-health"


def host_reference(lib: Path, folder: Path) -> Path:
    """This host's node report with the stand-in GPUs: what the gate compares with (no certify run)."""
    exe = ROOT / ".venv" / "bin" / "envbuild"
    env = {k: v for k, v in os.environ.items() if not k.startswith("FAKE_NVML")}
    proc = subprocess.run([str(exe), "probe", "--host"], capture_output=True, text=True, timeout=120,
                          env={**env, "LD_LIBRARY_PATH": str(lib)})
    assert proc.returncode == 0, proc.stderr
    path = folder / "host.json"
    path.write_text(proc.stdout)
    assert [g["uuid"] for g in json.loads(proc.stdout)["gpus"]] == [GPU0[7:47], GPU1[7:47]]
    return path


def cut(reason: str) -> str:
    """A drain reason as Slurm keeps it: 200 characters at most, a longer one cut to 197 and "..."."""
    return reason if len(reason) <= 200 else reason[:197] + "..."


def reason_of(node: str) -> str:
    return subprocess.run(["sinfo", "-R", "-h", "-n", node, "-o", "%E"], capture_output=True, text=True,
                          timeout=30).stdout.strip()


def resume(node: str) -> None:
    subprocess.run(["scontrol", "update", f"NodeName={node}", "State=RESUME"], capture_output=True, timeout=30)


def run_job(tmp_path: Path, slurm_node: str, faults: str) -> str:
    """A job that sets the stand-in GPUs' answers to ``faults`` (read by the Epilog's gate.conf, as a job
    would leave its GPUs), waited until its Epilog is done; the script's last log line."""
    (tmp_path / "nvml.env").unlink(missing_ok=True)
    script, marker = tmp_path / "job.sh", tmp_path / "ran"
    marker.unlink(missing_ok=True)
    script.write_text(f"#!/bin/sh\necho '{faults}' > {tmp_path / 'nvml.env'}\necho ran > {marker}\n")
    script.chmod(0o755)
    job = subprocess.run(["sbatch", "--parsable", "-p", "debug", "-D", str(tmp_path), "-o", str(tmp_path / "job.out"),
                          str(script)], capture_output=True, text=True, check=True, timeout=60).stdout.strip()
    try:
        assert wait_job(job) == "", gate_log(tmp_path)  # gone from squeue: the Epilog has ended too
    finally:
        subprocess.run(["scancel", job], timeout=30)
    assert marker.read_text() == "ran\n"
    return gate_log(tmp_path)[-1].replace(f"job {job} on {slurm_node}: ", "")


@pytest.fixture
def epilog(slurm_node, tmp_path, test_session_id, fake_lib):  # noqa: F811 - the fixture imported above
    """The script as Prolog and Epilog, the GPUs the stand-in's, their answers from ``tmp_path/nvml.env``."""
    gen = gate_script(slurm_node, tmp_path, test_session_id, ("Prolog", "Epilog"))
    configure = next(gen)
    try:
        ref = host_reference(fake_lib, tmp_path)
        configure(f"--against {ref} --checks {CHECKS}",
                  conf_lines=f"export LD_LIBRARY_PATH={fake_lib}\n[ -r {tmp_path / 'nvml.env'} ] && "
                             f". {tmp_path / 'nvml.env'}\n")
        yield
    finally:
        gen.close()


def test_slurm_epilog_drains_a_node_the_job_left_sick(epilog, slurm_node, tmp_path):
    # the twin: a job that leaves its GPUs as it found them
    assert run_job(tmp_path, slurm_node, "") == "epilog: gate exit 0: the node stays up"
    assert node_state(slurm_node)[0].rstrip("*") in UP
    records = sorted(p.name for p in (tmp_path / "hist" / slurm_node / "health").iterdir())
    assert len(records) == 1 and records[0].endswith(".health") and "-job" in records[0]  # the Prolog's, by job
    try:
        # new double-bit ECC errors during the job
        line = run_job(tmp_path, slurm_node, "export FAKE_NVML_ECC_DBE_AGG_1=2")
        reason = cut(f"epilog: envbuild gate: fail: epilog: {slurm_node} {GPU1}: aggregate double-bit ECC errors "
                     "during the job 2 (threshold 0 at the Prolog) [hardware] next: drain the node and reset the GPU")
        assert line == f"drained after the job: {reason}"
        assert wait_node(slurm_node, ("drain",)) == ("drain", reason)
        resume(slurm_node)
        # a GPU process left behind, holding its memory (PID_MAX_LIMIT, which no process gets: no name)
        line = run_job(tmp_path, slurm_node, "export FAKE_NVML_PROCS=1 FAKE_NVML_PID=4194304")
        reason = (f"gpu-processes: envbuild gate: fail: gpu-processes: {slurm_node} GPU 0 "
                  f"({GPU0[7:47]}): pid 4194304 holds 1.0 MiB")
        assert line == f"drained after the job: {reason}"
        assert reason_of(slurm_node) == reason
    finally:
        resume(slurm_node)


@pytest.fixture
def slurm_lock(slurm_node):
    with open("/tmp/envbuild-test-slurm-prolog.lock", "w") as lock:  # one test draining the node at a time
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield slurm_node
        finally:
            resume(slurm_node)


def test_gate_resume_resumes_a_drained_node_only_once_it_passes(slurm_lock, fake_lib, tmp_path,  # noqa: F811
                                                               test_session_id):
    node = slurm_lock
    ref = host_reference(fake_lib, tmp_path)
    args = ("--against", str(ref), "--checks", CHECKS, "--no-history", "--node", node)
    env = {"LD_LIBRARY_PATH": str(fake_lib)}
    sick = f"{node} {GPU1}: volatile double-bit ECC errors {{}} (threshold <= 0) [hardware] next: drain the node and reset"

    proc = gate(*args, "--drain", session=test_session_id, env={**env, "FAKE_NVML_ECC_DBE_VOL_1": "3"})
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert reason_of(node) == cut(f"gpu-health: envbuild gate: fail: gpu-health: {sick.format(3)}")
    # repaired badly: still sick, so it stays drained, the reason refreshed
    proc = gate(*args, "--resume", session=test_session_id, env={**env, "FAKE_NVML_ECC_DBE_VOL_1": "5"})
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert proc.stdout.splitlines()[-1] == f"gate: {HOST} against {ref}: 1 failed, 0 warnings -> exit 2"
    assert node_state(node)[0] == "drain"
    assert reason_of(node) == cut(f"gpu-health: envbuild gate: fail: gpu-health: {sick.format(5)}")
    # repaired: resumed
    proc = gate(*args, "--resume", session=test_session_id, env=env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.splitlines()[-2:] == [f"resumed: {node}",
                                             f"gate: {HOST} against {ref}: 0 failed, 0 warnings -> exit 0"]
    assert wait_node(node, UP)[0] in UP
    # a node that takes jobs already stays as it is
    proc = gate(*args, "--resume", session=test_session_id, env=env)
    assert (proc.returncode, proc.stdout.splitlines()[-2]) == (0, f"resumed: {node}"), proc.stdout + proc.stderr
    assert node_state(node)[0].rstrip("*") in UP
