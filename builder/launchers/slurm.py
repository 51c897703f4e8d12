"""Slurm launcher: run a certification as one batch job through the cluster's own scheduler.

For a :class:`~builder.launchers.base.LaunchSpec` of N nodes with G GPUs each (P = max(G, 1)
processes per node), :meth:`SlurmLauncher.run`:

1. makes a run folder ``<slurm dir>/slurm-<run>/`` (by default next to the certificate,
   ``images/<recipe>/certificates/slurm-<run>/``; it must be on a filesystem every node
   sees) holding

   - ``certify.sbatch``: the batch script (:func:`render_script`, template
     ``builder/launchers/templates/slurm/certify.sbatch.j2``, deterministic), kept so that a user
     can read it and run it again by hand (``sbatch certify.sbatch``);
   - ``code/``: a copy of envbuild's in-image code (``bench/``, ``probe/``), mounted
     read-only at ``/opt/envbuild`` (``PYTHONPATH``): the image is never changed;
   - ``results/`` (mode 0777: the nodes write as another UID): ``rank-<r>.json`` of each
     rank and ``node-<i>.exit`` (torchrun's exit status, or ``SIGTERM``/``SIGINT``);
   - ``logs/node-<i>.log`` (each task's output) and ``job.log`` (the batch script's);

2. submits it with ``sbatch --parsable`` and polls ``scontrol show job -o`` every
   ``poll_s`` seconds; a job purged from the controller's memory (``MinJobAge``) is looked
   up with ``sacct``, which needs accounting storage (without it the state is ``UNKNOWN``);
3. gives up (``scancel``) when the job is still pending after ``pending_timeout_s``, or
   after :data:`NEVER_STARTS_AFTER_S` when it is pending for a reason waiting cannot resolve
   (:func:`never_starts`: ``PartitionNodeLimit``, ``InvalidAccount``...), or still running :data:`END_MARGIN_S`
   seconds after its time limit (Slurm's ``KillWait``, 30 s by default, plus slack);
   meanwhile it reports progress at most every :data:`PROGRESS_S` seconds;
4. reads the rank results, node logs and exit statuses from the run folder and returns
   them as a :class:`LaunchResult` with the job's final state in ``notes``: a job that
   ended other than ``COMPLETED`` gives ``"Slurm job 42 FAILED (NonZeroExitCode), exit
   code 1:0; job.log: ...last lines..."``;
5. ALWAYS (``finally``, also on Ctrl-C, with SIGINT/SIGTERM deferred meanwhile) cancels a
   job that is still queued or running (``scancel``), waits up to :data:`CANCEL_WAIT_S`
   for it to end, and removes every container labelled ``envbuild.run=<run>`` on the
   local Docker engine; with the docker runtime and nodes other than this host it also
   runs a one-task-per-node ``srun`` step doing the same there.

The job (see the template; sources: Slurm's ``sbatch``, ``srun`` and ``scontrol`` man pages,
https://slurm.schedmd.com/sbatch.html, https://slurm.schedmd.com/srun.html):

- **one Slurm task per envbuild node**, each running torchrun with ``--nproc-per-node P``
  and ``--node-rank $SLURM_PROCID`` (static rendezvous, as the local and Kubernetes
  launchers), rather than one process per task with ``RANK``/``WORLD_SIZE``/``LOCAL_RANK``
  from ``SLURM_PROCID``/``SLURM_NTASKS``/``SLURM_LOCALID``: the bench, the result files and
  torchrun's per-rank failure summary stay the same everywhere, and the G ranks of a node
  share one container (NCCL's intra-node transports need a shared ``/dev/shm`` and IPC);
- ``#SBATCH --nodes=M --ntasks=N``: by default M = N with ``--ntasks-per-node=1`` (one
  envbuild node per machine); with ``slurm_nodes`` M < N the N tasks share M machines and
  the job asks ``--overcommit`` (one CPU per machine is allocated; the containers are not
  bound by the allocation anyway): this is how a one-node test cluster runs 2 nodes;
- GPUs: ``#SBATCH --gres=gpu:<G x tasks per machine>`` and ``srun --gpus-per-task=G``;
- master address: ``scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n1``, port the
  recipe's (``--port``); ``#SBATCH --time`` the time limit (default: the timeout rounded up
  to whole minutes, at least 1: Slurm's granularity), ``--no-requeue``;
- ``srun --kill-on-bad-exit=1``: a node that fails ends the step at once (so
  ``killed_after_s`` is 0 for the others).

Container runtimes (``runtime``; default ``docker``, because the image envbuild certifies is
one in the local Docker engine and docker needs no further option):

``docker``
    each task runs ``docker run --rm --network host`` (host networking, the norm for
    multi-node NCCL; each run needs its own port on a shared machine) as user
    ``12345:12345`` with a read-only root filesystem, tmpfs ``/tmp`` and ``HOME``, all
    capabilities dropped and ``no-new-privileges``, as the local launcher. The container is
    a child of dockerd, not of the job step, so a cancelled or timed-out job would leave it
    running: it is named ``envbuild-slurm-<jobid>-<node>`` and labelled ``envbuild=1``,
    ``envbuild.run=<run>``, ``envbuild.node``, ``envbuild.slurm-job`` (plus ``spec.labels``
    and ``$ENVBUILD_EXTRA_LABELS``), removed by the task's ``trap ... EXIT TERM INT``
    (Slurm sends SIGTERM, then SIGKILL after ``KillWait``), by a cleanup step at the end
    of the batch script, and by envbuild after the job ended. GPUs: ``--gpus
    device=$CUDA_VISIBLE_DEVICES`` (correct where Slurm does not renumber devices, i.e.
    without ``ConstrainDevices=yes``; use pyxis or apptainer there).
``pyxis``
    ``srun --container-image=IMAGE --container-mounts=...:ro,... --no-container-mount-home``
    (NVIDIA pyxis, https://github.com/NVIDIA/pyxis/wiki/Usage): the task runs inside an
    enroot container as the submitting user; the root filesystem is the job's private copy,
    so the image is not changed. ``IMAGE`` is an enroot URI (``registry#repo:tag``) or a
    squashfs file on a shared filesystem (``enroot import -o x.sqsh dockerd://REF``).
``apptainer``
    ``apptainer exec [--nv] --contain --cleanenv --bind ...`` (https://apptainer.org/docs/
    user/latest/): the submitting user, the read-only image, private ``/tmp`` and
    ``HOME``, a minimal ``/dev``; the environment is passed as ``APPTAINERENV_*``. ``IMAGE``
    is a SIF file (default ``docker-daemon:<image>``, converted from the node's engine).
"""

from __future__ import annotations

import contextlib
import math
import os
import re
import shlex
import shutil
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Optional, Sequence

import jinja2

from builder.image import engine
from builder.core.errors import EnvbuildError, ExitCode, Unreachable
from builder.core.files import template_environment
from builder.core.paths import image_dir
from builder.core.inputs import control_char_paths, has_control, one_line

from .base import LaunchResult, LaunchSpec, OnProgress
from . import local

#: Container runtimes of the batch script; the first is the default.
RUNTIMES = ("docker", "pyxis", "apptainer")
DEFAULT_RUNTIME = "docker"
#: File names inside the run folder.
SCRIPT_NAME = "certify.sbatch"
JOB_LOG = "job.log"
RESULTS_DIR = "results"
LOGS_DIR = "logs"
CODE_DIR = "code"
#: Where the in-image code is mounted (read-only); also ``PYTHONPATH``.
CODE_MOUNT = local.PYTHONPATH
#: Where each rank writes its result inside the container.
RESULTS_MOUNT = local.RESULTS_MOUNT
#: Prefix of the docker containers: ``envbuild-slurm-<jobid>-<node>``.
CONTAINER_PREFIX = "envbuild-slurm"
#: Label naming the Slurm job of a docker container.
SLURM_JOB_LABEL = "envbuild.slurm-job"
#: Seconds between two looks at the job.
POLL_S = 2.0
#: Seconds a job may stay pending before envbuild cancels it.
DEFAULT_PENDING_TIMEOUT_S = 600.0
#: Seconds past its time limit before envbuild cancels a job Slurm did not end (Slurm's
#: default ``KillWait`` is 30 s; ``scontrol show config``).
END_MARGIN_S = 120.0
#: Seconds to wait for a cancelled job to end.
CANCEL_WAIT_S = 60.0
#: Seconds of ``scontrol`` failures (controller unreachable) before giving up.
UNREACHABLE_AFTER_S = 60.0
#: Seconds for one Slurm command.
COMMAND_TIMEOUT_S = 30.0
#: Lines of ``job.log`` quoted in the job's note.
LOG_TAIL_LINES = 6
#: Seconds between two progress messages when nothing changed.
PROGRESS_S = 15.0
#: Seconds a job must stay pending for reasons of :data:`NEVER_STARTS` before envbuild
#: cancels it (right after submission Slurm may show ``PartitionConfig`` for a moment).
NEVER_STARTS_AFTER_S = 10.0

