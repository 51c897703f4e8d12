"""The HTML report of a certificate: ``<certificate stem>.html`` next to its JSON, read through the
:class:`~builder.core.certificate.Certificate` model. It opens on a summary (the verdict, the failures
with the failing nodes' log excerpts, the key figures against their floors, the stack against its
reference), so that the outcome is above the fold of a 1400x900 window; the sections follow."""

from __future__ import annotations

import io
import logging
import math
import os
import re
import sys
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from msgspec import UNSET

from builder.core.certificate import Certificate, RankEntry, load_certificate
from builder.core.documents import CollectiveRow, NodeReport, TrainingCheck
from builder.core.errors import EnvbuildError
from builder.core.files import write_atomic
from builder.core.inputs import one_line
from builder.core.model import convert
from builder.recipe.model import Lock

from .table import failing_nodes, log_excerpt, phases_line, reported_text
from .verdict import signal_text

#: Most collectives (and, separately, training checks) shown.
MAX_COLLECTIVES = 64
#: Most rows shown and drawn per collective.
MAX_ROWS = 4096
#: Most ranks in the per-rank table.
MAX_RANKS = 4096
#: Most series per plot.
MAX_SERIES = 16
#: Most characters of one string shown (longer ones end in ``...``).
MAX_TEXT = 2000
#: Most lines of the verdict's failures (and, separately, warnings) shown.
MAX_LINES = 1000
#: Failures listed open in the summary; the rest are one click away (``<details>``, no script).
SUMMARY_FAILURES = 8
#: Plotted ranges: sizes in (0, 2**50] bytes, bandwidths in (0, 1e9] GB/s, losses within
#: +-1e12; a value outside is left out of the plot (it stays in the table).
MAX_PLOT_SIZE = float(2**50)
MAX_PLOT_GBPS = 1e9
MAX_PLOT_LOSS = 1e12

_TEMPLATES = Path(__file__).resolve().parent / "templates"
#: matplotlib's settings are process-wide (``rc_context``): one report is drawn at a time.
_DRAW_LOCK = threading.Lock()
_PLOT_TEXT_RE = re.compile(r"[^A-Za-z0-9._+-]")

#: matplotlib settings of every plot: text drawn as paths (no font needed to read the page),
#: no mathtext (a ``$`` in a label is a character), stable element ids (``svg.hashsalt``).
_RC = {"svg.fonttype": "path", "svg.hashsalt": "envbuild-report", "text.parse_math": False,
       "axes.unicode_minus": False, "font.size": 9.0}
_COMPONENTS = ("torch", "CUDA", "NCCL", "Python", "OS")
#: The per-check details of a training check shown (field, label), when set.
_DETAILS = (("dtype", "dtype"), ("schedule", "schedule"), ("stages", "stages"), ("microbatches", "microbatches"),
            ("microbatch_size", "microbatch size"), ("batch_per_rank", "batch per rank"),
            ("global_batch", "global batch"), ("image_size", "image size (px)"), ("batch", "batch"),
            ("hidden", "hidden"), ("experts", "experts"), ("tokens_per_rank", "tokens per rank"),
            ("routed", "routed tokens per expert"))


def report_path(cert_path: str | os.PathLike[str]) -> Path:
    """The report of the certificate at ``cert_path``: the same name, ``.html``."""
    return Path(cert_path).with_suffix(".html")


# --------------------------------------------------------------------------- values


def _t(value: Any, limit: int = MAX_TEXT) -> str:
    """A value as shown: ``-`` for None or unset, floats to 6 digits, strings one escaped line."""
    if value is None or value is UNSET:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, int):
        return str(value) if abs(value) < 10**30 else "(a very large integer)"
    if isinstance(value, float):
        return format(value, ".6g")
    if isinstance(value, list):
        return ", ".join(_t(x, 200) for x in value[:16]) + (", ..." if len(value) > 16 else "")
    return one_line(value, limit) or "''"


def _fmt(x: float | None, spec: str) -> str:
    return "-" if x is None or not math.isfinite(x) else format(x, spec)


def _plotted(x: float | None, high: float, low: float = 0.0) -> float | None:
    """``x`` when finite and in ``(low, high]`` (a log axis takes no 0), else None."""
    return x if x is not None and math.isfinite(x) and low < x <= high else None


