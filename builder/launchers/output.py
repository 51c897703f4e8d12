"""What a node prints, read the same way by every launcher. Results come as one ``@@envbuild-result`` line on stdout, so
nothing on the host need be writable by the nodes; one is accepted only when it is of this run."""

from __future__ import annotations

import collections
import re
import threading
import time
from collections.abc import Iterable, Iterator
from typing import Any

from builder.core.documents import MAX_RESULT_BYTES, RESULT_SCHEMA, RankResult
from builder.core.errors import EnvbuildError, ManyErrors
from builder.core.events import Event, event, stamp
from builder.core.inputs import load_json, show
from builder.core.model import convert

from .base import LaunchSpec
from .progress import PROGRESS_PREFIX, ProgressTracker

RESULT_PREFIX = "@@envbuild-result "
#: Bytes of each node's log kept (the end; progress and result lines are not log).
LOG_KEEP_BYTES = 4 << 20


def result_problem(doc: object, rank: int, what: str = "result file", *, run_id: str | None = None,
                   world_size: int | None = None) -> str | None:
    """Why ``doc`` is not a result of ``rank`` of this run (None if it is); a foreign ``run_id``: stale or planted."""
    if not isinstance(doc, dict) or doc.get("schema") != RESULT_SCHEMA:
        got = doc.get("schema") if isinstance(doc, dict) else type(doc).__name__
        return f"{what} is not {RESULT_SCHEMA} (got {show(got, 60)})"
    if doc.get("rank") != rank:
        return f"{what} rank-{rank}.json says rank {show(doc.get('rank'), 40)}"
    if run_id is not None and doc.get("run_id") != run_id:
        return (f"{what} of rank {rank} is from run {show(doc.get('run_id'), 60)}, not this run "
                f"{run_id}: refused (stale or planted)")
    if world_size is not None and doc.get("world_size") != world_size:
        return (f"{what} of rank {rank} is for world size {show(doc.get('world_size'), 40)}, not {world_size}: refused")
    return None


def check_result(doc: object, rank: int, what: str = "result file", *, run_id: str | None = None,
                 world_size: int | None = None) -> tuple[RankResult | None, str | None]:
    """``(RankResult, None)`` when ``doc`` is a usable result of ``rank`` of this run, else ``(None, why)``."""
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
    """``(document, None)`` of one result line, or ``(None, why)`` when not bounded JSON."""
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
    """``{global rank: exit status}`` from torchrun's failure summary (signals negative); {} if none."""
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
    """A stream cut into lines of at most ``LIMIT`` bytes; a longer one is dropped (None), never held whole."""

    LIMIT = MAX_RESULT_BYTES + 64

    def __init__(self) -> None:
        self._parts: list[bytes] = []
        self._size = 0

    def feed(self, data: bytes) -> Iterator[bytes | None]:
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
        """The unterminated last line as a list of one (None when too long), or []."""
        if not self._parts:
            return []
        line = b"".join(self._parts) if self._size <= self.LIMIT else None
        self._parts, self._size = [], 0
        return [line]


class NodeOutput:
    """One node's lines sorted as they come (thread-safe); a result of a rank it does not host is refused."""

    def __init__(self, node: int, spec: LaunchSpec, tracker: ProgressTracker) -> None:
        self.node = node
        self.spec = spec
        self.tracker = tracker
        self.results: dict[int, RankResult] = {}
        self.problems: dict[int, str] = {}
        self._log: collections.deque[tuple[float, str]] = collections.deque()  # (Unix s read, line)
        self._log_bytes = 0
        self._mu = threading.Lock()

    def line(self, text: str, stdout: bool = True, at: float | None = None) -> None:
        """Sort one line; ``at``: its arrival time (default now)."""
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
            result, why = check_result(doc, rank, "result", run_id=self.spec.run_id, world_size=self.spec.world_size)
        with self._mu:
            if result is None:
                self.problems[rank] = why or "refused"
            else:
                self.results[rank] = result
                self.problems.pop(rank, None)

    def raw_line(self, raw: bytes | None, stdout: bool = True, at: float | None = None) -> None:
        """Sort one line of bytes (None: a line over the bound, noted in the log)."""
        if raw is None:
            self.keep(f"(node {self.node}: a line over {MAX_RESULT_BYTES} bytes was dropped)")
        else:
            self.line(raw.decode("utf-8", "replace").rstrip("\r"), stdout=stdout, at=at)

    def keep(self, text: str) -> None:
        with self._mu:
            self._log.append((time.time(), text))
            self._log_bytes += len(text) + 1
            while self._log_bytes > LOG_KEEP_BYTES and len(self._log) > 1:
                self._log_bytes -= len(self._log.popleft()[1]) + 1

    def log(self) -> str:
        with self._mu:
            return "".join(line + "\n" for _, line in self._log)

    def log_lines(self) -> list[tuple[str, str]]:
        """The kept lines with the time each was read (the events' ``ts``)."""
        with self._mu:
            return [(stamp(at), line) for at, line in self._log]


def plain_lines(text: str) -> list[str]:
    """A node log's lines but envbuild's own: progress and result lines, the k8s launcher's result blocks."""
    lines, in_block = [], False
    for line in (text or "").splitlines():
        if line.startswith("@@envbuild-result-"):  # RESULT_BEGIN/RESULT_END of builder.launchers.k8s.objects
            in_block = line.startswith("@@envbuild-result-begin")
            continue
        if not in_block and not line.startswith((PROGRESS_PREFIX, RESULT_PREFIX)):
            lines.append(line)
    return lines


#: torchrun's prefix of a worker's line (``[rank1]: Traceback ...``); the words or the glog
#: severity (``W1202 01:14:57.18 ...``, torch's C++ and elastic logs) that set a level.
_RANK_RE = re.compile(r"\[rank(\d{1,6})\]:")
_LEVEL_RES = (("error", re.compile(r"\b(?:error|traceback|exception|fatal)\b|^[EF]\d{4} \d\d:", re.I)),
              ("warning", re.compile(r"\bwarn(?:ing)?\b|^W\d{4} \d\d:", re.I)))


def log_events(spec: LaunchSpec, node: int, lines: Iterable[tuple[str, str]]) -> list[Event]:
    """Node ``node``'s ``(ts, line)`` as ``log`` events of ``node-<node>`` (the certificate's name): the rank from
    torchrun's ``[rankN]:`` prefix (or the node's only rank), the level from its words; blank lines dropped."""
    ranks = list(spec.ranks_of_node(node))
    out = []
    for ts, text in lines:
        if not text.strip():
            continue
        m = _RANK_RE.match(text)
        rank = int(m.group(1)) if m and int(m.group(1)) in ranks else ranks[0] if len(ranks) == 1 else None
        level = next((lvl for lvl, rx in _LEVEL_RES if rx.search(text)), "info")
        out.append(event("log", text, level, spec.run_id, f"node-{node}", rank, ts=ts))
    return out


def problems_by_rank(outputs: list[NodeOutput], results: dict[int, RankResult], world_size: int) -> dict[int, str]:
    """Problems by rank: one without a rank goes to the first rank with neither result nor problem; results win."""
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