#: Reasons of a pending job that waiting cannot resolve: the job as submitted breaks a limit
#: or asks for what is not there (``squeue`` man page, "JOB REASON CODES";
#: https://slurm.schedmd.com/job_reason_codes.html), with a hint. Left out on purpose:
#: aggregate limits (``QOSGrp*``, ``AssocGrp*``, ``*PerUser*``: other jobs end),
#: ``ReqNodeNotAvail``, ``NodeDown``, ``PartitionDown`` (nodes come back), holds.
#: ``PartitionNodeLimit`` also shows when the partition's nodes are down or drained.
NEVER_STARTS = {
    "PartitionNodeLimit": "the job asks for {nodes}; the partition allows fewer (or has fewer up): pass "
                          "--slurm-nodes with fewer (the envbuild nodes then share machines) or --partition",
    "PartitionTimeLimit": "its time limit {time_limit} is above the partition's: pass --time-limit or --partition",
    "PartitionConfig": "the partition cannot give what the job asks for (nodes, CPUs, GPUs, memory): "
                       "pass --partition, --slurm-nodes or --gpus-per-node",
    "AccountNotAllowed": "its account may not use the partition: pass --sbatch-arg=--account=A or --partition",
    "InvalidAccount": "its account is invalid: pass --sbatch-arg=--account=A (sacctmgr show assoc user=$USER)",
    "QOSNotAllowed": "its QOS may not be used here: pass --sbatch-arg=--qos=Q or --partition",
    "InvalidQOS": "its QOS is invalid: pass --sbatch-arg=--qos=Q (sacctmgr show assoc user=$USER)",
    "BadConstraints": "no node can satisfy its constraints: check --sbatch-arg, --gpus-per-node and --slurm-nodes",
    "DependencyNeverSatisfied": "its dependency can never be satisfied: drop --sbatch-arg=--dependency",
}
#: Per-job QOS or association limits (``QOSMaxNodePerJobLimit``, ``AssocMaxWallDurationPerJobLimit``...).
_PER_JOB_LIMIT_RE = re.compile(r"(QOS|Assoc)(Max|Min)\w*PerJob\w*")

#: Job states that do not change any more (``squeue`` man page, "JOB STATE CODES").
TERMINAL_STATES = frozenset({
    "BOOT_FAIL", "CANCELLED", "COMPLETED", "DEADLINE", "FAILED", "NODE_FAIL", "OUT_OF_MEMORY",
    "PREEMPTED", "SPECIAL_EXIT", "TIMEOUT", "REVOKED", "UNKNOWN",
})
#: States of a job that has not started yet.
PENDING_STATES = frozenset({"PENDING", "CONFIGURING", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED", "RESV_DEL_HOLD"})
#: torchrun's exit statuses of a rank stopped by the signals Slurm sends to end a job
#: (SIGTERM, then SIGKILL after ``KillWait``; ``scancel`` man page).
STOP_STATUSES = frozenset({-15, -9})
#: Terminal states that stop the ranks from outside (the ranks could not be checked).
INTERRUPTED_STATES = frozenset({"BOOT_FAIL", "CANCELLED", "NODE_FAIL", "PREEMPTED", "REVOKED", "UNKNOWN"})

#: Longest value of one Slurm option envbuild writes into the script (characters).
MAX_VALUE_CHARS = 200
#: Longest run folder path (characters).
MAX_PATH_CHARS = 1000
#: Most ``--sbatch-arg`` options.
MAX_SBATCH_ARGS = 32
#: Longest time limit accepted, in seconds (365 days).
MAX_TIME_LIMIT_S = 365 * 86400
#: Longest ``--pending-timeout`` accepted, in seconds (7 days).
MAX_PENDING_TIMEOUT_S = 7 * 86400

# Every pattern is applied with fullmatch: ``$`` of re.match also matches before a final
# newline, and a newline in an ``#SBATCH`` line starts a new line of the script.
_TIME_RE = re.compile(r"(?:([0-9]{1,5})-([0-9]{1,5})(?::([0-9]{1,5})(?::([0-9]{1,5}))?)?"
                      r"|([0-9]{1,7})(?::([0-9]{1,5})(?::([0-9]{1,5}))?)?)")
_PARTITION_RE = re.compile(r"[A-Za-z0-9_.-]{1,64}(?:,[A-Za-z0-9_.-]{1,64}){0,15}")
_SBATCH_ARG_RE = re.compile(r"--([a-z][a-z0-9-]{0,39})(?:=([A-Za-z0-9_.,:/@%+=\[\]-]{1,"
                            + str(MAX_VALUE_CHARS) + r"}))?")
_PATH_RE = re.compile(r"/[A-Za-z0-9._/+@-]{0,%d}" % (MAX_PATH_CHARS - 1))
_ENV_NAME_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,127}")
_IFNAME_RE = re.compile(r"[A-Za-z0-9_.:-]{1,15}")
_RUN_ID_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
_USER_RE = re.compile(r"[0-9]{1,10}:[0-9]{1,10}")
_LABEL_KEY_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._/-]{0,254}")
_SHM_RE = re.compile(r"[0-9]{1,15}[bkmgBKMG]?")
#: What a node runs: an image reference, ``docker-daemon:REF``, an enroot URI
#: (``registry#repo:tag``) or an absolute ``.sqsh``/``.sif`` path.
_CONTAINER_IMAGE_RE = re.compile(r"[A-Za-z0-9/][A-Za-z0-9._:/@#+=-]{0,%d}" % (MAX_PATH_CHARS - 1))
_JOBID_RE = re.compile(r"(\d+)(?:;\S+)?")

#: ``--sbatch-arg`` options passed on, by full name -> whether they take a value (True),
#: take none (False) or may take one (None). sbatch man page, https://slurm.schedmd.com/sbatch.html.
#: A closed list: sbatch (getopt_long) takes any unambiguous prefix of an option name
#: (``--out`` is ``--output``), so a list of refused names could be bypassed. Left out: the
#: options envbuild writes itself (:data:`SBATCH_SET_BY_ENVBUILD`) and those that detach the
#: job from the run (``--array``, ``--wrap``, ``--hold``, ``--wait``, ``--clusters``,
#: ``--export``, ``--error``, ``--requeue``, ``--uid``...).
SBATCH_OPTIONS: dict[str, Optional[bool]] = {
    **dict.fromkeys((
        "account", "acctg-freq", "begin", "comment", "constraint", "core-spec", "cores-per-socket",
        "cpu-freq", "cpus-per-gpu", "cpus-per-task", "deadline", "delay-boot", "dependency", "distribution",
        "exclude", "extra", "gpu-bind", "gpu-freq", "gres-flags", "hint", "kill-on-invalid-dep", "licenses",
        "mail-type", "mail-user", "mcs-label", "mem", "mem-bind", "mem-per-cpu", "mem-per-gpu", "mincpus",
        "network", "nodelist", "ntasks-per-core", "ntasks-per-socket", "power", "prefer", "priority",
        "profile", "qos", "reservation", "signal", "sockets-per-node", "switches", "thread-spec",
        "threads-per-core", "time-min", "tmp", "wckey"), True),
    **dict.fromkeys(("contiguous", "oversubscribe", "reboot", "spread-job", "use-min-nodes"), False),
    **dict.fromkeys(("exclusive", "nice"), None),
}
#: sbatch options envbuild writes itself, with the envbuild option that sets them.
SBATCH_SET_BY_ENVBUILD = {
    "job-name": "envbuild-<run>", "nodes": "from --slurm-nodes", "ntasks": "from --nodes",
    "ntasks-per-node": "from --slurm-nodes", "overcommit": "from --slurm-nodes", "time": "from --time-limit",
    "output": "the run folder, from --slurm-dir", "chdir": "the run folder, from --slurm-dir",
    "no-requeue": "always", "partition": "from --partition", "gres": "from --gpus-per-node",
    "gpus": "from --gpus-per-node", "gpus-per-node": "from --gpus-per-node", "gpus-per-task": "from --gpus-per-node",
}


