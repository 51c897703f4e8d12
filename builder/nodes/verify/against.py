"""``verify --against REF``: every node compared with one reference (a certificate's rank
probe, a node report, an image probed) under verify's rules, and the reference's validity.

A field of scope ``image`` (:class:`~.rules.Rule`) is compared only when the node's report
and the reference's are of the same scope: a host report (``envbuild probe --host``,
``gate``) says nothing about the torch or NCCL inside the image, while its driver, kernel
and GPUs are the node's. The driver floor then uses the reference's CUDA requirement
(:mod:`.floor`). A field the reference does not have and that is skipped when absent
(``image.digest``, ``image.id``, ``nccl.net_plugin``) is compared between the nodes instead;
a node whose report lacks such a field (an in-image probe does not know its image's ID) is
not compared in it.
"""

from __future__ import annotations

import datetime
from typing import TYPE_CHECKING

from ..report import Node, NodeReport
from .result import FAIL, WARN, Finding
from .rules import Rule, compare, group_values, show

if TYPE_CHECKING:
    from ..reference import Reference

#: ``--max-age`` default: 30 days, in seconds.
DEFAULT_MAX_AGE_S = 30 * 86400.0
SRC_VALIDITY = "a certificate holds for the nodes and software of its time: certify again when it is old"


def applies(rule: Rule, ref: NodeReport, r: NodeReport) -> bool:
    """Whether ``rule`` compares report ``r`` with the reference report ``ref``: host fields
    always, image fields only between reports of the same scope."""
    return rule.scope == "host" or ref.is_host == r.is_host


def compare_to(nodes: list[Node], ref: Reference, rule: Rule, kind: str) -> list[Finding]:
    """One :class:`~.rules.Rule` between every node and the reference: a finding naming the
    reference's value (``reference``) and each other value with its nodes (``groups``: every
    node by value, the reference's group included)."""
    want = rule.value(ref.report)
    if want is None and rule.skip_absent:
        return compare(nodes, rule, kind)  # the reference does not say: the nodes among themselves
    pairs = [(n.name, rule.value(r)) for n in nodes if (r := n.report) is not None and n.ok
             and applies(rule, ref.report, r)]
    out: list[Finding] = []
    if rule.skip_absent:  # a report that does not know the field (an in-image probe, its image's ID)
        pairs = [(n, v) for n, v in pairs if v is not None]
    groups = group_values(pairs)
    off = [g for g in groups if g.value != want]
    if off:
        others = "; ".join(f"{show(g.value)} on {', '.join(g.nodes)}" for g in off)
        out.insert(0, Finding(level=rule.level, rule=kind, field=rule.name,
                              message=f"{rule.name}: {ref.label} {show(want)}; {others}",
                              nodes=[n for g in off for n in g.nodes], source=rule.source, groups=groups,
                              reference=show(want)))
    return out


def _days(seconds: float) -> str:
    days = seconds / 86400
    return f"{days:.0f} days" if days >= 2 else f"{seconds / 3600:.0f} hours"


def validity_findings(ref: Reference, max_age_s: float, now: datetime.datetime | None = None) -> list[Finding]:
    """The certificate's own state: a failed verdict fails; older than ``max_age_s``, or of
    an unknown age, warns (naming its age, time and envbuild version)."""
    from ..reference import age_s

    run = ref.run
    if run is None:
        return []
    out = []
    if not run.passed:
        first = f": {run.failures[0]}" if run.failures else ""
        out.append(Finding(level=FAIL, rule="validity", field="certificate",
                           message=f"certificate {run.path}: its certification failed{first}",
                           source="a failing certificate certifies nothing"))
    age = age_s(run.finished_at, now)
    made = f"made {run.finished_at} by envbuild {run.envbuild_version or '(unknown version)'}"
    if age is None:
        out.append(Finding(level=WARN, rule="validity", field="certificate",
                           message=f"certificate {run.path}: no valid finished_at ({show(run.finished_at)}): its "
                                   "age is unknown", source=SRC_VALIDITY))
    elif age > max_age_s:
        out.append(Finding(level=WARN, rule="validity", field="certificate",
                           message=f"certificate {run.path}: {made}, {_days(age)} ago: older than --max-age "
                                   f"{_days(max_age_s)}; certify the image again", source=SRC_VALIDITY))
    return out


def scope_notes(nodes: list[Node], ref: Reference) -> list[str]:
    """One line naming the nodes whose reports are of another scope than the reference's
    (their image fields were not compared)."""
    other = [n.name for n in nodes if n.ok and n.report is not None and n.report.is_host != ref.report.is_host]
    if not other:
        return []
    head = ", ".join(other[:5]) + (f" (+{len(other) - 5} more)" if len(other) > 5 else "")
    what = "host reports" if not ref.report.is_host else "in-image reports"
    return [f"{len(other)} {what} ({head}) against the {ref.kind}'s "
            f"{'host' if ref.report.is_host else 'in-image'} report: only the driver, kernel, GPUs and the "
            "CUDA requirement were compared there (gate --image IMAGE probes the image too)"]