def _plot_label(value: Any) -> str:
    """A certificate string as a plot label: ``[A-Za-z0-9._+-]`` only, 40 characters."""
    return _PLOT_TEXT_RE.sub("_", str(value))[:40] or "_"


def _rank_order(key: str) -> tuple[int, int, str]:
    return (0, int(key), "") if key.isdigit() and len(key) < 12 else (1, 0, key)


def _size_label(x: float, _pos: Any = None) -> str:
    """A byte count as a label: ``8``, ``1K``, ``64M`` (powers of 1024)."""
    for unit, scale in (("G", 1 << 30), ("M", 1 << 20), ("K", 1 << 10)):
        if x >= scale:
            return f"{x / scale:g}{unit}"
    return f"{x:g}"


def _result(ok: bool | None, idle: str = "not gated") -> dict[str, str]:
    """A pass/fail cell: ``pass`` (good), ``FAIL`` (bad), or ``idle`` (no floor, not measured)."""
    return {"word": idle, "css": "note"} if ok is None else {"word": "pass", "css": "good"} if ok else \
        {"word": "FAIL", "css": "bad"}


# --------------------------------------------------------------------------- summary


def _node_logs(cert: Certificate) -> list[dict[str, Any]]:
    """The log excerpt (:func:`~.table.log_excerpt`, as the terminal shows it) of each failing node."""
    logs = []
    for n in failing_nodes(cert)[:MAX_RANKS]:
        status = cert.node_status.get(str(n))
        tail = status.log_tail if status is not None and isinstance(status.log_tail, list) else []
        excerpt = log_excerpt(tail[-MAX_LINES:])
        if status is None or not excerpt:
            continue
        ended = "killed or never started" if status.exit_code is None else signal_text(status.exit_code)
        logs.append({"node": n, "name": _t(status.name, 200), "ended": ended,
                     "lines": [_t(line, 400) for line in excerpt]})
    return logs


def _busbw_figure(cert: Certificate) -> dict[str, Any]:
    s = cert.settings
    rows = cert.collectives.get("all_reduce")
    gate = next((r for r in rows[:MAX_ROWS] if r.size_bytes == s.busbw_size and r.type == "float32"),
                None) if isinstance(rows, list) else None
    floor = s.min_busbw_gbps
    return {"name": f"all-reduce busbw at {_size_label(s.busbw_size)}B, float32",
            "value": "not measured" if gate is None else f"{gate.busbw_gbps:.4g} GB/s",
            "floor": "not gated (no --min-busbw)" if floor is None else f">= {floor:g} GB/s ({_t(s.busbw_source)})",
            **_result(None if floor is None else gate is not None and gate.busbw_gbps >= floor)}


def _scaling_figure(cert: Certificate) -> dict[str, Any] | None:
    """The scaling efficiency against its floor (``--min-scaling-efficiency``); None: neither."""
    sc, floor = cert.scaling, cert.settings.min_scaling_efficiency
    if sc is None and floor is None:
        return None
    eff = sc.efficiency if sc is not None else None
    return {"name": f"scaling efficiency at {sc.world_size if sc else cert.world_size} ranks",
            "value": "not measured" if eff is None else f"{eff:.3f} ({eff * 100:.1f} %)",
            "floor": "not gated (no --min-scaling-efficiency)" if floor is None else f">= {floor:g}",
            **_result(None if floor is None else eff is not None and eff >= floor)}


def _figures(cert: Certificate, stack: dict[str, Any]) -> list[dict[str, Any]]:
    """The key figures of the run, each against its threshold or floor."""
    reported = sum(1 for r in cert.ranks.values() if r.reported)
    figures = [{"name": "ranks reported", "value": f"{reported} of {cert.world_size}", "floor": "every rank",
                **_result(reported == cert.world_size)},
               {"name": "stack", "value": stack["status"], "floor": "every rank as the reference",
                **_result(stack["ok"], "not checked")}]
    tables = [v[:MAX_ROWS] for v in list(cert.collectives.values())[:MAX_COLLECTIVES] if isinstance(v, list)]
    if tables:
        wrong = sum(r.wrong for rows in tables for r in rows)
        figures.append({"name": "wrong elements", "value": f"{wrong} in {sum(map(len, tables))} measurement(s) of "
                        f"{len(tables)} collective(s)", "floor": "0", **_result(wrong == 0)})
    if "all_reduce" in cert.collectives or cert.settings.min_busbw_gbps is not None:
        figures.append(_busbw_figure(cert))
    checks = [c for c in list(cert.training.values())[:MAX_COLLECTIVES] if c.unsupported is None]
    if cert.training:
        matched = sum(1 for c in checks if c.reference_match)
        unsupported = len(cert.training) - len(checks)
        figures.append({"name": "training checks", "value": f"{matched} of {len(checks)} match"
                        + (f", {unsupported} unsupported" if unsupported else ""),
                        "floor": "within tolerance of the single-process reference",
                        **_result(matched == len(checks) if checks else None, "not measured")})
    scaling = _scaling_figure(cert)
    return figures + ([scaling] if scaling else [])