def _usage(message: str, field_: str, value: object) -> EnvbuildError:
    return EnvbuildError(message, field=field_, value=value, exit_code=ExitCode.USAGE)


def _is_text(value: object, limit: int) -> bool:
    return isinstance(value, str) and 0 < len(value) <= limit


def check_partition(text: object) -> str:
    """``text`` when it is a partition name or a comma list of them (``gpu``,
    ``gpu,debug``; at most 16 names of 64 letters, digits and ``_.-``).

    Raises:
        EnvbuildError: (exit 64, field ``--partition``) anything else.
    """
    if not (_is_text(text, 2000) and _PARTITION_RE.fullmatch(text)):
        raise _usage("is not a partition name (letters, digits, _.-; a comma list of at most 16)",
                     "--partition", text)
    return text


def check_sbatch_arg(text: object) -> str:
    """``text`` when it is one ``#SBATCH`` option envbuild passes on: ``--NAME`` or
    ``--NAME=VALUE`` with NAME in :data:`SBATCH_OPTIONS` (full names, long form) and VALUE of
    at most :data:`MAX_VALUE_CHARS` letters, digits and ``_.,:/@%+=[]-`` (no blanks, quotes,
    shell metacharacters or control characters).

    Raises:
        EnvbuildError: (exit 64, field ``--sbatch-arg``) anything else, naming why.
    """
    m = _SBATCH_ARG_RE.fullmatch(text) if _is_text(text, MAX_VALUE_CHARS + 50) else None
    if not m:
        raise _usage("is not one sbatch option: --name or --name=value (letters, digits and _.,:/@%+=[]-; "
                     "no blanks, quotes or shell characters)", "--sbatch-arg", text)
    name, value = m.group(1), m.group(2)
    if name in SBATCH_SET_BY_ENVBUILD:
        raise _usage(f"is set by envbuild itself ({SBATCH_SET_BY_ENVBUILD[name]})",
                     "--sbatch-arg", text)
    if name not in SBATCH_OPTIONS:
        raise _usage("is not an sbatch option envbuild passes on (--account, --qos, --constraint, --reservation, "
                     "--exclusive, --mem, --nodelist, --exclude...: README, Running on a cluster)", "--sbatch-arg", text)
    takes = SBATCH_OPTIONS[name]
    if takes is True and value is None:
        raise _usage(f"needs a value: --{name}=VALUE", "--sbatch-arg", text)
    if takes is False and value is not None:
        raise _usage(f"takes no value: --{name}", "--sbatch-arg", text)
    return text


def check_ifname(text: object) -> str:
    """``text`` when it is a network interface name (1..15 of letters, digits, ``_.:-``).

    Raises:
        EnvbuildError: (exit 64, field ``--socket-ifname``) anything else.
    """
    if not (_is_text(text, 15) and _IFNAME_RE.fullmatch(text)):
        raise _usage("is not a network interface name (1-15 letters, digits, _.:-)", "--socket-ifname", text)
    return text


def check_container_image(text: object, runtime: Optional[str] = None) -> str:
    """``text`` when a node can run it: an image reference, ``docker-daemon:REF``, an enroot
    URI (``registry#repo:tag``) or an absolute path, of letters, digits and ``._:/@#+=-``;
    for pyxis no ``,`` either (it separates srun's container options).

    Raises:
        EnvbuildError: (exit 64, field ``--container-image``) anything else.
    """
    if not (_is_text(text, MAX_PATH_CHARS) and _CONTAINER_IMAGE_RE.fullmatch(text)) \
            or (runtime == "pyxis" and "," in text):
        raise _usage("is not an image reference, enroot URI or absolute path (letters, digits, ._:/@#+=-)",
                     "--container-image", text)
    return text


def check_slurm_dir(path: object) -> str:
    """``path`` when it is an absolute path the script can carry unquoted: letters, digits
    and ``._/+@-``, at most :data:`MAX_PATH_CHARS` characters (Slurm reads ``#SBATCH
    --output``/``--chdir`` unquoted; pyxis splits mounts at ``,`` and ``:``).

    Raises:
        EnvbuildError: (exit 64, field ``--slurm-dir``) anything else.
    """
    if not (_is_text(path, MAX_PATH_CHARS) and _PATH_RE.fullmatch(path)):
        raise _usage("must be an absolute path of letters, digits and ._/+@- (Slurm reads it unquoted in "
                     "#SBATCH lines; pyxis splits mounts at , and :)", "--slurm-dir", path)
    return path


def check_pending_timeout(seconds: object) -> float:
    """``seconds`` as a float when it is a finite number in ``(0, MAX_PENDING_TIMEOUT_S]``.

    Raises:
        EnvbuildError: (exit 64, field ``--pending-timeout``) anything else.
    """
    ok = isinstance(seconds, (int, float)) and not isinstance(seconds, bool) and math.isfinite(seconds) \
        and 0 < seconds <= MAX_PENDING_TIMEOUT_S
    if not ok:
        raise _usage(f"must be a number of seconds in (0, {MAX_PENDING_TIMEOUT_S}]", "--pending-timeout", seconds)
    return float(seconds)


def check_slurm_nodes(slurm_nodes: object, nodes: int) -> int:
    """``slurm_nodes`` when the ``nodes`` envbuild nodes can share that many Slurm nodes
    evenly (an integer in ``1..nodes`` dividing ``nodes``).

    Raises:
        EnvbuildError: (exit 64, field ``--slurm-nodes``) anything else.
    """
    if not isinstance(slurm_nodes, int) or isinstance(slurm_nodes, bool) or not 1 <= slurm_nodes <= nodes:
        raise _usage(f"must be between 1 and the number of nodes ({nodes})", "--slurm-nodes", slurm_nodes)
    if nodes % slurm_nodes:
        raise _usage(f"must divide the number of nodes ({nodes}) evenly", "--slurm-nodes", slurm_nodes)
    return slurm_nodes


# --------------------------------------------------------------------------- options


@dataclass(frozen=True)
class SlurmOptions:
    """How to run the job.

    Attributes:
        runtime: ``"docker"`` (default), ``"pyxis"`` or ``"apptainer"`` (module doc).
        partition: ``#SBATCH --partition`` (None: the cluster's default partition).
        time_limit: ``#SBATCH --time`` in a Slurm time format (``"10"`` minutes,
            ``"1:30:00"``, ``"1-00"``...); None: the timeout rounded up to whole minutes.
        slurm_nodes: Slurm nodes M the N envbuild nodes run on (None: N, one each).
        container_image: what the nodes run (None: the spec's image for docker and pyxis,
            ``docker-daemon:<image>`` for apptainer).
        sbatch_args: extra ``#SBATCH`` lines (``--account=x``, ``--qos=y``, ``--exclusive``).
        socket_ifname: ``GLOO_SOCKET_IFNAME`` and ``NCCL_SOCKET_IFNAME`` (None: unset, the
            libraries choose; ``spec.env`` wins).
        pending_timeout_s: seconds the job may stay pending before it is cancelled.
        user: ``uid:gid`` of the docker containers.
    """

    runtime: str = DEFAULT_RUNTIME
    partition: Optional[str] = None
    time_limit: Optional[str] = None
    slurm_nodes: Optional[int] = None
    container_image: Optional[str] = None
    sbatch_args: tuple[str, ...] = ()
    socket_ifname: Optional[str] = None
    pending_timeout_s: float = DEFAULT_PENDING_TIMEOUT_S
    user: str = local.RUN_USER

    def __post_init__(self) -> None:
        """Check the values that need no spec (the rest: :func:`render_context`), each
        whole (``fullmatch``): nothing with a newline or control character reaches the script.

        Raises:
            EnvbuildError: (exit 64) a bad runtime, partition, time limit, sbatch option
                (:func:`check_sbatch_arg`), interface name, container image, user,
                ``slurm_nodes`` not an integer >= 1, or a pending timeout not in
                ``(0, MAX_PENDING_TIMEOUT_S]``.
        """
        if self.runtime not in RUNTIMES:
            raise _usage(f"is not a container runtime ({', '.join(RUNTIMES)})", "--container-runtime", self.runtime)
        if self.partition is not None:
            check_partition(self.partition)
        if self.time_limit is not None:
            parse_time_limit(self.time_limit)
        if self.slurm_nodes is not None and (not isinstance(self.slurm_nodes, int) or isinstance(self.slurm_nodes, bool)
                                             or self.slurm_nodes < 1):
            raise _usage("must be an integer >= 1", "--slurm-nodes", self.slurm_nodes)
        if len(self.sbatch_args) > MAX_SBATCH_ARGS:
            raise _usage(f"at most {MAX_SBATCH_ARGS} options", "--sbatch-arg", len(self.sbatch_args))
        for a in self.sbatch_args:
            check_sbatch_arg(a)
        if self.socket_ifname is not None:
            check_ifname(self.socket_ifname)
        if self.container_image is not None:
            check_container_image(self.container_image, self.runtime)
        if not (isinstance(self.user, str) and _USER_RE.fullmatch(self.user)):
            raise _usage("is not uid:gid", "user", self.user)
        check_pending_timeout(self.pending_timeout_s)


