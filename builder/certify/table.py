"""The certificate on a terminal: the all-reduce sweep in nccl-tests columns (with the min and median time over ranks
and the slowest rank), the profiles, NCCL transports, the verdict with its reasons, and for a failing verdict the log
excerpt of each failing node."""

from __future__ import annotations

import os
import re
from collections.abc import Sequence
from typing import Any

from builder.core.certificate import Certificate
from builder.core.inputs import escape

#: Lines of a failing node's log shown under a failing verdict when none looks like an error.
LOG_SHOW_LINES = 5

#: A Python exception line (``OverflowError: ...``), also prefixed by torch (``[rank0]: ...``);
#: torchrun's own ``ChildFailedError`` wraps the real cause and is skipped.
_ERROR_LINE_RE = re.compile(r"^(?:\[rank\d+\]:\s*)?(?:[A-Za-z_]\w*\.)*\w*(?:Error|Exception)(?::.*)?$")


def _fmt(x: float | None, spec: str) -> str:
    return "-" if x is None else format(x, spec)


def log_excerpt(tail: Sequence[str]) -> list[str]:
    """The lines of a node's log tail worth showing: the last Python exception line (``OverflowError: ...``; not
    torchrun's ``ChildFailedError`` wrapper), else the last :data:`LOG_SHOW_LINES` non-blank lines."""
    lines = [line.rstrip() for line in tail if line.strip()]
    for line in reversed(lines):
        if _ERROR_LINE_RE.match(line.strip()) and "ChildFailedError" not in line:
            return [line.strip()]
    return lines[-LOG_SHOW_LINES:]


def failing_nodes(cert: Certificate) -> list[int]:
    """Nodes that exited non-zero or host a rank that did not report, in order."""
    bad = {int(n) for n, v in cert.node_status.items() if v.exit_code not in (None, 0)}
    bad |= {int(r.node) for r in cert.ranks.values() if not r.reported}
    return sorted(bad)


def reported_text(cert: Certificate) -> str:
    """``2 of 4 rank(s) reported a result (see the failures)``: why a section is empty."""
    n = sum(1 for r in cert.ranks.values() if r.reported)
    why = "" if cert.verdict.passed else " (see the failures)"
    return f"{n} of {cert.world_size} rank(s) reported a result{why}"


def _head(cert: Certificate) -> str:
    """One line; every string of the certificate in it escaped (a certificate is input too)."""
    b = cert.backend
    st = cert.stack
    if cert.lock is None and st is not None:  # a foreign image: the probe's stack is the reference
        found = ", ".join(f"{k} {escape(v, 80)}".strip() for k, v in (("torch", st.torch), ("python", st.python),
                                                                      ("", st.os)) if v is not None)
        what = (f"no recipe lock (reference: rank {st.reference_rank}'s probe: {found})"
                if st.reference_rank is not None else "no recipe lock, and no rank's probe reported a stack")
    else:
        what = f"recipe {escape(cert.recipe, 80)}, lock {escape(str(cert.lock_hash or '').split(':')[-1][:12])}"
    s = cert.settings
    return (f"{escape(cert.image.ref)}: {what}, "
            f"backend {escape(b.used, 80)}" + (f" (recipe: {escape(b.recipe, 80)})" if b.used != b.recipe else "")
            + f", {cert.nodes} node(s) x {cert.nproc_per_node} = world {cert.world_size}; "
            f"collectives {s.iters} iters (+{s.warmup} warmup) per size; DDP check and scaling "
            f"{s.ddp_batch} images of {s.ddp_image_size} px per rank, {s.ddp_steps} steps")


def _allreduce(cert: Certificate, console: Any) -> None:
    from rich.table import Table
    from rich.text import Text

    th = cert.settings
    rows = cert.collectives.get("all_reduce")
    if not isinstance(rows, list) or not rows:
        return
    t = Table(title="all-reduce (sum)", title_justify="left")
    for col in ("size (B)", "count", "type", "min (us)", "median (us)", "time (us)", "slowest",
                "algbw (GB/s)", "busbw (GB/s)", "#wrong"):
        t.add_column(col, justify="right")
    for row in rows:
        gate = th.min_busbw_gbps is not None and row.size_bytes == th.busbw_size and row.type == "float32"
        t.add_row(str(row.size_bytes), str(row.count), str(row.type), _fmt(row.min_time_us, ".2f"),
                  _fmt(row.median_time_us, ".2f"), _fmt(row.time_us, ".2f"),
                  "-" if row.slowest_rank is None else f"rank {row.slowest_rank}",
                  _fmt(row.algbw_gbps, ".3f"), Text(_fmt(row.busbw_gbps, ".3f") + (" *" if gate else "")),
                  Text(str(row.wrong), style="red" if row.wrong else ""))
    console.print(t)
    if th.min_busbw_gbps is not None:
        console.print(f"* gate: busbw >= {th.min_busbw_gbps:g} GB/s at {th.busbw_size} B ({th.busbw_source})",
                      markup=False, highlight=False)


