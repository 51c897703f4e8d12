"""The HTML report of a certificate: ``<certificate stem>.html`` next to its JSON."""

from __future__ import annotations

import io
import logging
import math
import os
import re
import sys
import threading
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from builder.core.errors import EnvbuildError
from builder.core.files import write_atomic
from builder.core.inputs import one_line

#: Most collectives (and, separately, training checks) shown.
MAX_COLLECTIVES = 64
#: Most rows shown and drawn per collective.
MAX_ROWS = 4096
#: Most ranks in the per-rank table.
MAX_RANKS = 4096
#: Most points per loss series, and series per plot.
MAX_STEPS = 10_000
MAX_SERIES = 16
#: Most characters of one string shown (longer ones end in ``...``).
MAX_TEXT = 2000
#: Most lines of the verdict's failures (and, separately, warnings) shown.
MAX_LINES = 1000
#: Plotted ranges: sizes in (0, 2**50] bytes, bandwidths in [0, 1e9] GB/s, losses within
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


def report_path(cert_path: str | os.PathLike[str]) -> Path:
    """The report of the certificate at ``cert_path``: the same name, ``.html``."""
    return Path(cert_path).with_suffix(".html")


# --------------------------------------------------------------------------- values


def _num(value: Any) -> float | None:
    """``value`` as a finite float; None for anything else (booleans, strings, NaN)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    try:
        x = float(value)
    except OverflowError:
        return None
    return x if math.isfinite(x) else None


def _in(value: Any, low: float, high: float) -> float | None:
    """:func:`_num` of ``value`` when it lies in ``[low, high]``, else None."""
    x = _num(value)
    return x if x is not None and low <= x <= high else None


def _text(value: Any, limit: int = MAX_TEXT) -> str:
    """A scalar as shown; strings as one escaped line of at most ``limit`` characters."""
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value) if abs(value) < 10**30 else "(a very large integer)"
    if isinstance(value, float):
        return format(value, ".6g")
    if isinstance(value, str):
        return one_line(value, limit) or "''"
    return one_line(f"<{type(value).__name__}>", 40)


def _fmt(value: Any, spec: str) -> str:
    x = _num(value)
    return "-" if x is None else format(x, spec)


def _map(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _list(value: Any, limit: int) -> list[Any]:
    return list(value[:limit]) if isinstance(value, list) else []


def _plot_label(value: Any) -> str:
    """A certificate string as a plot label: ``[A-Za-z0-9._+-]`` only, 40 characters."""
    return _PLOT_TEXT_RE.sub("_", str(value))[:40] or "_"


def _rank_order(key: Any) -> tuple[int, int, str]:
    s = str(key)
    return (0, int(s), "") if s.isdigit() and len(s) < 12 else (1, 0, s)


def _scalar_facts(entry: Mapping[str, Any], skip: Iterable[str] = (), limit: int = 64) -> list[tuple[str, str]]:
    """``(field, shown value)`` of the scalar fields of ``entry`` that are not None, one level
    of mappings flattened (``tolerance.rtol``) and short lists of scalars joined."""
    skipped, facts = set(skip), []
    for key, value in list(entry.items())[:256]:
        if key in skipped:
            continue
        items = list(value.items())[:32] if isinstance(value, Mapping) else [(None, value)]
        for sub, v in items:
            name = _text(key, 80) + ("" if sub is None else "." + _text(sub, 80))
            if isinstance(v, list) and len(v) <= 16 and all(not isinstance(x, (list, Mapping)) for x in v):
                facts.append((name, ", ".join(_text(x, 200) for x in v) or "(none)"))
            elif v is not None and not isinstance(v, (list, Mapping)):
                facts.append((name, _text(v)))
            if len(facts) >= limit:
                return facts
    return facts


# --------------------------------------------------------------------------- sections


def _head(doc: Mapping[str, Any], source: str) -> dict[str, Any]:
    image, backend = _map(doc.get("image")), _map(doc.get("backend"))
    used, recipe_backend = backend.get("used"), backend.get("recipe")
    rows = [
        ("image", _text(image.get("ref"))), ("image ID", _text(image.get("id"))),
        *[(k, _text(v)) for k, v in (("recipe", doc.get("recipe")), ("lock hash", doc.get("lock_hash")))
          if v is not None],
        ("backend", _text(used) + ("" if recipe_backend in (None, used) else f" (recipe: {_text(recipe_backend)})")),
        ("world size", f"{_text(doc.get('nodes'))} node(s) x {_text(doc.get('nproc_per_node'))} rank(s) = "
                       f"{_text(doc.get('world_size'))}"),
        ("run", _text(doc.get("run_id"))),
        ("started / finished", f"{_text(doc.get('started_at'))} / {_text(doc.get('finished_at'))}"),
    ]
    return {"image": _text(image.get("ref"), 200), "rows": rows, "envbuild": _text(doc.get("envbuild_version"), 80),
            "source": one_line(source, 400) or "(in memory)"}


def _verdict(doc: Mapping[str, Any]) -> dict[str, Any]:
    v = _map(doc.get("verdict"))
    passed = v.get("passed") is True
    return {"word": "PASSED" if passed else "FAILED", "css": "passed" if passed else "failed",
            "exit_code": _text(v.get("exit_code"), 20),
            "failures": [_text(x) for x in _list(v.get("failures"), MAX_LINES)],
            "warnings": [_text(x) for x in _list(v.get("warnings"), MAX_LINES)]}


def _probe_values(probe: Mapping[str, Any], nccl_version: Any) -> dict[str, Any]:
    """torch, CUDA, NCCL, Python, OS of one rank's probe (``envbuild.probe/1``)."""
    torch, os_, nccl = _map(probe.get("torch")), _map(probe.get("os")), _map(probe.get("nccl"))
    loaded = _map(nccl.get("loaded")).get("version")
    os_name = os_.get("pretty_name") or " ".join(str(x) for x in (os_.get("id"), os_.get("version_id")) if x)
    return {"torch": torch.get("version"), "CUDA": torch.get("cuda"),
            "NCCL": loaded or torch.get("nccl_compiled") or nccl_version,
            "Python": _map(probe.get("python")).get("version"), "OS": os_name or None}


