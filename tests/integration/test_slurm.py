"""Slurm launcher (builder/launchers/slurm/) and `envbuild certify --launcher slurm`.

Golden files for the rendered batch scripts (docker on a one-node test cluster, docker with
GPUs, pyxis and apptainer on a GPU partition), each also checked with ``bash -n``; the values
a script cannot carry refused with exit 64; the parsers of squeue --json (Slurm 22.05's
shape and the later one) and scontrol/sacct text; the node logs, where the ranks print
their results, read as they grow and checked against the run; the private run folder.

Then a real one-node Slurm (Debian slurm-wlm + munge, started by scripts/setup-slurm.sh
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

import dataclasses
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

import pytest

from builder.certify import settings as certify_settings
from builder.certify import verdict
from builder.certify.settings import Overrides
from builder.core.errors import EnvbuildError, ExitCode
from builder.image import engine
from builder.launchers import base, slurm
from builder.launchers.base import LaunchResult, LaunchSpec
from builder.launchers.slurm import job as slurm_job
from builder.launchers.slurm import script as slurm_script

from certify_helpers import certify_image
from factories import rank_result
from fixtures_nodes import free_port, slurm_node  # noqa: F401 - pytest fixture (scripts/setup-slurm.sh)

ROOT = Path(__file__).resolve().parents[2]
GOLDEN = ROOT / "tests" / "golden" / "slurm"
RUN_ID = "0123456789ab"
FOLDER = f"/shared/envbuild/images/cuda12-torch2/certificates/slurm-{RUN_ID}"
BENCH_ARGS = ["--backend", "nccl", "--sizes", "8,1024,65536,1048576", "--iters", "10", "--warmup", "2",
              "--ddp-steps", "3", "--ddp-batch", "8", "--ddp-image-size", "64", "--pg-timeout-s", "600"]
GPU_SPEC = LaunchSpec(image="envbuild/cuda12-torch2:3f2a9c1d0e4b", nodes=2, gpus_per_node=4, backend="nccl",
                      port=29500, shm_size="8g", timeout_s=600, bench_args=BENCH_ARGS, env={}, run_id=RUN_ID,
                      labels={"envbuild.recipe": "cuda12-torch2"})
CPU_SPEC = dataclasses.replace(
    GPU_SPEC, image="envbuild/cpu-torch2:fbe68042d4fa", gpus_per_node=0, backend="gloo", shm_size="256m",
    timeout_s=300, labels={"envbuild.recipe": "cpu-torch2"},
    bench_args=["--backend", "gloo", *BENCH_ARGS[2:-1], "300"])
#: golden file -> (spec, options, folder)
CASES = {
    "docker.sbatch": (CPU_SPEC, slurm.SlurmOptions(slurm_nodes=1), FOLDER.replace("cuda12", "cpu")),
    "docker-gpu.sbatch": (GPU_SPEC, slurm.SlurmOptions(partition="gpu", socket_ifname="ib0"), FOLDER),
    "pyxis.sbatch": (GPU_SPEC, slurm.SlurmOptions(
        runtime="pyxis", partition="gpu", time_limit="30", container_image="/shared/images/cuda12-torch2.sqsh",
        sbatch_args=("--account=ml", "--exclusive")), FOLDER),
    "apptainer.sbatch": (GPU_SPEC, slurm.SlurmOptions(
        runtime="apptainer", partition="gpu", container_image="/shared/images/cuda12-torch2.sif",
        socket_ifname="ib0", sbatch_args=("--account=ml",)), FOLDER),
}
SHORT = dict(sizes=[8, 1024, 65536], iters=3, warmup=1, ddp_steps=1, nodes=2, backend="gloo")


def render_case(name: str) -> str:
    spec, options, folder = CASES[name]
    return slurm.render_script(spec, options, folder, environ={})


# --------------------------------------------------------------------------- goldens


@pytest.mark.parametrize("name", sorted(CASES))
def test_golden_scripts(name):
    """Regenerate with `make golden` (scripts/goldens.py)."""
    assert render_case(name) == (GOLDEN / name).read_text(), f"{name}: run `make golden` and review the diff"


@pytest.mark.parametrize("name", sorted(CASES))
def test_scripts_are_valid_bash(name, tmp_path):
    path = tmp_path / name
    path.write_text(render_case(name))
    proc = subprocess.run(["bash", "-n", str(path)], capture_output=True, text=True, timeout=30)
    assert proc.returncode == 0, proc.stderr
    # the node function, as srun hands it to bash -c, parses on its own too
    text = path.read_text()
    body = text[text.index("envbuild_node() {"):text.index("\n}\n") + 3]
    proc = subprocess.run(["bash", "-n", "-c", body], capture_output=True, text=True, timeout=30)
    assert proc.returncode == 0, proc.stderr


def test_rendering_is_deterministic_across_processes():
    code = ("import sys; sys.path[:0] = ['tests/integration', 'tests']; import test_slurm as t; "
            "sys.stdout.write(''.join(t.render_case(n) for n in sorted(t.CASES)))")
    runs = {subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True,
                           env={**os.environ, "PYTHONHASHSEED": str(seed)}).stdout for seed in (1, 2)}
    assert len(runs) == 1 and runs.pop() == "".join(render_case(n) for n in sorted(CASES))


def test_script_details():
    docker = render_case("docker.sbatch")
    assert "#SBATCH --nodes=1\n#SBATCH --ntasks=2\n#SBATCH --overcommit\n#SBATCH --time=5\n" in docker
    assert 'MASTER_ADDR="$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n1)"' in docker
    assert "--network host --user 12345:12345 --read-only" in docker
    assert 'name="envbuild-slurm-$SLURM_JOB_ID-$node"' in docker
    assert "trap envbuild_rm EXIT" in docker and "trap 'envbuild_stop TERM 143' TERM" in docker
    assert "--label envbuild=1" in docker and f"--label envbuild.run={RUN_ID}" in docker
    assert "--kill-on-bad-exit=1" in docker
    assert "GLOO_SOCKET_IFNAME" not in docker  # host networking: the library picks the interface
    pyxis = render_case("pyxis.sbatch")
    assert "#SBATCH --ntasks-per-node=1\n" in pyxis and "#SBATCH --gres=gpu:4\n" in pyxis
    assert "--container-image=/shared/images/cuda12-torch2.sqsh" in pyxis and "--gpus-per-task=4" in pyxis
    assert "docker" not in pyxis.replace("docker-", "")
    app = render_case("apptainer.sbatch")
    assert "apptainer exec --nv --contain --cleanenv" in app and "APPTAINERENV_NCCL_SOCKET_IFNAME=ib0" in app


def test_extra_labels_from_the_environment_reach_the_containers():
    text = slurm.render_script(CPU_SPEC, slurm.SlurmOptions(), FOLDER,
                               environ={base.EXTRA_LABELS_ENV: "envbuild.test-session=abc"})
    assert "--label envbuild.test-session=abc" in text


@pytest.mark.parametrize("change, field, message", [
    (dict(folder="relative/dir"), "--slurm-dir", "--slurm-dir: 'relative/dir' must be an absolute path of letters, "
     "digits and ._/+@- (Slurm reads it unquoted in #SBATCH lines; pyxis splits mounts at , and :)"),
    (dict(folder="/has space/x"), "--slurm-dir", None),
    (dict(folder="/per%cent"), "--slurm-dir", None),
    (dict(folder="/shared/runs\n"), "--slurm-dir", None),
    (dict(runtime="podman"), "--container-runtime",
     "--container-runtime: 'podman' is not a container runtime (docker, pyxis, apptainer)"),
    (dict(partition="a b"), "--partition", None),
    (dict(partition="debug\n"), "--partition",
     r"--partition: 'debug\n' is not a partition name (letters, digits, _.-; a comma list of at most 16)"),
    (dict(partition="debug\n#SBATCH --wrap=id"), "--partition", None),
    (dict(time_limit="0"), "--time-limit", "--time-limit: '0' must be more than 0 (0 means no limit)"),
    (dict(time_limit="ten"), "--time-limit", None),
    (dict(time_limit="10\n"), "--time-limit",
     r"--time-limit: '10\n' is not a Slurm time limit (M, M:S, H:M:S, D-H, D-H:M or D-H:M:S)"),
    (dict(time_limit=" 10"), "--time-limit", None),
    (dict(time_limit="9999999"), "--time-limit", "--time-limit: '9999999' is more than 365 days"),
    (dict(slurm_nodes=3), "--slurm-nodes", "--slurm-nodes: 3 must be between 1 and the number of nodes (2)"),
    (dict(slurm_nodes=0), "--slurm-nodes", "--slurm-nodes: 0 must be an integer >= 1"),
    (dict(sbatch_args=("--comment=a b",)), "--sbatch-arg", None),
    (dict(sbatch_args=("account=x",)), "--sbatch-arg", None),
    (dict(sbatch_args=("--account=ml\n",)), "--sbatch-arg",
     r"--sbatch-arg: '--account=ml\n' is not one sbatch option: --name or --name=value (letters, digits and "
     r"_.,:/@%+=[]-; no blanks, quotes or shell characters)"),
    (dict(sbatch_args=("--account=ml\n#SBATCH --wrap=id",)), "--sbatch-arg", None),
    (dict(sbatch_args=("--comment=$(id)",)), "--sbatch-arg", None),
    (dict(sbatch_args=("-Aml",)), "--sbatch-arg", None),
    (dict(sbatch_args=("--output=/tmp/x",)), "--sbatch-arg",
     "--sbatch-arg: '--output=/tmp/x' is set by envbuild itself (the run folder, from --slurm-dir)"),
    (dict(sbatch_args=("--out=/tmp/x",)), "--sbatch-arg",  # a prefix sbatch would read as --output
     "--sbatch-arg: '--out=/tmp/x' is not an sbatch option envbuild passes on (--account, --qos, --constraint, "
     "--reservation, --exclusive, --mem, --nodelist, --exclude...: README, Running on a cluster)"),
    (dict(sbatch_args=("--array=0-99",)), "--sbatch-arg", None),
    (dict(sbatch_args=("--account",)), "--sbatch-arg", "--sbatch-arg: '--account' needs a value: --account=VALUE"),
    (dict(sbatch_args=("--contiguous=yes",)), "--sbatch-arg", "--sbatch-arg: '--contiguous=yes' takes no value: --contiguous"),
    (dict(socket_ifname="eth0;rm"), "--socket-ifname", None),
    (dict(socket_ifname="eth0\n"), "--socket-ifname",
     r"--socket-ifname: 'eth0\n' is not a network interface name list ([^][=]NAME[,NAME...], names of at most 15 "
     "characters [A-Za-z0-9_.:-])"),
    (dict(socket_ifname="^^lo"), "--socket-ifname", None),
    (dict(container_image="a,b", runtime="pyxis"), "--container-image", None),
    (dict(container_image="/shared/x.sqsh\n", runtime="pyxis"), "--container-image", None),
    (dict(container_image="/shared/x.sif\x1b[2J", runtime="apptainer"), "--container-image",
     r"--container-image: '/shared/x.sif\x1b[2J' is not an image reference, enroot URI or absolute path "
     "(letters, digits, ._:/@#+=-)"),
    (dict(pending_timeout_s=float("nan")), "--pending-timeout", "--pending-timeout: nan must be a number of seconds "
     "in (0, 604800]"),
    (dict(pending_timeout_s=-5.0), "--pending-timeout", None),
    (dict(env={"BAD-NAME": "1"}), "env", None),
    (dict(env={"NCCL_DEBUG": "INFO\nrm -rf /"}), "env.NCCL_DEBUG",
     r"env.NCCL_DEBUG: 'INFO\nrm -rf /' is not a one-line value of at most 4096 characters"),
])
def test_values_a_script_cannot_carry_are_usage_errors(change, field, message):
    """Each value is matched whole: a trailing newline (which would end the ``#SBATCH`` line
    and start another) is refused like any other bad value (exit 64), naming the option."""
    folder = change.pop("folder", FOLDER)
    env = change.pop("env", None)
    spec = dataclasses.replace(CPU_SPEC, env=env) if env else CPU_SPEC
    with pytest.raises(EnvbuildError) as e:  # the options alone, or with the spec
        slurm.render_script(spec, slurm.SlurmOptions(**change), folder, environ={})
    assert e.value.exit_code == ExitCode.USAGE and e.value.field == field
    if message is not None:
        assert str(e.value) == message


@pytest.mark.parametrize("change", [
    dict(partition="gpu,debug"), dict(time_limit="1-00:30:00"), dict(sbatch_args=(
        "--account=ml", "--exclusive", "--exclusive=user", "--constraint=a100", "--nodelist=gpu[01-04]", "--mem=0",
        "--qos=high")),
    dict(socket_ifname="ib0"), dict(socket_ifname="^lo,docker"), dict(socket_ifname="=ib0,ib1"),
    dict(container_image="registry.example#envbuild/x:1", runtime="pyxis"),
    dict(pending_timeout_s=604800.0),
])
def test_values_a_script_can_carry_twins(change):
    text = slurm.render_script(CPU_SPEC, slurm.SlurmOptions(slurm_nodes=1, **change), FOLDER, environ={})
    for a in change.get("sbatch_args", ()):
        assert f"\n#SBATCH {a}\n" in text


@pytest.mark.parametrize("spec_ifname, option_ifname, gloo, nccl", [
    (None, "^lo,docker", "GLOO_SOCKET_IFNAME=", "'NCCL_SOCKET_IFNAME=^lo,docker'"),
    ("=ib0", None, "GLOO_SOCKET_IFNAME=ib0", "NCCL_SOCKET_IFNAME==ib0"),
    ("eth0", "ib0", "GLOO_SOCKET_IFNAME=ib0", "NCCL_SOCKET_IFNAME=ib0"),
])
def test_socket_ifname_reaches_the_nodes_as_each_library_reads_it(spec_ifname, option_ifname, gloo, nccl):
    """NCCL's forms (``^`` exclude, ``=`` exact) set NCCL_SOCKET_IFNAME as written and
    GLOO_SOCKET_IFNAME as gloo reads it (names without ``=``; nothing for ``^``), as the
    local launcher does (base.socket_env); the Slurm option wins over the spec's."""
    spec = dataclasses.replace(CPU_SPEC, socket_ifname=spec_ifname)
    text = slurm.render_script(spec, slurm.SlurmOptions(slurm_nodes=1, socket_ifname=option_ifname), FOLDER,
                               environ={})
    assert f"--env {gloo} " in text and f"--env {nccl} " in text


