"""verify's default view: one line per group of equal nodes (10,000 nodes are a few lines)."""

from __future__ import annotations

from dataclasses import dataclass, field

from builder.core.inputs import one_line

from .result import VerifyResult
from .rules import show

#: Node names listed per group line.
GROUP_NAMES = 5
#: Deviations shown per group line.
GROUP_FIELDS = 4


@dataclass
class NodeGroup:
    """Nodes that deviate in the same way: ``deviations`` as ``(field, shown value)``
    pairs (empty: agree in every compared field), ``nodes`` in their order."""

    deviations: tuple[tuple[str, str], ...]
    nodes: list[str] = field(default_factory=list)


def _deviations(result: VerifyResult) -> dict[str, list[tuple[str, str]]]:
    dev: dict[str, list[tuple[str, str]]] = {n.name: [] for n in result.nodes}
    for n in result.nodes:
        if not n.ok:
            dev[n.name].append(("not checked", ""))
    for f in result.findings:
        if f.level == "unknown":
            continue
        if f.groups:
            usual = f.reference if f.reference is not None else show(f.groups[-1].value)
            for g in f.groups:
                value = show(g.value)
                if value != usual:
                    for name in g.nodes:
                        dev.setdefault(name, []).append((f.field or f.rule, value))
        else:
            for name in f.nodes:
                dev.setdefault(name, []).append((f.rule, f.field or ""))
    return dev


def node_groups(result: VerifyResult) -> list[NodeGroup]:
    """The nodes of ``result`` in groups of equal deviations."""
    groups: dict[tuple[tuple[str, str], ...], NodeGroup] = {}
    for name, devs in _deviations(result).items():
        key = tuple(devs)
        groups.setdefault(key, NodeGroup(key)).nodes.append(name)
    return sorted(groups.values(), key=lambda g: (bool(g.deviations), -len(g.nodes)))  # stable: first-node order


def names(nodes: list[str], limit: int = GROUP_NAMES) -> str:
    """``"a, b, c"``; over ``limit`` names the first ``limit`` and ``(+N more)``."""
    return ", ".join(nodes[:limit]) + (f" (+{len(nodes) - limit} more)" if len(nodes) > limit else "")


def describe_group(g: NodeGroup, against: bool) -> str:
    """One line: ``"9998 nodes agree in every compared field: node-1, ... (+9993 more)"`` or
    ``"2 nodes: torch.version 2.13.1+cpu: node-7, node-9"``; escaped."""
    count = f"{len(g.nodes)} node{'s' if len(g.nodes) != 1 else ''}"
    who = names(g.nodes)
    if not g.deviations:
        one = len(g.nodes) == 1
        what = ("matches" if one else "match") + " the reference" if against else ("agrees" if one else "agree")
        return one_line(f"{count} {what} in every compared field: {who}", 2000)
    shown = [f"{f} {v}".strip() for f, v in g.deviations[:GROUP_FIELDS]]
    more = f" (+{len(g.deviations) - GROUP_FIELDS} more)" if len(g.deviations) > GROUP_FIELDS else ""
    return one_line(f"{count}: {'; '.join(shown)}{more}: {who}", 2000)
