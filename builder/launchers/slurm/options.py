"""Slurm options: every value a batch script carries, checked whole before it is written."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import TypeGuard

from builder.core.errors import UsageError

from ..base import RUN_USER, LaunchSpec, check_socket_ifname

#: Container runtimes of the batch script; the first is the default. ``none``: the node's own
#: Python and libraries (``python3`` on the job's PATH) run the bench, no container.
RUNTIMES = ("docker", "pyxis", "apptainer", "none")
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

#: ``--sbatch-arg`` options passed on -> takes a value (True), none (False), maybe (None); from
#: https://slurm.schedmd.com/sbatch.html. A closed list, as getopt_long takes any unambiguous
#: prefix (``--out`` is ``--output``). Left out: options envbuild writes itself and those that
#: detach the job from the run (``--array``, ``--wrap``, ``--export``...).
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


def _is_text(value: object, limit: int) -> TypeGuard[str]:
    return isinstance(value, str) and 0 < len(value) <= limit


def check_partition(text: object) -> str:
    """``text`` when it is a partition name or a comma list of at most 16.
    Raises UsageError (exit 64, ``--partition``)."""
    if not (_is_text(text, 2000) and _PARTITION_RE.fullmatch(text)):
        raise UsageError("is not a partition name (letters, digits, _.-; a comma list of at most 16)",
                         field="--partition", value=text)
    return text


def check_sbatch_arg(text: object) -> str:
    """``text`` when it is one ``#SBATCH`` option of :data:`SBATCH_OPTIONS` with a value free of
    blanks, quotes and shell metacharacters. Raises UsageError (exit 64, ``--sbatch-arg``)."""
    m = _SBATCH_ARG_RE.fullmatch(text) if _is_text(text, MAX_VALUE_CHARS + 50) else None
    if not m:
        raise UsageError("is not one sbatch option: --name or --name=value (letters, digits and _.,:/@%+=[]-; "
                         "no blanks, quotes or shell characters)", field="--sbatch-arg", value=text)
    name, value = m.group(1), m.group(2)
    if name in SBATCH_SET_BY_ENVBUILD:
        raise UsageError(f"is set by envbuild itself ({SBATCH_SET_BY_ENVBUILD[name]})",
                         field="--sbatch-arg", value=text)
    if name not in SBATCH_OPTIONS:
        raise UsageError("is not an sbatch option envbuild passes on (--account, --qos, --constraint, --reservation, "
                         "--exclusive, --mem, --nodelist, --exclude...: docs/slurm.md)",
                         field="--sbatch-arg", value=text)
    takes = SBATCH_OPTIONS[name]
    if takes is True and value is None:
        raise UsageError(f"needs a value: --{name}=VALUE", field="--sbatch-arg", value=text)
    if takes is False and value is not None:
        raise UsageError(f"takes no value: --{name}", field="--sbatch-arg", value=text)
    return m.group(0)


def check_container_image(text: object, runtime: str | None = None) -> str:
    """``text`` when a node can run it (a reference, ``docker-daemon:REF``, an enroot URI or a path;
    no ``,`` for pyxis). Raises UsageError (exit 64, ``--container-image``)."""
    if not (_is_text(text, MAX_PATH_CHARS) and _CONTAINER_IMAGE_RE.fullmatch(text)) \
            or (runtime == "pyxis" and "," in text):
        raise UsageError("is not an image reference, enroot URI or absolute path (letters, digits, ._:/@#+=-)",
                         field="--container-image", value=text)
    return text


def check_slurm_dir(path: object) -> str:
    """``path`` when the script can carry it unquoted (Slurm reads ``#SBATCH`` paths unquoted; pyxis
    splits mounts at ``,`` and ``:``). Raises UsageError (exit 64, ``--slurm-dir``)."""
    if not (_is_text(path, MAX_PATH_CHARS) and _PATH_RE.fullmatch(path)):
        raise UsageError("must be an absolute path of letters, digits and ._/+@- (Slurm reads it unquoted in "
                         "#SBATCH lines; pyxis splits mounts at , and :)", field="--slurm-dir", value=path)
    return path


def check_pending_timeout(seconds: object) -> float:
    """``seconds`` as a float when it is a finite number in ``(0, MAX_PENDING_TIMEOUT_S]``. Raises EnvbuildError: (exit
    64, field ``--pending-timeout``) anything else."""
    if isinstance(seconds, (int, float)) and not isinstance(seconds, bool) and math.isfinite(seconds) \
            and 0 < seconds <= MAX_PENDING_TIMEOUT_S:
        return float(seconds)
    raise UsageError(f"must be a number of seconds in (0, {MAX_PENDING_TIMEOUT_S}]",
                     field="--pending-timeout", value=seconds)


def check_slurm_nodes(slurm_nodes: object, nodes: int) -> int:
    """``slurm_nodes`` when it divides ``nodes`` evenly. Raises UsageError (exit 64, ``--slurm-nodes``)."""
    if not isinstance(slurm_nodes, int) or isinstance(slurm_nodes, bool) or not 1 <= slurm_nodes <= nodes:
        raise UsageError(f"must be between 1 and the number of nodes ({nodes})",
                         field="--slurm-nodes", value=slurm_nodes)
    if nodes % slurm_nodes:
        raise UsageError(f"must divide the number of nodes ({nodes}) evenly", field="--slurm-nodes", value=slurm_nodes)
    return slurm_nodes


# --------------------------------------------------------------------------- options


@dataclass(frozen=True)
class SlurmOptions:
    """How to run the job.
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
        """Check the values that need no spec (the rest: :func:`render_context`), each whole (``fullmatch``): nothing
        with a newline or control character reaches the script. Raises EnvbuildError (exit 64)."""
        if self.runtime not in RUNTIMES:
            raise UsageError(f"is not a container runtime ({', '.join(RUNTIMES)})",
                             field="--container-runtime", value=self.runtime)
        if self.partition is not None:
            check_partition(self.partition)
        if self.time_limit is not None:
            parse_time_limit(self.time_limit)
        if self.slurm_nodes is not None and (not isinstance(self.slurm_nodes, int) or isinstance(self.slurm_nodes, bool)
                                             or self.slurm_nodes < 1):
            raise UsageError("must be an integer >= 1", field="--slurm-nodes", value=self.slurm_nodes)
        if len(self.sbatch_args) > MAX_SBATCH_ARGS:
            raise UsageError(f"at most {MAX_SBATCH_ARGS} options", field="--sbatch-arg", value=len(self.sbatch_args))
        for a in self.sbatch_args:
            check_sbatch_arg(a)
        check_socket_ifname(self.socket_ifname, "--socket-ifname")
        if self.container_image is not None and self.runtime == "none":
            raise UsageError("goes with a container runtime; --container-runtime none runs no image",
                             field="--container-image", value=self.container_image)
        if self.container_image is not None:
            check_container_image(self.container_image, self.runtime)
        if not (isinstance(self.user, str) and _USER_RE.fullmatch(self.user)):
            raise UsageError("is not uid:gid", field="user", value=self.user)
        check_pending_timeout(self.pending_timeout_s)