def parse_time_limit(text: object) -> int:
    """Seconds of a Slurm time limit: ``"M"``, ``"M:S"``, ``"H:M:S"``, ``"D-H"``,
    ``"D-H:M"``, ``"D-H:M:S"`` (``sbatch --time``), matched whole (no blanks, no newline).

    Raises:
        EnvbuildError: (exit 64, field ``--time-limit``) another format, zero (``0`` would
            mean no limit) or more than :data:`MAX_TIME_LIMIT_S` (365 days).
    """
    m = _TIME_RE.fullmatch(text) if _is_text(text, 40) else None
    if not m:
        raise _usage("is not a Slurm time limit (M, M:S, H:M:S, D-H, D-H:M or D-H:M:S)", "--time-limit", text)
    if m.group(1) is not None:
        d, h, mi, s = (int(g or 0) for g in m.group(1, 2, 3, 4))
        seconds = ((d * 24 + h) * 60 + mi) * 60 + s
    else:
        parts = [int(g) for g in m.group(5, 6, 7) if g is not None]
        if len(parts) == 1:
            seconds = parts[0] * 60
        elif len(parts) == 2:
            seconds = parts[0] * 60 + parts[1]
        else:
            seconds = (parts[0] * 60 + parts[1]) * 60 + parts[2]
    if seconds <= 0:
        raise _usage("must be more than 0 (0 means no limit)", "--time-limit", text)
    if seconds > MAX_TIME_LIMIT_S:
        raise _usage(f"is more than {MAX_TIME_LIMIT_S // 86400} days", "--time-limit", text)
    return seconds


def time_limit_for(spec: LaunchSpec, options: SlurmOptions) -> str:
    """The job's ``--time``: ``options.time_limit`` (checked) or ``ceil(timeout_s / 60)``
    minutes, at least 1."""
    if options.time_limit is not None:
        parse_time_limit(options.time_limit)
        return options.time_limit
    return str(max(1, math.ceil(spec.timeout_s / 60)))


def container_name(job_id: str | int, node: int) -> str:
    """Name of node ``node``'s docker container in job ``job_id``: ``envbuild-slurm-<job>-<node>``."""
    return f"{CONTAINER_PREFIX}-{job_id}-{node}"


def default_slurm_dir(images_dir: str | os.PathLike, recipe: str) -> Path:
    """Where run folders go by default: ``<images_dir>/<recipe>/certificates`` (next to the
    certificates; each run gets ``slurm-<run>/`` inside)."""
    return image_dir(images_dir, recipe).certificates


def run_dir(slurm_dir: str | os.PathLike, run_id: str) -> Path:
    """The run folder of ``run_id``: ``<slurm_dir>/slurm-<run_id>``, absolute."""
    return Path(os.path.abspath(Path(slurm_dir) / f"slurm-{run_id}"))


# --------------------------------------------------------------------------- rendering


class Raw(str):
    """A shell word written as is (a variable expansion such as ``"$node"``), not quoted."""


class _Checked(str):
    """Filter output whose every word was checked for control characters (it may hold the
    ``\\``-newline continuations :func:`_words` puts between words)."""


def _refuse_control(value: object, where: str) -> EnvbuildError:
    return _usage("would put a newline or control character into the batch script; refused", where, value)


def sh(value: Any) -> str:
    """One shell word: :class:`Raw` as is, anything else ``shlex.quote``-d.

    Raises:
        EnvbuildError: (exit 64) the value holds a newline or another control character.
    """
    text = str(value)
    if has_control(text):
        raise _refuse_control(text, "script")
    return _Checked(text if isinstance(value, Raw) else shlex.quote(text))


def _words(items: Sequence[Any], indent: int = 8, width: int = 96) -> str:
    """Shell words joined with spaces, wrapped with `` \\`` continuations before ``width``
    columns. An item that is a tuple or list is a group of words (an option and its
    value) that stays on one line. Each word goes through :func:`sh` (checked, quoted)."""
    lines: list[str] = []
    cur = ""
    for item in items:
        group = " ".join(sh(w) for w in item) if isinstance(item, (tuple, list)) else sh(item)
        if cur and len(cur) + 1 + len(group) > width - indent:
            lines.append(cur)
            cur = group
        else:
            cur = f"{cur} {group}" if cur else group
    if cur:
        lines.append(cur)
    return _Checked((" \\\n" + " " * indent).join(lines))


def _finalize(value: Any) -> Any:
    """jinja2 ``finalize``: every value substituted into the script, after its filters;
    the second line of defence behind :func:`render_context`'s checks."""
    if isinstance(value, _Checked):
        return value
    if has_control(str(value)):
        raise _refuse_control(value, "script")
    return value


def _environment() -> jinja2.Environment:
    env = template_environment({"sh": sh, "words": _words}, package="builder.launchers")
    env.finalize = _finalize  # read when the template is compiled (get_template below)
    return env


def render_template(ctx: Mapping[str, Any]) -> str:
    """``builder/launchers/templates/slurm/certify.sbatch.j2`` rendered with ``ctx`` (from
    :func:`render_context`), refusing any value with a newline or control character: first
    by walking ``ctx`` (the error names the field, e.g. ``sbatch[7]``), then in the template
    itself (:func:`_finalize`, :func:`sh`).

    Raises:
        EnvbuildError: (exit 64) such a value, shown escaped.
    """
    for path, value in control_char_paths(dict(ctx)):
        raise _refuse_control(value, path)
    return _environment().get_template("slurm/certify.sbatch.j2").render(dict(ctx))


def task_env(spec: LaunchSpec, options: SlurmOptions) -> dict[str, str]:
    """Environment of every node: :func:`builder.launchers.local.node_env` without the
    per-node ``ENVBUILD_NODE`` (set from ``SLURM_PROCID``) and without the local network's
    ``eth0`` interface names (host networking: set from ``options.socket_ifname`` when
    given), then ``spec.env`` again (which wins).

    Raises:
        EnvbuildError: (exit 64) a name that is not an environment variable name, a value
            with a control character (a newline) or over 4096 characters.
    """
    env = local.node_env(spec, 0)
    env.pop("ENVBUILD_NODE", None)
    for k in ("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME"):
        env.pop(k, None)
        if options.socket_ifname:
            env[k] = options.socket_ifname
    env.update(spec.env)
    for name, value in env.items():
        if not (isinstance(name, str) and _ENV_NAME_RE.fullmatch(name)):
            raise _usage("is not an environment variable name", "env", name)
        if not isinstance(value, str) or has_control(value) or len(value) > 4096:
            raise _usage("is not a one-line value of at most 4096 characters", f"env.{name}", value)
    return env