def _summary(cert: Certificate, stack: dict[str, Any]) -> dict[str, Any]:
    v = cert.verdict
    failures = [_t(x) for x in v.failures[:MAX_LINES]]
    return {"word": "PASSED" if v.passed else "FAILED", "css": "passed" if v.passed else "failed",
            "exit_code": v.exit_code, "failures": failures[:SUMMARY_FAILURES],
            "more_failures": failures[SUMMARY_FAILURES:], "warnings": [_t(x) for x in v.warnings[:MAX_LINES]],
            "logs": _node_logs(cert) if not v.passed else [], "figures": _figures(cert, stack)}


# --------------------------------------------------------------------------- sections


def _run(cert: Certificate, source: str) -> dict[str, Any]:
    s, b, host = cert.settings, cert.backend, cert.host
    sizes = ", ".join(_size_label(x) for x in s.sizes[:16]) + (", ..." if len(s.sizes) > 16 else "")
    rows = [("image", cert.image.ref), ("image ID", cert.image.id), ("recipe", cert.recipe),
            ("lock hash", cert.lock_hash),
            ("backend", _t(b.used, 80) + ("" if b.recipe == b.used else f" (recipe: {_t(b.recipe, 80)})")),
            ("world size", f"{cert.nodes} node(s) x {cert.nproc_per_node} rank(s) = {cert.world_size}"),
            ("run", cert.run_id), ("started / finished", f"{_t(cert.started_at)} / {_t(cert.finished_at)}"),
            ("host", _t(host.hostname, 200) + (f" ({_t(host.launcher, 80)} launcher)" if host.launcher else "")),
            ("profiles", ", ".join(_t(p, 80) for p in cert.profiles) or "none (the all-reduce sweep)"),
            ("collective settings", f"sizes {sizes} B; dtypes {_t(s.dtypes) or '(not recorded)'}; {s.iters} iterations "
                                    f"(+{s.warmup} warmup) per size; timeout {s.timeout_s:g} s"),
            ("phases", phases_line(cert).removeprefix("phases: ") if cert.phases else None)]
    return {"image": _t(cert.image.ref, 200), "envbuild": _t(cert.envbuild_version, 80),
            "rows": [(k, _t(v)) for k, v in rows if v is not None], "source": one_line(source, 400) or "(in memory)"}


def _probe_values(p: NodeReport, nccl: str | None) -> tuple[Any, ...]:
    """torch, CUDA, NCCL, Python, OS of one rank's probe."""
    t, loaded = p.torch, p.nccl.loaded
    os_name = p.os.pretty_name or " ".join(x for x in (p.os.id, p.os.version_id) if x) or None
    return (t and t.version, t and t.cuda, (loaded and loaded.version) or (t and t.nccl_compiled) or nccl,
            p.python.version, os_name)


def _reference(cert: Certificate) -> tuple[str, tuple[Any, ...]]:
    """``(what the reference is, its values)``: the lock's pins, else the stack a probe discovered."""
    st, none = cert.stack, (None,) * len(_COMPONENTS)
    if st is not None and st.source == "probe":
        if st.reference_rank is None:
            return "no recipe lock, and no rank's probe reported a stack", none
        return (f"no recipe lock: discovered by rank {st.reference_rank}'s probe",
                (st.torch, st.cuda, st.nccl, st.python, st.os))
    what = f"the lock of --recipe {_t(st.recipe, 80)}" if st is not None and st.source == "recipe" else \
        "the image's recipe lock"
    try:
        lock = convert(cert.lock, Lock) if cert.lock is not None else None
    except EnvbuildError:  # a lock of an older shape: the stack compared with it
        lock = None
    if lock is not None:
        return what, (lock.torch.local, lock.cuda, lock.nccl, lock.python, f"{lock.os.id} {lock.os.version_id}")
    if st is not None:
        return what, (st.torch, st.cuda, st.nccl, st.python, st.os)
    return "no recipe lock", none


