"""Host-side phase times of a launch: where the seconds of a certification went.

A launcher marks its own steps on a :class:`PhaseClock` (host monotonic seconds): ``launch``
(before the first engine call), ``started`` (every node started), ``ended`` (the wait for
the nodes is over) and ``removed`` (everything removed). The ranks' progress lines
(:class:`~builder.launchers.progress.ProgressTracker`) give, per rank, the host time at
which the rank entered each phase of the bench (``start``, ``init``, ``all-reduce``,
``ddp``, ``profiles``, ``probe``, ``write``, ``done``). A bench phase
counts from the moment the LAST rank entered it (the collective phases wait for every rank)
to the moment the last rank entered the next one.

:func:`phase_times` turns them into an ordered list of ``(name, seconds)``, recorded in the
certificate as ``phases`` (issue 13 item 3)::

    containers up   launch -> started: network, containers, attach, start
    ranks up        started -> every rank printed ``start`` (container start, torchrun,
                    the worker processes, the bench's own start-up)
    <phase>         one per bench phase: init = ``import torch`` and the rendezvous
                    (``init_process_group``), all-reduce, ddp, profiles, probe, write
    exit            ``done`` -> the wait ended (process group teardown, the ranks, torchrun
                    and the containers exit)
    teardown        ended -> removed (containers, network, the label sweep)

Seconds are rounded to 0.01; a phase whose ends are unknown (a rank that never printed it,
a launch cut short) is left out.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping

#: The host marks, in order.
MARKS = ("launch", "started", "ended", "removed")
#: The bench phase whose entry ends the "ranks up" span, and the one that starts "exit".
FIRST_PHASE, LAST_PHASE = "start", "done"


class PhaseClock:
    """Host marks of one launch (:data:`MARKS`), in monotonic seconds."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self.marks: dict[str, float] = {}

    def mark(self, name: str) -> None:
        """Record ``name`` (one of :data:`MARKS`) now; the first record of a name counts."""
        if name not in self.marks:
            self.marks[name] = self.clock()


def _entered(starts: Mapping[int, Mapping[str, float]], world_size: int) -> list[tuple[str, float]]:
    """``(phase, when the last rank entered it)`` for the phases every rank entered, in that order."""
    if world_size < 1 or any(r not in starts for r in range(world_size)):
        return []
    names = set.intersection(*(set(starts[r]) for r in range(world_size)))
    entered = [(n, max(starts[r][n] for r in range(world_size))) for n in names]
    return sorted(entered, key=lambda item: item[1])


def phase_times(marks: Mapping[str, float], starts: Mapping[int, Mapping[str, float]],
                world_size: int) -> list[tuple[str, float]]:
    """The phase list of the module doc from the host ``marks`` and the ranks' ``starts``
    (``{rank: {phase: host seconds}}``, :meth:`ProgressTracker.phase_starts`)."""
    out: list[tuple[str, float]] = []

    def span(name: str, a: float | None, b: float | None) -> None:
        if a is not None and b is not None and b >= a:
            out.append((name, round(b - a, 2)))

    span("containers up", marks.get("launch"), marks.get("started"))
    entered = _entered(starts, world_size)
    when = dict(entered)
    span("ranks up", marks.get("started"), when.get(FIRST_PHASE))
    bench = [(n, t) for n, t in entered if n not in (FIRST_PHASE, LAST_PHASE)]
    if FIRST_PHASE in when:
        bench = [(n, t) for n, t in bench if t >= when[FIRST_PHASE]]
    ends = [t for _, t in bench[1:]] + ([when.get(LAST_PHASE)] if bench else [])
    for (name, t), end in zip(bench, ends, strict=True):
        span(name, t, end)
    span("exit", when.get(LAST_PHASE), marks.get("ended"))
    span("teardown", marks.get("ended"), marks.get("removed"))
    return out
