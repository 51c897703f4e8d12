"""Find the bad node(s) of a failing multi-node certification by bisection (docs/bisect.md).

Split the nodes in two, run the cheapest check that failed on each half, recurse into the
halves that fail: about 2 log2(N) runs for one bad node, as NVIDIA's Cluster Readiness Engine
isolates faults. A collective needs two nodes, so a lone node runs with one already known good.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from pathlib import Path
from typing import Protocol

import msgspec

from builder.core.certificate import RunSettings, Verdict
from builder.core.errors import FailureClass, next_step, with_step
from builder.core.files import write_atomic
from builder.core.inputs import one_line
from builder.core.model import Model
from builder.image import engine
from builder.launchers.base import Launcher, LaunchResult
from builder.recipe.model import Lock

from .run import Plan
from .verdict import check_results, judge

SCHEMA = "envbuild.bisect/1"
#: Failure lines kept as the evidence of one run.
MAX_EVIDENCE = 6
#: Most nodes a bisection searches (each run is a certification of part of them).
MAX_NODES = 4096


class Trial(Model, frozen=True):
    """One run over ``nodes`` (machines, in rank order)."""

    nodes: list[int]
    passed: bool
    reason: FailureClass | None
    evidence: list[str]
    run_id: str
    seconds: float


class BadNode(Model, frozen=True):
    node: int
    reason: FailureClass
    next_step: str
    evidence: list[str]
    run_id: str


class Bisection(Model, frozen=True):
    """``<certificate>.bisect.json``; ``unresolved``: nodes whose fault shows only together."""

    run_id: str
    nodes: list[int]
    reason: FailureClass
    bad: list[BadNode]
    unresolved: list[int]
    rounds: int
    trials: list[Trial]
    schema: str = SCHEMA


class SubsetLauncher(Launcher, Protocol):
    def on(self, machines: list[int]) -> Launcher: ...


def cheapest(s: RunSettings, reason: FailureClass) -> RunSettings:
    """The settings of the runs over part of the nodes: a busbw floor missed needs its gate size
    only; every other check runs as it did."""
    if reason == FailureClass.THRESHOLD and s.min_busbw_gbps is not None and s.min_scaling_efficiency is None:
        return msgspec.structs.replace(s, sizes=[s.busbw_size])
    return s


def search(nodes: list[int], trial: Callable[[list[int]], Trial]) -> tuple[list[BadNode], list[int], list[Trial], int]:
    """``(bad nodes, unresolved nodes, runs, rounds)`` of ``nodes``, which failed together.

    ``trial`` runs the check over the nodes it is given. A half of one node runs with a node
    already known good, deferred until one is known; when none is, the deferred ones run two by
    two, then alone."""
    good: list[int] = []
    trials: list[Trial] = []
    bad: dict[int, Trial] = {}
    unresolved: list[int] = []
    deferred: list[int] = []
    rounds = 0

    def test(group: list[int]) -> Trial:
        t = trial(group + [g for g in good[:1] if len(group) == 1])
        trials.append(t)
        if t.passed:
            good.extend(n for n in t.nodes if n not in good)
        return t

    def split(group: list[int], depth: int) -> None:
        nonlocal rounds
        rounds = max(rounds, depth)
        half = (len(group) + 1) // 2
        failed = []
        for part in (group[:half], group[half:]):
            if len(part) == 1 and not good:
                deferred.append(part[0])
                continue
            t = test(part)
            if not t.passed:
                failed.append((part, t))
        if not failed and not any(n in deferred for n in group):
            unresolved.extend(group)  # each half passes: the fault shows with all of them only
        for part, t in failed:
            if len(part) == 1:
                bad[part[0]] = t
            else:
                split(part, depth + 1)

    split(list(nodes), 1)
    for i in range(0, len(deferred) - 1, 2):  # no good node known: the lone ones two by two first
        if not good:
            test(deferred[i:i + 2])
    for n in deferred:
        if n not in good:
            t = test([n])
            if not t.passed:
                bad[n] = t
    out = [BadNode(node=n, reason=t.reason or FailureClass.WORKLOAD,
                   next_step=next_step(t.reason or FailureClass.WORKLOAD), evidence=t.evidence, run_id=t.run_id)
           for n, t in sorted(bad.items())]
    return out, unresolved, trials, rounds


def runner(p: Plan, launcher: SubsetLauncher, settings: RunSettings, lock: Lock | None) -> Callable[[list[int]], Trial]:
    """A ``trial`` of :func:`search`: ``settings`` certified over the given machines (no
    certificate written)."""
    def run_on(machines: list[int]) -> Trial:
        s = msgspec.structs.replace(settings, nodes=len(machines))
        spec = dataclasses.replace(p.spec, nodes=len(machines), run_id=engine.new_run_id(), bench_args=s.bench_args())
        t0 = time.monotonic()
        launch = launcher.on(machines).run(spec)
        check_results(launch, spec)
        verdict = judge(s, launch, lock, p.socket)
        where = f"nodes {','.join(map(str, machines))} as ranks 0..{spec.world_size - 1}: "
        return Trial(nodes=list(machines), passed=verdict.passed, reason=verdict.failure_class,
                     evidence=[one_line(where + f, 400) for f in verdict.failures[:MAX_EVIDENCE]],
                     run_id=spec.run_id, seconds=round(time.monotonic() - t0, 2))
    return run_on


def bisect(p: Plan, launch: LaunchResult, verdict: Verdict, launcher: SubsetLauncher) -> Bisection:
    """Bisect the nodes of the failed run ``launch`` of plan ``p`` (its ``verdict``)."""
    reason = verdict.failure_class or FailureClass.WORKLOAD
    lock = None if p.image.reference == "probe" else p.image.lock
    nodes = list(range(min(p.settings.nodes, MAX_NODES)))
    bad, unresolved, trials, rounds = search(nodes, runner(p, launcher, cheapest(p.settings, reason), lock))
    return Bisection(run_id=p.spec.run_id, nodes=nodes, reason=reason, bad=bad, unresolved=unresolved,
                     rounds=rounds, trials=trials)


def write_bisection(doc: Bisection, cert_path: str | Path) -> Path:
    """Write ``doc`` as ``<certificate>.bisect.json`` beside the certificate."""
    path = Path(cert_path)
    return write_atomic(path.with_name(path.stem + ".bisect.json"),
                        msgspec.json.format(msgspec.json.encode(doc), indent=2) + b"\n", parents=False)


def lines(doc: Bisection) -> list[str]:
    """What the command line prints: one line per bad node, the unresolved ones, the cost."""
    out = [with_step(f"bisect: node {b.node}: {b.evidence[0] if b.evidence else 'failed'} (run {b.run_id})",
                     b.reason, b.next_step) for b in doc.bad]
    if doc.unresolved:
        out.append(f"bisect: nodes {','.join(map(str, doc.unresolved))} fail only together ({doc.reason}): "
                   "no node alone is at fault")
    out.append(f"bisect: {len(doc.trials)} run(s) in {doc.rounds} round(s), "
               f"{sum(t.seconds for t in doc.trials):.1f} s")
    return out