def _stack(cert: Certificate) -> dict[str, Any]:
    """Per component the distinct values the ranks' probes reported (with their ranks when they
    differ) and the reference's; ``status`` the differences (lock mismatches, ranks apart)."""
    versions = cert.nccl.versions if cert.nccl is not None else {}
    seen: list[dict[str, list[str]]] = [{} for _ in _COMPONENTS]
    for rank, probe in sorted(list(cert.probe.items())[:MAX_RANKS], key=lambda kv: _rank_order(kv[0])):
        if probe is not None:
            for i, value in enumerate(_probe_values(probe, versions.get(rank))):
                seen[i].setdefault(_t(value, 200), []).append(_t(rank, 20))
    reference, expected = _reference(cert)
    mismatches = [f"rank {_t(r, 20)}: {_t(m, 300)}" for r, e in sorted(cert.ranks.items())[:MAX_RANKS]
                  if isinstance(e.lock_mismatches, list) for m in e.lock_mismatches[:20]]
    rows: list[dict[str, Any]] = []
    for name, values, pin in zip(_COMPONENTS, seen, expected, strict=True):
        shown = "; ".join(f"{v} (rank {', '.join(r[:8])}{'...' if len(r) > 8 else ''})" for v, r in values.items()) \
            if len(values) > 1 else next(iter(values), "(no probe)")
        rows.append({"name": name, "seen": shown, "expected": "(not recorded)" if pin is None else _t(pin, 200),
                     "differs": len(values) > 1})
    apart = [r["name"] for r in rows if r["differs"]]
    probed = any(seen)
    status = (f"ranks differ in {', '.join(apart)}; " if apart else "") + \
        (f"{len(mismatches)} difference(s) from the lock" if mismatches else "")
    return {"reference": reference, "rows": rows if probed else [], "mismatches": mismatches,
            "missing": None if probed else f"no rank's probe reported: {reported_text(cert)}",
            "ok": (not apart and not mismatches) if probed else None,
            "status": status.removesuffix("; ") or ("no difference" if probed else "no probe")}


_RANK_COLUMNS = ("rank", "node", "hostname", "device", "reported", "elapsed (s)", "errors", "lock mismatches",
                 "problem")


def _rank_row(rank: str, e: RankEntry) -> list[dict[str, str]]:
    errors = e.errors[:5] if isinstance(e.errors, list) else []
    mism = e.lock_mismatches[:5] if isinstance(e.lock_mismatches, list) else []
    problem = e.problem or (f"exit code {e.exit_code}" if isinstance(e.exit_code, int) and e.exit_code else None)
    last = e.last_progress if isinstance(e.last_progress, dict) else {}
    if problem is None and not e.reported and last.get("phase") is not None:
        problem = " ".join(_t(x, 200) for x in ("no result; last in", last.get("phase"), last.get("detail")) if x)
    cells = [(_t(rank, 20), ""), (str(e.node), "num"), (_t(e.hostname, 200), ""), (_t(e.device, 200), ""),
             ("yes" if e.reported else "no", "" if e.reported else "bad"),
             (_fmt(e.elapsed_s if isinstance(e.elapsed_s, float) else None, ".2f"), "num"),
             ("; ".join(_t(x, 300) for x in errors) or "-", "bad" if errors else ""),
             ("; ".join(_t(x, 300) for x in mism) or "-", "bad" if mism else ""),
             (_t(problem, 400), "bad" if problem else "")]
    return [{"text": t, "css": c} for t, c in cells]


def _ranks(cert: Certificate) -> dict[str, Any]:
    keys = sorted(list(cert.ranks)[: MAX_RANKS * 4], key=_rank_order)
    rows = [_rank_row(k, cert.ranks[k]) for k in keys[:MAX_RANKS]]
    # a column no rank has a value in is left out; a cell without a value is blank
    keep = [i for i in range(len(_RANK_COLUMNS)) if any(row[i]["text"] != "-" for row in rows)]
    rows = [[{**row[i], "text": "" if row[i]["text"] == "-" else row[i]["text"]} for i in keep] for row in rows]
    return {"columns": [_RANK_COLUMNS[i] for i in keep], "rows": rows, "more": max(0, len(cert.ranks) - len(rows))}