def test_template_refuses_a_newline_that_got_past_the_checks():
    """The second line of defence: a context value with a newline or control character
    (here put in after render_context's checks) is refused when the script is rendered,
    naming the field; the unchanged context renders the golden script."""
    spec, options, folder = CASES["docker.sbatch"]
    ctx = slurm.render_context(spec, options, folder, environ={})
    assert slurm.render_template(ctx) == (GOLDEN / "docker.sbatch").read_text()
    for key, value, field in [
        ("sbatch", [*ctx["sbatch"], "--comment=x\n#SBATCH --wrap=id"], "sbatch[8]"),
        ("image", ctx["image"] + "\n", "image"),
        ("env", {**ctx["env"], "X": "a\x1b[2Jb"}, "env.X"),
        ("run", [*ctx["run"], ("--label", "a\u202eb")], "run[-1][1]"),
        ("port", "29500\nid", "port"),
    ]:
        with pytest.raises(EnvbuildError) as e:
            slurm.render_template({**ctx, key: value})
        assert e.value.exit_code == ExitCode.USAGE
        assert "would put a newline or control character into the batch script; refused" in str(e.value)
        if not field.startswith("run"):
            assert e.value.field == field
    # inside the template too: a value no walk saw (jinja2 finalize, the sh filter)
    env = slurm_script._environment()
    with pytest.raises(EnvbuildError) as e:
        env.from_string("#SBATCH {{ opt }}\n").render(opt="--comment=x\n#SBATCH --wrap=id")
    assert str(e.value) == (r"script: '--comment=x\n#SBATCH --wrap=id' would put a newline or control character "
                            "into the batch script; refused")
    with pytest.raises(EnvbuildError):
        env.from_string("X={{ v|sh }}\n").render(v="a\nb")
    assert env.from_string("#SBATCH {{ opt }}\nX={{ v|sh }}\n").render(opt="--qos=high", v="a b") == \
        "#SBATCH --qos=high\nX='a b'\n"


