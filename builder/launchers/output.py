"""What a node prints, read the same way by every launcher: progress lines, result lines and
the rest (its log), and the checks every rank result passes before it counts.

A rank prints its result document as one line ``@@envbuild-result {...}`` on stdout (the
bench's ``--result-to-stdout``), so that nothing on the host needs to be writable by the
nodes. :func:`check_result` accepts a document only when it is of this run: schema
``envbuild.rank-result/1``, the rank expected, the run id and world size of the run, and
every field valid under :class:`~builder.launchers.model.RankResult`. :class:`NodeOutput`
sorts the lines of one node (a container's output stream, a Slurm task's log file): progress
to a :class:`~builder.launchers.progress.ProgressTracker`, results checked (and refused when
printed by a node that does not host the rank), the rest kept as the node's log (its last
:data:`LOG_KEEP_BYTES`).
"""

from __future__ import annotations

import collections
import re
import threading
from collections.abc import Iterator
from typing import Any

from builder.core.errors import EnvbuildError, ManyErrors
from builder.core.inputs import load_json, show
from builder.core.model import convert

from .base import LaunchSpec
from .model import MAX_RESULT_BYTES, RESULT_SCHEMA, RankResult
from .progress import PROGRESS_PREFIX, ProgressTracker

RESULT_PREFIX = "@@envbuild-result "
#: Bytes of each node's log kept (the end; progress and result lines are not log).
LOG_KEEP_BYTES = 4 << 20


def result_problem(doc: object, rank: int, what: str = "result file", *, run_id: str | None = None,
                   world_size: int | None = None) -> str | None:
    """Why ``doc`` is not a result of ``rank`` of this run (None when it is): not a
    ``envbuild.rank-result/1`` mapping, written by another rank, by another run (its
    ``run_id`` is not ``run_id``: a stale or planted result), or for another world size.
    ``run_id``/``world_size`` None skip those checks. ``what`` names where it came from in
    the message (``"result file"``, ``"result"``). One line, values escaped. The fields
    themselves are checked by :func:`check_result`."""
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


def check_result(doc: object, rank: int, what: str = "result file", *, run_id: str | None = None,
                 world_size: int | None = None) -> tuple[RankResult | None, str | None]:
    """``(RankResult, None)`` when ``doc`` is a usable result of ``rank`` of this run, else
    ``(None, why)``: :func:`result_problem`, then every field under the
    :class:`~builder.launchers.model.RankResult` model (the first violation named, with how
    many more). ``doc`` may be a :class:`RankResult` already (checked again)."""
    if isinstance(doc, RankResult):
        doc = doc.to_dict()
    why = result_problem(doc, rank, what, run_id=run_id, world_size=world_size)
    if why:
        return None, why
    try:
        return convert(doc, RankResult), None
    except ManyErrors as e:
        more = f" (and {len(e.errors) - 1} more)" if len(e.errors) > 1 else ""
        return None, f"{what} of rank {rank} is not a valid {RESULT_SCHEMA}: {e.errors[0]}{more}"


def parse_result_line(line: str, node: int) -> tuple[Any | None, str | None]:
    """``(document, None)`` of one ``@@envbuild-result {...}`` line printed by node
    ``node``, or ``(None, why)`` when it is not JSON within the bounds
    (:func:`builder.core.inputs.load_json`; at most :data:`MAX_RESULT_BYTES`)."""
    body = line[len(RESULT_PREFIX):]
    if len(body) > MAX_RESULT_BYTES:
        return None, f"a result line of node {node} is over {MAX_RESULT_BYTES} bytes"
    try:
        return load_json(body, f"node-{node} output"), None
    except EnvbuildError as e:
        return None, f"unreadable result printed by node {node}: {e}"


# torchrun's failure summary (torch.distributed.elastic ChildFailedError), per failed rank:
#   rank      : 1 (local_rank: 0)
#   exitcode  : 3 (pid: 45)
_TR_RANK_RE = re.compile(r"\s*rank\s*:\s*(\d{1,9})\s*\(local_rank:\s*\d{1,9}\)")
_TR_EXIT_RE = re.compile(r"\s*exitcode\s*:\s*(-?\d{1,9})")


def parse_torchrun_failures(text: str) -> dict[int, int]:
    """``{global rank: exit status}`` from torchrun's failure summary in a node log.

    Signals appear as negative statuses (``-9`` for SIGKILL), as torchrun prints them.
    Ranks that torchrun did not list are absent; ``{}`` when there is no summary.
    """
    out: dict[int, int] = {}
    lines = text.splitlines()
    for i, line in enumerate(lines):
        m = _TR_RANK_RE.match(line)
        if not m:
            continue
        for nxt in lines[i + 1 : i + 4]:
            e = _TR_EXIT_RE.match(nxt)
            if e:
                out.setdefault(int(m.group(1)), int(e.group(1)))
                break
    return out