def _reference_values(doc: Mapping[str, Any]) -> tuple[str, dict[str, Any]]:
    """``(what the reference is, its values)``: the certificate's ``stack``, else the lock's pins."""
    stack = _map(doc.get("stack"))
    if stack.get("reference_rank") is None and stack.get("source") == "probe":
        return "no recipe lock, and no rank's probe reported a stack", {}
    if stack.get("reference_rank") is not None or stack.get("source") == "recipe":
        source = str(stack.get("source"))
        what = {"lock": "the image's recipe lock", "recipe": f"the lock of --recipe {_text(stack.get('recipe'), 80)}",
                "probe": f"no recipe lock: discovered by rank {_text(stack.get('reference_rank'), 20)}'s probe"}
        return what.get(source, _text(source, 80)), {"torch": stack.get("torch"), "CUDA": stack.get("cuda"),
                                                     "NCCL": stack.get("nccl"), "Python": stack.get("python"),
                                                     "OS": stack.get("os")}
    lock = _map(doc.get("lock"))
    if not lock:
        return "no recipe lock", {}
    torch, os_ = lock.get("torch"), _map(lock.get("os"))
    torch_pin = (_map(torch).get("local") or _map(torch).get("version")) if isinstance(torch, Mapping) else torch
    os_pin = " ".join(str(x) for x in (os_.get("id"), os_.get("version_id")) if x) or None
    return "the image's recipe lock", {"torch": torch_pin, "CUDA": lock.get("cuda"), "NCCL": lock.get("nccl"),
                                       "Python": lock.get("python"), "OS": os_pin}


def _stack(doc: Mapping[str, Any]) -> dict[str, Any]:
    """One row per component: the distinct values the ranks reported (with their ranks when
    they differ) and the reference's."""
    versions = _map(_map(doc.get("nccl")).get("versions"))
    seen: dict[str, dict[str, list[str]]] = {k: {} for k in ("torch", "CUDA", "NCCL", "Python", "OS")}
    for rank, probe in sorted(list(_map(doc.get("probe")).items())[:MAX_RANKS], key=lambda kv: _rank_order(kv[0])):
        if isinstance(probe, Mapping):
            for name, value in _probe_values(probe, versions.get(rank)).items():
                seen[name].setdefault(_text(value, 200), []).append(_text(rank, 20))
    reference, expected = _reference_values(doc)
    if not any(seen.values()):
        return {"reference": reference, "rows": [], "missing": f"no rank's probe reported: {reported_text(doc)}"}
    rows = []
    for name, values in seen.items():
        if not values:
            shown = "(no probe)"
        elif len(values) == 1:
            shown = next(iter(values))
        else:
            shown = "; ".join(f"{v} (rank {', '.join(r[:8])}{'...' if len(r) > 8 else ''})" for v, r in values.items())
        pin = expected.get(name)
        rows.append({"name": name, "seen": shown, "expected": "(not recorded)" if pin is None else _text(pin, 200),
                     "differs": len(values) > 1})
    return {"reference": reference, "rows": rows, "missing": None}


