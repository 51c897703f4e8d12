"""What every launcher shares: the :class:`Launcher` interface, and how a node is set up.
Judging a :class:`LaunchResult` is :mod:`builder.certify.verdict`'s job."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import threading
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from builder.agent import payload
from builder.core.certificate import Ranks
from builder.core.documents import RankResult
from builder.core.errors import EnvbuildError, UsageError
from builder.core.events import Event
from builder.image import engine

from .progress import SOCKET_VARS as SOCKET_VARS

#: Called with one-line progress messages while a launch runs (e.g. for a status line).
OnProgress = Callable[[str], None]

#: Where the in-image code is mounted (read-only) in each node; also ``PYTHONPATH``.
MOUNT_POINT = payload.MOUNT_POINT
PYTHONPATH = MOUNT_POINT
#: Where each rank writes its result file inside its node (a private tmpfs or folder).
RESULTS_MOUNT = "/results"
#: The arbitrary user the docker nodes run as; deliberately without a passwd entry.
RUN_USER = "12345:12345"
#: ``HOME`` inside each node (on the ``/tmp`` tmpfs).
HOME = "/tmp/home"
#: Environment variable with extra labels ``key=value,...`` (for tests and CI).
EXTRA_LABELS_ENV = "ENVBUILD_EXTRA_LABELS"

_LABEL_KEY_RE = re.compile(r"\A[A-Za-z0-9][A-Za-z0-9._/-]*\Z")


@dataclass
class LaunchSpec(Ranks):
    """What to launch; ``timeout_s``: seconds from the nodes' start until every rank has a result."""

    image: str
    nodes: int
    gpus_per_node: int
    backend: str
    port: int
    shm_size: str | None  # Docker syntax ("8g"); None: the engine's 64 MB
    timeout_s: float
    bench_args: list[str]  # after ``python3 -m bench --out /results``
    env: dict[str, str]
    run_id: str
    labels: dict[str, str] = field(default_factory=dict)
    socket_ifname: str | None = None


@dataclass
class LaunchResult:
    """What a launch produced; a failing or hung rank is part of it, not an exception; ``notes`` never set exit."""

    rank_results: dict[int, RankResult]
    node_logs: dict[int, str]
    node_exit_codes: dict[int, int | None]  # None: killed or never started
    timed_out: bool
    missing_ranks: list[int]
    started_at: str
    finished_at: str
    rank_exit_codes: dict[int, int] = field(default_factory=dict)  # failed workers, as torchrun said
    rank_problems: dict[int, str] = field(default_factory=dict)  # unreadable, foreign, stopped from outside
    killed_after_s: float | None = None  # grace the others got after a node failed
    cleanup_errors: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    deadline_s: float | None = None  # the one enforced when not spec.timeout_s
    progress: dict[int, dict] = field(default_factory=dict)
    socket_seen: dict[int, dict] = field(default_factory=dict)
    interfaces_seen: dict[int, dict] = field(default_factory=dict)
    removed_stale: list[str] = field(default_factory=list)
    phases: list[tuple[str, float]] = field(default_factory=list)
    oom_killed: dict[int, int] = field(default_factory=dict)  # node: its memory limit, bytes (0: none)
    #: rank: its probe's differences from the lock, filled once by the verdict for the certificate
    lock_mismatches: dict[int, list[str]] = field(default_factory=dict)
    log_events: list[Event] = field(default_factory=list)  # the node logs' lines, for the run folder


@runtime_checkable
class Launcher(Protocol):
    """Starts the ranks of ``spec``, removing all it made; EnvbuildError only when it cannot launch (exit 3)."""

    def run(self, spec: LaunchSpec, on_progress: OnProgress | None = None) -> LaunchResult:
        ...


# --------------------------------------------------------------------------- labels


def parse_extra_labels(text: str | None) -> dict[str, str]:
    """``"key=value,key2=value2"`` into a dict; EnvbuildError (exit 2) on a bad item or key."""
    labels: dict[str, str] = {}
    for item in (text or "").split(","):
        item = item.strip()
        if not item:
            continue
        key, sep, value = item.partition("=")
        key = key.strip()
        if not sep or not _LABEL_KEY_RE.fullmatch(key):
            raise EnvbuildError("expected key=value[,key=value...]", field=EXTRA_LABELS_ENV, value=text)
        labels[key] = value.strip()
    return labels


