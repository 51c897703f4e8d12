"""The launcher interface: start the ranks of a certification run somewhere, collect results.

A launcher takes a :class:`LaunchSpec` (plain data: which image, how many nodes and GPUs,
the bench options) and returns a :class:`LaunchResult` (plain data: the per-rank result
documents of the in-image bench, schema ``envbuild.rank-result/1``, plus what happened to
each node). Judging the results is :mod:`builder.certify.certify`'s job, not the launcher's.

Launchers: :class:`builder.launchers.local.LocalDockerLauncher` (one Docker container per
simulated node on this engine), :class:`builder.launchers.slurm.SlurmLauncher` (one Slurm
batch job) and the Kubernetes launcher implement the same :class:`Launcher` protocol.
"""

from __future__ import annotations

import re
import threading
import time
from dataclasses import dataclass, field
from typing import Callable, Mapping, Optional, Protocol, runtime_checkable

#: Called with one-line progress messages while a launch runs (e.g. for a status line).
OnProgress = Callable[[str], None]


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
    shm_size: Optional[str]
    timeout_s: float
    bench_args: list[str]
    env: dict[str, str]
    run_id: str
    labels: dict[str, str] = field(default_factory=dict)
    socket_ifname: Optional[str] = None

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
        rank_results: ``{rank: document}`` for every rank whose result file was read
            (schema ``envbuild.rank-result/1``).
        node_logs: ``{node: stdout+stderr text}`` of each node that started.
        node_exit_codes: ``{node: exit status}``; None for a node that was killed (still
            running at the deadline or after the grace period) or never started.
        timed_out: the deadline (``timeout_s``) passed with ranks missing.
        missing_ranks: ranks with no (readable) result file, sorted.
        started_at: UTC ISO time the nodes were started, e.g. ``"2026-05-12T10:00:00Z"``.
        finished_at: UTC ISO time the launch ended.
        rank_exit_codes: ``{rank: exit status}`` of worker processes that failed, as
            torchrun reported them (e.g. ``{1: 3}``); ranks torchrun did not report are
            absent.
        rank_problems: ``{rank: reason}`` for ranks that could not be checked: result
            files that exist but could not be read or are not ``envbuild.rank-result/1``
            documents, or ranks stopped from outside before they reported (a Slurm job
            cancelled or never started).
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
            waiting (:meth:`ProgressTracker.snapshot`); {} when the launcher reads none.
        socket_seen: ``{rank: {"GLOO_SOCKET_IFNAME": str|None, "NCCL_SOCKET_IFNAME":
            str|None}}``: what each rank saw (its ``start`` progress line), {} if unknown.
        interfaces_seen: ``{rank: {interface: is loopback}}`` from the same line.
        removed_stale: objects of earlier runs this launch removed before starting (one
            line each, e.g. a network left by an envbuild killed with SIGKILL).
    """

    rank_results: dict[int, dict]
    node_logs: dict[int, str]
    node_exit_codes: dict[int, Optional[int]]
    timed_out: bool
    missing_ranks: list[int]
    started_at: str
    finished_at: str
    rank_exit_codes: dict[int, int] = field(default_factory=dict)
    rank_problems: dict[int, str] = field(default_factory=dict)
    killed_after_s: Optional[float] = None
    cleanup_errors: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    deadline_s: Optional[float] = None
    progress: dict[int, dict] = field(default_factory=dict)
    socket_seen: dict[int, dict] = field(default_factory=dict)
    interfaces_seen: dict[int, dict] = field(default_factory=dict)
    removed_stale: list[str] = field(default_factory=list)


@runtime_checkable
class Launcher(Protocol):
    """Starts the ranks of ``spec`` and returns what they produced.

    ``run`` must remove everything it created before returning or raising (also on
    ``KeyboardInterrupt``). It raises :class:`builder.core.errors.EnvbuildError` when it cannot
    launch at all (no such image: exit 2; engine unreachable: exit 3); a rank that fails
    or hangs is not an exception but part of the result.
    """

    def run(self, spec: LaunchSpec, on_progress: Optional[OnProgress] = None) -> LaunchResult:
        ...


#: Schema of the per-rank result the in-image bench writes (``builder/agent/bench/__init__.py``).
RESULT_SCHEMA = "envbuild.rank-result/1"

#: Largest result document or progress line read, in bytes (as node reports: 16 MiB).
MAX_RESULT_BYTES = 16 << 20


def result_problem(doc: object, rank: int, what: str = "result file", *, run_id: Optional[str] = None,
                   world_size: Optional[int] = None) -> Optional[str]:
    """Why ``doc`` is not a usable result of ``rank`` of this run (None when it is): not a
    ``envbuild.rank-result/1`` mapping, written by another rank, by another run (its
    ``run_id`` is not ``run_id``: a stale or planted result), or for another world size.
    ``run_id``/``world_size`` None skip those checks. ``what`` names where it came from in
    the message (``"result file"``, ``"result"``). One line, values escaped."""
    from builder.core.inputs import show

    if not isinstance(doc, dict) or doc.get("schema") != RESULT_SCHEMA:
        got = doc.get("schema") if isinstance(doc, dict) else type(doc).__name__
        return f"{what} is not {RESULT_SCHEMA} (got {show(got, 60)})"
    if doc.get("rank") != rank:
        return f"{what} rank-{rank}.json says rank {show(doc.get('rank'), 40)}"
    if run_id is not None and doc.get("run_id") != run_id:
        return (f"{what} of rank {rank} is from run {show(doc.get('run_id'), 60)}, not this run "
                f"{run_id}: refused (stale or planted)")
    if world_size is not None and doc.get("world_size") != world_size:
        return (f"{what} of rank {rank} is for world size {show(doc.get('world_size'), 40)}, not "
                f"{world_size}: refused")
    return None


# --------------------------------------------------------------------------- socket settings

#: What ``--socket-ifname`` accepts: NCCL_SOCKET_IFNAME's syntax (``src/misc/socket.cc``):
#: an optional ``^`` (exclude) and ``=`` (exact names), then a comma list of interface
#: names or prefixes (Linux names: at most 15 characters, IFNAMSIZ 16).
SOCKET_IFNAME_RE = re.compile(r"\A\^?=?[A-Za-z0-9_.:-]{1,15}(?:,[A-Za-z0-9_.:-]{1,15}){0,15}\Z")
SOCKET_VARS = ("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME")


def socket_env(ifname: Optional[str]) -> dict[str, str]:
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


# --------------------------------------------------------------------------- progress

PROGRESS_PREFIX = "@@envbuild-progress "
RESULT_PREFIX = "@@envbuild-result "
#: A rank whose last progress line is older than this many seconds when the launch gives
#: up has stopped (the bench beats every 2 s while alive, ``bench.progress``).
SILENT_AFTER_S = 10.0


def parse_progress_line(line: str) -> Optional[dict]:
    """The document of one ``@@envbuild-progress {...}`` line, checked (never raises):
    a phase line (``rank`` and ``seq`` integers, ``phase`` a string) or a beat line of
    the rank's heartbeat process (``rank`` and ``beat`` integers, ``state`` a string);
    None for anything else."""
    if not line.startswith(PROGRESS_PREFIX) or len(line) > 65536:
        return None
    from builder.core.errors import EnvbuildError
    from builder.core.inputs import load_json

    try:
        doc = load_json(line[len(PROGRESS_PREFIX):], "progress line", max_depth=4)
    except EnvbuildError:
        return None
    if not isinstance(doc, dict) or type(doc.get("rank")) is not int:
        return None
    if type(doc.get("seq")) is int and isinstance(doc.get("phase"), str):
        return doc
    if type(doc.get("beat")) is int and isinstance(doc.get("state"), str) and "phase" not in doc:
        return doc
    return None


#: Process states (``/proc/PID/stat``) of a rank stopped by a signal (SIGSTOP, a tracer).
STOPPED_STATES = ("T", "t")


class ProgressTracker:
    """The last phase and heartbeat of every rank, and when they arrived (thread-safe).

    Args:
        world_size: ranks of the run; lines of other ranks are ignored.
        run_id: lines of another run are ignored (None: not checked).
        clock: seconds, monotonic (the host's clock at arrival is what counts: a frozen
            rank's own clock says nothing).
    """

    def __init__(self, world_size: int, run_id: Optional[str] = None, clock=time.monotonic) -> None:
        self.world_size = world_size
        self.run_id = run_id
        self.clock = clock
        self._mu = threading.Lock()
        self._phase: dict[int, dict] = {}
        self._state: dict[int, str] = {}
        self._seen_at: dict[int, float] = {}
        self._phase_at: dict[int, float] = {}
        self.socket: dict[int, dict] = {}
        self.interfaces: dict[int, dict] = {}

    def feed(self, line: str, at: Optional[float] = None) -> bool:
        """Take one output line; True when it was a progress line of this run."""
        doc = parse_progress_line(line)
        if doc is None or not 0 <= doc["rank"] < self.world_size:
            return False
        if self.run_id is not None and doc.get("run") != self.run_id:
            return False
        now = self.clock() if at is None else at
        r = doc["rank"]
        with self._mu:
            self._seen_at[r] = now
            if "beat" in doc:
                self._state[r] = doc["state"][:8]
                return True
            prev = self._phase.get(r)
            if prev is None or doc["seq"] != prev["seq"]:
                self._phase_at[r] = now
            self._phase[r] = doc
            if doc["phase"] == "start" and "socket" in doc:
                self.socket[r] = _socket_of(doc.get("socket"))
                ifs = doc.get("interfaces")
                if isinstance(ifs, dict):
                    self.interfaces[r] = {str(k)[:32]: bool(v) for k, v in list(ifs.items())[:64]}
        return True

    def snapshot(self, at: Optional[float] = None) -> dict[int, dict]:
        """``{rank: {"phase", "detail", "collective", "seq", "state", "silent_s",
        "in_phase_s"}}`` at ``at`` (default now), for each rank that printed a phase: its
        last phase, its process state in the last beat (None before the first),
        seconds since its last line of either kind (``silent_s``) and since it entered
        the phase (``in_phase_s``)."""
        now = self.clock() if at is None else at
        with self._mu:
            out = {}
            for r, d in sorted(self._phase.items()):
                detail = d.get("detail")
                out[r] = {"phase": d["phase"][:80], "detail": detail[:80] if isinstance(detail, str) else None,
                          "collective": bool(d.get("collective")), "seq": d["seq"],
                          "state": self._state.get(r),
                          "silent_s": round(max(0.0, now - self._seen_at[r]), 1),
                          "in_phase_s": round(max(0.0, now - self._phase_at[r]), 1)}
            return out


def progress_from_logs(logs, world_size: int, run_id: Optional[str] = None) -> ProgressTracker:
    """A :class:`ProgressTracker` fed from whole node logs read after the fact (a launcher
    that cannot watch the output as it comes, e.g. Kubernetes pod logs): each line counts
    at the time it carries (``t``, the rank's clock); :meth:`ProgressTracker.snapshot` at
    ``tracker.latest`` then tells how long each rank was silent before the last line seen."""
    tracker = ProgressTracker(world_size, run_id)
    tracker.latest = 0.0
    for text in logs:
        for line in (text or "").splitlines():
            doc = parse_progress_line(line) if line.startswith(PROGRESS_PREFIX) else None
            t = doc.get("t") if doc else None
            if isinstance(t, (int, float)) and not isinstance(t, bool):
                tracker.feed(line, at=float(t))
                tracker.latest = max(tracker.latest, float(t))
    return tracker


def _socket_of(value: object) -> dict:
    value = value if isinstance(value, Mapping) else {}
    return {k: (value.get(k) if isinstance(value.get(k), str) else None) for k in SOCKET_VARS}


def parse_result_line(line: str, node: int) -> tuple[Optional[dict], Optional[str]]:
    """``(document, None)`` of one ``@@envbuild-result {...}`` line printed by node
    ``node``, or ``(None, why)`` when it is not JSON within the bounds
    (:func:`builder.core.inputs.load_json`; at most :data:`MAX_RESULT_BYTES`)."""
    from builder.core.errors import EnvbuildError
    from builder.core.inputs import load_json

    body = line[len(RESULT_PREFIX):]
    if len(body) > MAX_RESULT_BYTES:
        return None, f"a result line of node {node} is over {MAX_RESULT_BYTES} bytes"
    try:
        return load_json(body, f"node-{node} output"), None
    except EnvbuildError as e:
        return None, f"unreadable result printed by node {node}: {e}"
