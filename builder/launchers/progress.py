"""Rank progress: the ``@@envbuild-progress`` lines of every rank (``bench.progress``), tracked
per rank by host arrival time (a frozen rank's own clock says nothing), and the naming of
the ranks that hang, shared by every launcher and the verdict.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from builder.core.errors import EnvbuildError
from builder.core.inputs import load_json, one_line

PROGRESS_PREFIX = "@@envbuild-progress "
#: Seconds of silence after which a rank has stopped (the bench beats every 2 s while alive).
SILENT_AFTER_S = 10.0
#: Process states (``/proc/PID/stat``) of a rank stopped by a signal (SIGSTOP, a tracer).
STOPPED_STATES = ("T", "t")
#: The socket variables a rank reports in its ``start`` line.
SOCKET_VARS = ("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME")
#: Longest progress line read, in characters.
MAX_PROGRESS_LINE = 65536
#: Distinct phase names whose first arrival is kept per rank (phase times).
MAX_PHASE_NAMES = 64


def parse_progress_line(line: str) -> dict | None:
    """The document of a phase or beat line, checked; None for anything else (never raises)."""
    if not line.startswith(PROGRESS_PREFIX) or len(line) > MAX_PROGRESS_LINE:
        return None
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


def _socket_of(value: object) -> dict[str, str | None]:
    value = value if isinstance(value, Mapping) else {}
    return {k: (value.get(k) if isinstance(value.get(k), str) else None) for k in SOCKET_VARS}


class ProgressTracker:
    """The last phase and heartbeat of every rank of this run, and when they arrived (thread-safe)."""

    def __init__(self, world_size: int, run_id: str | None = None, clock: Callable[[], float] = time.monotonic) -> None:
        self.world_size = world_size
        self.run_id = run_id
        self.clock = clock
        self._mu = threading.Lock()
        self._phase: dict[int, dict] = {}
        self._state: dict[int, str] = {}
        self._seen_at: dict[int, float] = {}
        self._phase_at: dict[int, float] = {}
        self._first_at: dict[int, dict[str, float]] = {}
        self._first_t: dict[int, dict[str, float]] = {}  # by the rank's own clock (``t``)
        self.socket: dict[int, dict] = {}
        self.interfaces: dict[int, dict] = {}
        self.latest = 0.0

    def feed(self, line: str, at: float | None = None) -> bool:
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
            self.latest = max(self.latest, now)
            if "beat" in doc:
                self._state[r] = doc["state"][:8]
                return True
            prev = self._phase.get(r)
            if prev is None or doc["seq"] != prev["seq"]:
                self._phase_at[r] = now
                t: Any = doc.get("t")
                stamp = float(t) if type(t) in (int, float) and math.isfinite(t) else None
                for firsts, when in ((self._first_at.setdefault(r, {}), now), (self._first_t.setdefault(r, {}), stamp)):
                    if len(firsts) < MAX_PHASE_NAMES and when is not None:
                        firsts.setdefault(doc["phase"][:80], when)
            self._phase[r] = doc
            if doc["phase"] == "start" and "socket" in doc:
                self.socket[r] = _socket_of(doc.get("socket"))
                ifs = doc.get("interfaces")
                if isinstance(ifs, dict):
                    self.interfaces[r] = {str(k)[:32]: bool(v) for k, v in list(ifs.items())[:64]}
        return True

    def phase_starts(self, stamped: bool = False) -> dict[int, dict[str, float]]:
        """``{rank: {phase: clock seconds its first line arrived}}`` (:mod:`builder.launchers.phases`);
        ``stamped``: the ``t`` (epoch s) the rank wrote on it, for logs read long after the fact."""
        with self._mu:
            return {r: dict(v) for r, v in sorted((self._first_t if stamped else self._first_at).items())}

    def snapshot(self, at: float | None = None) -> dict[int, dict]:
        """Per rank that printed a phase: phase, process state, ``silent_s`` (since its last line), ``in_phase_s``."""
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


def progress_from_logs(logs: Iterable[str], world_size: int, run_id: str | None = None) -> ProgressTracker:
    """A tracker fed from logs read later (pod logs), each line at its ``t``; snapshot at ``latest``."""
    tracker = ProgressTracker(world_size, run_id)
    for text in logs:
        for line in (text or "").splitlines():
            doc = parse_progress_line(line) if line.startswith(PROGRESS_PREFIX) else None
            t = doc.get("t") if doc else None
            if isinstance(t, (int, float)) and not isinstance(t, bool):
                tracker.feed(line, at=float(t))
    return tracker


# --------------------------------------------------------------------------- hang naming


def ranks_text(ranks: Iterable[int]) -> str:
    ordered = sorted(ranks)
    return ("rank " if len(ordered) == 1 else "ranks ") + ", ".join(str(r) for r in ordered)


def phase_text(state: Mapping[str, Any]) -> str:
    detail = state.get("detail")
    return one_line(f"{state.get('phase')} {detail}" if detail else str(state.get("phase")), 80)


def hung_ranks(progress: Mapping[int, dict], prog: Mapping[int, dict | None],
                stuck: Sequence[int]) -> tuple[set[int], set[int], set[int]]:
    """``(silent, idle, hung)`` ranks of ``stuck`` by the rule of :func:`name_hangs`."""
    silent = {r for r, p in prog.items() if p is None or p.get("silent_s", 0) > SILENT_AFTER_S
              or p.get("state") in STOPPED_STATES}
    idle = {r for r, p in prog.items() if r not in silent and p is not None and not p.get("collective")}
    hung = silent | idle
    if not hung:
        seqs = {r: p["seq"] for r, p in prog.items() if p is not None}
        ahead = [p["seq"] for r, p in progress.items() if r not in stuck] + list(seqs.values())
        lowest = min(seqs.values())
        if max(ahead) > lowest:
            hung = {r for r, q in seqs.items() if q == lowest}
    return silent, idle, hung


def _why(r: int, p: dict | None, sets: tuple[set[int], set[int], set[int]], others: list[int]) -> str:
    silent, idle, hung = sets
    if r in silent or p is None:
        if p is None:
            return "hung: never reported progress"
        if p.get("state") in STOPPED_STATES:
            return f"hung: stopped by a signal (process state {p['state']}) in {phase_text(p)}"
        return f"hung: no heartbeat for {p['silent_s']:g} s (frozen or gone); last in {phase_text(p)}"
    if r in idle:
        return (f"hung: stopped making progress in {phase_text(p)} for {p['in_phase_s']:g} s "
                "(alive, outside any collective)")
    if r in hung:
        return (f"hung: stopped making progress in {phase_text(p)} for {p['in_phase_s']:g} s; "
                f"{ranks_text(others)} got further")
    if hung:
        return f"blocked in {phase_text(p)}, waiting for {ranks_text(hung)}"
    return f"blocked in {phase_text(p)} for {p['in_phase_s']:g} s (no rank got further)"


def name_hangs(progress: Mapping[int, dict], stuck: Sequence[int], limit_s: float) -> dict[int, tuple[str, bool]]:
    """``{rank: (failure line, hung?)}`` of the ranks ``stuck`` at the deadline. Hung: its heartbeat stopped (silent
    over ``SILENT_AFTER_S``), stopped by a signal, or alive outside any collective (the others wait in one); with none
    so, the ranks furthest behind, unless all share a phase."""
    head = {r: f"rank {r} did not finish within {limit_s:g} s (timeout)" for r in stuck}
    if not progress:
        return {r: (head[r], False) for r in stuck}
    prog = {r: progress.get(r) for r in stuck}
    sets = hung_ranks(progress, prog, stuck)
    others = sorted(x for x in progress if x not in sets[2])
    return {r: (f"{head[r]}: {_why(r, prog[r], sets, others)}", r in sets[2]) for r in stuck}