@pytest.mark.parametrize("text, seconds", [("1", 60), ("90", 5400), ("1:30", 90), ("1:00:00", 3600),
                                           ("2-0", 172800), ("1-2:3", 93780), ("0-0:0:5", 5)])
def test_time_limits(text, seconds):
    assert slurm.parse_time_limit(text) == seconds


def test_default_time_limit_is_the_timeout_in_whole_minutes():
    assert slurm.time_limit_for(dataclasses.replace(CPU_SPEC, timeout_s=61), slurm.SlurmOptions()) == "2"
    assert slurm.time_limit_for(dataclasses.replace(CPU_SPEC, timeout_s=5), slurm.SlurmOptions()) == "1"


def test_parse_scontrol_and_sacct():
    line = ("JobId=21 JobName=envbuild-4f09cd13d9e8 UserId=root(0) JobState=TIMEOUT Reason=TimeLimit "
            "Dependency=(null) ExitCode=0:15 RunTime=00:01:02 TimeLimit=00:01:00 NodeList=vm BatchHost=vm")
    info = slurm.parse_scontrol_job(line)
    assert (info.state, info.reason, info.exit_code, info.nodes, info.time_limit) == \
        ("TIMEOUT", "TimeLimit", "0:15", "vm", "00:01:00")
    assert info.terminal
    assert slurm.parse_scontrol_job("JobState=RUNNING Reason=None").reason is None
    assert slurm.parse_scontrol_job("slurm_load_jobs error: Invalid job id specified") is None
    acct = "20|FAILED|1:0|vm|00:05:00|None\n21|CANCELLED by 0|0:15|vm|00:01:00|None\n"
    assert slurm.parse_sacct(acct, "21").state == "CANCELLED"
    assert slurm.parse_sacct(acct, "20").exit_code == "1:0"
    assert slurm.parse_sacct(acct, "22") is None