def reported_text(doc: Mapping[str, Any]) -> str:
    """``1 of 2 rank(s) reported a result``: why a section of a failed run is empty."""
    n = sum(1 for r in _map(doc.get("ranks")).values() if _map(r).get("reported") is True)
    return f"{n} of {_text(doc.get('world_size'), 20)} rank(s) reported a result"


_RANK_COLUMNS = ("rank", "node", "hostname", "device", "reported", "elapsed (s)", "errors", "lock mismatches",
                 "problem")


def _rank_row(rank: str, entry: Mapping[str, Any]) -> list[dict[str, str]]:
    errors = _list(entry.get("errors"), MAX_LINES)
    mism = _list(entry.get("lock_mismatches"), MAX_LINES)
    last = _map(entry.get("last_progress"))
    problem = entry.get("problem") or (f"exit code {_text(entry.get('exit_code'))}"
                                       if entry.get("exit_code") not in (None, 0) else None)
    if problem is None and last.get("phase") is not None:
        problem = " ".join(str(x) for x in ("no result; last in", last.get("phase"), last.get("detail")) if x)
    reported = entry.get("reported") is True
    cells = [(_text(rank, 20), ""), (_text(entry.get("node"), 20), "num"), (_text(entry.get("hostname"), 200), ""),
             (_text(entry.get("device"), 200), ""), ("yes" if reported else "no", "" if reported else "bad"),
             (_fmt(entry.get("elapsed_s"), ".2f"), "num"),
             ("; ".join(_text(e, 300) for e in errors[:5]) or "-", "bad" if errors else ""),
             ("; ".join(_text(m, 300) for m in mism[:5]) or "-", "bad" if mism else ""),
             (_text(problem, 400), "bad" if problem else "")]
    return [{"text": t, "css": c} for t, c in cells]


def _ranks(doc: Mapping[str, Any]) -> dict[str, Any]:
    ranks = _map(doc.get("ranks"))
    keys = sorted(list(ranks)[: MAX_RANKS * 4], key=_rank_order)
    rows = [_rank_row(k, _map(ranks[k])) for k in keys[:MAX_RANKS]]
    # a column no rank has a value in is left out; a cell without a value is blank
    keep = [i for i in range(len(_RANK_COLUMNS)) if any(row[i]["text"] != "-" for row in rows)]
    rows = [[{**row[i], "text": "" if row[i]["text"] == "-" else row[i]["text"]} for i in keep] for row in rows]
    return {"columns": [_RANK_COLUMNS[i] for i in keep], "rows": rows, "more": max(0, len(ranks) - len(rows))}


def _collective_rows(rows: list[Any]) -> list[dict[str, Any]]:
    out = []
    for r in rows[:MAX_ROWS]:
        r = _map(r)
        wrong = _num(r.get("wrong"))
        out.append({"size": _text(r.get("size_bytes"), 30), "count": _text(r.get("count"), 30),
                    "type": _text(r.get("type"), 40), "time": _fmt(r.get("time_us"), ".2f"),
                    "algbw": _fmt(r.get("algbw_gbps"), ".4g"), "busbw": _fmt(r.get("busbw_gbps"), ".4g"),
                    "wrong": _text(r.get("wrong"), 30), "wrong_bad": wrong is None or wrong != 0})
    return out


def collectives(doc: Mapping[str, Any]) -> list[tuple[str, list[Any] | None, str | None, int]]:
    """``(name, rows, unsupported reason, rows in the certificate)`` per collective of ``doc``,
    in its order; at most :data:`MAX_ROWS` rows; rows None when unsupported."""
    found: list[tuple[str, list[Any] | None, str | None, int]] = []
    coll = _map(doc.get("collectives"))
    for name, value in list(coll.items())[:MAX_COLLECTIVES]:
        if isinstance(value, Mapping) and value.get("unsupported") is not None:
            found.append((_text(name, 200), None, _text(value.get("unsupported")), 0))
        else:
            found.append((_text(name, 200), _list(value, MAX_ROWS), None, len(value) if isinstance(value, list) else 0))
    return found


