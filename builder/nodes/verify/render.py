"""verify's human output (rich). Every value from a report is escaped (never rich markup)."""

from __future__ import annotations

from typing import Any

from builder.core.errors import with_step
from builder.core.inputs import one_line

from .against import duration_text
from .result import FAIL, UNKNOWN, WARN, NodeDrift, NodeSummary, VerifyResult
from .rules import show
from .summary import describe_group, names, node_groups

#: Characters of one value shown in a table cell (the JSON output has it whole).
CELL_LIMIT = 200
#: Characters of one finding line in the human output (the JSON output has it whole).
LINE_LIMIT = 900
#: Differing fields shown in the "fields that differ" table; the rest are printed one
#: line each (a rich table costs ~0.5 ms a row: 20k rows would take tens of seconds).
TABLE_FIELDS = 100
#: Node rows drawn as a table; the rest are plain lines.
TABLE_ROWS = 100
_STYLE = {FAIL: "red", WARN: "yellow", UNKNOWN: "magenta"}
#: How a reference's values are named, by its kind.
REFERENCE_LABEL = {"certificate": "certified", "report": "reference", "image": "image"}
#: Node names listed in one cell; the rest are counted.
NAMES_SHOWN = 50


def _short_image(value: str | None) -> str:
    """An image ID or digest as 12 hex digits (as ``docker images`` shows IDs)."""
    if not value:
        return "-"
    return value.split(":", 1)[-1][:12] if value.startswith("sha256:") else value


def cell(value: Any, limit: int | None = CELL_LIMIT, style: str = "") -> Any:
    """``value`` as a rich ``Text`` safe for a terminal: one escaped line, never read as markup."""
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


def _plain(console: Any, lines: list[str]) -> None:
    """Print already-escaped ``lines`` in one write (no markup, no wrapping)."""
    if lines:
        console.print("\n".join(lines), markup=False, highlight=False, soft_wrap=True)


def _print_nodes(nodes: list[NodeSummary], console: Any, title: str = "nodes") -> None:
    """The nodes table: the first :data:`TABLE_ROWS` rows drawn, the rest one plain line each."""
    from rich.table import Table
    from rich.text import Text

    header, rows = _node_rows(nodes)
    keep = [i for i in range(len(header)) if i < 3 or any(r[i] not in ("-", None) for r in rows)]
    table = Table(title=title, title_justify="left", show_edge=False)
    for i in keep:
        table.add_column(header[i], no_wrap=header[i] not in ("source", "address"), overflow="fold")
    for r in rows[:TABLE_ROWS]:
        cells = list(r)
        if cells[2] is None:
            cells[2] = Text("not checked", style="magenta")
        table.add_row(*[cells[i] if isinstance(cells[i], Text) else cell(cells[i] or "") for i in keep])
    console.print(table)
    _plain(console, [" ".join(one_line("not checked" if i == 2 and r[i] is None else (r[i] or "-"), CELL_LIMIT)
                              for i in keep) for r in rows[TABLE_ROWS:]])


def _print_summary(result: VerifyResult, console: Any) -> None:
    """One line per group of equal nodes, then the full rows of the nodes that differ."""
    groups = node_groups(result)
    against = result.reference is not None
    _plain(console, [f"nodes: {len(result.nodes)} in {len(groups)} group{'s' if len(groups) != 1 else ''}"]
           + ["  " + describe_group(g, against) for g in groups])
    differ = {name for g in groups if g.deviations for name in g.nodes}
    if differ:
        _print_nodes([n for n in result.nodes if n.name in differ], console, "nodes that differ")


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
    label = f"({REFERENCE_LABEL[result.reference.kind]})" if result.reference else ""
    for f in diffs:
        rows = [(f.reference, label)] if f.reference is not None else []
        rows += [(show(g.value), names(g.nodes, NAMES_SHOWN)) for g in f.groups]
        for i, (value, who) in enumerate(rows):
            first = i == 0
            shown = _short_image(value) if f.field in ("image.id", "image.digest") and value != "(absent)" else value
            t.add_row(cell(f.rule, style=_STYLE[f.level]) if first else "", cell(f.field) if first else "",
                      cell(shown), cell(who, None))
    console.print(t)
    return {id(f) for f in diffs}