PENDING_LINE = ("JobId=97 JobName=envbuild-4f09cd13d9e8 UserId=root(0) GroupId=root(0) Account=(null) QOS=(null) "
                "JobState=PENDING Reason={reason} Dependency=(null) ExitCode=0:0 RunTime=00:00:00 "
                "TimeLimit=00:02:00 Partition=debug NodeList= NumNodes=2-2 NumCPUs=2 NumTasks=2")


@pytest.mark.parametrize("reason, message", [
    ("PartitionNodeLimit", "cannot start (pending, reason PartitionNodeLimit): the job asks for 2 nodes; the "
     "partition allows fewer (or has fewer up): pass --slurm-nodes with fewer (the envbuild nodes then share "
     "machines) or --partition"),
    ("PartitionTimeLimit", "cannot start (pending, reason PartitionTimeLimit): its time limit 00:02:00 is above "
     "the partition's: pass --time-limit or --partition"),
    ("QOSMaxNodePerJobLimit", "cannot start (pending, reason QOSMaxNodePerJobLimit): it is above a per-job limit "
     "of its QOS or association: ask for less (--slurm-nodes, --time-limit, --gpus-per-node) or pass "
     "--sbatch-arg=--qos=Q"),
    # waiting helps: other jobs end, nodes come back
    ("Resources", None),
    ("Priority", None),
    ("QOSGrpNodeLimit", None),
    ("QOSMaxJobsPerUserLimit", None),
    ("ReqNodeNotAvail,_UnavailableNodes:vm", None),
    ("None", None),
])
def test_pending_reasons_that_never_resolve(reason, message):
    info = slurm.parse_scontrol_job(PENDING_LINE.format(reason=reason))
    assert slurm.never_starts(info, 2) == message


def test_only_pending_jobs_never_start():
    running = PENDING_LINE.format(reason="PartitionNodeLimit").replace("JobState=PENDING", "JobState=RUNNING")
    assert slurm.never_starts(slurm.parse_scontrol_job(running), 2) is None


TORCHRUN_SIGTERM = """\
Failures:
[0]:
  time      : 2026-12-01_08:50:30
  host      : vm
  rank      : 1 (local_rank: 0)
  exitcode  : -15 (pid: 9)
  error_file: <N/A>
  traceback : Signal 15 (SIGTERM) received by PID 9
"""