def _loss_series(entry: Mapping[str, Any]) -> dict[str, list[float]]:
    """``{label: losses per step}`` of a training check: the distributed run's (one series,
    or one per rank) and the single-process reference's."""
    def points(value: Any) -> list[float]:
        return [x if (x := _in(v, -MAX_PLOT_LOSS, MAX_PLOT_LOSS)) is not None else math.nan
                for v in _list(value, MAX_STEPS)]

    series: dict[str, list[float]] = {}
    losses = entry.get("losses", entry.get("loss_per_step"))
    if isinstance(losses, list) and losses and isinstance(losses[0], list):
        losses = {str(i): v for i, v in enumerate(losses)}
    if isinstance(losses, Mapping):
        for rank, value in sorted(list(losses.items())[:MAX_SERIES - 1], key=lambda kv: _rank_order(kv[0])):
            series[f"rank {_plot_label(rank)}"] = points(value)
    elif isinstance(losses, list):
        series["distributed"] = points(losses)
    ref = entry.get("reference_losses")
    if ref is None:
        ref = _map(entry.get("reference")).get("losses")
    if isinstance(ref, list):
        series["single-process reference"] = points(ref)
    return {k: v for k, v in series.items() if any(not math.isnan(x) for x in v)}


_LOSS_FIELDS = ("losses", "loss_per_step", "reference_losses", "ranks", "unsupported", "reference_match")


