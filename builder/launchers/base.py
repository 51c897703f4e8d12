"""The launcher interface: start the ranks of a certification run somewhere, collect results.

A launcher takes a :class:`LaunchSpec` (plain data: which image, how many nodes and GPUs,
the bench options) and returns a :class:`LaunchResult` (plain data: the per-rank result
documents of the in-image bench, schema ``envbuild.rank-result/1``, plus what happened to
each node). Judging the results is :mod:`builder.certify`'s job, not the launcher's.

Launchers: :class:`builder.launchers.local.LocalDockerLauncher` (one Docker container per
simulated node on this engine), :class:`builder.launchers.slurm.SlurmLauncher` (one Slurm
batch job) and the Kubernetes launcher implement the same :class:`Launcher` protocol.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Optional, Protocol, runtime_checkable

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
        run_id: the run id (:func:`builder.engine.new_run_id`); names and labels objects.
        labels: extra labels for everything the launcher creates (on top of
            :func:`builder.engine.run_labels`).
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


@runtime_checkable
class Launcher(Protocol):
    """Starts the ranks of ``spec`` and returns what they produced.

    ``run`` must remove everything it created before returning or raising (also on
    ``KeyboardInterrupt``). It raises :class:`builder.errors.EnvbuildError` when it cannot
    launch at all (no such image: exit 2; engine unreachable: exit 3); a rank that fails
    or hangs is not an exception but part of the result.
    """

    def run(self, spec: LaunchSpec, on_progress: Optional[OnProgress] = None) -> LaunchResult:
        ...


#: Schema of the per-rank result the in-image bench writes (``builder/bench/__init__.py``).
RESULT_SCHEMA = "envbuild.rank-result/1"


def result_problem(doc: object, rank: int, what: str = "result file") -> Optional[str]:
    """Why ``doc`` is not a usable result of ``rank`` (None when it is): not a
    ``envbuild.rank-result/1`` mapping, or written by another rank. ``what`` names where it
    came from in the message (``"result file"``, ``"result"``)."""
    if not isinstance(doc, dict) or doc.get("schema") != RESULT_SCHEMA:
        got = doc.get("schema") if isinstance(doc, dict) else type(doc).__name__
        return f"{what} is not {RESULT_SCHEMA} (got {got!r})"
    if doc.get("rank") != rank:
        return f"{what} rank-{rank}.json says rank {doc.get('rank')!r}"
    return None
