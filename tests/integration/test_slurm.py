"""Slurm launcher (builder/launchers/slurm/) and `envbuild certify --launcher slurm`.

Golden files for the rendered batch scripts (docker on a one-node test cluster, docker with
GPUs, pyxis and apptainer on a GPU partition), each also checked with ``bash -n``; the values
a script cannot carry refused with exit 64; the parsers of squeue --json (Slurm 22.05's
shape and the later one) and scontrol/sacct text; the node logs, where the ranks print
their results, read as they grow and checked against the run; the private run folder.

Then a real one-node Slurm (Debian slurm-wlm + munge, started by scripts/setup-slurm_script.sh
through the session fixture ``slurm_node``) running the CPU image through docker, 2 tasks
on the one node (``--slurm-nodes 1``, host networking, a free port per run):

- ``envbuild certify --launcher slurm`` passes, and its certificate has the shape of the
  local launcher's (same keys everywhere: the socket section, each rank's last progress);
- a rank that exits non-zero (TEST-ONLY ``ENVBUILD_BENCH_FAULT=exit@1``) gives a failing
  verdict (exit 2) naming the job's state FAILED and the tail of its log;
- a job over its 1-minute time limit (``sleep@1``) is cancelled by Slurm and reported
  (TIMEOUT, exit 3, the hung rank named apart from the one waiting for it), in about 70 s;
- Ctrl-C cancels the job; an sbatch that refuses the job is one line, exit 3;

and after each, no container of the run (by label) is left. Runs are small (sizes 8, 1024,
65536; 1 DDP step) except the CLI one, which uses the recipe's settings.

Regenerate the goldens with ``make golden`` (scripts/goldens.py calls :func:`regenerate`) and
review the diff.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import jsonschema
import pytest
from test_slurm_units import shape  # noqa: F401

from builder.core.errors import ExitCode
from builder.core.inputs import one_line
from builder.image import engine
from builder.launchers import base, slurm
from builder.launchers.output import plain_lines
from builder.launchers.slurm import job as slurm_job
from builder.launchers.slurm import launcher as slurm_launcher

from certify_helpers import certify_image
from fixtures_nodes import free_port, slurm_node  # noqa: F401 - pytest fixture (scripts/setup-slurm_script.sh)

SHORT = dict(sizes=[8, 1024, 65536], iters=3, warmup=1, nodes=2, backend="gloo")


# --------------------------------------------------------------------------- real Slurm


@pytest.fixture
def case_labels(test_labels) -> dict[str, str]:
    return {**test_labels, "envbuild.test-case": uuid.uuid4().hex[:16]}


def containers(client, label: str) -> list[str]:
    return [c.name for c in client.sdk.containers.list(all=True, filters={"label": label})]


def job_line(run_id: str) -> str:
    """``scontrol show job -o`` line of the job of ``run_id`` (JobName envbuild-<run>)."""
    out = subprocess.run(["scontrol", "show", "job", "-o"], capture_output=True, text=True, timeout=30).stdout
    lines = [ln for ln in out.splitlines() if f"JobName=envbuild-{run_id} " in ln]
    assert len(lines) == 1, out[-2000:]
    return lines[0]


def make_launcher(client, tmp_path, options=None) -> slurm.SlurmLauncher:
    return slurm.SlurmLauncher(tmp_path / "slurm", options or slurm.SlurmOptions(slurm_nodes=1, pending_timeout_s=180),
                               client=client, poll_s=1.0)


def run_slurm(client, image, tmp_path, labels, options=None, launcher=None, **kw):
    run_id = engine.new_run_id()
    launcher = launcher or make_launcher(client, tmp_path, options)
    args = {**SHORT, "timeout_s": 120, "port": free_port(), **kw}
    t0 = time.monotonic()
    cert, path = certify_image(client, image, images_dir=tmp_path, labels=labels, launcher=launcher,
                               run_id=run_id, **args)
    elapsed = time.monotonic() - t0
    assert json.loads(path.read_text()) == cert
    assert containers(client, f"{engine.RUN_LABEL}={run_id}") == []
    assert containers(client, f"envbuild.test-case={labels['envbuild.test-case']}") == []
    assert launcher.folder == tmp_path.resolve() / "slurm" / f"slurm-{run_id}"
    assert (launcher.folder / "certify.sbatch").is_file()
    return cert, launcher, elapsed


def outline(cert: dict) -> dict:
    """The certificate with each rank's probe document (a node report: its interfaces and
    environment differ between a container on a private network and one on the host
    network) cut down to its top-level keys."""
    return {**cert, "probe": {r: sorted(p) for r, p in cert["probe"].items()}}


def test_cli_certify_through_slurm_passes_with_the_local_shape(slurm_node, docker_client, torch_image, tmp_path,
                                                                case_labels):
    port = free_port()
    extra = ",".join(f"{k}={v}" for k, v in case_labels.items())
    exe = Path(sys.executable).parent / "envbuild"
    t0 = time.monotonic()
    proc = subprocess.run([str(exe), "--images-dir", str(tmp_path / "images"), "certify", torch_image,
                           "--launcher", "slurm", "--slurm-nodes", "1", "--nodes", "2", "--port", str(port),
                           "--timeout", "180", "--pending-timeout", "180"],
                          capture_output=True, text=True, timeout=600,
                          env={**os.environ, base.EXTRA_LABELS_ENV: extra})
    elapsed = time.monotonic() - t0
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "verdict: PASSED" in proc.stdout and "Traceback" not in proc.stderr
    [path] = (tmp_path / "images" / "cpu-torch2" / "certificates").glob("*.json")
    [folder] = (tmp_path / "images" / "cpu-torch2" / "certificates").glob("slurm-*")
    cert = json.loads(path.read_text())
    assert folder.name == f"slurm-{cert['run_id']}"
    assert "slurm: job " in proc.stdout and str(folder) in proc.stdout.replace("\n", "")
    assert (folder / "certify.sbatch").is_file() and sorted(p.name for p in (folder / "results").glob("rank-*")) == \
        ["rank-0.json", "rank-1.json"]
    assert cert["verdict"] == {"passed": True, "exit_code": 0, "failures": [], "warnings": [], "failure_class": None,
                               "next_step": None}
    assert cert["world_size"] == 2 and cert["node_status"] == {"0": {"name": "node-0", "exit_code": 0},
                                                               "1": {"name": "node-1", "exit_code": 0}}
    assert containers(docker_client, f"envbuild.test-case={case_labels['envbuild.test-case']}") == []
    job = job_line(cert["run_id"])
    assert "JobState=COMPLETED" in job and "NumTasks=2" in job
    # the node logs gathered beside the certificate: the lines of logs/node-<i>.log but envbuild's own
    [gathered] = path.parent.glob("*.logs.jsonl")
    schema = json.loads((Path(__file__).resolve().parents[2] / "schemas/log-event.schema.json").read_text())
    evs = [json.loads(line) for line in gathered.read_text().splitlines()]
    for e in evs:
        jsonschema.validate(e, schema)
    assert [(e["node"], e["rank"], e["msg"]) for e in evs] == [
        (f"node-{n}", n, one_line(line, 2000)) for n in (0, 1)
        for line in plain_lines((folder / "logs" / f"node-{n}.log").read_text()) if line.strip()]

    # the same image through the local launcher: the same shape, key for key
    local_cert, _ = certify_image(docker_client, torch_image, images_dir=tmp_path / "local", labels=case_labels,
                                  timeout_s=180, **SHORT)
    assert local_cert["verdict"]["passed"], local_cert["verdict"]
    # what differs by construction: the first phase (the job queued, the containers created)
    # and the phases' seconds; the settings hold what each run was given
    s = cert["settings"]
    assert (s["nodes"], s["port"], s["timeout_s"]) == (2, port, 180)
    bench_phases = ["ranks up", "import torch", "init", "profiles", "probe", "write", "exit", "teardown", "other"]
    assert [p["name"] for p in cert["phases"]] == ["queued"] + bench_phases
    assert [p["name"] for p in local_cert["phases"]] == ["containers up"] + bench_phases
    assert sum(p["seconds"] for p in cert["phases"]) == pytest.approx(elapsed, abs=5.0)
    drop = ("phases", "settings")  # the settings: also which launcher ran, and its options
    assert shape({k: v for k, v in outline(cert).items() if k not in drop}) == \
        shape({k: v for k, v in outline(local_cert).items() if k not in drop})
    print(f"slurm CLI certify: {elapsed:.1f} s")


def test_rank_exit_gives_failing_verdict_with_job_state(slurm_node, docker_client, torch_image, tmp_path, case_labels):
    cert, launcher, elapsed = run_slurm(docker_client, torch_image, tmp_path, case_labels,
                                        extra_env={"ENVBUILD_BENCH_FAULT": "exit@1"})
    v = cert["verdict"]
    assert not v["passed"] and v["exit_code"] == ExitCode.CHECK_FAILED
    assert v["failures"][0].startswith(f"Slurm job {launcher.job_id} ended FAILED (NonZeroExitCode)"), v
    assert "task 1: Exited with exit code 1" in v["failures"][0]  # the tail of job.log
    # rank 0 is stopped by srun --kill-on-bad-exit, or fails first when its peer vanishes
    assert v["failures"][1] in ("rank 0 did not finish: killed 0 s after another node failed",
                                "rank 0 exited with 1"), v
    assert v["failures"][2:] == ["rank 1 exited with 3"]
    assert cert["node_status"]["1"]["exit_code"] == 1 and cert["node_status"]["0"]["exit_code"] in (None, 1)
    assert elapsed < 90, elapsed  # no waiting for the timeout or the time limit
    assert any("TEST fault exit@1" in line for line in cert["node_status"]["1"]["log_tail"])
    job = job_line(cert["run_id"])
    assert "JobState=FAILED" in job
    # the launcher reads the job's state from Slurm's JSON output, and it agrees with scontrol's
    # (the batch script's exit code is srun's: 1, or 143 when the stopped node's status came last)
    info = slurm_job.job_info(launcher.job_id)
    assert (info.source, info.state, info.reason) == ("squeue --json", "FAILED", "NonZeroExitCode")
    assert info.exit_code == slurm_job._field(job, "ExitCode") and info.exit_code in ("1:0", "143:0"), job
    print(f"exit fault: {elapsed:.1f} s")


def test_job_over_its_time_limit_is_cancelled_and_reported(slurm_node, docker_client, torch_image, tmp_path,
                                                            case_labels):
    """sleep@1: rank 1 sleeps, rank 0 waits in the first all-reduce (process-group timeout
    300 s); Slurm ends the job at its 1-minute limit (SIGTERM; the tasks' traps remove
    the containers). What proves that Slurm, not envbuild, ended it is the job's state
    (``scontrol``: TIMEOUT, reason TimeLimit, run time at least the limit) and the time
    envbuild took (under the limit + END_MARGIN_S after which envbuild would cancel); the
    verdict is judged from that state alone, never from slurmstepd's "DUE TO TIME LIMIT"
    line in job.log, which may be written after the state changed."""
    cert, launcher, elapsed = run_slurm(
        docker_client, torch_image, tmp_path, case_labels, timeout_s=300,
        options=slurm.SlurmOptions(slurm_nodes=1, time_limit="1", pending_timeout_s=120),
        extra_env={"ENVBUILD_BENCH_FAULT": "sleep@1"})
    job = job_line(cert["run_id"])
    state = slurm_job.parse_scontrol_job(job)
    assert (state.state, state.reason, state.time_limit) == ("TIMEOUT", "TimeLimit", "00:01:00"), job
    run_time = slurm_job._field(job, "RunTime")
    assert run_time >= "00:01:00", job  # HH:MM:SS: ran to its limit
    v = cert["verdict"]
    assert not v["passed"] and v["exit_code"] == ExitCode.UNREACHABLE and cert["timed_out"], v
    assert v["failures"][0].startswith(f"Slurm job {launcher.job_id} ended TIMEOUT (TimeLimit): cancelled by "
                                       "Slurm at its time limit (--time=1)"), v
    assert "envbuild cancelled it" not in v["failures"][0], v
    # the ranks' progress, read from the node logs as the job ran, names the hung one (the
    # shared hang naming, as the local launcher's)
    hung, waiting = v["failures"][1:]
    assert re.fullmatch(r"rank 1 did not finish within 60 s \(timeout\): hung: stopped making progress in test "
                        r"fault sleep 3600 s for \d+(\.\d)? s \(alive, outside any collective\)", hung), hung
    assert waiting == "rank 0 did not finish within 60 s (timeout): blocked in profiles ddp, waiting for rank 1"
    assert cert["ranks"]["1"]["last_progress"]["phase"] == "test fault"
    assert {n["exit_code"] for n in cert["node_status"].values()} == {None}
    # the trap's line, in the whole log: torchrun's own SIGTERM traceback may follow it and
    # push it out of the certificate's log tail
    for node in (0, 1):
        log = (launcher.folder / "logs" / f"node-{node}.log").read_text()
        assert f"envbuild: node {node}: SIGTERM: removing container envbuild-slurm-{launcher.job_id}-{node}" in log
    assert elapsed < 60 + slurm_launcher.END_MARGIN_S, elapsed
    print(f"time limit: {elapsed:.1f} s")


def test_job_cancelled_from_outside_cannot_check(slurm_node, docker_client, torch_image, tmp_path, case_labels):
    """Someone runs scancel on the job while rank 1 sleeps: the verdict names the state
    CANCELLED and the ranks could not be checked (exit 3); the traps removed the containers."""
    case = f"envbuild.test-case={case_labels['envbuild.test-case']}"
    launcher = make_launcher(docker_client, tmp_path, slurm.SlurmOptions(slurm_nodes=1, pending_timeout_s=120))
    cancelled: list = []

    def cancel_when_running():
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline:
            if launcher.job_id and len(docker_client.sdk.containers.list(filters={"label": case})) == 2:
                time.sleep(2)
                cancelled.append(subprocess.run(["scancel", launcher.job_id], capture_output=True, text=True,
                                                timeout=30))
                return
            time.sleep(0.5)

    t = threading.Thread(target=cancel_when_running, daemon=True)
    t.start()
    try:
        cert, _, elapsed = run_slurm(docker_client, torch_image, tmp_path, case_labels, launcher=launcher,
                                     timeout_s=300, extra_env={"ENVBUILD_BENCH_FAULT": "sleep@1"})
    finally:
        t.join(5)
    assert cancelled and cancelled[0].returncode == 0, cancelled
    v = cert["verdict"]
    assert not v["passed"] and v["exit_code"] == ExitCode.UNREACHABLE and not cert["timed_out"]
    assert v["failures"][0].startswith(f"Slurm job {launcher.job_id} ended CANCELLED"), v
    assert v["failures"][1:] == [f"rank {r}: Slurm job {launcher.job_id} ended CANCELLED before this rank reported"
                                 for r in (0, 1)]
    assert "JobState=CANCELLED" in job_line(cert["run_id"])
    print(f"cancelled: {elapsed:.1f} s")


def test_job_that_can_never_start_fails_fast(slurm_node, docker_client, torch_image, tmp_path, case_labels):
    """2 envbuild nodes on 2 Slurm nodes (no --slurm-nodes) on the one-node cluster: Slurm keeps the
    job pending (PartitionNodeLimit) for ever; envbuild cancels it within seconds, not after the
    600 s --pending-timeout, exit 3."""
    extra = ",".join(f"{k}={v}" for k, v in case_labels.items())
    exe = Path(sys.executable).parent / "envbuild"
    t0 = time.monotonic()
    proc = subprocess.run([str(exe), "--images-dir", str(tmp_path), "certify", torch_image, "--launcher", "slurm",
                           "--nodes", "2", "--port", str(free_port()), "--timeout", "120"],
                          capture_output=True, text=True, timeout=300,
                          env={**os.environ, base.EXTRA_LABELS_ENV: extra})
    elapsed = time.monotonic() - t0
    assert proc.returncode == 3, proc.stdout[-3000:] + proc.stderr[-3000:]
    [path] = (tmp_path / "cpu-torch2" / "certificates").glob("*.json")
    cert = json.loads(path.read_text())
    folder = tmp_path / "cpu-torch2" / "certificates" / f"slurm-{cert['run_id']}"
    job = job_line(cert["run_id"])
    job_id = job.split()[0].split("=")[1]
    assert "JobState=CANCELLED" in job and "NumNodes=2" in job
    why = "cannot start (pending, reason PartitionNodeLimit)"
    note = (f"Slurm job {job_id} {why}: the job asks for 2 nodes; the partition allows fewer (or has fewer up): pass "
            f"--slurm-nodes with fewer (the envbuild nodes then share machines) or --partition; envbuild cancelled "
            f"it; {folder}/job.log is empty")
    assert cert["verdict"]["failures"] == [note] + [
        f"rank {r}: Slurm job {job_id} {why} before this rank reported" for r in (0, 1)]
    assert f"  fail: {note}" in proc.stdout.splitlines(), proc.stdout
    squeue = subprocess.run(["squeue", "-h", "-n", f"envbuild-{cert['run_id']}"], capture_output=True, text=True,
                            timeout=30)
    assert squeue.returncode == 0 and squeue.stdout.strip() == ""
    assert containers(docker_client, f"envbuild.test-case={case_labels['envbuild.test-case']}") == []
    assert elapsed < 30, elapsed
    print(f"never starts: {elapsed:.1f} s")


def test_ctrl_c_cancels_the_job_and_removes_the_containers(slurm_node, docker_client, torch_image, tmp_path,
                                                           case_labels):
    extra = ",".join(f"{k}={v}" for k, v in case_labels.items())
    exe = Path(sys.executable).parent / "envbuild"
    case = f"envbuild.test-case={case_labels['envbuild.test-case']}"
    proc = subprocess.Popen([str(exe), "--images-dir", str(tmp_path), "certify", torch_image, "--launcher", "slurm",
                             "--slurm-nodes", "1", "--port", str(free_port()), "--slurm-dir", str(tmp_path / "s")],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, base.EXTRA_LABELS_ENV: extra})
    try:
        deadline = time.monotonic() + 180
        while not [c for c in docker_client.sdk.containers.list(filters={"label": case})]:
            assert proc.poll() is None, proc.communicate()
            assert time.monotonic() < deadline, "no container started within 180 s"
            time.sleep(0.5)
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, out + err
    assert "interrupted" in err and "Traceback" not in err
    [folder] = (tmp_path / "s").glob("slurm-*")
    assert "JobState=CANCELLED" in job_line(folder.name.split("-", 1)[1])
    assert containers(docker_client, case) == []
    assert not list(tmp_path.glob("*/certificates/*.json"))


def test_refused_submission_is_one_line_exit_3(slurm_node, torch_image, tmp_path):
    exe = Path(sys.executable).parent / "envbuild"
    proc = subprocess.run([str(exe), "--images-dir", str(tmp_path), "certify", torch_image, "--launcher", "slurm",
                           "--partition", "no-such-partition", "--slurm-dir", str(tmp_path)],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 3, proc.stdout + proc.stderr
    errors = [ln for ln in proc.stderr.splitlines() if ln.startswith("error: ")]
    assert len(errors) == 1 and errors[0] == proc.stderr.strip().splitlines()[-1], proc.stderr
    assert "sbatch refused the job" in errors[0] and "Invalid partition name specified" in errors[0], errors
    assert "Traceback" not in proc.stderr


def test_slurm_nodes_over_the_image_nodes_is_64_after_reading_its_labels(torch_image, tmp_path):
    """Without --nodes the number of nodes comes from the image's labels (2): this one
    combination can only be checked once the engine answered; still a usage error."""
    exe = Path(sys.executable).parent / "envbuild"
    proc = subprocess.run([str(exe), "--images-dir", str(tmp_path), "certify", torch_image, "--launcher", "slurm",
                           "--slurm-nodes", "3", "--slurm-dir", str(tmp_path / "s")],
                          capture_output=True, text=True, timeout=120)
    assert (proc.returncode, proc.stderr.strip().splitlines()[-1]) == (
        64, "error: --slurm-nodes: 3 must be between 1 and the number of nodes (2)")
    assert not (tmp_path / "s").exists()