def collect(tmp_path, state, reason, *, job_log, logs, exits=("SIGTERM", "SIGTERM")):
    """SlurmLauncher._collect of a finished 2-node run (one rank each) whose folder holds
    ``job_log``, the node logs ``logs`` ({node: text}) and ``exits[i]`` in node-<i>.exit; no
    rank results."""
    folder = tmp_path / f"slurm-{RUN_ID}"
    for sub in (slurm.RESULTS_DIR, slurm.LOGS_DIR):
        (folder / sub).mkdir(parents=True)
    (folder / slurm.JOB_LOG).write_text(job_log)
    for node, text in logs.items():
        (folder / slurm.LOGS_DIR / f"node-{node}.log").write_text(text)
    for node, status in enumerate(exits):
        (folder / slurm.RESULTS_DIR / f"node-{node}.exit").write_text(status + "\n")
    launcher = slurm.SlurmLauncher(tmp_path, slurm.SlurmOptions(slurm_nodes=1, time_limit="1"))
    launcher.job_id = "21"
    outcome = slurm.Outcome(slurm.JobInfo(state=state, reason=reason, exit_code="0:15"), started_at="")
    launch = launcher.collect(CPU_SPEC, folder, outcome, 60, [])
    s = certify_settings.resolve({"certify": {"nodes": 2}}, Overrides(sizes=[8]), gpu_visible=False)
    return launch, verdict.judge(s, launch, {}).to_dict()


def test_time_limit_verdict_comes_from_the_job_state_not_a_log_line(tmp_path):
    """The job state TIMEOUT alone makes the verdict "timeout, could not check" (3), with an
    empty job.log (slurmstepd's "DUE TO TIME LIMIT" line not written yet) and with torchrun's
    summary blaming rank 1 for the SIGTERM that ended the job (a race with docker rm)."""
    launch, v = collect(tmp_path, "TIMEOUT", "TimeLimit", job_log="", logs={1: TORCHRUN_SIGTERM})
    assert launch.timed_out and launch.rank_exit_codes == {}
    assert v == {"passed": False, "exit_code": 3, "warnings": [], "failures": [
        f"Slurm job 21 ended TIMEOUT (TimeLimit): cancelled by Slurm at its time limit (--time=1), exit code 0:15; "
        f"{tmp_path}/slurm-{RUN_ID}/job.log is empty",
        "rank 0 did not finish within 60 s (timeout)", "rank 1 did not finish within 60 s (timeout)"]}


def test_a_time_limit_log_line_without_the_state_is_no_timeout_twin(tmp_path):
    """The fault the other way round: a COMPLETED job whose log happens to hold the line is
    not a timeout, and a rank that torchrun saw killed on a node that exited by itself is
    blamed (2)."""
    line = "slurmstepd-vm: error: *** JOB 21 ON vm CANCELLED AT 2026-12-01T08:50:30 DUE TO TIME LIMIT ***"
    launch, v = collect(tmp_path, "COMPLETED", None, job_log=line + "\n", logs={1: TORCHRUN_SIGTERM},
                        exits=("1", "1"))
    assert not launch.timed_out and launch.rank_exit_codes == {1: -15} and launch.notes == []
    assert v["exit_code"] == 2 and v["failures"] == ["rank 0 wrote no result: node 0 exited with 1",
                                                     "rank 1 killed by SIGTERM (exit 143)"]


def test_a_node_stopped_after_another_failed_is_not_blamed_for_the_signal(tmp_path):
    """srun --kill-on-bad-exit: node 1 exits 1, Slurm stops node 0 (its task's trap writes
    SIGTERM); torchrun on node 0 may report its rank killed by signal 15: it is the node
    that was stopped, not a rank that failed."""
    failing = TORCHRUN_SIGTERM.replace("rank      : 1 (local_rank: 0)", "rank      : 0 (local_rank: 0)")
    launch, v = collect(tmp_path, "FAILED", "NonZeroExitCode", job_log="srun: error: vm: task 1: Exited with exit "
                        "code 1\n", logs={0: failing}, exits=("SIGTERM", "1"))
    assert launch.rank_exit_codes == {} and launch.killed_after_s == 0.0
    assert v["exit_code"] == 2 and v["failures"][1:] == [
        "rank 0 did not finish: killed 0 s after another node failed", "rank 1 wrote no result: node 1 exited with 1"]


def test_judge_lists_the_job_state_first_and_keeps_the_exit_code():
    s = certify_settings.resolve({"certify": {"nodes": 2}}, Overrides(sizes=[8]), gpu_visible=False)
    launch = LaunchResult(rank_results={}, node_logs={}, node_exit_codes={0: None, 1: None}, timed_out=True,
                          missing_ranks=[0, 1], started_at="", finished_at="",
                          notes=["Slurm job 7 ended TIMEOUT (TimeLimit)"], deadline_s=60.0)
    v = verdict.judge(s, launch, {}).to_dict()
    assert v["exit_code"] == ExitCode.UNREACHABLE
    assert v["failures"] == ["Slurm job 7 ended TIMEOUT (TimeLimit)", "rank 0 did not finish within 60 s (timeout)",
                             "rank 1 did not finish within 60 s (timeout)"]


def result_doc(rank: int, world: int = 2, run_id: str = RUN_ID, **kw) -> dict:
    """A rank result as the bench prints it (the fields the host reads; tests/factories.py)."""
    fields = dict(run_id=run_id, hostname=f"vm-{rank}", options={"sizes": [8], "iters": 3}, allreduce=[], ddp=None,
                  probe=None, started_at="2026-12-01T08:50:00.000Z", finished_at=None, elapsed_s=None)
    return rank_result(rank, world, **{**fields, **kw})