def torchrun_words(spec: LaunchSpec) -> list[Any]:
    """The node command, in groups of words (see :func:`_words`): torchrun (node rank
    ``$node``, master ``$MASTER_ADDR:$MASTER_PORT``) running the bench;
    :func:`builder.launchers.local.torchrun_argv` with the Slurm values."""
    argv: list[Any] = list(local.torchrun_argv(spec, 0))
    for opt, value in (("--node-rank", Raw('"$node"')), ("--master-addr", Raw('"$MASTER_ADDR"')),
                       ("--master-port", Raw('"$MASTER_PORT"'))):
        argv[argv.index(opt) + 1] = value
    groups: list[Any] = []
    i = 0
    while i < len(argv):
        w = argv[i]
        nxt = argv[i + 1] if i + 1 < len(argv) else None
        if isinstance(w, str) and w.startswith("-") and nxt is not None and not str(nxt).startswith("-"):
            groups.append((w, nxt))
            i += 2
        else:
            groups.append(w)
            i += 1
    return groups


def _check_spec(spec: LaunchSpec, options: SlurmOptions, folder: str,
                environ: Optional[Mapping[str, str]]) -> tuple[int, str, dict[str, str]]:
    """``(Slurm nodes, the image the nodes run, docker labels)`` of ``spec``, each value
    checked whole.

    Raises:
        EnvbuildError: (exit 64) a run id, folder, node count, port, timeout, Slurm node
            count, image, shm size or label the script cannot carry.
    """
    if not (_is_text(spec.run_id, 64) and _RUN_ID_RE.fullmatch(spec.run_id)):
        raise _usage("is not a run id (1-64 letters, digits, ._-)", "run_id", spec.run_id)
    check_slurm_dir(folder)
    if spec.nodes < 1:
        raise _usage("must be >= 1", "nodes", spec.nodes)
    if spec.gpus_per_node < 0:
        raise _usage("must be >= 0", "gpus_per_node", spec.gpus_per_node)
    if not 1 <= spec.port <= 65535:
        raise _usage("is not a TCP port", "port", spec.port)
    if not spec.timeout_s > 0:
        raise _usage("must be > 0", "timeout_s", spec.timeout_s)
    slurm_nodes = spec.nodes if options.slurm_nodes is None else int(options.slurm_nodes)
    check_slurm_nodes(slurm_nodes, spec.nodes)
    image = options.container_image or (f"docker-daemon:{spec.image}" if options.runtime == "apptainer"
                                        else spec.image)
    check_container_image(image, options.runtime)
    if spec.shm_size is not None and not _SHM_RE.fullmatch(str(spec.shm_size)):
        raise _usage("is not a size (256m, 8g)", "shm_size", spec.shm_size)
    labels = local.labels_for(spec, environ)
    for k, v in labels.items():
        if not (isinstance(k, str) and _LABEL_KEY_RE.fullmatch(k)) or not isinstance(v, str) \
                or has_control(v) or len(v) > 1000:
            raise _usage("is not a label (KEY=VALUE, one line)", "label", f"{k}={v}")
    return slurm_nodes, image, labels


def _node_command(spec: LaunchSpec, options: SlurmOptions, image: str, labels: Mapping[str, str],
                  env: Mapping[str, str], code_dir: str, results_dir: str) -> list[Any]:
    """What each task runs, in groups of words (:func:`_words`): ``docker run ...``,
    ``apptainer exec ...`` or (pyxis: srun runs it in the container) torchrun itself."""
    if options.runtime == "docker":
        run: list[Any] = [("docker", "run", "--rm"), ("--name", Raw('"$name"'))]
        run += [("--label", f"{k}={v}") for k, v in labels.items()]
        run += [("--label", Raw('"envbuild.node=$node"')), ("--label", Raw(f'"{SLURM_JOB_LABEL}=$SLURM_JOB_ID"')),
                ("--network", "host"), ("--user", options.user), "--read-only",
                ("--tmpfs", "/tmp:rw,exec,mode=1777"), ("--tmpfs", f"{local.HOME}:rw,mode=1777"),
                ("--cap-drop", "ALL"), ("--security-opt", "no-new-privileges")]
        if spec.shm_size:
            run.append(("--shm-size", spec.shm_size))
        if spec.gpus_per_node > 0:
            run.append(("--gpus", Raw('"\\"device=${CUDA_VISIBLE_DEVICES:?no GPUs given to this task}\\""')))
        run += [("--volume", f"{code_dir}:{CODE_MOUNT}:ro"), ("--volume", f"{results_dir}:{RESULTS_MOUNT}")]
        run += [("--env", f"{k}={v}") for k, v in env.items()]
        run += [("--env", Raw('"ENVBUILD_NODE=$node"')), ("--env", Raw('"ENVBUILD_SLURM_JOB=$SLURM_JOB_ID"')),
                image, *torchrun_words(spec)]
        return run
    if options.runtime == "apptainer":
        run = [("apptainer", "exec")] + (["--nv"] if spec.gpus_per_node > 0 else [])
        run += ["--contain", "--cleanenv", ("--bind", f"{code_dir}:{CODE_MOUNT}:ro"),
                ("--bind", f"{results_dir}:{RESULTS_MOUNT}"), image, *torchrun_words(spec)]
        return run
    return torchrun_words(spec)


def render_context(spec: LaunchSpec, options: SlurmOptions, folder: str | os.PathLike,
                   environ: Optional[Mapping[str, str]] = None) -> dict[str, Any]:
    """The plain-data context of the template (see :func:`render_script`).

    Raises:
        EnvbuildError: (exit 64) a value the script cannot carry (module doc of
            :func:`render_script`).
    """
    folder = str(folder)
    slurm_nodes, image, labels = _check_spec(spec, options, folder, environ)
    per_node = spec.nodes // slurm_nodes
    code_dir = f"{folder}/{CODE_DIR}"
    results_dir = f"{folder}/{RESULTS_DIR}"
    sbatch = [f"--job-name=envbuild-{spec.run_id}", f"--nodes={slurm_nodes}", f"--ntasks={spec.nodes}"]
    sbatch.append("--ntasks-per-node=1" if per_node == 1 else "--overcommit")
    sbatch += [f"--time={time_limit_for(spec, options)}", f"--output={folder}/{JOB_LOG}",
               f"--chdir={folder}", "--no-requeue"]
    if options.partition:
        sbatch.append(f"--partition={options.partition}")
    if spec.gpus_per_node > 0:
        sbatch.append(f"--gres=gpu:{spec.gpus_per_node * per_node}")
    sbatch += list(options.sbatch_args)

    srun = [f"--nodes={slurm_nodes}", f"--ntasks={spec.nodes}",
            "--ntasks-per-node=1" if per_node == 1 else "--overcommit",
            "--kill-on-bad-exit=1", "--export=ALL", Raw('--output="$ENVBUILD_LOGS/node-%t.log"')]
    if spec.gpus_per_node > 0:
        srun.append(f"--gpus-per-task={spec.gpus_per_node}")
    if options.runtime == "pyxis":
        srun += [f"--container-image={image}",
                 f"--container-mounts={code_dir}:{CODE_MOUNT}:ro,{results_dir}:{RESULTS_MOUNT}",
                 "--no-container-mount-home", "--container-workdir=/tmp"]

    env = task_env(spec, options)
    if options.runtime == "apptainer":
        # apptainer gives each container a private, writable HOME (--contain) and sets USER
        env = {k: v for k, v in env.items() if k not in ("HOME", "USER")}
    run = _node_command(spec, options, image, labels, env, code_dir, results_dir)

    return {
        "run_id": spec.run_id,
        "runtime": options.runtime,
        "image": image,
        "nodes": spec.nodes,
        "nproc": spec.nproc_per_node,
        "backend": spec.backend,
        "slurm_nodes": slurm_nodes,
        "folder": folder,
        "script": f"{folder}/{SCRIPT_NAME}",
        "results_dir": results_dir,
        "logs_dir": f"{folder}/{LOGS_DIR}",
        "code_dir": code_dir,
        "port": spec.port,
        "sbatch": sbatch,
        "srun": srun,
        "env": env,
        "run": run,
        "status_dir": RESULTS_MOUNT if options.runtime == "pyxis" else Raw('"$ENVBUILD_RESULTS"'),
        "run_label": f"{engine.RUN_LABEL}={spec.run_id}",
        "container_prefix": CONTAINER_PREFIX,
    }


