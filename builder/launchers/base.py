"""What every launcher shares: the interface, and how a node is set up.

A launcher takes a :class:`LaunchSpec` (plain data: which image, how many nodes and GPUs,
the bench options) and returns a :class:`LaunchResult` (the per-rank result documents of
the in-image bench, :class:`~builder.launchers.model.RankResult`, plus what happened to
each node). Judging the results is :mod:`builder.certify.verdict`'s job, not the launcher's.

Launchers: :class:`builder.launchers.local.LocalDockerLauncher` (one Docker container per
simulated node on this engine), :class:`builder.launchers.slurm.SlurmLauncher` (one Slurm
batch job) and the Kubernetes launcher implement the same :class:`Launcher` protocol. They
share, from here: the torchrun command (:func:`torchrun_argv`), the node environment
(:func:`node_env`), the labels of what they create (:func:`labels_for`), the socket
settings (:func:`socket_env`, :func:`check_socket_ifname`), the in-image code
(:func:`agent_dir`: the one payload of :mod:`builder.agent.payload`, mounted read-only at
:data:`MOUNT_POINT`) and the signal deferral of their cleanup (:func:`deferred_signals`);
from :mod:`.output`, the reading and checking of what the nodes print, and from
:mod:`.progress`, the progress tracking and hang naming.
"""

from __future__ import annotations

import contextlib
import datetime
import os
import re
import signal
import threading
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from builder.agent import payload
from builder.core.errors import EnvbuildError, ExitCode
from builder.image import engine

from .model import RankResult

#: Called with one-line progress messages while a launch runs (e.g. for a status line).
OnProgress = Callable[[str], None]

#: Where the in-image code is mounted (read-only) inside each node; also ``PYTHONPATH``
#: (makes ``-m bench`` and ``import probe`` work).
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
class LaunchSpec:
    """What to launch.

    Attributes:
        image: image reference (name:tag or ID) present on the engine.
        nodes: simulated nodes N (>= 1).
        gpus_per_node: GPUs G per node; 0 on CPU (one process per node then).
        backend: ``"gloo"`` or ``"nccl"``, passed to the bench as ``--backend``.
        port: torchrun's static rendezvous port on node 0.
        shm_size: ``/dev/shm`` size per node, Docker syntax (``"256m"``, ``"8g"``); None:
            the engine's default (64 MB).
        timeout_s: seconds from the start of the nodes until every rank must have written
            its result; ranks without one are then killed and named.
        bench_args: arguments after ``python3 -m bench --out /results``.
        env: extra environment for every node (on top of the launcher's own).
        run_id: the run id (:func:`builder.image.engine.new_run_id`); names and labels objects.
        labels: extra labels for everything the launcher creates (on top of
            :func:`builder.image.engine.run_labels`).
        socket_ifname: the ``--socket-ifname`` override (:func:`socket_env` gives the
            variables it sets); None: the image's own settings (or none) stay in effect.
    """

    image: str
    nodes: int
    gpus_per_node: int
    backend: str
    port: int
    shm_size: str | None
    timeout_s: float
    bench_args: list[str]
    env: dict[str, str]
    run_id: str
    labels: dict[str, str] = field(default_factory=dict)
    socket_ifname: str | None = None

    @property
    def nproc_per_node(self) -> int:
        """Processes (ranks) per node: ``max(gpus_per_node, 1)``."""
        return max(self.gpus_per_node, 1)

    @property
    def world_size(self) -> int:
        """Ranks in all: ``nodes * nproc_per_node``."""
        return self.nodes * self.nproc_per_node

    def ranks_of_node(self, node: int) -> list[int]:
        """Global ranks hosted by ``node`` (torchrun static rendezvous: node*P .. node*P+P-1)."""
        p = self.nproc_per_node
        return list(range(node * p, node * p + p))

    def node_of_rank(self, rank: int) -> int:
        """The node hosting global rank ``rank``."""
        return rank // self.nproc_per_node


