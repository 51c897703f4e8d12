"""Compare node reports: which node differs in what, and how bad that is."""

from __future__ import annotations

import datetime
from typing import TYPE_CHECKING

from ..report import Node
from . import rules
from .against import DEFAULT_MAX_AGE_S, compare_to, scope_notes, validity_findings
from .drift import drift, split_history
from .floor import driver_floor_findings
from .interfaces import nccl_interface
from .render import render
from .result import FAIL, UNKNOWN, WARN, Finding, VerifyResult, classified, exit_code, node_summary

if TYPE_CHECKING:
    from ..reference import Reference

__all__ = ["DEFAULT_MAX_AGE_S", "VerifyResult", "nccl_interface", "render", "verify"]


def verify(nodes: list[Node], floors: dict[str, dict] | None = None, reference: Reference | None = None,
           max_age_s: float = DEFAULT_MAX_AGE_S, now: datetime.datetime | None = None) -> VerifyResult:
    """Compare ``nodes`` with each other, or each with ``reference`` (``--against``)."""
    histories: dict[str, list[Node]] = {}
    if reference is not None:
        nodes, histories = split_history(nodes)
        cmp = lambda rule, kind: compare_to(nodes, reference, rule, kind)  # noqa: E731
    else:
        cmp = lambda rule, kind: rules.compare(nodes, rule, kind)  # noqa: E731
    findings: list[Finding] = validity_findings(reference, max_age_s, now) if reference else []
    for rule in rules.MUST_MATCH:
        findings += cmp(rule, "must-match")
    findings += driver_floor_findings(nodes, floors, reference.requirement if reference else None)
    findings += rules.interface_findings(nodes, several=reference is not None or len(nodes) > 1)
    for rule in rules.SHOULD_MATCH:
        findings += cmp(rule, "should-match")
    reports = [n.report for n in nodes if n.ok and n.report is not None] + ([reference.report] if reference else [])
    for var in rules.env_names(reports, rules.TORCHRUN_ENV if reference else ()):
        rule = rules.env_rule(var)
        findings += cmp(rule, "must-match" if rule.level == FAIL else "should-match")
    findings += rules.nccl_copies_findings(nodes) + rules.cuda_runtime_findings(nodes)
    findings += rules.probe_error_findings(nodes) + rules.unreachable_findings(nodes)
    order = {FAIL: 0, WARN: 1, UNKNOWN: 2}
    findings.sort(key=lambda f: order[f.level])  # stable: rule order kept within a level
    return VerifyResult(schema="envbuild.verify/1", exit_code=int(exit_code(findings)),
                        nodes=[node_summary(n) for n in nodes], findings=[classified(f) for f in findings],
                        reference=reference.summary(now) if reference else None,
                        drift=drift(histories, reference) if reference else [],
                        notes=scope_notes(nodes, reference) if reference else [])