def _collective(name: str, value: Any, cert: Certificate) -> dict[str, Any]:
    """One collective: its verdict line, plot and rows (the all-reduce plot with the busbw floor)."""
    if not isinstance(value, list):
        return {"name": _t(name, 200), "unsupported": _t(value.unsupported), "rows": [], "more": 0}
    rows: list[CollectiveRow] = value[:MAX_ROWS]
    s = cert.settings
    floor = (s.busbw_size, s.min_busbw_gbps) if name == "all_reduce" and s.min_busbw_gbps is not None else None
    wrong = sum(r.wrong for r in rows)
    best = max(rows, key=lambda r: r.busbw_gbps, default=None)
    line = (f"{wrong} wrong element(s) in {len(rows)} measurement(s)" +
            (f"; best busbw {best.busbw_gbps:.4g} GB/s at {_size_label(best.size_bytes)}B {_t(best.type, 40)}"
             if best else ""))
    shown = [{"size": str(r.size_bytes), "count": str(r.count), "type": _t(r.type, 40), "time": _fmt(r.time_us, ".2f"),
              "algbw": _fmt(r.algbw_gbps, ".4g"), "busbw": _fmt(r.busbw_gbps, ".4g"), "wrong": str(r.wrong),
              "ranks": _t(r.wrong_ranks) if r.wrong_ranks else ""} for r in rows]
    return {"name": _t(name, 200), "unsupported": None, "line": line, **_result(wrong == 0 if rows else None),
            "svg": draw_collective(rows, floor), "rows": shown, "more": len(value) - len(rows)}


def _last(values: list[float | None]) -> float | None:
    return next((v for v in reversed(values) if v is not None), None)


def _training(name: str, c: TrainingCheck) -> dict[str, Any]:
    """One training check as a table row and its loss plot."""
    if c.unsupported is not None:
        return {"name": _t(name, 200), "unsupported": _t(c.unsupported), **_result(None, "unsupported")}
    details = [f"{label} {_t(getattr(c, f), 200)}" for f, label in _DETAILS if getattr(c, f) is not None]
    tol = list((c.tolerance or {}).items())[:8]
    numbers = [f"{_t(k, 40)} {v:g}" for k, v in tol if isinstance(v, float)]
    return {"name": _t(name, 200), "unsupported": None, **_result(c.reference_match, "not compared"),
            "model": _t(c.model, 200), "steps": _t(c.steps),
            "final": f"{_fmt(_last(c.losses), '.5g')} / {_fmt(_last(c.reference_losses), '.5g')}",
            "diff": _fmt(c.max_param_diff, ".3g"), "tolerance": ", ".join(numbers) or "-",
            "rule": "; ".join(f"{_t(k, 40)}: {_t(v, 400)}" for k, v in tol if not isinstance(v, float)),
            "rate": _fmt(c.samples_per_s, ".1f"), "wall": _fmt(c.wall_s, ".2f"), "details": ", ".join(details) or "-",
            "svg": draw_losses({"distributed": c.losses, "single-process reference": c.reference_losses})}


def _scaling(cert: Certificate) -> dict[str, Any] | None:
    sc = cert.scaling
    if sc is None:
        return None
    n = sc.world_size
    rows = [("model", _t(sc.model, 200)), ("per rank", f"batch {sc.batch_per_rank} of {sc.image_size} px images, "
                                                      f"{sc.steps} steps"),
            ("throughput at 1 rank", f"{sc.throughput_1:.2f} images/s ({sc.time_1_s:.3f} s)"),
            (f"throughput at {n} ranks", f"{sc.throughput_n:.2f} images/s ({sc.time_n_s:.3f} s); "
                                         f"ideal {n * sc.throughput_1:.2f}")]
    return {"figure": _scaling_figure(cert), "rows": rows}


# --------------------------------------------------------------------------- plots


