"""``verify --against REF``: every node compared with one reference (a certificate's rank
probe, a node report, an image probed) under verify's rules, and the reference's validity."""

from __future__ import annotations

import datetime
from typing import TYPE_CHECKING

from builder.core.documents import NodeReport

from ..report import Node
from .result import FAIL, WARN, Finding
from .rules import Rule, compare, group_values, show
from .summary import names

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
    """One :class:`~.rules.Rule` between every node and the reference, as one finding."""
    want = rule.value(ref.report)
    if want is None and rule.skip_absent:
        return compare(nodes, rule, kind)  # the reference does not say: the nodes among themselves
    pairs = [(n.name, rule.value(r)) for n in nodes if (r := n.report) is not None and n.ok
             and applies(rule, ref.report, r)]
    if rule.skip_absent:  # a report that does not know the field (an in-image probe, its image's ID)
        pairs = [(n, v) for n, v in pairs if v is not None]
    groups = group_values(pairs)
    off = [g for g in groups if g.value != want]
    if not off:
        return []
    others = "; ".join(f"{show(g.value)} on {', '.join(g.nodes)}" for g in off)
    level = rule.against_level or rule.level
    return [Finding(level=level, rule="must-match" if level == FAIL else kind, field=rule.name,
                    message=f"{rule.name}: {ref.label} {show(want)}; {others}", nodes=[n for g in off for n in g.nodes],
                    source=rule.source, groups=groups, reference=show(want))]


def duration_text(seconds: float) -> str:
    """``"60 s"``, ``"36 min"``, ``"5 hours"``, ``"30 days"``: the largest unit of which
    there are at least two (seconds below 2 minutes), rounded down."""
    for unit, size in (("days", 86400), ("hours", 3600), ("min", 60)):
        if seconds >= 2 * size:
            return f"{int(seconds // size)} {unit}"
    return f"{int(seconds)} s"


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
                           message=f"certificate {run.path}: {made}, {duration_text(age)} ago: older than "
                                   f"--max-age {duration_text(max_age_s)}; certify the image again",
                           source=SRC_VALIDITY))
    return out


def scope_notes(nodes: list[Node], ref: Reference) -> list[str]:
    """One line naming the nodes whose reports are of another scope than the reference's
    (their image fields were not compared)."""
    other = [n.name for n in nodes if n.ok and n.report is not None and n.report.is_host != ref.report.is_host]
    if not other:
        return []
    head = names(other)
    what = "host reports" if not ref.report.is_host else "in-image reports"
    return [f"{len(other)} {what} ({head}) against the {ref.kind}'s "
            f"{'host' if ref.report.is_host else 'in-image'} report: only the driver, kernel, GPUs and the "
            "CUDA requirement were compared there (gate --image IMAGE probes the image too)"]
