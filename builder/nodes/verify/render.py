"""verify's human output (rich): a nodes table, the fields that differ, the other findings
one per line, a summary line. Every value from a report is escaped (never rich markup)."""

from __future__ import annotations

from typing import Any

from builder.core.inputs import one_line

from .result import FAIL, UNKNOWN, WARN, NodeSummary, VerifyResult
from .rules import show

#: Characters of one value shown in a table cell (the JSON output has it whole).
CELL_LIMIT = 200
#: Characters of one finding line in the human output (the JSON output has it whole).
LINE_LIMIT = 900
#: Differing fields shown in the "fields that differ" table; the rest are printed one
#: line each (a rich table costs ~0.5 ms a row: 20k rows would take tens of seconds).
TABLE_FIELDS = 100
_STYLE = {FAIL: "red", WARN: "yellow", UNKNOWN: "magenta"}


def _short_image(value: str | None) -> str:
    """An image ID or digest as 12 hex digits (as ``docker images`` shows IDs)."""
    if not value:
        return "-"
    return value.split(":", 1)[-1][:12] if value.startswith("sha256:") else value


def cell(value: Any, limit: int | None = CELL_LIMIT, style: str = "") -> Any:
    """``value`` as a rich ``Text`` safe for a terminal: one line, control characters and
    bidi overrides escaped (:func:`builder.core.inputs.one_line`), never read as rich markup
    (``"[/]"`` prints as it is), cut to ``limit`` characters."""
    from rich.text import Text

    return Text(one_line("-" if value is None else value, limit), style=style)


def _node_rows(nodes: list[NodeSummary]) -> tuple[list[str], list[list]]:
    rows: list[list] = []
    for s in nodes:
        first = s.source.split(" ", 1)[0]
        kind = s.source if first not in ("container", "ssh", "slurm") else first
        if not s.ok:
            rows.append([s.name, kind, None, None, None, None, None])
        else:
            rows.append([s.name, kind, s.torch or "-", s.nccl or "-", s.driver or "-",
                         _short_image(s.image), s.address or "-"])
    return ["node", "source", "torch", "nccl", "driver", "image", "address"], rows


def _print_nodes(result: VerifyResult, console: Any) -> None:
    from rich.table import Table
    from rich.text import Text

    header, rows = _node_rows(result.nodes)
    keep = [i for i in range(len(header)) if i < 3 or any(r[i] not in ("-", None) for r in rows)]
    nodes = Table(title="nodes", title_justify="left", show_edge=False)
    for i in keep:
        nodes.add_column(header[i], no_wrap=header[i] not in ("source", "address"), overflow="fold")
    for r in rows:
        if r[2] is None:
            r[2] = Text("not checked", style="magenta")
        nodes.add_row(*[r[i] if isinstance(r[i], Text) else cell(r[i] or "") for i in keep])
    console.print(nodes)


def _print_differences(result: VerifyResult, console: Any) -> set[int]:
    """The "fields that differ" table; returns the ids of the findings it showed."""
    from rich.table import Table

    diffs = result.differences[:TABLE_FIELDS]
    if not diffs:
        return set()
    t = Table(title="fields that differ", title_justify="left", show_edge=False)
    t.add_column("rule", no_wrap=True)  # coloured by level: red fails, yellow warns
    t.add_column("field", overflow="fold")
    t.add_column("value", overflow="fold")
    t.add_column("nodes", overflow="fold", min_width=min(40, max(len(n.name) for n in result.nodes)))
    for f in diffs:
        for i, g in enumerate(f.groups):
            first = i == 0
            shown = _short_image(g.value) if f.field in ("image.id", "image.digest") and g.value else show(g.value)
            t.add_row(cell(f.rule, style=_STYLE[f.level]) if first else "", cell(f.field) if first else "",
                      cell(shown), cell(", ".join(g.nodes), None))
    console.print(t)
    return {id(f) for f in diffs}


def render(result: VerifyResult, console: Any) -> None:
    """Print ``result`` with rich: a nodes table, a table of the first
    :data:`TABLE_FIELDS` differing fields (nodes grouped by value), the other findings one
    per line, and a summary line.

    Every value from a report is shown through :func:`cell` (escaped, never markup), so
    a report string such as ``"[/]"`` or ``"\\x1b[2J"`` prints literally. Linear in the
    number of findings and nodes.
    """
    from rich.text import Text

    _print_nodes(result, console)
    shown_as_diff = _print_differences(result, console)
    for f in result.findings:
        if id(f) in shown_as_diff:
            continue
        line = Text.assemble((f.level, _STYLE[f.level]), f": {f.rule}: ", one_line(f.message, LINE_LIMIT))
        console.print(line, highlight=False, soft_wrap=True)
    checked = sum(1 for n in result.nodes if n.ok)
    fails = sum(1 for f in result.findings if f.level == FAIL)
    warns = sum(1 for f in result.findings if f.level == WARN)
    unknown = sum(1 for f in result.findings if f.level == UNKNOWN)
    console.print(f"verify: {checked} of {len(result.nodes)} nodes checked; {fails} failed, {warns} warnings, "
                  f"{unknown} not checked -> exit {int(result.exit_code)}", markup=False, highlight=False)