def render_script(spec: LaunchSpec, options: SlurmOptions, folder: str | os.PathLike,
                  environ: Optional[Mapping[str, str]] = None) -> str:
    """The batch script of ``spec`` for the run folder ``folder`` (see the module doc).

    The same spec, options, folder and labels give the same bytes (the run id is part of
    the spec). ``environ`` is where ``ENVBUILD_EXTRA_LABELS`` is read (default
    ``os.environ``; docker labels).

    Raises:
        EnvbuildError: (exit 64) ``folder`` not absolute or with characters an ``#SBATCH``
            line or a pyxis mount list cannot carry (blanks, ``%``, ``,``, ``:``, quotes); a
            bad runtime, partition, time limit, sbatch option, ``slurm_nodes`` (must be 1..N
            and divide N), interface name, image reference, environment name, or any value
            with a newline or control character (:func:`render_template`).
    """
    return render_template(render_context(spec, options, folder, environ))


def write_run_dir(folder: str | os.PathLike, script: str) -> Path:
    """Create the run folder: ``certify.sbatch`` (mode 0755), ``code/`` (a copy of
    ``builder/agent/bench`` and ``builder/agent/probe/``, read-only), ``results/`` (mode 0777) and
    ``logs/``. Returns the script's path.

    Raises:
        EnvbuildError: (exit 3) the folder exists already or cannot be written.
    """
    folder = Path(folder)
    bench_dir, probe_path = local.in_image_sources()
    try:
        folder.mkdir(parents=True, exist_ok=False)
        code = folder / CODE_DIR
        shutil.copytree(bench_dir, code / "bench", ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        shutil.copytree(probe_path, code / "probe", ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        for p in sorted(code.rglob("*"), reverse=True):
            os.chmod(p, 0o555 if p.is_dir() else 0o444)
        os.chmod(code, 0o555)
        results = folder / RESULTS_DIR
        results.mkdir()
        os.chmod(results, 0o777)  # the nodes write as another UID
        (folder / LOGS_DIR).mkdir()
        path = folder / SCRIPT_NAME
        path.write_text(script)
        os.chmod(path, 0o755)
    except FileExistsError:
        raise EnvbuildError("exists already; every run needs its own folder", field="slurm_dir",
                            value=str(folder), exit_code=ExitCode.UNREACHABLE) from None
    except OSError as e:
        raise EnvbuildError(f"cannot write: {e.strerror or e}", field="slurm_dir", value=str(folder),
                            exit_code=ExitCode.UNREACHABLE) from None
    return path


# --------------------------------------------------------------------------- Slurm commands


def _run(argv: Sequence[str], timeout_s: float = COMMAND_TIMEOUT_S) -> subprocess.CompletedProcess:
    """Run a Slurm command; text output.

    Raises:
        Unreachable: (exit 3) not on PATH, or no answer within ``timeout_s``.
    """
    try:
        return subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout_s,
                              stdin=subprocess.DEVNULL)
    except FileNotFoundError:
        raise Unreachable(f"Slurm: {argv[0]} not found on PATH (run envbuild on a Slurm submit host)") from None
    except subprocess.TimeoutExpired:
        raise Unreachable(f"Slurm: {argv[0]} gave no answer within {timeout_s:g} s") from None


def submit(script: str | os.PathLike) -> str:
    """Submit ``script`` with ``sbatch --parsable``; returns the job id (``"42"``).

    Raises:
        Unreachable: (exit 3) no sbatch, the controller does not answer.
        EnvbuildError: (exit 3) sbatch refused the job (its message: an unknown partition,
            a time limit above the partition's...).
    """
    proc = _run(["sbatch", "--parsable", str(script)])
    out = proc.stdout.strip().splitlines()
    m = _JOBID_RE.fullmatch(out[-1].strip()) if proc.returncode == 0 and out else None
    if not m:
        msg = one_line(proc.stderr or proc.stdout or f"exit status {proc.returncode}")
        if re.search(r"Unable to contact|Socket timed out|Connection refused|Zero Bytes", msg, re.I):
            raise Unreachable(f"Slurm: sbatch: {msg}")
        raise EnvbuildError(f"sbatch refused the job: {msg}", file=str(script), exit_code=ExitCode.UNREACHABLE)
    return m.group(1)


@dataclass
class JobInfo:
    """A job as Slurm reports it.

    Attributes:
        state: ``PENDING``, ``RUNNING``, ``COMPLETED``, ``FAILED``, ``CANCELLED``,
            ``TIMEOUT``... (``squeue`` "JOB STATE CODES"); ``UNKNOWN`` when Slurm forgot it.
        reason: why it waits or ended (``Resources``, ``NonZeroExitCode``, ``TimeLimit``);
            None for ``None``.
        exit_code: ``"<status>:<signal>"`` of the batch script (``"1:0"``), or None.
        nodes: the node list (``"vm"``, ``"gpu[01-04]"``), or None.
        time_limit: the limit as Slurm shows it (``"00:01:00"``), or None.
        source: ``"scontrol"``, ``"sacct"`` or None (unknown).
    """

    state: str
    reason: Optional[str] = None
    exit_code: Optional[str] = None
    nodes: Optional[str] = None
    time_limit: Optional[str] = None
    source: Optional[str] = None

    @property
    def terminal(self) -> bool:
        """True when the state does not change any more."""
        return self.state in TERMINAL_STATES


def _field(text: str, key: str) -> Optional[str]:
    m = re.search(rf"(?:^|\s){key}=(\S*)", text)
    if not m or m.group(1) in ("", "(null)", "None"):
        return None
    return m.group(1)


def parse_scontrol_job(text: str) -> Optional[JobInfo]:
    """A :class:`JobInfo` from ``scontrol show job -o ID`` output (``Key=Value`` fields);
    None when it holds no ``JobState``."""
    state = _field(text, "JobState")
    if not state:
        return None
    return JobInfo(state=state.split("+")[0], reason=_field(text, "Reason"), exit_code=_field(text, "ExitCode"),
                   nodes=_field(text, "NodeList"), time_limit=_field(text, "TimeLimit"), source="scontrol")


def parse_sacct(text: str, job_id: str) -> Optional[JobInfo]:
    """A :class:`JobInfo` from ``sacct -X -n -P -o JobID,State,ExitCode,NodeList,Timelimit,Reason``;
    None when the job is not listed. ``CANCELLED by 0`` is read as ``CANCELLED``."""
    for line in text.splitlines():
        parts = line.split("|")
        if len(parts) >= 3 and parts[0] == str(job_id):
            get = lambda i: (parts[i] or None) if len(parts) > i and parts[i] not in ("None", "") else None  # noqa: E731
            return JobInfo(state=parts[1].split()[0] if parts[1] else "UNKNOWN", exit_code=get(2), nodes=get(3),
                           time_limit=get(4), reason=get(5), source="sacct")
    return None


def never_starts(info: JobInfo, slurm_nodes: int) -> Optional[str]:
    """Why the pending job ``info`` can never start as submitted, with a hint (``"cannot
    start (pending, reason PartitionNodeLimit): the job asks for 2 node(s); ..."``), or None
    when it is not pending or waiting may help (:data:`NEVER_STARTS`).

    Args:
        slurm_nodes: the Slurm nodes the job asks for (``#SBATCH --nodes``).
    """
    reason = info.reason or ""
    if info.state != "PENDING":
        return None
    if reason in NEVER_STARTS:
        hint = NEVER_STARTS[reason].format(nodes=f"{slurm_nodes} node{'s' if slurm_nodes != 1 else ''}",
                                           time_limit=info.time_limit or "?")
    elif _PER_JOB_LIMIT_RE.fullmatch(reason):
        hint = ("it is above a per-job limit of its QOS or association: ask for less (--slurm-nodes, "
                "--time-limit, --gpus-per-node) or pass --sbatch-arg=--qos=Q")
    else:
        return None
    return f"cannot start (pending, reason {reason}): {hint}"


class ControllerError(Exception):
    """``scontrol`` could not reach the controller (transient, retried)."""


def job_info(job_id: str) -> JobInfo:
    """The job's state: ``scontrol show job -o`` (the controller keeps finished jobs for
    ``MinJobAge``, 300 s by default), then ``sacct`` (needs accounting storage: "Slurm
    accounting storage is disabled" otherwise), else ``UNKNOWN``.

    Raises:
        ControllerError: scontrol did not reach the controller.
        Unreachable: (exit 3) scontrol is missing or hangs.
    """
    proc = _run(["scontrol", "show", "job", "-o", str(job_id)])
    info = parse_scontrol_job(proc.stdout) if proc.returncode == 0 else None
    if info is not None:
        return info
    err = proc.stderr or proc.stdout
    if "invalid job id" not in err.lower():
        raise ControllerError(one_line(err or f"scontrol exit status {proc.returncode}"))
    with contextlib.suppress(Unreachable):
        acct = _run(["sacct", "-j", str(job_id), "-X", "-n", "-P", "-o",
                     "JobID,State,ExitCode,NodeList,Timelimit,Reason"])
        if acct.returncode == 0:
            found = parse_sacct(acct.stdout, job_id)
            if found is not None:
                return found
    return JobInfo(state="UNKNOWN")


def scancel(job_id: str) -> Optional[str]:
    """``scancel ID`` (SIGTERM to every step, SIGKILL after ``KillWait``); returns an error
    line, or None when it worked or the job was gone already."""
    try:
        proc = _run(["scancel", str(job_id)])
    except Unreachable as e:
        return str(e)
    if proc.returncode != 0 and "invalid job id" not in (proc.stderr or "").lower() \
            and "already completing" not in (proc.stderr or "").lower():
        return f"scancel {job_id}: {one_line(proc.stderr or proc.returncode)}"
    return None


def scancel_by_name(job_name: str) -> Optional[str]:
    """``scancel --name=NAME --user=ME``: for a job whose id never came back (sbatch cut
    short by Ctrl-C); returns an error line or None."""
    import getpass

    try:
        proc = _run(["scancel", f"--name={job_name}", f"--user={getpass.getuser()}"])
    except (Unreachable, KeyError, OSError) as e:
        return f"scancel --name={job_name}: {e}"
    return None if proc.returncode == 0 else f"scancel --name={job_name}: {one_line(proc.stderr or proc.returncode)}"


def hostnames(nodelist: Optional[str]) -> list[str]:
    """Host names of a Slurm node list (``scontrol show hostnames``); [] on failure."""
    if not nodelist:
        return []
    with contextlib.suppress(Unreachable):
        proc = _run(["scontrol", "show", "hostnames", nodelist])
        if proc.returncode == 0:
            return [h.strip() for h in proc.stdout.splitlines() if h.strip()]
    return []


def log_tail(path: str | os.PathLike, lines: int = LOG_TAIL_LINES) -> str:
    """The last ``lines`` non-blank lines of a file joined with `` | `` ("" if unreadable)."""
    try:
        text = Path(path).read_text(errors="replace")
    except OSError:
        return ""
    kept = [l.strip() for l in text.splitlines() if l.strip()][-lines:]
    return " | ".join(kept)


def read_exit_status(path: str | os.PathLike) -> Optional[int]:
    """A node's ``node-<i>.exit``: the integer status, or None (missing, or a signal name:
    the node was stopped)."""
    try:
        text = Path(path).read_text().strip()
    except OSError:
        return None
    return int(text) if re.fullmatch(r"-?\d+", text) else None


# --------------------------------------------------------------------------- launcher


@dataclass
class _Outcome:
    info: JobInfo
    started_at: str
    gave_up: Optional[str] = None  # "pending" or "running": envbuild cancelled the job
    waited_s: float = 0.0
    last_state: Optional[str] = None  # the state seen when envbuild gave up
    never_starts: Optional[str] = None  # why the pending job could never start (never_starts)


class SlurmLauncher:
    """Runs the ranks of a :class:`LaunchSpec` as one Slurm batch job (see the module doc).

    Args:
        slurm_dir: the folder run folders go into (``slurm-<run>/`` each); it must be on a
            filesystem every node sees.
        options: :class:`SlurmOptions`.
        client: a docker client for the final cleanup by label (docker runtime); None:
            connect when needed (an unreachable engine is a cleanup warning).
        poll_s: seconds between two looks at the job.

    After :meth:`run`, ``job_id`` and ``folder`` name the last job and its run folder.
    """

    def __init__(self, slurm_dir: str | os.PathLike, options: SlurmOptions = SlurmOptions(), *,
                 client: Any = None, poll_s: float = POLL_S) -> None:
        self.slurm_dir = Path(slurm_dir)
        self.options = options
        self.client = client
        self.poll_s = poll_s
        self.job_id: Optional[str] = None
        self.folder: Optional[Path] = None

    def run(self, spec: LaunchSpec, on_progress: Optional[OnProgress] = None) -> LaunchResult:
        """Write the run folder, submit the job, wait for it, collect the results.

        Raises:
            EnvbuildError: (exit 64) a value the script cannot carry; (exit 3) sbatch
                missing or refusing, the controller unreachable, the folder not writable.
            KeyboardInterrupt: passed on, after the job was cancelled and its containers
                removed.
        """
        say = on_progress or (lambda msg: None)
        folder = run_dir(self.slurm_dir, spec.run_id)
        script = render_script(spec, self.options, folder)
        limit_s = parse_time_limit(time_limit_for(spec, self.options))
        self.folder, self.job_id = folder, None
        if shutil.which("sbatch") is None:
            raise Unreachable("Slurm: sbatch not found on PATH (run envbuild on a Slurm submit host)")
        cleanup_errors: list[str] = []
        outcome: Optional[_Outcome] = None
        self._submitting = False
        try:
            path = write_run_dir(folder, script)
            submitted_at = local.utc_now_iso()
            self._submitting = True
            try:
                self.job_id = submit(path)
            except EnvbuildError:  # sbatch answered: no job (only Ctrl-C leaves one unknown)
                self._submitting = False
                raise
            self._submitting = False
            say(f"run {spec.run_id}: Slurm job {self.job_id} submitted ({path}), "
                f"{spec.nodes} node(s) x {spec.nproc_per_node} rank(s) through {self.options.runtime}")
            outcome = self._wait(spec, self.job_id, limit_s, submitted_at, say)
            return self._collect(spec, folder, outcome, limit_s, cleanup_errors)
        finally:
            try:
                with local.deferred_signals():
                    self._cleanup(spec, outcome, cleanup_errors, say)
            except KeyboardInterrupt:
                with local.deferred_signals():
                    self._cleanup(spec, outcome, cleanup_errors, say)
                raise

    # -- waiting

    def _info(self, job_id: str, failing_since: list[float]) -> Optional[JobInfo]:
        try:
            info = job_info(job_id)
        except ControllerError as e:
            now = time.monotonic()
            if not failing_since:
                failing_since.append(now)
            elif now - failing_since[0] > UNREACHABLE_AFTER_S:
                raise Unreachable(f"Slurm controller: {e}") from None
            return None
        failing_since.clear()
        return info

    def _wait(self, spec: LaunchSpec, job_id: str, limit_s: int, submitted_at: str,
              say: OnProgress) -> _Outcome:
        t0 = time.monotonic()
        started: Optional[float] = None
        started_at = submitted_at
        failing: list[float] = []
        last: tuple = ()
        said_at = 0.0
        never_since: Optional[float] = None
        slurm_nodes = self.options.slurm_nodes or spec.nodes
        results = run_dir(self.slurm_dir, spec.run_id) / RESULTS_DIR
        while True:
            info = self._info(job_id, failing)
            now = time.monotonic()
            if info is not None:
                if info.terminal:
                    return _Outcome(info, started_at, waited_s=now - t0)
                if info.state in PENDING_STATES:
                    never = never_starts(info, slurm_nodes)
                    if not never:
                        never_since = None
                    elif never_since is None:
                        never_since = now
                    if (never and now - never_since >= NEVER_STARTS_AFTER_S) \
                            or now - t0 > self.options.pending_timeout_s:
                        out = self._give_up(job_id, info, started_at, "pending", t0)
                        out.never_starts = never
                        return out
                else:
                    if started is None:
                        started, started_at = now, local.utc_now_iso()
                    if now - started > limit_s + END_MARGIN_S:
                        return self._give_up(job_id, info, started_at, "running", t0)
                n = sum(1 for p in results.glob("rank-*.json"))
                reason = info.reason if info.state in PENDING_STATES else None
                if (info.state, reason, n) != last or now - said_at >= PROGRESS_S:
                    say(f"run {spec.run_id}: Slurm job {job_id} {info.state}" + (f" ({reason})" if reason else "")
                        + f", {n}/{spec.world_size} rank result(s), {now - t0:.0f} s")
                    last, said_at = (info.state, reason, n), now
            time.sleep(self.poll_s)

    def _give_up(self, job_id: str, info: JobInfo, started_at: str, why: str, t0: float) -> _Outcome:
        err = scancel(job_id)
        end = self._await_end(job_id, CANCEL_WAIT_S)
        out = _Outcome(end or info, started_at, gave_up=why, waited_s=time.monotonic() - t0,
                       last_state=info.state)
        out.info.reason = out.info.reason or info.reason
        if err:
            out.info.reason = f"{out.info.reason or ''}; {err}".strip("; ")
        return out

    def _await_end(self, job_id: str, timeout_s: float) -> Optional[JobInfo]:
        deadline = time.monotonic() + timeout_s
        info = None
        while time.monotonic() < deadline:
            try:
                info = job_info(job_id)
            except (ControllerError, Unreachable):
                info = None
            if info is not None and info.terminal:
                return info
            time.sleep(min(self.poll_s, 1.0))
        return info

    # -- collecting

    @staticmethod
    def _read_nodes(spec: LaunchSpec, folder: Path) -> tuple[dict[int, str], dict[int, Optional[int]], dict[int, int]]:
        """``(node logs, node exit statuses, rank exit statuses from torchrun's summaries)``."""
        node_logs: dict[int, str] = {}
        node_exit: dict[int, Optional[int]] = {}
        rank_exit: dict[int, int] = {}
        for node in range(spec.nodes):
            log = folder / LOGS_DIR / f"node-{node}.log"
            if log.exists():
                node_logs[node] = log.read_text(errors="replace")
                for rank, code in local.parse_torchrun_failures(node_logs[node]).items():
                    rank_exit.setdefault(rank, code)
            node_exit[node] = read_exit_status(folder / RESULTS_DIR / f"node-{node}.exit")
        return node_logs, node_exit, rank_exit

    def _collect(self, spec: LaunchSpec, folder: Path, outcome: _Outcome, limit_s: int,
                 cleanup_errors: list[str]) -> LaunchResult:
        """The :class:`LaunchResult` of a job that ended (or was given up): the verdict's
        first note comes from the job's state (``scontrol``/``sacct``), never from a log line;
        ranks stopped by the signal that ended the job are not blamed for it."""
        info = outcome.info
        results, problems = local.read_results(folder / RESULTS_DIR, spec.world_size)
        node_logs, node_exit, rank_exit = self._read_nodes(spec, folder)
        missing = [r for r in range(spec.world_size) if r not in results]

        timed_out = False
        deadline_s: Optional[float] = None
        state = info.state
        if outcome.never_starts:
            what = f"{outcome.never_starts}; envbuild cancelled it"
        elif outcome.gave_up == "pending":
            what = (f"did not start within {self.options.pending_timeout_s:g} s (still "
                    f"{outcome.last_state or 'PENDING'}"
                    + (f", reason {info.reason}" if info.reason else "") + "); envbuild cancelled it")
        elif outcome.gave_up == "running":
            timed_out, deadline_s = True, float(limit_s + END_MARGIN_S)
            what = (f"was still running {END_MARGIN_S:g} s after its time limit of {limit_s:g} s; "
                    "envbuild cancelled it")
        else:
            what = f"ended {state}" + (f" ({info.reason})" if info.reason else "")
            if state in ("TIMEOUT", "DEADLINE"):
                timed_out, deadline_s = True, float(limit_s)
                what += f": cancelled by Slurm at its time limit (--time={time_limit_for(spec, self.options)})"
        # A node Slurm stopped (time limit, scancel, srun --kill-on-bad-exit: node-<i>.exit
        # holds the signal's name, or nothing) had SIGTERM, then SIGKILL after KillWait, reach
        # torchrun too (docker run passes signals on); its summary may or may not be written
        # before the container goes: that signal is no fault of the node's ranks.
        for r in [r for r, c in rank_exit.items()
                  if c in STOP_STATUSES and node_exit.get(r // spec.nproc_per_node, 0) is None]:
            del rank_exit[r]
        if outcome.gave_up == "pending" or (not outcome.gave_up and state in INTERRUPTED_STATES):
            for r in missing:
                if r not in rank_exit:
                    problems.setdefault(r, f"Slurm job {self.job_id} {what.split(':')[0]} before this rank reported")
        failed_nodes = [n for n, c in node_exit.items() if c not in (None, 0)]
        killed = [n for n, c in node_exit.items() if c is None]
        notes: list[str] = []
        if state != "COMPLETED" or outcome.gave_up:
            note = f"Slurm job {self.job_id} {what}"
            if info.exit_code and outcome.gave_up != "pending":  # a job that never ran has none
                note += f", exit code {info.exit_code}"
            tail = log_tail(folder / JOB_LOG)
            note += f"; {folder / JOB_LOG}: {tail}" if tail else f"; {folder / JOB_LOG} is empty"
            notes.append(one_line(note, 600))
        return LaunchResult(
            rank_results=results,
            node_logs=node_logs,
            node_exit_codes=node_exit,
            timed_out=timed_out,
            missing_ranks=missing,
            started_at=outcome.started_at,
            finished_at=local.utc_now_iso(),
            rank_exit_codes=rank_exit,
            rank_problems=problems,
            killed_after_s=0.0 if (failed_nodes and killed and not timed_out) else None,
            cleanup_errors=cleanup_errors,
            notes=notes,
            deadline_s=deadline_s,
        )

    # -- cleanup

    def _cleanup(self, spec: LaunchSpec, outcome: Optional[_Outcome], errors: list[str],
                 say: OnProgress) -> None:
        """Cancel the job if it may still run; remove the run's docker containers."""
        info = outcome.info if outcome else None
        if self.job_id is None and getattr(self, "_submitting", False):
            err = scancel_by_name(f"envbuild-{spec.run_id}")  # sbatch was cut short: maybe submitted
            if err:
                errors.append(err)
        if self.job_id and (info is None or not info.terminal):
            say(f"run {spec.run_id}: cancelling Slurm job {self.job_id}")
            err = scancel(self.job_id)
            if err:
                errors.append(err)
            end = self._await_end(self.job_id, CANCEL_WAIT_S)
            if end is None or not end.terminal:
                errors.append(f"Slurm job {self.job_id} did not end within {CANCEL_WAIT_S:g} s of scancel")
            info = end or info
        if self.options.runtime != "docker" or not self.job_id:
            return
        label = f"{engine.RUN_LABEL}={spec.run_id}"
        try:
            client = self.client or engine.connect(timeout_s=30)
            engine.remove_by_label(client, label)
        except Exception as e:  # noqa: BLE001 - cleanup goes on
            errors.append(f"remove containers labelled {label}: {one_line(e, 200)}")
        me = {socket.gethostname(), socket.gethostname().split(".")[0], socket.getfqdn()}
        others = [h for h in hostnames(info.nodes if info else None) if h not in me and h.split(".")[0] not in me]
        if others:
            self._remote_cleanup(others, label, errors)

    def _remote_cleanup(self, hosts: list[str], label: str, errors: list[str]) -> None:
        """``docker rm -f`` the run's containers on the job's other nodes (one-task-per-node
        ``srun`` step, bounded)."""
        argv = ["srun", f"--job-name=envbuild-cleanup-{label.split('=')[-1]}", f"--nodelist={','.join(hosts)}",
                f"--nodes={len(hosts)}", "--ntasks-per-node=1", "--time=2", "--immediate=60"]
        if self.options.partition:
            argv.append(f"--partition={self.options.partition}")
        argv += ["bash", "-c", f"docker ps -aq --filter label={label} | xargs -r docker rm -f >/dev/null"]
        try:
            proc = _run(argv, timeout_s=180)
            if proc.returncode != 0:
                errors.append(f"remove containers labelled {label} on {', '.join(hosts)}: "
                              f"{one_line(proc.stderr or proc.returncode, 200)}")
        except Unreachable as e:
            errors.append(f"remove containers labelled {label} on {', '.join(hosts)}: {e}")