def result_line(doc) -> str:
    return "@@envbuild-result " + (doc if isinstance(doc, str) else json.dumps(doc)) + "\n"


def test_node_logs_results_are_checked_against_the_run(tmp_path):
    """The ranks print their results in their node logs; each is checked whole: another
    run's (stale or planted), another schema, not JSON, a rank the node does not host, a
    field out of bounds; a log that is a FIFO is not read (and does not hang the reader).
    The twin: this run's result of the rank the node hosts is taken."""
    spec = dataclasses.replace(CPU_SPEC, nodes=6)
    logs = tmp_path / "logs"
    logs.mkdir()
    (logs / "node-0.log").write_text("torchrun says hi\n" + result_line(result_doc(0, 6)) + "bye\n")
    (logs / "node-1.log").write_text(result_line("{not json"))
    (logs / "node-2.log").write_text(result_line({"schema": "other", "rank": 2}))
    (logs / "node-3.log").write_text(result_line(result_doc(3, 6, run_id="ffffffffffff")))
    (logs / "node-4.log").write_text(result_line(result_doc(0, 6)) + result_line(result_doc(4, 6, allreduce=[
        {"size_bytes": -8, "count": 2, "type": "float32", "redop": "sum", "time_us": 1.0, "rank_time_us": [1.0],
         "algbw_gbps": 0.1, "busbw_gbps": 0.1, "wrong": 0, "wrong_by_rank": [0]}])))
    os.mkfifo(logs / "node-5.log")
    nl = slurm.NodeLogs(logs, spec)
    nl.finish()
    assert sorted(nl.results()) == [0] and nl.results()[0].hostname == "vm-0"
    assert nl.problems() == {
        1: "unreadable result printed by node 1: node-1 output: not valid JSON: Expecting property name enclosed in "
           "double quotes: line 1 column 2 (char 1)",
        2: "result is not envbuild.rank-result/1 (got 'other')",
        3: "result of rank 3 is from run 'ffffffffffff', not this run 0123456789ab: refused (stale or planted)",
        4: "result of rank 4 is not a valid envbuild.rank-result/1: allreduce[0].size_bytes: -8 Expected `int` >= 0",
        5: f"the log of node 5 was not read: {logs}/node-5.log is not a regular file",
    }
    assert nl.logs()[0] == "torchrun says hi\nbye\n"  # result lines are not log
    # the twin of rank 3: the same document of this very run is taken
    (logs / "node-3.log").write_text(result_line(result_doc(3, 6, run_id="ffffffffffff")))
    twin = slurm.NodeLogs(logs, dataclasses.replace(spec, run_id="ffffffffffff"))
    twin.finish()
    assert 3 in twin.results()


def test_node_logs_are_read_as_they_grow(tmp_path):
    """Each poll reads what a log gained; a line split over two polls is read whole once."""
    logs = tmp_path / "logs"
    logs.mkdir()
    line = result_line(result_doc(1))
    (logs / "node-1.log").write_text("@@envbuild-progress " + json.dumps({"rank": 1, "run": RUN_ID, "seq": 1,
                                                                         "phase": "init"}) + "\n" + line[:40])
    nl = slurm.NodeLogs(logs, CPU_SPEC)
    nl.poll()
    assert nl.results() == {} and nl.tracker.snapshot()[1]["phase"] == "init"
    with open(logs / "node-1.log", "a") as f:
        f.write(line[40:])
    nl.poll()
    assert sorted(nl.results()) == [1] and nl.problems() == {}


def test_run_folder_is_private_and_holds_the_payload(tmp_path):
    """results/ is the job's user's only (0700, nothing the docker nodes' UID or another user
    can write); code/ is a read-only copy of the one payload (builder.agent.payload)."""
    from builder.agent import payload

    folder = tmp_path / "slurm-x"
    script = slurm.write_run_dir(folder, "#!/bin/bash\n")
    assert script == folder / "certify.sbatch" and (script.stat().st_mode & 0o777) == 0o755
    assert ((folder / "results").stat().st_mode & 0o777) == 0o700
    code = folder / "code"
    assert sorted(p.relative_to(code).as_posix() for p in code.rglob("*.py")) == sorted(payload.files())
    assert all((p.stat().st_mode & 0o222) == 0 for p in code.rglob("*"))
    text = render_case("docker.sbatch")
    assert 'chmod 0700 "$ENVBUILD_RESULTS"' in text and "0777" not in text
    assert "--tmpfs /results:rw,mode=1777" in text and ":/results" not in text  # nothing of the host
    assert text.count("--result-to-stdout") == 1


#: ``squeue --json`` of Slurm 22.05.8 (OpenAPI v0.0.38), cut down: it lists every job the
#: controller holds whatever ``-j`` says.
SQUEUE_2205 = {"meta": {"plugin": {"type": "openapi/v0.0.38"}}, "errors": [], "jobs": [
    {"job_id": 96, "job_state": "FAILED", "state_reason": "NonZeroExitCode", "exit_code": 256, "nodes": "vm",
     "time_limit": 525600, "name": "wrap"},
    {"job_id": 97, "job_state": "PENDING", "state_reason": "PartitionNodeLimit", "exit_code": 0, "nodes": "",
     "time_limit": 2, "name": "envbuild-4f09cd13d9e8"},
    {"job_id": 98, "job_state": "TIMEOUT", "state_reason": "TimeLimit", "exit_code": 15, "nodes": "vm",
     "time_limit": 1, "name": "envbuild-x"}]}
