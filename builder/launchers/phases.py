"""Host-side phase times of a launch: where the seconds of a certification went.

A bench phase counts from when the LAST rank entered it (collective phases wait for every
rank); the spans follow each other without a gap, adding up to ``removed - launch``.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping

from .progress import ProgressTracker, hung_ranks

#: The host marks, in order.
MARKS = ("launch", "started", "ended", "removed")
#: The bench phase whose entry ends the "ranks up" span, and the one that starts "exit".
FIRST_PHASE, LAST_PHASE = "start", "done"
#: Span names of bench phases that say little by themselves.
SHOWN = {FIRST_PHASE: "import torch", LAST_PHASE: "exit"}


class PhaseClock:

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self.marks: dict[str, float] = {}

    def mark(self, name: str) -> None:
        """Record ``name`` now; the first record of a name counts."""
        if name not in self.marks:
            self.marks[name] = self.clock()


def _entered(starts: Mapping[int, Mapping[str, float]], world_size: int) -> list[tuple[str, float]]:
    """``(phase, when the last rank entered it)`` for the phases every rank entered, in order."""
    if world_size < 1 or any(r not in starts for r in range(world_size)):
        return []
    names = set.intersection(*(set(starts[r]) for r in range(world_size)))
    entered = [(n, max(starts[r][n] for r in range(world_size))) for n in names]
    order = {n: i for i, n in enumerate(starts[0])}  # as rank 0 entered them: ties (a stamp's ms) keep it
    return sorted(entered, key=lambda item: (item[1], order[item[0]]))


def stalled_phase(progress: Mapping[int, dict], starts: Mapping[int, Mapping[str, float]],
                  world_size: int) -> tuple[str, float] | None:
    """``(phase, entered at)`` of the lowest not-done rank that held the run up; None when none."""
    stuck = [r for r in range(world_size) if LAST_PHASE not in starts.get(r, {})]
    prog = {r: progress.get(r) for r in stuck}
    if not stuck or all(p is None for p in prog.values()):
        return None
    held = sorted(hung_ranks(progress, prog, stuck)[2] or stuck)
    for r in held:
        p = prog.get(r)
        if p is not None:
            return str(p.get("phase")), starts.get(r, {}).get(str(p.get("phase")), 0.0)
    return None


def phase_times(marks: Mapping[str, float], starts: Mapping[int, Mapping[str, float]], world_size: int,
                stalled: tuple[str, float] | None = None, timed_out: bool = False,
                first: str = "containers up") -> list[tuple[str, float]]:
    """``[(span, seconds)]`` of host ``marks`` and ``{rank: {phase: host s}}`` (to ``started``: ``first``)."""
    launch, ended = marks.get("launch"), marks.get("ended")
    if launch is None or ended is None:
        return []
    spans = [(first, launch)] + ([("ranks up", marks["started"])] if "started" in marks else [])
    entered = _entered(starts, world_size)
    when = dict(entered)
    if FIRST_PHASE in when:
        spans += [(SHOWN.get(n, n), t) for n, t in entered if t >= when[FIRST_PHASE]]
    if LAST_PHASE not in when:
        cut = " (hung)" if timed_out else " (cut short)"
        if stalled is not None and stalled[1] > spans[-1][1] and stalled[0] not in when:
            spans.append((stalled[0] + cut, stalled[1]))
        else:
            spans[-1] = (spans[-1][0] + cut, spans[-1][1])
    spans.append(("teardown", ended))
    end = max(marks.get("removed", ended), ended)
    out: list[tuple[str, float]] = []
    at = launch
    for i, (name, t) in enumerate(spans):
        a = min(max(t, at), end)
        b = min(max(spans[i + 1][1], a), end) if i + 1 < len(spans) else end
        out.append((name, round(b - a, 2)))
        at = a
    return out


def job_phases(marks: Mapping[str, float], tracker: ProgressTracker, progress: Mapping[int, dict],
               world_size: int, timed_out: bool, first: str) -> list[tuple[str, float]]:
    """:func:`phase_times` of a batch job whose logs the host reads late (Slurm, Kubernetes): the
    ranks' own stamps (``t``, epoch s) against host ``marks`` taken with ``time.time``."""
    starts = tracker.phase_starts(stamped=True)
    return phase_times(marks, starts, world_size, stalled_phase(progress, starts, world_size), timed_out, first)