@dataclass
class LaunchResult:
    """What a launch produced.

    Attributes:
        rank_results: ``{rank: result}`` for every rank whose result was read and checked
            (:func:`builder.launchers.output.check_result`). A launcher that hands plain
            documents instead has them checked by the certification run.
        node_logs: ``{node: stdout+stderr text}`` of each node that started.
        node_exit_codes: ``{node: exit status}``; None for a node that was killed (still
            running at the deadline or after the grace period) or never started.
        timed_out: the deadline (``timeout_s``) passed with ranks missing.
        missing_ranks: ranks with no (readable) result, sorted.
        started_at: UTC ISO time the nodes were started, e.g. ``"2026-05-12T10:00:00Z"``.
        finished_at: UTC ISO time the launch ended.
        rank_exit_codes: ``{rank: exit status}`` of worker processes that failed, as
            torchrun reported them (e.g. ``{1: 3}``); ranks torchrun did not report are
            absent.
        rank_problems: ``{rank: reason}`` for ranks that could not be checked: results
            that could not be read or are not of this run, or ranks stopped from outside
            before they reported (a Slurm job cancelled or never started).
        killed_after_s: for a launch cut short because a node failed: seconds of grace
            the other nodes got before being killed; None otherwise.
        cleanup_errors: what could not be removed afterwards (one line each); filled in
            by the launcher's cleanup, which runs after the result is built.
        notes: what the launcher saw of the run as a whole, one line each (e.g. a batch
            job's final state and the tail of its log); the verdict lists them with its
            failures when it fails, else with its warnings; they never change its exit code.
        deadline_s: the deadline actually enforced, in seconds, when it is not
            ``spec.timeout_s`` (e.g. a Slurm time limit); None otherwise.
        progress: ``{rank: state}`` of the ranks' progress lines when the launch gave up
            waiting (:meth:`~builder.launchers.progress.ProgressTracker.snapshot`); {} when
            the launcher reads none.
        socket_seen: ``{rank: {"GLOO_SOCKET_IFNAME": str|None, "NCCL_SOCKET_IFNAME":
            str|None}}``: what each rank saw (its ``start`` progress line), {} if unknown.
        interfaces_seen: ``{rank: {interface: is loopback}}`` from the same line.
        removed_stale: objects of earlier runs this launch removed before starting (one
            line each, e.g. a network left by an envbuild killed with SIGKILL).
        phases: host-side phase times ``[(name, seconds)]`` in order
            (:func:`builder.launchers.phases.phase_times`); the launcher completes the list
            after its cleanup (``teardown``), as it does ``cleanup_errors``; [] when unknown.
    """

    rank_results: dict[int, RankResult]
    node_logs: dict[int, str]
    node_exit_codes: dict[int, int | None]
    timed_out: bool
    missing_ranks: list[int]
    started_at: str
    finished_at: str
    rank_exit_codes: dict[int, int] = field(default_factory=dict)
    rank_problems: dict[int, str] = field(default_factory=dict)
    killed_after_s: float | None = None
    cleanup_errors: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    deadline_s: float | None = None
    progress: dict[int, dict] = field(default_factory=dict)
    socket_seen: dict[int, dict] = field(default_factory=dict)
    interfaces_seen: dict[int, dict] = field(default_factory=dict)
    removed_stale: list[str] = field(default_factory=list)
    phases: list[tuple[str, float]] = field(default_factory=list)


@runtime_checkable
class Launcher(Protocol):
    """Starts the ranks of ``spec`` and returns what they produced.

    ``run`` must remove everything it created before returning or raising (also on
    ``KeyboardInterrupt``). It raises :class:`builder.core.errors.EnvbuildError` when it cannot
    launch at all (no such image: exit 2; engine unreachable: exit 3); a rank that fails
    or hangs is not an exception but part of the result.
    """

    def run(self, spec: LaunchSpec, on_progress: OnProgress | None = None) -> LaunchResult:
        ...


def utc_now_iso() -> str:
    """Current UTC time, ISO 8601 with seconds and ``Z``: ``"2026-05-12T10:00:00Z"``."""
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


# --------------------------------------------------------------------------- labels


def parse_extra_labels(text: str | None) -> dict[str, str]:
    """Parse ``"key=value,key2=value2"`` (blanks around items ignored) into a dict.

    ``None`` or ``""`` gives ``{}``. Values may be empty (``"key="``).

    Raises:
        EnvbuildError: (exit 2) an item has no ``=`` or its key is not a label key.
    """
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
    """The labels in ``$ENVBUILD_EXTRA_LABELS`` (see :func:`parse_extra_labels`)."""
    environ = os.environ if environ is None else environ
    return parse_extra_labels(environ.get(EXTRA_LABELS_ENV))


