"""The engine-free tests of tests/integration/test_slurm.py: Slurm launcher (builder/launchers/slurm/) and `envbuild certify --launcher slurm`."""

from __future__ import annotations

import dataclasses
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from builder.certify import settings as certify_settings
from builder.certify import verdict
from builder.certify.settings import Overrides
from builder.core.errors import EnvbuildError, ExitCode
from builder.launchers import base, slurm
from builder.launchers.base import LaunchResult, LaunchSpec
from builder.launchers.slurm import job as slurm_job
from builder.launchers.slurm import launcher as slurm_launcher
from builder.launchers.slurm import nodelogs as slurm_nodelogs
from builder.launchers.slurm import options as slurm_options
from builder.launchers.slurm import script as slurm_script

from factories import lock_of, rank_result
from fixtures_nodes import free_port, slurm_node  # noqa: F401 - pytest fixture (scripts/setup-slurm_script.sh)

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
    "none.sbatch": (GPU_SPEC, slurm.SlurmOptions(runtime="none", partition="gpu", socket_ifname="ib0"), FOLDER),
}


def render_case(name: str) -> str:
    spec, options, folder = CASES[name]
    return slurm_script.render_script(spec, options, folder, environ={})


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
    code = ("import sys; sys.path[:0] = ['tests/unit', 'tests']; import test_slurm_units as t; "
            "sys.stdout.write(''.join(t.render_case(n) for n in sorted(t.CASES)))")
    runs = {subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True,
                           env={**os.environ, "PYTHONHASHSEED": str(seed)}).stdout for seed in (1, 2)}
    assert len(runs) == 1 and runs.pop() == "".join(render_case(n) for n in sorted(CASES))


def test_node_native_script_runs_the_nodes_own_python():
    """--container-runtime none: torchrun on the node itself, the payload from the run folder,
    results straight into it; the job's own HOME/USER; no image named to the probe."""
    text = render_case("none.sbatch")
    body = text[text.index("envbuild_node() {"):text.index("\n}\n")]
    assert f"    export PYTHONPATH={FOLDER}/code\n" in body
    assert "    python3 -m torch.distributed.run --nnodes 2 --nproc-per-node 4 --node-rank \"$node\"" in body
    assert '--out "$ENVBUILD_RESULTS"' in body and 'status="$ENVBUILD_RESULTS"/node-"$node".exit' in body
    for absent in ("docker", "apptainer", "--container-", "export HOME=", "export USER=", "ENVBUILD_IMAGE"):
        assert absent not in body, absent
    assert "docker ps" not in text  # no container cleanup step


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
    text = slurm_script.render_script(CPU_SPEC, slurm.SlurmOptions(), FOLDER,
                               environ={base.EXTRA_LABELS_ENV: "envbuild.test-session=abc"})
    assert "--label envbuild.test-session=abc" in text


