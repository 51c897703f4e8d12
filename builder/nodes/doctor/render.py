"""doctor's human output (rich)."""

from __future__ import annotations

from typing import Any

from builder.core.inputs import one_line

from ..verify.render import cell
from .base import FAIL, PASS, SKIP, UNKNOWN, WARN
from .runner import DoctorResult

#: Characters of one detail line in the human output (the JSON output has it whole).
LINE_LIMIT = 900


def render(result: DoctorResult, console: Any) -> None:
    """Print ``result``: a row per check, details and fix of those that did not pass, every message escaped."""
    from rich.table import Table
    from rich.text import Text

    style = {PASS: "green", SKIP: "dim", WARN: "yellow", FAIL: "red", UNKNOWN: "magenta"}
    t = Table(title=f"doctor: {len(result.nodes)} nodes", title_justify="left", show_edge=False)
    t.add_column("check", no_wrap=True)
    t.add_column("status", no_wrap=True)
    t.add_column("finding", overflow="fold")
    for c in result.checks:
        t.add_row(cell(c.name), cell(c.status, style=style[c.status]), cell(c.message, LINE_LIMIT))
    console.print(t)
    for c in result.checks:
        if c.status not in (FAIL, WARN, UNKNOWN):
            continue
        console.print(Text.assemble((c.name, style[c.status]), ":"), highlight=False)
        for line in c.details:
            console.print(Text("  " + one_line(line, LINE_LIMIT)), highlight=False, soft_wrap=True)
        for line in ([f"fix: {c.fix}"] if c.fix else []) + ([f"next: {c.next_step} [{c.cls}]"] if c.cls else []):
            console.print(Text("  " + one_line(line, LINE_LIMIT)), highlight=False, soft_wrap=True)
    counts = {s: sum(1 for c in result.checks if c.status == s) for s in style}
    console.print(f"doctor: {counts[PASS]} passed, {counts[WARN]} warnings, {counts[FAIL]} failed, "
                  f"{counts[UNKNOWN]} not checked, {counts[SKIP]} skipped -> exit {int(result.exit_code)}",
                  markup=False, highlight=False)