#: The same jobs as later plugins write them (numbers as {"set", "infinite", "number"}).
SQUEUE_LATER = {"jobs": [
    {"job_id": 98, "job_state": ["TIMEOUT", "COMPLETING"], "state_reason": "TimeLimit",
     "exit_code": {"status": ["SIGNALED"], "return_code": {"set": True, "infinite": False, "number": 0},
                   "signal": {"id": {"set": True, "infinite": False, "number": 15}, "name": "TERM"}},
     "nodes": "vm", "time_limit": {"set": True, "infinite": False, "number": 1}},
    {"job_id": 99, "job_state": ["RUNNING"], "state_reason": "None", "nodes": "vm",
     "time_limit": {"set": False, "infinite": True, "number": 0}}]}


def test_parse_squeue_json():
    text = json.dumps(SQUEUE_2205)
    info = slurm.parse_squeue_json(text, "96")
    assert (info.state, info.reason, info.exit_code, info.nodes, info.time_limit, info.source) == \
        ("FAILED", "NonZeroExitCode", "1:0", "vm", "365-00:00:00", "squeue --json")
    pending = slurm.parse_squeue_json(text, "97")
    assert (pending.state, pending.nodes, pending.time_limit) == ("PENDING", None, "00:02:00")
    assert slurm.never_starts(pending, 2).startswith("cannot start (pending, reason PartitionNodeLimit)")
    assert slurm.parse_squeue_json(text, "98").exit_code == "0:15"
    assert slurm.parse_squeue_json(text, "9") is None  # purged: sacct is asked next
    later = slurm.parse_squeue_json(json.dumps(SQUEUE_LATER), "98")
    assert (later.state, later.exit_code, later.time_limit) == ("TIMEOUT", "0:15", "00:01:00") and later.terminal
    running = slurm.parse_squeue_json(json.dumps(SQUEUE_LATER), "99")
    assert (running.state, running.reason, running.time_limit, running.terminal) == ("RUNNING", None, None, False)
    for bad in ("not json", "[]", json.dumps({"jobs": [{"job_id": 5, "job_state": "RUN;NING"}]})):
        with pytest.raises(ValueError):
            slurm.parse_squeue_json(bad, "5")


# --------------------------------------------------------------------------- real Slurm


@pytest.fixture
def case_labels(test_labels) -> dict[str, str]:
    return {**test_labels, "envbuild.test-case": uuid.uuid4().hex[:16]}


def containers(client, label: str) -> list[str]:
    return [c.name for c in client.containers.list(all=True, filters={"label": label})]


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


def shape(x):
    """The structure of a JSON document: keys of objects, element shapes of arrays (all
    elements alike), and for scalars only null vs. not."""
    if isinstance(x, dict):
        return {k: shape(v) for k, v in x.items()}
    if isinstance(x, list):
        shapes = [shape(v) for v in x]
        assert all(s == shapes[0] for s in shapes), x
        return [shapes[0]] if shapes else []
    return None if x is None else "value"


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
    assert cert["verdict"] == {"passed": True, "exit_code": 0, "failures": [], "warnings": []}
    assert cert["world_size"] == 2 and cert["node_status"] == {"0": {"name": "node-0", "exit_code": 0},
                                                               "1": {"name": "node-1", "exit_code": 0}}
    assert containers(docker_client, f"envbuild.test-case={case_labels['envbuild.test-case']}") == []
    job = job_line(cert["run_id"])
    assert "JobState=COMPLETED" in job and "NumTasks=2" in job

    # the same image through the local launcher: the same shape, key for key
    local_cert, _ = certify_image(docker_client, torch_image, images_dir=tmp_path / "local", labels=case_labels,
                                  timeout_s=180, **SHORT)
    assert local_cert["verdict"]["passed"], local_cert["verdict"]
    # what differs by construction: the overrides each run was given, and the host-side phase
    # times, which only the local launcher records (the Slurm job's are in its job.log)
    assert cert["overrides"] == {"nodes": 2, "port": port, "timeout_s": 180.0} and cert["phases"] == []
    assert len(local_cert["phases"]) > 0
    drop = ("overrides", "phases")
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
    info = slurm.job_info(launcher.job_id)
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
    state = slurm.parse_scontrol_job(job)
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
    assert waiting == "rank 0 did not finish within 60 s (timeout): blocked in all-reduce 8 B, waiting for rank 1"
    assert cert["ranks"]["1"]["last_progress"]["phase"] == "test fault"
    assert {n["exit_code"] for n in cert["node_status"].values()} == {None}
    # the trap's line, in the whole log: torchrun's own SIGTERM traceback may follow it and
    # push it out of the certificate's log tail
    for node in (0, 1):
        log = (launcher.folder / "logs" / f"node-{node}.log").read_text()
        assert f"envbuild: node {node}: SIGTERM: removing container envbuild-slurm-{launcher.job_id}-{node}" in log
    assert elapsed < 60 + slurm.END_MARGIN_S, elapsed
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
            if launcher.job_id and len(docker_client.containers.list(filters={"label": case})) == 2:
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
        while not [c for c in docker_client.containers.list(filters={"label": case})]:
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


