"""The ranks' results as they come back in the pod logs, and the run's
:class:`~builder.launchers.base.LaunchResult`.

Each pod prints its ranks' result files between :data:`~.pod.RESULT_BEGIN` and
:data:`~.pod.RESULT_END` marker lines (:data:`~.pod.NODE_SCRIPT`), so the results survive
the pods; :func:`parse_result_blocks` reads them back, :func:`assemble_result` builds the
result of a run from what was seen of its pods (:class:`Outcome`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from builder.core.errors import EnvbuildError
from builder.core.inputs import load_json, one_line

from ..base import LaunchResult, LaunchSpec
from ..model import MAX_RESULT_BYTES, RankResult
from ..output import result_problem
from ..progress import progress_from_logs
from .pod import RESULT_BEGIN, RESULT_END

_BEGIN_RE = re.compile(rf"{re.escape(RESULT_BEGIN)} rank-(\d{{1,9}})\.json")
_END_RE = re.compile(rf"{re.escape(RESULT_END)} rank-(\d{{1,9}})\.json")


def parse_result_blocks(log: str, run_id: str | None = None, world_size: int | None = None
                        ) -> tuple[dict[int, dict[str, Any]], dict[int, str]]:
    """The result documents a node printed between marker lines (:data:`~.pod.NODE_SCRIPT`).

    Each block is parsed with :func:`builder.core.inputs.load_json` (bounded; at most
    :data:`~builder.launchers.model.MAX_RESULT_BYTES`) and checked with
    :func:`~builder.launchers.output.result_problem` (and the run id and world size when
    given).

    Returns:
        ``(results, problems)``: ``{rank: document}`` for blocks that hold an
        ``envbuild.rank-result/1`` document of that rank, ``{rank: reason}`` for blocks
        that are unterminated, not JSON, of another schema, rank, run or world size.
    """
    results: dict[int, dict[str, Any]] = {}
    problems: dict[int, str] = {}
    lines = log.splitlines()
    i = 0
    while i < len(lines):
        m = _BEGIN_RE.fullmatch(lines[i].rstrip())
        if not m:
            i += 1
            continue
        rank = int(m.group(1))
        body: list[str] = []
        j = i + 1
        while j < len(lines) and not _END_RE.fullmatch(lines[j].rstrip()):
            body.append(lines[j])
            j += 1
        i = j + 1
        if j >= len(lines):
            problems[rank] = "result block in the pod log is not terminated (log cut short?)"
            continue
        doc, problem = _result_of_block("\n".join(body), rank, run_id, world_size)
        if problem is not None:
            problems[rank] = problem
            continue
        results[rank] = doc
        problems.pop(rank, None)
    return results, problems


def _result_of_block(text: str, rank: int, run_id: str | None, world_size: int | None
                     ) -> tuple[Any, str | None]:
    """``(document, None)`` or ``(None, reason)`` for the body of one result block."""
    if len(text) > MAX_RESULT_BYTES:
        return None, f"result in the pod log is over {MAX_RESULT_BYTES} bytes"
    try:
        doc = load_json(text, "result in the pod log")
    except EnvbuildError as e:
        return None, one_line(str(e), 300)
    problem = result_problem(doc, rank, "result", run_id=run_id, world_size=world_size)
    return (None, problem) if problem else (doc, None)


@dataclass
class Outcome:
    """What was seen of a run's pods (nodes are completion indexes).

    Attributes:
        timed_out: the Job's deadline (or the launcher's) passed.
        failed: the Job failed.
        exit_codes: ``{node: exit status}``; a node absent was killed or never ended.
        logs: ``{node: log text}``, the last read of each node's pod log.
        headers: ``{node: "[envbuild] pod <name> on <host>\\n"}``.
    """

    timed_out: bool = False
    failed: bool = False
    exit_codes: dict[int, int | None] = field(default_factory=dict)
    logs: dict[int, str] = field(default_factory=dict)
    headers: dict[int, str] = field(default_factory=dict)


def assemble_result(spec: LaunchSpec, outcome: Outcome, *, started_at: str, finished_at: str,
                    cleanup_errors: list[str] | None = None) -> LaunchResult:
    """Build the :class:`LaunchResult` of a run from ``outcome``.

    Results come from the logs (:func:`parse_result_blocks`, checked against the run),
    only for the ranks the node hosts; the per-rank exit codes from torchrun's failure
    summary in the logs; the ranks' progress from their progress lines
    (:func:`~builder.launchers.progress.progress_from_logs`). A failed (not timed-out) run
    whose other nodes were stopped by the Job controller gets ``killed_after_s`` 0
    (``backoffLimit: 0`` gives them no grace).
    """
    from ..output import check_result, parse_torchrun_failures

    exit_codes: dict[int, int | None] = {n: None for n in range(spec.nodes)}
    exit_codes.update({n: c for n, c in outcome.exit_codes.items() if 0 <= n < spec.nodes})
    node_logs: dict[int, str] = {}
    results: dict[int, RankResult] = {}
    problems: dict[int, str] = {}
    rank_exit: dict[int, int] = {}
    for node in range(spec.nodes):
        text = outcome.logs.get(node)
        if text is None:
            continue
        node_logs[node] = outcome.headers.get(node, "") + text
        got, bad = parse_result_blocks(text, spec.run_id, spec.world_size)
        mine = set(spec.ranks_of_node(node))
        for rank, doc in got.items():
            if rank in mine:
                model, why = check_result(doc, rank, "result", run_id=spec.run_id, world_size=spec.world_size)
                if model is not None:
                    results[rank] = model
                else:
                    problems.setdefault(rank, why or "refused")
            else:
                problems.setdefault(rank, f"result of rank {rank} printed by node {node}, which does not host it")
        for rank, why in bad.items():
            problems.setdefault(rank, why)
        for rank, code in parse_torchrun_failures(text).items():
            rank_exit.setdefault(rank, code)
    for rank in results:
        problems.pop(rank, None)
    killed = [n for n, c in exit_codes.items() if c is None]
    tracker = progress_from_logs(outcome.logs.values(), spec.world_size, spec.run_id)
    return LaunchResult(
        rank_results=results, node_logs=node_logs, node_exit_codes=exit_codes, timed_out=outcome.timed_out,
        missing_ranks=[r for r in range(spec.world_size) if r not in results],
        started_at=started_at, finished_at=finished_at, rank_exit_codes=rank_exit, rank_problems=problems,
        killed_after_s=0.0 if (outcome.failed and killed and not outcome.timed_out) else None,
        cleanup_errors=cleanup_errors if cleanup_errors is not None else [],
        progress=tracker.snapshot(at=tracker.latest) if tracker.latest else {},
        socket_seen=dict(tracker.socket), interfaces_seen=dict(tracker.interfaces),
    )