class LineBuffer:
    """Bytes of one stream cut into lines, each at most :data:`MAX_RESULT_BYTES` + 64
    bytes: :meth:`feed` yields every complete line (without its newline), or None for a
    line that was longer (dropped: it is never kept whole in memory); :meth:`rest` gives
    the last, unterminated line the same way."""

    LIMIT = MAX_RESULT_BYTES + 64

    def __init__(self) -> None:
        self._parts: list[bytes] = []
        self._size = 0

    def feed(self, data: bytes) -> Iterator[bytes | None]:
        """The lines completed by ``data``."""
        while data:
            cut = data.find(b"\n")
            if cut < 0:
                if self._size <= self.LIMIT:  # longer: dropped, noted at its end
                    self._parts.append(data)
                self._size += len(data)
                return
            self._parts.append(data[:cut])
            line = b"".join(self._parts) if self._size + cut <= self.LIMIT else None
            self._parts, self._size = [], 0
            data = data[cut + 1:]
            yield line

    def rest(self) -> list[bytes | None]:
        """The unterminated last line as a list of one (None in it when it was too long);
        [] when there is none."""
        if not self._parts:
            return []
        line = b"".join(self._parts) if self._size <= self.LIMIT else None
        self._parts, self._size = [], 0
        return [line]


class NodeOutput:
    """The lines of node ``node`` of ``spec`` sorted as they come (thread-safe).

    :meth:`line` takes one line: a progress line (stdout) goes to ``tracker``; a result
    line (stdout) becomes ``results[rank]`` (a :class:`RankResult`) or ``problems[rank]``
    (a result that is not of this run, or printed by a node that does not host its rank; a
    line without a usable rank is kept under a negative key, :meth:`problems_by_rank`);
    every other line is the node's log, of which the last :data:`LOG_KEEP_BYTES` are kept.
    """

    def __init__(self, node: int, spec: LaunchSpec, tracker: ProgressTracker) -> None:
        self.node = node
        self.spec = spec
        self.tracker = tracker
        self.results: dict[int, RankResult] = {}
        self.problems: dict[int, str] = {}
        self._log: collections.deque[str] = collections.deque()
        self._log_bytes = 0
        self._mu = threading.Lock()

    def line(self, text: str, stdout: bool = True, at: float | None = None) -> None:
        """Sort one line (without its newline); ``at``: its arrival time (default now)."""
        if stdout and text.startswith(PROGRESS_PREFIX):
            if self.tracker.feed(text, at=at):
                return
        elif stdout and text.startswith(RESULT_PREFIX):
            self._result(text)
            return
        self.keep(text)

    def _result(self, text: str) -> None:
        doc, why = parse_result_line(text, self.node)
        rank = doc.get("rank") if isinstance(doc, dict) else None
        if why is not None or type(rank) is not int:
            with self._mu:
                self.problems.setdefault(-1 - len(self.problems), why or "a result without a rank")
            return
        result = None
        if rank not in self.spec.ranks_of_node(self.node):
            why = f"result of rank {rank} printed by node {self.node}, which does not host it"
        else:
            result, why = check_result(doc, rank, "result", run_id=self.spec.run_id,
                                       world_size=self.spec.world_size)
        with self._mu:
            if result is None:
                self.problems[rank] = why or "refused"
            else:
                self.results[rank] = result
                self.problems.pop(rank, None)

    def raw_line(self, raw: bytes | None, stdout: bool = True, at: float | None = None) -> None:
        """Sort one line as bytes (from a :class:`LineBuffer`; None: a line over the bound,
        noted in the log)."""
        if raw is None:
            self.keep(f"(node {self.node}: a line over {MAX_RESULT_BYTES} bytes was dropped)")
        else:
            self.line(raw.decode("utf-8", "replace").rstrip("\r"), stdout=stdout, at=at)

    def keep(self, text: str) -> None:
        """Add a line to the node's log (the oldest lines go beyond :data:`LOG_KEEP_BYTES`)."""
        with self._mu:
            self._log.append(text)
            self._log_bytes += len(text) + 1
            while self._log_bytes > LOG_KEEP_BYTES and len(self._log) > 1:
                self._log_bytes -= len(self._log.popleft()) + 1

    def log(self) -> str:
        """The node's log kept so far (text, newline-terminated lines)."""
        with self._mu:
            return "".join(line + "\n" for line in self._log)


def problems_by_rank(outputs: list[NodeOutput], results: dict[int, RankResult],
                     world_size: int) -> dict[int, str]:
    """The problems of every node's output by rank: a problem without a usable rank
    (a line that was not JSON) is shown on the first rank that has neither a result nor
    a problem of its own; problems of ranks that have a result are dropped."""
    problems: dict[int, str] = {}
    loose: list[str] = []
    for out in outputs:
        for r, why in out.problems.items():
            if r < 0:
                loose.append(why)
            elif r not in results:
                problems[r] = why
    for why in loose:
        first = next((m for m in range(world_size) if m not in results and m not in problems), None)
        if first is not None:
            problems[first] = why
    return problems