@pytest.mark.parametrize("change, field, message", [
    (dict(folder="relative/dir"), "--slurm-dir", "--slurm-dir: 'relative/dir' must be an absolute path of letters, "
     "digits and ._/+@- (Slurm reads it unquoted in #SBATCH lines; pyxis splits mounts at , and :)"),
    (dict(folder="/has space/x"), "--slurm-dir", None),
    (dict(folder="/per%cent"), "--slurm-dir", None),
    (dict(folder="/shared/runs\n"), "--slurm-dir", None),
    (dict(runtime="podman"), "--container-runtime",
     "--container-runtime: 'podman' is not a container runtime (docker, pyxis, apptainer, none)"),
    (dict(runtime="none", container_image="img:1"), "--container-image",
     "--container-image: 'img:1' goes with a container runtime; --container-runtime none runs no image"),
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
     "--reservation, --exclusive, --mem, --nodelist, --exclude...: docs/slurm.md)"),
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
        slurm_script.render_script(spec, slurm.SlurmOptions(**change), folder, environ={})
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
    text = slurm_script.render_script(CPU_SPEC, slurm.SlurmOptions(slurm_nodes=1, **change), FOLDER, environ={})
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
    text = slurm_script.render_script(spec, slurm.SlurmOptions(slurm_nodes=1, socket_ifname=option_ifname), FOLDER,
                               environ={})
    assert f"--env {gloo} " in text and f"--env {nccl} " in text


def test_template_refuses_a_newline_that_got_past_the_checks():
    """The second line of defence: a context value with a newline or control character
    (here put in after render_context's checks) is refused when the script is rendered,
    naming the field; the unchanged context renders the golden script."""
    spec, options, folder = CASES["docker.sbatch"]
    ctx = slurm_script.render_context(spec, options, folder, environ={})
    assert slurm_script.render_template(ctx) == (GOLDEN / "docker.sbatch").read_text()
    for key, value, field in [
        ("sbatch", [*ctx["sbatch"], "--comment=x\n#SBATCH --wrap=id"], "sbatch[8]"),
        ("image", ctx["image"] + "\n", "image"),
        ("env", {**ctx["env"], "X": "a\x1b[2Jb"}, "env.X"),
        ("run", [*ctx["run"], ("--label", "a\u202eb")], "run[-1][1]"),
        ("port", "29500\nid", "port"),
    ]:
        with pytest.raises(EnvbuildError) as e:
            slurm_script.render_template({**ctx, key: value})
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
    assert slurm_options.parse_time_limit(text) == seconds


def test_default_time_limit_is_the_timeout_in_whole_minutes():
    assert slurm_options.time_limit_for(dataclasses.replace(CPU_SPEC, timeout_s=61), slurm.SlurmOptions()) == "2"
    assert slurm_options.time_limit_for(dataclasses.replace(CPU_SPEC, timeout_s=5), slurm.SlurmOptions()) == "1"


def test_parse_scontrol_and_sacct():
    line = ("JobId=21 JobName=envbuild-4f09cd13d9e8 UserId=root(0) JobState=TIMEOUT Reason=TimeLimit "
            "Dependency=(null) ExitCode=0:15 RunTime=00:01:02 TimeLimit=00:01:00 NodeList=vm BatchHost=vm")
    info = slurm_job.parse_scontrol_job(line)
    assert (info.state, info.reason, info.exit_code, info.nodes, info.time_limit) == \
        ("TIMEOUT", "TimeLimit", "0:15", "vm", "00:01:00")
    assert info.terminal
    assert slurm_job.parse_scontrol_job("JobState=RUNNING Reason=None").reason is None
    assert slurm_job.parse_scontrol_job("slurm_load_jobs error: Invalid job id specified") is None
    acct = "20|FAILED|1:0|vm|00:05:00|None\n21|CANCELLED by 0|0:15|vm|00:01:00|None\n"
    assert slurm_job.parse_sacct(acct, "21").state == "CANCELLED"
    assert slurm_job.parse_sacct(acct, "20").exit_code == "1:0"
    assert slurm_job.parse_sacct(acct, "22") is None


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
    info = slurm_job.parse_scontrol_job(PENDING_LINE.format(reason=reason))
    assert slurm_job.never_starts(info, 2) == message


def test_only_pending_jobs_never_start():
    running = PENDING_LINE.format(reason="PartitionNodeLimit").replace("JobState=PENDING", "JobState=RUNNING")
    assert slurm_job.never_starts(slurm_job.parse_scontrol_job(running), 2) is None


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
    for sub in (slurm_script.RESULTS_DIR, slurm_script.LOGS_DIR):
        (folder / sub).mkdir(parents=True)
    (folder / slurm_script.JOB_LOG).write_text(job_log)
    for node, text in logs.items():
        (folder / slurm_script.LOGS_DIR / f"node-{node}.log").write_text(text)
    for node, status in enumerate(exits):
        (folder / slurm_script.RESULTS_DIR / f"node-{node}.exit").write_text(status + "\n")
    launcher = slurm.SlurmLauncher(tmp_path, slurm.SlurmOptions(slurm_nodes=1, time_limit="1"))
    launcher.job_id = "21"
    outcome = slurm_launcher.Outcome(slurm_job.JobInfo(state=state, reason=reason, exit_code="0:15"), started_at="")
    launch = launcher.collect(CPU_SPEC, folder, outcome, 60, [])
    s = certify_settings.resolve(lock_of({"nodes": 2}), Overrides(sizes=[8]), gpu_visible=False)
    return launch, verdict.judge(s, launch, None).to_dict()


def test_time_limit_verdict_comes_from_the_job_state_not_a_log_line(tmp_path):
    """The job state TIMEOUT alone makes the verdict "timeout, could not check" (3), with an
    empty job.log (slurmstepd's "DUE TO TIME LIMIT" line not written yet) and with torchrun's
    summary blaming rank 1 for the SIGTERM that ended the job (a race with docker rm)."""
    launch, v = collect(tmp_path, "TIMEOUT", "TimeLimit", job_log="", logs={1: TORCHRUN_SIGTERM})
    assert launch.timed_out and launch.rank_exit_codes == {}
    assert v == {"passed": False, "exit_code": 3, "warnings": [], "failure_class": "network", "next_step": (
        "fix the network config (the interface NCCL/gloo use, its MTU, the firewall between the nodes)"), "failures": [
        f"Slurm job 21 ended TIMEOUT (TimeLimit): cancelled by Slurm at its time limit (--time=1), exit code 0:15; "
        f"{tmp_path}/slurm-{RUN_ID}/job.log is empty",
        "rank 0 did not finish within 60 s (timeout)", "rank 1 did not finish within 60 s (timeout)"]}


def test_ranks_ended_by_a_lost_node_are_could_not_check(tmp_path):
    """NODE_FAIL: the surviving node's rank exited 1 when its peer vanished (gloo saw it before
    Slurm's signal did): a consequence of the lost node, so the verdict is "could not check" (3);
    the twin below blames a rank exit of a job that completed (2)."""
    exited_1 = TORCHRUN_SIGTERM.replace("rank      : 1", "rank      : 0").replace("-15 (pid: 9)", "1 (pid: 9)")
    launch, v = collect(tmp_path, "NODE_FAIL", "NodeDown", job_log="", logs={0: exited_1}, exits=("1", ""))
    assert launch.rank_exit_codes == {}
    assert v["exit_code"] == 3 and v["failures"][1:] == [
        "rank 0: exited with 1 after Slurm job 21 ended NODE_FAIL (NodeDown)",
        "rank 1: Slurm job 21 ended NODE_FAIL (NodeDown) before this rank reported"], v
    launch, v = collect(tmp_path / "done", "COMPLETED", None, job_log="", logs={0: exited_1}, exits=("1", "0"))
    assert launch.rank_exit_codes == {0: 1} and v["exit_code"] == 2, v


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
    s = certify_settings.resolve(lock_of({"nodes": 2}), Overrides(sizes=[8]), gpu_visible=False)
    launch = LaunchResult(rank_results={}, node_logs={}, node_exit_codes={0: None, 1: None}, timed_out=True,
                          missing_ranks=[0, 1], started_at="", finished_at="",
                          notes=["Slurm job 7 ended TIMEOUT (TimeLimit)"], deadline_s=60.0)
    v = verdict.judge(s, launch, None).to_dict()
    assert v["exit_code"] == ExitCode.UNREACHABLE
    assert v["failures"] == ["Slurm job 7 ended TIMEOUT (TimeLimit)", "rank 0 did not finish within 60 s (timeout)",
                             "rank 1 did not finish within 60 s (timeout)"]


def result_doc(rank: int, world: int = 2, run_id: str = RUN_ID, **kw) -> dict:
    """A rank result as the bench prints it (the fields the host reads; tests/factories.py)."""
    fields = dict(run_id=run_id, hostname=f"vm-{rank}", options={"sizes": [8], "iters": 3},
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
    (logs / "node-4.log").write_text(result_line(result_doc(0, 6)) + result_line(result_doc(4, 6, local_rank=-8)))
    os.mkfifo(logs / "node-5.log")
    nl = slurm_nodelogs.NodeLogs(logs, spec)
    nl.finish()
    assert sorted(nl.results()) == [0] and nl.results()[0].hostname == "vm-0"
    assert nl.problems() == {
        1: "unreadable result printed by node 1: node-1 output: not valid JSON: Expecting property name enclosed in "
           "double quotes: line 1 column 2 (char 1)",
        2: "result is not envbuild.rank-result/3 (got 'other')",
        3: "result of rank 3 is from run 'ffffffffffff', not this run 0123456789ab: refused (stale or planted)",
        4: "result of rank 4 is not a valid envbuild.rank-result/3: local_rank: -8 Expected `int` >= 0",
        5: f"the log of node 5 was not read: {logs}/node-5.log is not a regular file",
    }
    assert nl.logs()[0] == "torchrun says hi\nbye\n"  # result lines are not log
    # the twin of rank 3: the same document of this very run is taken
    (logs / "node-3.log").write_text(result_line(result_doc(3, 6, run_id="ffffffffffff")))
    twin = slurm_nodelogs.NodeLogs(logs, dataclasses.replace(spec, run_id="ffffffffffff"))
    twin.finish()
    assert 3 in twin.results()


def test_node_logs_are_read_as_they_grow(tmp_path):
    """Each poll reads what a log gained; a line split over two polls is read whole once."""
    logs = tmp_path / "logs"
    logs.mkdir()
    line = result_line(result_doc(1))
    (logs / "node-1.log").write_text("@@envbuild-progress " + json.dumps({"rank": 1, "run": RUN_ID, "seq": 1,
                                                                         "phase": "init"}) + "\n" + line[:40])
    nl = slurm_nodelogs.NodeLogs(logs, CPU_SPEC)
    nl.poll()
    assert nl.results() == {} and nl.tracker.snapshot()[1]["phase"] == "init"
    with open(logs / "node-1.log", "a") as f:
        f.write(line[40:])
    nl.poll()
    assert sorted(nl.results()) == [1] and nl.problems() == {}


def test_node_logs_become_log_events_of_the_published_schema(tmp_path):
    """Each kept line is one ``log`` event of ``node-<i>``: the rank of torchrun's ``[rankN]:`` prefix
    when the node hosts it (not otherwise), the level from its words; result and blank lines are no event."""
    import jsonschema

    logs = tmp_path / "logs"
    logs.mkdir()
    (logs / "node-1.log").write_text("torchrun says hi\n \n[rank5]: Traceback (most recent call last):\n"
                                     "[rank9]: not this node's rank\nnode-1:12 [0] NCCL WARN NET/Socket\n"
                                     "W1202 01:14:57.180000 1 api.py:753] Received 15 death signal\n"
                                     + result_line(result_doc(5, 8)))
    nl = slurm_nodelogs.NodeLogs(logs, GPU_SPEC)
    nl.finish()
    evs = nl.events()
    assert [(e.run, e.node, e.rank, e.level, e.event, e.msg) for e in evs] == [
        (RUN_ID, "node-1", None, "info", "log", "torchrun says hi"),
        (RUN_ID, "node-1", 5, "error", "log", "[rank5]: Traceback (most recent call last):"),
        (RUN_ID, "node-1", None, "info", "log", "[rank9]: not this node's rank"),
        (RUN_ID, "node-1", None, "warning", "log", "node-1:12 [0] NCCL WARN NET/Socket"),
        (RUN_ID, "node-1", None, "warning", "log", "W1202 01:14:57.180000 1 api.py:753] Received 15 death signal")]
    schema = json.loads((ROOT / "schemas/log-event.schema.json").read_text())
    for e in evs:
        jsonschema.validate(e.to_dict(), schema)
        assert re.fullmatch(r"20\d\d-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z", e.ts), e.ts


def test_run_folder_is_private_and_holds_the_payload(tmp_path):
    """results/ is the job's user's only (0700, nothing the docker nodes' UID or another user
    can write); code/ is a read-only copy of the one payload (builder.agent.payload)."""
    from builder.agent import payload

    folder = tmp_path / "slurm-x"
    script = slurm_script.write_run_dir(folder, "#!/bin/bash\n")
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
    info = slurm_job.parse_squeue_json(text, "96")
    assert (info.state, info.reason, info.exit_code, info.nodes, info.time_limit, info.source) == \
        ("FAILED", "NonZeroExitCode", "1:0", "vm", "365-00:00:00", "squeue --json")
    pending = slurm_job.parse_squeue_json(text, "97")
    assert (pending.state, pending.nodes, pending.time_limit) == ("PENDING", None, "00:02:00")
    assert slurm_job.never_starts(pending, 2).startswith("cannot start (pending, reason PartitionNodeLimit)")
    assert slurm_job.parse_squeue_json(text, "98").exit_code == "0:15"
    assert slurm_job.parse_squeue_json(text, "9") is None  # purged: sacct is asked next
    later = slurm_job.parse_squeue_json(json.dumps(SQUEUE_LATER), "98")
    assert (later.state, later.exit_code, later.time_limit) == ("TIMEOUT", "0:15", "00:01:00") and later.terminal
    running = slurm_job.parse_squeue_json(json.dumps(SQUEUE_LATER), "99")
    assert (running.state, running.reason, running.time_limit, running.terminal) == ("RUNNING", None, None, False)
    for bad in ("not json", "[]", json.dumps({"jobs": [{"job_id": 5, "job_state": "RUN;NING"}]})):
        with pytest.raises(ValueError):
            slurm_job.parse_squeue_json(bad, "5")


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
     "invalid choice: 'podman' (choose from 'docker', 'pyxis', 'apptainer', 'none')"),
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


# --------------------------------------------------------------------------- regeneration


def regenerate() -> None:
    """Write the golden files (`make golden`)."""
    GOLDEN.mkdir(parents=True, exist_ok=True)
    for name in sorted(CASES):
        (GOLDEN / name).write_text(render_case(name))
        print(f"wrote {(GOLDEN / name).relative_to(ROOT)}")