def _print_reference(result: VerifyResult, console: Any) -> None:
    ref = result.reference
    if ref is None:
        return
    bits = [b for b in (ref.recipe, f"lock {ref.lock_hash.split(':')[-1][:12]}" if ref.lock_hash else None,
                        f"made {ref.made_at}" if ref.made_at else None,
                        f"envbuild {ref.envbuild_version}" if ref.envbuild_version else None,
                        f"{duration_text(max(ref.age_s, 0))} ago" if ref.age_s is not None else None) if b]
    _plain(console, [f"against {ref.kind} {one_line(ref.name, 300)}" + (f" ({one_line(', '.join(bits))})"
                                                                         if bits else "")]
           + ([f"  CUDA requirement: {one_line(ref.cuda_requirement, 300)}"] if ref.cuda_requirement else []))


def _change_line(c: Any) -> str:
    since = f" (since {c.since})" if c.since else ""
    return f"    {one_line(c.field, 120)}: {one_line(show(c.before), 120)} -> {one_line(show(c.after), 120)}{since}"


def _drift_lines(d: NodeDrift, label: str) -> list[str]:
    """A node's drift: what changed since the reference and since the previous report."""
    plural = "s" if d.reports != 1 else ""
    head = f"  {one_line(d.node, 200)}: {d.reports} report{plural}, {d.first_at} .. {d.latest_at}"
    out = [head, f"    since the {label}: " + ("nothing changed" if not d.since_reference else
                                               f"{len(d.since_reference)} field(s)")]
    out += [_change_line(c) for c in d.since_reference[:TABLE_FIELDS]]
    if d.previous_at:
        out.append(f"    since the previous report ({d.previous_at}): "
                   + ("nothing changed" if not d.since_previous else f"{len(d.since_previous)} field(s)"))
        out += [_change_line(c) for c in d.since_previous[:TABLE_FIELDS]]
    return out


def _print_drift(result: VerifyResult, console: Any) -> None:
    if not result.drift:
        return
    label = {"certificate": "certificate", "report": "reference report", "image": "image"}[
        result.reference.kind if result.reference else "report"]
    lines = [f"drift ({len(result.drift)} node{'s' if len(result.drift) != 1 else ''} with history)"]
    for d in result.drift:
        lines += _drift_lines(d, label)
    _plain(console, lines)


def render(result: VerifyResult, console: Any, all_rows: bool = False) -> None:
    """Nodes as one line per group of equal nodes and full rows of those that differ (every row with
    ``all_rows``); a table of the first :data:`TABLE_FIELDS` differing fields."""
    _print_reference(result, console)
    if all_rows:
        _print_nodes(result.nodes, console)
    else:
        _print_summary(result, console)
    shown_as_diff = _print_differences(result, console)
    lines = [with_step(f"{f.level}: {f.rule}: {one_line(f.message, LINE_LIMIT)}", f.cls, f.next_step)
             for f in result.findings if id(f) not in shown_as_diff]
    _plain(console, lines)
    _print_drift(result, console)
    _plain(console, [f"note: {one_line(n, LINE_LIMIT)}" for n in result.notes])
    checked = sum(1 for n in result.nodes if n.ok)
    fails = sum(1 for f in result.findings if f.level == FAIL)
    warns = sum(1 for f in result.findings if f.level == WARN)
    unknown = sum(1 for f in result.findings if f.level == UNKNOWN)
    console.print(f"verify: {checked} of {len(result.nodes)} nodes checked; {fails} failed, {warns} warnings, "
                  f"{unknown} not checked -> exit {int(result.exit_code)}", markup=False, highlight=False)