def labels_for(spec: LaunchSpec, environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """Labels of everything a launch creates: env extras, then ``spec.labels``, then
    :func:`builder.image.engine.run_labels` (which win)."""
    return {**extra_labels_from_env(environ), **spec.labels, **engine.run_labels(spec.run_id)}


# --------------------------------------------------------------------------- the node


def agent_dir() -> Path:
    """The in-image code every launcher ships (:data:`builder.agent.payload.AGENT_DIR`:
    ``bench/``, ``probe/``...), checked to be there.

    Raises:
        EnvbuildError: (exit 2) the bench or the probe is missing from the package.
    """
    root = payload.AGENT_DIR
    for p in (root / "bench" / "__main__.py", root / "probe" / "__main__.py"):
        if not p.is_file():
            raise EnvbuildError("missing from the envbuild package", field="file", value=str(p))
    return root


def torchrun_argv(spec: LaunchSpec, node: Any, *, master_addr: Any = "node-0", master_port: Any = None) -> list[Any]:
    """The command of node ``node``: torchrun (static rendezvous on ``master_addr``, port
    ``master_port``, default ``spec.port``) running the bench, which prints its result on
    stdout (``--result-to-stdout``) besides its file in :data:`RESULTS_MOUNT`. ``node`` and
    the master may be words a launcher fills in later (a shell variable)."""
    return [
        "python3", "-m", "torch.distributed.run",
        "--nnodes", str(spec.nodes),
        "--nproc-per-node", str(spec.nproc_per_node),
        "--node-rank", node if not isinstance(node, int) else str(node),
        "--master-addr", master_addr,
        "--master-port", str(spec.port) if master_port is None else master_port,
        "--max-restarts", "0",
        "-m", "bench", "--out", RESULTS_MOUNT,
        *spec.bench_args, "--result-to-stdout",
    ]


def node_env(spec: LaunchSpec, node: int) -> dict[str, str]:
    """Environment of node ``node``: the launcher's settings, the ``--socket-ifname``
    override (:func:`socket_env`; without it the image's own ``GLOO_SOCKET_IFNAME``/
    ``NCCL_SOCKET_IFNAME``, if any, stay in effect), then ``spec.env``."""
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

#: What ``--socket-ifname`` accepts: NCCL_SOCKET_IFNAME's syntax (``src/misc/socket.cc``):
#: an optional ``^`` (exclude) and ``=`` (exact names), then a comma list of interface
#: names or prefixes (Linux names: at most 15 characters, IFNAMSIZ 16). Use with fullmatch.
SOCKET_IFNAME_RE = re.compile(r"\A\^?=?[A-Za-z0-9_.:-]{1,15}(?:,[A-Za-z0-9_.:-]{1,15}){0,15}\Z")
SOCKET_VARS = ("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME")


def check_socket_ifname(value: str | None, field_: str = "socket_ifname") -> str | None:
    """``value`` when it is a valid ``--socket-ifname`` (None passes): NCCL's syntax, an
    optional ``^`` and ``=`` then a comma list of interface names (at most 15 characters
    each, ``[A-Za-z0-9_.:-]``; :data:`SOCKET_IFNAME_RE`, matched whole).

    Raises:
        EnvbuildError: (exit 64, field ``field_``) anything else, e.g. ``'eth0\\n'``,
            ``'eth0;rm'``, ``''``.
    """
    if value is None:
        return None
    if not isinstance(value, str) or not SOCKET_IFNAME_RE.fullmatch(value):
        raise EnvbuildError("is not a network interface name list ([^][=]NAME[,NAME...], names of at "
                            "most 15 characters [A-Za-z0-9_.:-])", field=field_, value=value,
                            exit_code=ExitCode.USAGE)
    return value


def socket_env(ifname: str | None) -> dict[str, str]:
    """The environment ``--socket-ifname IFNAME`` sets on every node ({} for None).

    ``NCCL_SOCKET_IFNAME`` gets the value as written. ``GLOO_SOCKET_IFNAME`` (a comma
    list of exact interface names, PyTorch ``ProcessGroupGloo``) gets the names without
    the ``=``; with ``^`` (an exclusion gloo cannot express) it is set to ``""``, which
    PyTorch treats as unset (it uses the variable only when longer than one character,
    ``torch/csrc/distributed/c10d/init.cpp``): gloo then binds to the address of the
    hostname.
    """
    if ifname is None:
        return {}
    gloo = "" if ifname.startswith("^") else ifname.lstrip("=")
    return {"GLOO_SOCKET_IFNAME": gloo, "NCCL_SOCKET_IFNAME": ifname}


# --------------------------------------------------------------------------- signals


@contextlib.contextmanager
def deferred_signals() -> Iterator[None]:
    """Hold off SIGINT and SIGTERM while cleaning up; re-raise one afterwards.

    In the main thread only (elsewhere a no-op). A signal received inside raises
    ``KeyboardInterrupt`` once the block is done, so a second Ctrl-C cannot cut the
    cleanup short.
    """
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