def training(doc: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Per training check, what the page shows of it."""
    checks = dict(list(_map(doc.get("training")).items())[:MAX_COLLECTIVES])
    out = []
    for name, entry in checks.items():
        entry = _map(entry)
        match = entry.get("reference_match")
        reference = _map(entry.get("reference"))
        facts = _scalar_facts(entry, skip=_LOSS_FIELDS + ("reference",))
        facts += [("reference." + k, v) for k, v in _scalar_facts(reference, skip=("losses",))]
        out.append({"name": _text(name, 200), "match": match if isinstance(match, bool) else None,
                    "unsupported": None if entry.get("unsupported") is None else _text(entry["unsupported"]),
                    "series": _loss_series(entry), "facts": facts})
    return out


def _scaling(doc: Mapping[str, Any]) -> dict[str, Any] | None:
    scaling = doc.get("scaling")
    if not isinstance(scaling, Mapping):
        return None
    eff = _num(scaling.get("efficiency"))
    return {"efficiency": "-" if eff is None else f"{eff:.3f} ({eff * 100:.1f} %)",
            "facts": _scalar_facts(scaling, skip=("efficiency",))}


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


def _size_label(x: float, _pos: Any = None) -> str:
    """A byte count as a tick label: ``8``, ``1K``, ``64M`` (powers of 1024)."""
    for unit, scale in (("G", 1 << 30), ("M", 1 << 20), ("K", 1 << 10)):
        if x >= scale:
            return f"{x / scale:g}{unit}"
    return f"{x:g}"


def _svg(fig: Any) -> str:
    """The figure as an inline ``<svg>`` element (no XML prolog, no date)."""
    buf = io.StringIO()
    fig.savefig(buf, format="svg", bbox_inches="tight", metadata={"Date": None})
    text = buf.getvalue()
    return text[text.index("<svg"):]


def draw_collective(rows: list[Any]) -> str | None:
    """The bandwidth (GB/s) over size (bytes) plot of one collective; None when nothing to plot."""
    by_type: dict[str, list[tuple[float, float | None, float | None]]] = {}
    for r in rows[:MAX_ROWS]:
        r = _map(r)
        size, alg, bus = _num(r.get("size_bytes")), _in(r.get("algbw_gbps"), 0, MAX_PLOT_GBPS), \
            _in(r.get("busbw_gbps"), 0, MAX_PLOT_GBPS)
        if size is None or not 0 < size <= MAX_PLOT_SIZE or (alg is None and bus is None):
            continue
        label = _plot_label(r.get("type", "?"))
        if label in by_type or len(by_type) < MAX_SERIES // 2:
            by_type.setdefault(label, []).append((size, alg, bus))
    if not by_type:
        return None
    mpl = _matplotlib()
    from matplotlib.figure import Figure
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

    with mpl.rc_context(_RC):
        fig = Figure(figsize=(7.0, 3.4), dpi=96)
        ax = fig.add_subplot()
        for i, (dtype, pts) in enumerate(by_type.items()):
            pts.sort(key=lambda p: p[0])
            for col, style, word in ((1, "-", "algbw"), (2, "--", "busbw")):
                color = f"C{(2 * i + col - 1) % 10}"
                xy = [(p[0], y) for p in pts if (y := p[col]) is not None]
                if xy:
                    ax.plot([x for x, _ in xy], [y for _, y in xy], style, marker="o", markersize=3,
                            color=color, label=f"{dtype} {word}")
        ax.set_xscale("log", base=2)
        ax.xaxis.set_major_locator(LogLocator(base=2, numticks=14))
        ax.xaxis.set_major_formatter(FuncFormatter(_size_label))
        ax.xaxis.set_minor_formatter(NullFormatter())
        ax.set_xlabel("size (bytes)")
        ax.set_ylabel("bandwidth (GB/s, 1e9 B/s)")
        ax.set_ylim(bottom=0)
        ax.grid(True, alpha=0.3)
        ax.legend(loc="best", fontsize=8)
        return _svg(fig)


def draw_losses(series: Mapping[str, list[float]]) -> str | None:
    """The loss per step of a training check; None without a series."""
    if not series:
        return None
    mpl = _matplotlib()
    from matplotlib.figure import Figure
    from matplotlib.ticker import MaxNLocator

    with mpl.rc_context(_RC):
        fig = Figure(figsize=(7.0, 3.0), dpi=96)
        ax = fig.add_subplot()
        for i, (label, ys) in enumerate(list(series.items())[:MAX_SERIES]):
            steps = list(range(1, len(ys) + 1))
            if label == "single-process reference":
                ax.plot(steps, ys, "--", marker="x", color="black", label=label, zorder=3)
            else:
                ax.plot(steps, ys, "-", marker="o", markersize=3, color=f"C{i % 10}", label=label)
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
    """Import matplotlib, load its font and jinja2 now: certify calls it in a thread while the
    ranks run, which takes about 0.9 s of the 1.2 s a report costs off the wall time. A failure
    is left to the real drawing to report."""
    try:
        with _DRAW_LOCK:
            draw_losses({"warm": [1.0, 0.5]})
        _environment().get_template("report.html.j2")
    except Exception:  # noqa: BLE001 - the drawing after the run says what is wrong
        pass


def render_html(doc: Mapping[str, Any], source: str = "") -> str:
    """The report page of certificate ``doc``; ``source`` names the certificate file in the footer."""
    from markupsafe import Markup

    if not isinstance(doc, Mapping):
        raise TypeError(f"a certificate document is a JSON object, not {type(doc).__name__}")
    colls, checks = [], training(doc)
    with _DRAW_LOCK:
        for name, rows, unsupported, total in collectives(doc):
            svg = draw_collective(rows) if rows is not None else None
            shown = _collective_rows(rows or [])
            colls.append({"name": name, "unsupported": unsupported, "svg": Markup(svg) if svg else None,
                          "rows": shown, "more": max(0, total - len(shown))})
        for t in checks:
            svg = draw_losses(t["series"])
            t["svg"] = Markup(svg) if svg else None
    return str(_environment().get_template("report.html.j2").render(
        head=_head(doc, source), verdict=_verdict(doc), stack=_stack(doc), ranks=_ranks(doc),
        collectives=colls, training=checks, scaling=_scaling(doc),
        missing=None if _verdict(doc)["css"] == "passed" else reported_text(doc)))


def write_report(doc: Mapping[str, Any], path: str | os.PathLike[str], source: str = "") -> Path:
    """Draw the report of ``doc`` and write it at ``path``.
    Raises Unreachable (exit 3): the file cannot be written; whatever drawing raises."""
    return write_atomic(path, render_html(doc, source=source).encode("utf-8"), parents=False)


def write_beside(doc: Mapping[str, Any], cert_path: str | os.PathLike[str]) -> tuple[Path | None, str | None]:
    """Write the report next to the certificate at ``cert_path`` (:func:`report_path`)."""
    target = report_path(cert_path)
    try:
        return write_report(doc, target, source=Path(cert_path).name), None
    except Exception as e:  # noqa: BLE001 - a failure to draw must not lose the certificate
        reason = (e.message if isinstance(e, EnvbuildError) else (e.strerror or str(e)) if isinstance(e, OSError)
                  else f"{type(e).__name__}: {e}")
        return None, (f"report not written: {one_line(target, 300)}: {one_line(reason, 300)} "
                      f"(the certificate {one_line(cert_path, 300)} is kept)")