def _matplotlib() -> Any:
    """matplotlib, imported now (pyplot's backend set to Agg unless pyplot was imported). Its
    logger is set to errors only unless the caller set a level: the first import on a machine
    logs "building the font cache", which is not a line for envbuild's stderr."""
    log = logging.getLogger("matplotlib")
    if log.level == logging.NOTSET:
        log.setLevel(logging.ERROR)
    import matplotlib

    if "matplotlib.pyplot" not in sys.modules:
        matplotlib.use("Agg")
    return matplotlib


def _svg(fig: Any) -> Any:
    """The figure as an inline ``<svg>`` element (no XML prolog, no date), safe to insert."""
    from markupsafe import Markup

    buf = io.StringIO()
    fig.savefig(buf, format="svg", bbox_inches="tight", metadata={"Date": None})
    text = buf.getvalue()
    return Markup(text[text.index("<svg"):])  # noqa: S704 - matplotlib's own SVG; labels are _plot_label'd


def _points(rows: list[CollectiveRow]) -> dict[str, list[tuple[float, float | None, float | None]]]:
    """``{dtype: [(size, algbw, busbw)]}`` of the rows in the plotted ranges, by size."""
    by_type: dict[str, list[tuple[float, float | None, float | None]]] = {}
    for r in rows[:MAX_ROWS]:
        size = _plotted(float(r.size_bytes), MAX_PLOT_SIZE)
        alg, bus = _plotted(r.algbw_gbps, MAX_PLOT_GBPS), _plotted(r.busbw_gbps, MAX_PLOT_GBPS)
        label = _plot_label(r.type)
        if size is not None and (alg, bus) != (None, None) and (label in by_type or len(by_type) < MAX_SERIES // 2):
            by_type.setdefault(label, []).append((size, alg, bus))
    return {k: sorted(v) for k, v in by_type.items()}


def draw_collective(rows: list[CollectiveRow], floor: tuple[int, float] | None = None) -> Any:
    """busbw (GB/s, log) over size (bytes, log) per dtype, algbw dashed where it differs (it
    equals busbw for all-reduce at 2 ranks), and the busbw floor at the gate size; None: no point."""
    by_type = _points(rows)
    if not by_type:
        return None
    mpl = _matplotlib()
    from matplotlib.figure import Figure
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

    with mpl.rc_context(_RC):
        fig = Figure(figsize=(6.4, 3.0), dpi=96)
        ax = fig.add_subplot()
        for i, (dtype, pts) in enumerate(by_type.items()):
            same = all(a is None or b is None or abs(a - b) <= 1e-9 * max(a, b) for _, a, b in pts)
            for col, style, word in ((2, "-", "busbw" + (" = algbw" if same else "")), (1, "--", "algbw")):
                xy = [(p[0], y) for p in pts if (y := p[col]) is not None]
                if xy and not (same and col == 1):
                    ax.plot([x for x, _ in xy], [y for _, y in xy], style, marker="o", markersize=3,
                            color=f"C{(2 * i + 2 - col) % 10}", label=f"{dtype} {word}")
        if floor is not None and _plotted(floor[1], MAX_PLOT_GBPS) is not None:
            ax.axhline(floor[1], color="C3", linestyle=":", linewidth=1.6,
                       label=f"floor {floor[1]:g} GB/s at {_size_label(floor[0])}B")
            ax.axvline(floor[0], color="C3", linestyle=":", linewidth=0.8)
        ax.set_xscale("log", base=2)
        ax.xaxis.set_major_locator(LogLocator(base=2, numticks=14))
        ax.xaxis.set_major_formatter(FuncFormatter(_size_label))
        ys = [y for pts in by_type.values() for p in pts for y in p[1:] if y is not None]
        ys += [floor[1]] if floor is not None and _plotted(floor[1], MAX_PLOT_GBPS) is not None else []
        ax.set_yscale("log")  # whole decades: at least two labelled ticks
        ax.set_ylim(10 ** math.floor(math.log10(min(ys))), 10 ** max(math.ceil(math.log10(max(ys))),
                                                                   math.floor(math.log10(min(ys))) + 1))
        ax.yaxis.set_major_formatter(FuncFormatter(lambda y, _pos: f"{y:g}"))
        for axis in (ax.xaxis, ax.yaxis):
            axis.set_minor_formatter(NullFormatter())
        ax.set_xlabel("size (bytes)")
        ax.set_ylabel("GB/s (1e9 B/s)")
        ax.grid(True, alpha=0.3)
        ax.legend(loc="best", fontsize=8)
        return _svg(fig)


def draw_losses(series: Mapping[str, list[float | None]]) -> Any:
    """The loss per step of a training check and of its reference; None without a point."""
    pts: dict[str, list[float]] = {}
    for k, ys in list(series.items())[:MAX_SERIES]:
        xs = [math.nan if (x := _plotted(v, MAX_PLOT_LOSS, -MAX_PLOT_LOSS)) is None else x for v in ys[:10_000]]
        if any(not math.isnan(x) for x in xs):
            pts[k] = xs
    if not pts:
        return None
    mpl = _matplotlib()
    from matplotlib.figure import Figure
    from matplotlib.ticker import MaxNLocator

    with mpl.rc_context(_RC):
        fig = Figure(figsize=(6.4, 2.6), dpi=96)
        ax = fig.add_subplot()
        for i, (label, line) in enumerate(pts.items()):
            steps = list(range(1, len(line) + 1))
            if label == "single-process reference":
                ax.plot(steps, line, "--", marker="x", color="black", label=label, zorder=3)
            else:
                ax.plot(steps, line, "-", marker="o", markersize=3, color=f"C{i % 10}", label=label)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_xlabel("step")
        ax.set_ylabel("loss")
        ax.grid(True, alpha=0.3)
        ax.legend(loc="best", fontsize=8)
        return _svg(fig)


# --------------------------------------------------------------------------- page


def _environment() -> Any:
    import jinja2

    return jinja2.Environment(loader=jinja2.FileSystemLoader(str(_TEMPLATES)), autoescape=True,
                              undefined=jinja2.StrictUndefined, keep_trailing_newline=True)


def prewarm() -> None:
    """Import matplotlib, load its font and jinja2 now: certify calls it in a thread while the ranks run, which takes
    about 0.9 s of the 1.2 s a report costs off the wall time. A failure is left to the real drawing to report."""
    try:
        with _DRAW_LOCK:
            draw_losses({"warm": [1.0, 0.5]})
        _environment().get_template("report.html.j2")
    except Exception:  # noqa: BLE001 - the drawing after the run says what is wrong
        pass


def render_html(cert: Certificate | Mapping[str, Any], source: str = "") -> str:
    """The report page of ``cert``; a document is read through the model first (raises
    ManyErrors, exit 2: what it breaks). ``source`` names the certificate file in the footer."""
    if not isinstance(cert, Certificate):
        cert = load_certificate(dict(cert), file=source or None)
    stack = _stack(cert)
    with _DRAW_LOCK:
        colls = [_collective(k, v, cert) for k, v in list(cert.collectives.items())[:MAX_COLLECTIVES]]
        checks = [_training(k, c) for k, c in list(cert.training.items())[:MAX_COLLECTIVES]]
    return str(_environment().get_template("report.html.j2").render(
        run=_run(cert, source), summary=_summary(cert, stack), stack=stack, ranks=_ranks(cert),
        collectives=colls, training=checks, scaling=_scaling(cert),
        missing=None if cert.verdict.passed else reported_text(cert)))


def write_report(cert: Certificate | Mapping[str, Any], path: str | os.PathLike[str], source: str = "") -> Path:
    """Draw the report of ``cert`` and write it at ``path``.
    Raises Unreachable (exit 3): the file cannot be written; whatever drawing raises."""
    return write_atomic(path, render_html(cert, source=source).encode("utf-8"), parents=False)


def write_beside(cert: Certificate, cert_path: str | os.PathLike[str]) -> tuple[Path | None, str | None]:
    """Write the report next to the certificate at ``cert_path`` (:func:`report_path`)."""
    target = report_path(cert_path)
    try:
        return write_report(cert, target, source=Path(cert_path).name), None
    except Exception as e:  # noqa: BLE001 - a failure to draw must not lose the certificate
        reason = (e.message if isinstance(e, EnvbuildError) else (e.strerror or str(e)) if isinstance(e, OSError)
                  else f"{type(e).__name__}: {e}")
        return None, (f"report not written: {one_line(target, 300)}: {one_line(reason, 300)} "
                      f"(the certificate {one_line(cert_path, 300)} is kept)")