def _profiles(cert: Certificate, console: Any) -> None:
    """Per collective: sizes, the best busbw and #wrong (or why unsupported); per profile the
    training check; the scaling efficiency."""
    from rich.table import Table
    from rich.text import Text

    if not cert.profiles:
        return
    missing = [what for what, got in (("collectives", cert.collectives), ("training checks", cert.training))
               if not got]
    if missing:
        console.print(f"{' and '.join(missing)} of {', '.join(cert.profiles)}: no results, {reported_text(cert)}",
                      markup=False, highlight=False, soft_wrap=True)
    t = Table(title=f"collectives of {', '.join(cert.profiles)}", title_justify="left")
    for col in ("collective", "sizes (B)", "types", "max busbw (GB/s)", "#wrong"):
        t.add_column(col, justify="right" if col != "collective" else "left")
    for name, rows in cert.collectives.items():
        if not isinstance(rows, list):
            t.add_row(name, Text("unsupported: " + rows.unsupported[:100], style="yellow"), "", "", "")
            continue
        sizes = sorted({r.size_bytes for r in rows})
        wrong = sum(r.wrong for r in rows)
        t.add_row(name, f"{sizes[0]}..{sizes[-1]} ({len(sizes)})" if sizes else "-",
                  ",".join(sorted({r.type for r in rows})),
                  _fmt(max((r.busbw_gbps for r in rows), default=None), ".3f"),
                  Text(str(wrong), style="red" if wrong else ""))
    if cert.collectives:
        console.print(t)
    tr = Table(title="training checks against a single-process reference", title_justify="left")
    for col in ("profile", "reference match", "max param diff", "samples/s", "final loss"):
        tr.add_column(col, justify="right" if col != "profile" else "left")
    for name, c in cert.training.items():
        if c.unsupported is not None:
            tr.add_row(name, Text("unsupported: " + c.unsupported[:100], style="yellow"), "", "", "")
            continue
        tr.add_row(name, Text("yes" if c.reference_match else "NO", style="" if c.reference_match else "red"),
                   _fmt(c.max_param_diff, ".3g"), _fmt(c.samples_per_s, ".1f"),
                   _fmt(c.losses[-1] if c.losses else None, ".5g"))
    if cert.training:
        console.print(tr)
    sc = cert.scaling
    if sc is not None:
        floor = cert.settings.min_scaling_efficiency
        console.print(f"scaling: {sc.throughput_1:.2f} images/s at 1 rank, {sc.throughput_n:.2f} at {sc.world_size}: "
                      f"efficiency {_fmt(sc.efficiency, '.3f')}"
                      + (f" (floor {floor:g})" if floor is not None else " (not gated)"),
                      markup=False, highlight=False, soft_wrap=True)


def _transports(cert: Certificate, console: Any) -> None:
    from rich.table import Table

    if cert.transports:
        n = Table(title="NCCL transports", title_justify="left")
        n.add_column("rank", justify="right")
        n.add_column("transports")
        n.add_column("network")
        nets = cert.nccl.networks if cert.nccl else {}
        for r, via in sorted(cert.transports.items(), key=lambda kv: int(kv[0])):
            n.add_row(r, ", ".join(via) if via else "-", nets.get(r, "-"))
        console.print(n)


def _failing_logs(cert: Certificate, console: Any, path: str | os.PathLike[str] | None, written: bool) -> None:
    from rich.text import Text

    where = f"the certificate {path}" if path is not None else "the certificate"
    for n in failing_nodes(cert):
        status = cert.node_status.get(str(n))
        tail = status.log_tail if status is not None and isinstance(status.log_tail, list) else []
        excerpt = log_excerpt(tail)
        if not excerpt:
            continue
        if len(excerpt) == 1:
            console.print(Text(f"  node {n} log: ", style="red") + Text(excerpt[0]), soft_wrap=True)
        else:
            console.print(Text(f"  node {n} log (last {len(excerpt)} lines):", style="red"), soft_wrap=True)
            for line in excerpt:
                console.print(Text(f"    {line}"), soft_wrap=True)
        if written:
            console.print(Text(f"  (full tail: node_status.{n}.log_tail in {where})"), soft_wrap=True)


def phases_line(cert: Certificate) -> str:
    """``phases: containers up 0.4 s, ranks up 6.1 s, ..., teardown 0.5 s (total 21.0 s)``:
    the host-side phase times of the certificate (``phases``)."""
    total = sum(p.seconds for p in cert.phases)
    return ("phases: " + ", ".join(f"{p.name} {p.seconds:.1f} s" for p in cert.phases)
            + f" (total {total:.1f} s)")


def print_table(cert: Certificate, console: Any, path: str | os.PathLike[str] | None = None,
                written: bool = True) -> None:
    """Print the certificate: the all-reduce table (nccl-tests columns), the profiles, NCCL transports, and the verdict
    with its reasons (rich tables). A failing verdict is followed by each failing node's log excerpt
    (:func:`log_excerpt`) and where its full tail is (``node_status.<n>.log_tail`` of the certificate at ``path``; not
    said when the certificate was not ``written``)."""
    from rich.text import Text

    console.print(_head(cert), markup=False, highlight=False, soft_wrap=True)
    _allreduce(cert, console)
    _transports(cert, console)
    _profiles(cert, console)
    if cert.phases:
        console.print(phases_line(cert), markup=False, highlight=False, soft_wrap=True)
    v = cert.verdict
    if v.passed:
        console.print(Text("verdict: PASSED", style="bold green"))
    else:
        console.print(Text(f"verdict: FAILED (exit {v.exit_code})", style="bold red"))
    for f in v.failures:
        console.print(Text("  fail: ", style="red") + Text(f), soft_wrap=True)
    if v.failure_class and v.next_step:
        console.print(Text(f"  next: {v.next_step} [{v.failure_class.value}]"), soft_wrap=True)
    for w in v.warnings:
        console.print(Text("  warning: ", style="yellow") + Text(w), soft_wrap=True)
    if not v.passed:
        _failing_logs(cert, console, path, written)