def extra_labels_from_env(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    environ = os.environ if environ is None else environ
    return parse_extra_labels(environ.get(EXTRA_LABELS_ENV))


def labels_for(spec: LaunchSpec, environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """Labels of everything a launch creates; :func:`builder.image.engine.run_labels` win."""
    return {**extra_labels_from_env(environ), **spec.labels, **engine.run_labels(spec.run_id)}


# --------------------------------------------------------------------------- the node


def agent_dir() -> Path:
    """The in-image code every launcher ships; EnvbuildError (exit 2) when the bench or probe is missing."""
    root = payload.AGENT_DIR
    for p in (root / "bench" / "__main__.py", root / "probe" / "__main__.py"):
        if not p.is_file():
            raise EnvbuildError("missing from the envbuild package", field="file", value=str(p))
    return root


def torchrun_argv(spec: LaunchSpec, node: Any, *, master_addr: Any = "node-0", master_port: Any = None,
                  out: Any = RESULTS_MOUNT, topology: bool = True, to_stdout: bool = True) -> list[Any]:
    """Node ``node``'s torchrun command (``node``, master, ``out``: maybe shell words); no ``topology``: the environment
    gives it (Kubeflow ``PET_*``); no ``to_stdout``: results stay in files."""
    return [
        "python3", "-m", "torch.distributed.run",
        *(("--nnodes", str(spec.nodes),
           "--nproc-per-node", str(spec.nproc_per_node),
           "--node-rank", node if not isinstance(node, int) else str(node),
           "--master-addr", master_addr,
           "--master-port", str(spec.port) if master_port is None else master_port) if topology else ()),
        "--max-restarts", "0",
        "-m", "bench", "--out", out,
        *spec.bench_args, *(("--result-to-stdout",) if to_stdout else ()),
    ]


def node_env(spec: LaunchSpec, node: int) -> dict[str, str]:
    """Environment of node ``node``; without ``--socket-ifname`` the image's own socket settings stay."""
    env = {
        "PYTHONPATH": PYTHONPATH,
        "PYTHONDONTWRITEBYTECODE": "1",
        "HOME": HOME,
        # getpass.getuser() looks at USER before the (missing) passwd entry
        "USER": "envbuild",
        **socket_env(spec.socket_ifname),
        "ENVBUILD_RUN_ID": spec.run_id,
        "ENVBUILD_NODE": str(node),
        "ENVBUILD_IMAGE": spec.image,  # the probe records the image in use (node report)
    }
    if spec.backend == "nccl":
        env["NCCL_DEBUG"] = "INFO"
    env.update(spec.env)
    return env


# --------------------------------------------------------------------------- socket settings

#: NCCL_SOCKET_IFNAME's syntax (``src/misc/socket.cc``): optional ``^`` (exclude) and ``=``
#: (exact), then interface names or prefixes of at most 15 characters (IFNAMSIZ 16).
SOCKET_IFNAME_RE = re.compile(r"\A\^?=?[A-Za-z0-9_.:-]{1,15}(?:,[A-Za-z0-9_.:-]{1,15}){0,15}\Z")


def check_socket_ifname(value: str | None, field_: str = "socket_ifname") -> str | None:
    """``value`` when it is a valid ``--socket-ifname`` (None passes); EnvbuildError (exit 64) otherwise."""
    if value is None:
        return None
    if not isinstance(value, str) or not SOCKET_IFNAME_RE.fullmatch(value):
        raise UsageError("is not a network interface name list ([^][=]NAME[,NAME...], names of at "
                         "most 15 characters [A-Za-z0-9_.:-])", field=field_, value=value)
    return value


def socket_env(ifname: str | None) -> dict[str, str]:
    """The environment of ``--socket-ifname IFNAME`` ({} for None); ``GLOO_SOCKET_IFNAME`` takes exact names: those
    without ``=``, or ``""`` (unset for PyTorch, c10d/init.cpp) for an ``^`` exclusion."""
    if ifname is None:
        return {}
    gloo = "" if ifname.startswith("^") else ifname.lstrip("=")
    return {"GLOO_SOCKET_IFNAME": gloo, "NCCL_SOCKET_IFNAME": ifname}


# --------------------------------------------------------------------------- signals


@contextlib.contextmanager
def deferred_signals() -> Iterator[None]:
    """Hold off SIGINT and SIGTERM while cleaning up, then raise KeyboardInterrupt (main thread only)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    received: list[int] = []

    def _note(signum: int, frame: object) -> None:
        received.append(signum)

    old = {}
    for s in (signal.SIGINT, signal.SIGTERM):
        try:
            old[s] = signal.signal(s, _note)
        except (ValueError, OSError):
            pass
    try:
        yield
    finally:
        for s, h in old.items():
            signal.signal(s, h)
        if received:
            raise KeyboardInterrupt(signal.Signals(received[0]).name)