@pytest.mark.parametrize("args, message", [
    (["--partition", "debug"], "envbuild certify: --partition, --slurm-dir go(es) with --launcher slurm"),
    (["--launcher", "k8s", "--sbatch-arg=--account=ml"], "envbuild certify: --slurm-dir, --sbatch-arg go(es) with "
     "--launcher slurm"),
    (["--launcher", "slurm", "--time-limit", "0"],
     "envbuild certify: argument --time-limit: '0' must be more than 0 (0 means no limit)"),
    (["--launcher", "slurm", "--time-limit", "x\n"], r"envbuild certify: argument --time-limit: 'x\n' is not a "
     "Slurm time limit (M, M:S, H:M:S, D-H, D-H:M or D-H:M:S)"),
    (["--launcher", "slurm", "--partition", "debug\n"], r"envbuild certify: argument --partition: 'debug\n' is not "
     "a partition name (letters, digits, _.-; a comma list of at most 16)"),
    (["--launcher", "slurm", "--sbatch-arg=--account=ml\n#SBATCH --wrap=id"],
     r"envbuild certify: argument --sbatch-arg: '--account=ml\n#SBATCH --wrap=id' is not one sbatch option: "
     r"--name or --name=value (letters, digits and _.,:/@%+=[]-; no blanks, quotes or shell characters)"),
    (["--launcher", "slurm", "--sbatch-arg=--chdir=/tmp"],
     "envbuild certify: argument --sbatch-arg: '--chdir=/tmp' is set by envbuild itself (the run folder, from "
     "--slurm-dir)"),
    (["--launcher", "slurm", "--container-image", "/x.sqsh\n"], r"envbuild certify: argument --container-image: "
     r"'/x.sqsh\n' is not an image reference, enroot URI or absolute path (letters, digits, ._:/@#+=-)"),
    (["--launcher", "slurm", "--container-runtime", "pyxis", "--container-image", "a,b"],
     "envbuild certify: argument --container-image: 'a,b' is not an image reference, enroot URI or absolute path "
     "(letters, digits, ._:/@#+=-)"),
    (["--launcher", "slurm", "--socket-ifname", "eth0\n"],
     r"envbuild certify: argument --socket-ifname: 'eth0\n' is not a network interface name list "
     "([^][=]NAME[,NAME...], names of at most 15 characters [A-Za-z0-9_.:-])"),
    (["--launcher", "slurm", "--slurm-nodes", "0"], "envbuild certify: argument --slurm-nodes: '0' is not an integer "
     "in 1..1024"),
    (["--launcher", "slurm", "--nodes", "2", "--slurm-nodes", "3"],
     "error: --slurm-nodes: 3 must be between 1 and the number of nodes (2)"),
    (["--launcher", "slurm", "--nodes", "4", "--slurm-nodes", "3"],
     "error: --slurm-nodes: 3 must divide the number of nodes (4) evenly"),
    (["--launcher", "slurm", "--pending-timeout", "-5"],
     "envbuild certify: argument --pending-timeout: '-5' is not a number in (0..604800]"),
    (["--launcher", "slurm", "--pending-timeout", "nan"],
     "envbuild certify: argument --pending-timeout: 'nan' is not a number in (0..604800]"),
    (["--launcher", "slurm", "--container-runtime", "podman"], "envbuild certify: argument --container-runtime: "
     "invalid choice: 'podman' (choose from 'docker', 'pyxis', 'apptainer')"),
])
def test_usage_errors_exit_64_before_the_engine_is_contacted(args, message, tmp_path):
    """With no Docker engine (DOCKER_HOST: a missing socket) a bad Slurm option is still a
    usage error (64), not "could not check" (3): the arguments are checked first."""
    exe = Path(sys.executable).parent / "envbuild"
    proc = subprocess.run([str(exe), "--images-dir", str(tmp_path), "certify", "envbuild/cpu-torch2:none", *args,
                           "--slurm-dir", str(tmp_path / "s")], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "DOCKER_HOST": f"unix://{tmp_path}/no-engine.sock"})
    assert (proc.returncode, proc.stderr.strip()) == (64, message)
    assert not (tmp_path / "s").exists()


def test_usage_error_twin_contacts_the_engine(tmp_path):
    """The same command line with good values gets as far as the (missing) engine: exit 3."""
    exe = Path(sys.executable).parent / "envbuild"
    sock = f"unix://{tmp_path}/no-engine.sock"
    proc = subprocess.run([str(exe), "--images-dir", str(tmp_path), "certify", "envbuild/cpu-torch2:none",
                           "--launcher", "slurm", "--time-limit", "10", "--partition", "debug", "--nodes", "4",
                           "--slurm-nodes", "2", "--sbatch-arg=--account=ml", "--pending-timeout", "60",
                           "--slurm-dir", str(tmp_path / "s")], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "DOCKER_HOST": sock})
    assert proc.returncode == 3, proc.stderr
    assert proc.stderr.startswith(f"error: no Docker engine answers at {sock}"), proc.stderr


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


# --------------------------------------------------------------------------- regeneration


def regenerate() -> None:
    """Write the golden files (`make golden`)."""
    GOLDEN.mkdir(parents=True, exist_ok=True)
    for name in sorted(CASES):
        (GOLDEN / name).write_text(render_case(name))
        print(f"wrote {(GOLDEN / name).relative_to(ROOT)}")

