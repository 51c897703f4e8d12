"""Slurm options: every value a batch script carries, checked whole before it is written.

Each pattern is applied with ``fullmatch`` (``$`` of ``re.match`` also matches before a final
newline, and a newline in an ``#SBATCH`` line starts a new line of the script); a bad value
is a usage error (exit 64) naming the command-line option.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import TypeGuard

from builder.core.errors import EnvbuildError, ExitCode

from ..base import RUN_USER, LaunchSpec, check_socket_ifname

#: Container runtimes of the batch script; the first is the default.
RUNTIMES = ("docker", "pyxis", "apptainer")
DEFAULT_RUNTIME = "docker"
#: Seconds a job may stay pending before envbuild cancels it.
DEFAULT_PENDING_TIMEOUT_S = 600.0

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
_PATH_RE = re.compile(rf"/[A-Za-z0-9._/+@-]{{0,{MAX_PATH_CHARS - 1}}}")
_ENV_NAME_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,127}")
_RUN_ID_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
_USER_RE = re.compile(r"[0-9]{1,10}:[0-9]{1,10}")
_LABEL_KEY_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._/-]{0,254}")
_SHM_RE = re.compile(r"[0-9]{1,15}[bkmgBKMG]?")
#: What a node runs: an image reference, ``docker-daemon:REF``, an enroot URI
#: (``registry#repo:tag``) or an absolute ``.sqsh``/``.sif`` path.
_CONTAINER_IMAGE_RE = re.compile(rf"[A-Za-z0-9/][A-Za-z0-9._:/@#+=-]{{0,{MAX_PATH_CHARS - 1}}}")

#: ``--sbatch-arg`` options passed on, by full name -> whether they take a value (True),
#: take none (False) or may take one (None). sbatch man page, https://slurm.schedmd.com/sbatch.html.
#: A closed list: sbatch (getopt_long) takes any unambiguous prefix of an option name
#: (``--out`` is ``--output``), so a list of refused names could be bypassed. Left out: the
#: options envbuild writes itself (:data:`SBATCH_SET_BY_ENVBUILD`) and those that detach the
#: job from the run (``--array``, ``--wrap``, ``--hold``, ``--wait``, ``--clusters``,
#: ``--export``, ``--error``, ``--requeue``, ``--uid``...).
SBATCH_OPTIONS: dict[str, bool | None] = {
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


def _is_text(value: object, limit: int) -> TypeGuard[str]:
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
                     "--exclusive, --mem, --nodelist, --exclude...: README, Running on a cluster)",
                     "--sbatch-arg", text)
    takes = SBATCH_OPTIONS[name]
    if takes is True and value is None:
        raise _usage(f"needs a value: --{name}=VALUE", "--sbatch-arg", text)
    if takes is False and value is not None:
        raise _usage(f"takes no value: --{name}", "--sbatch-arg", text)
    return m.group(0)


def check_container_image(text: object, runtime: str | None = None) -> str:
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
    if isinstance(seconds, (int, float)) and not isinstance(seconds, bool) and math.isfinite(seconds) \
            and 0 < seconds <= MAX_PENDING_TIMEOUT_S:
        return float(seconds)
    raise _usage(f"must be a number of seconds in (0, {MAX_PENDING_TIMEOUT_S}]", "--pending-timeout", seconds)


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
        socket_ifname: ``--socket-ifname`` in NCCL's syntax (``eth0``, ``^lo,docker``, ``=ib0``;
            :data:`~builder.launchers.base.SOCKET_IFNAME_RE`): sets ``NCCL_SOCKET_IFNAME`` and
            ``GLOO_SOCKET_IFNAME`` as each library reads them (:func:`~builder.launchers.base.socket_env`);
            None: the spec's ``socket_ifname``, else unset (the libraries choose); ``spec.env`` wins.
        pending_timeout_s: seconds the job may stay pending before it is cancelled.
        user: ``uid:gid`` of the docker containers.
    """

    runtime: str = DEFAULT_RUNTIME
    partition: str | None = None
    time_limit: str | None = None
    slurm_nodes: int | None = None
    container_image: str | None = None
    sbatch_args: tuple[str, ...] = ()
    socket_ifname: str | None = None
    pending_timeout_s: float = DEFAULT_PENDING_TIMEOUT_S
    user: str = RUN_USER

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
        check_socket_ifname(self.socket_ifname, "--socket-ifname")
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