def parse_time_limit(text: object) -> int:
    """Seconds of a Slurm time limit: ``"M"``, ``"M:S"``, ``"H:M:S"``, ``"D-H"``, ``"D-H:M"``, ``"D-H:M:S"`` (``sbatch
    --time``), matched whole (no blanks, no newline). Raises EnvbuildError: (exit 64, field ``--time-limit``) another
    format, zero (``0`` would mean no limit) or more than :data:`MAX_TIME_LIMIT_S` (365 days)."""
    m = _TIME_RE.fullmatch(text) if _is_text(text, 40) else None
    if not m:
        raise UsageError("is not a Slurm time limit (M, M:S, H:M:S, D-H, D-H:M or D-H:M:S)",
                         field="--time-limit", value=text)
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
        raise UsageError("must be more than 0 (0 means no limit)", field="--time-limit", value=text)
    if seconds > MAX_TIME_LIMIT_S:
        raise UsageError(f"is more than {MAX_TIME_LIMIT_S // 86400} days", field="--time-limit", value=text)
    return seconds


def time_limit_for(spec: LaunchSpec, options: SlurmOptions) -> str:
    """The job's ``--time``: ``options.time_limit`` (checked) or ``ceil(timeout_s / 60)``
    minutes, at least 1."""
    if options.time_limit is not None:
        parse_time_limit(options.time_limit)
        return options.time_limit
    return str(max(1, math.ceil(spec.timeout_s / 60)))
