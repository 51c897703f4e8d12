"""Drift over time: a node's gate history read back as one node (its latest report), with what
changed since the reference and since the previous report."""

from __future__ import annotations

import collections
from typing import TYPE_CHECKING

from ..report import Node
from .against import applies
from .result import Change, NodeDrift
from .rules import MUST_MATCH, SHOULD_MATCH, TORCHRUN_ENV, env_names, env_rule

if TYPE_CHECKING:
    from ..reference import Reference


def _series_key(n: Node) -> tuple[str, str] | None:
    r = n.report
    if not n.ok or r is None or n.target is not None or not r.hostname or not r.probed_at:
        return None
    return r.hostname, r.scope or "-"


def split_history(nodes: list[Node]) -> tuple[list[Node], dict[str, list[Node]]]:
    """``(nodes, histories)``: each host's series becomes its latest report, named by the host (``host
    (scope)`` when it has two scopes); ``histories``: each series, oldest first."""
    series: dict[tuple[str, str], list[Node]] = {}
    for n in nodes:
        key = _series_key(n)
        if key is not None:
            series.setdefault(key, []).append(n)
    if not any(len(s) > 1 for s in series.values()):
        return nodes, {}
    scopes = collections.Counter(host for host, _ in series)
    latest: dict[int, str] = {}
    histories: dict[str, list[Node]] = {}
    for (host, scope), members in series.items():
        members.sort(key=lambda n: (n.report.probed_at or "") if n.report else "")
        name = host if scopes[host] == 1 else f"{host} ({scope})"
        members[-1].name = name
        latest[id(members[-1])] = name
        histories[name] = members
    keep = [n for n in nodes if _series_key(n) is None or id(n) in latest]
    return keep, histories


def _since(values: list[str | None], times: list[str | None]) -> str | None:
    """When the last value of ``values`` was first seen in its unbroken run at the end."""
    i = len(values) - 1
    while i > 0 and values[i - 1] == values[-1]:
        i -= 1
    return times[i]


def node_drift(name: str, history: list[Node], ref: Reference) -> NodeDrift:
    """What changed on one node (its ``history``, oldest first)."""
    reports = [n.report for n in history if n.report is not None]
    times = [r.probed_at for r in reports]
    since_ref: list[Change] = []
    since_prev: list[Change] = []
    # every must/should-match field and every variable set in any of its reports or the reference, in its scope
    every = [*MUST_MATCH, *SHOULD_MATCH, *(env_rule(v) for v in env_names([*reports, ref.report], TORCHRUN_ENV))]
    for rule in [r for r in every if applies(r, ref.report, reports[-1])]:
        values = [rule.value(r) for r in reports]
        want = rule.value(ref.report)
        if values[-1] != want and not (rule.skip_absent and (want is None or values[-1] is None)):
            since_ref.append(Change(field=rule.name, before=want, after=values[-1], since=_since(values, times)))
        if len(values) > 1 and values[-1] != values[-2]:
            since_prev.append(Change(field=rule.name, before=values[-2], after=values[-1], since=times[-1]))
    return NodeDrift(node=name, reports=len(reports), first_at=times[0],
                     previous_at=times[-2] if len(times) > 1 else None, latest_at=times[-1],
                     since_reference=since_ref, since_previous=since_prev)


def drift(histories: dict[str, list[Node]], ref: Reference) -> list[NodeDrift]:
    """:func:`node_drift` of every node with a history, by name."""
    return [node_drift(name, histories[name], ref) for name in sorted(histories)]
