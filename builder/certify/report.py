"""The HTML report of a certificate: ``<certificate stem>.html`` next to its JSON.

:func:`render_html` turns a certificate document (the JSON data: :meth:`Certificate.to_dict`
or a file read back) into one self-contained HTML page: the verdict with its failures and
warnings, the stack (torch, CUDA, NCCL, Python, OS as the ranks' probes saw them against the
reference), a per-rank table, one bandwidth-vs-size plot per collective (algbw and busbw in
GB/s = 1e9 B/s, nccl-tests definitions, log-x size in bytes) and, per training check, the
loss per step against the single-process reference, plus ``scaling.efficiency`` when present.
:func:`write_report` writes it atomically (a temporary file in the same folder, fsync'd, then
``os.replace``); :func:`write_beside` is the certification run's hook: it never raises, so a
failure to draw never loses the certificate (it returns one warning line instead).

Shapes read (both those of today and those of issue 10, item 3):

* ``collectives.<name>``: a list of rows ``{size_bytes, count, type, time_us, algbw_gbps,
  busbw_gbps, wrong}`` (``wrong`` the total over ranks) or ``{"unsupported": reason}``;
  the ``allreduce`` list of ``envbuild.certificate/1`` is shown as ``all_reduce`` when
  ``collectives`` has none.
* ``training.<profile>`` (``ddp``, ``fsdp``, ``pipeline``, ``tp``, ``moe``): a mapping with
  ``reference_match``, the tolerance, the losses per step (``losses``; a list, or a list per
  rank) and the reference's (``reference_losses``, or ``reference.losses``), throughput;
  every other scalar field is listed as is. The ``ddp`` table of ``envbuild.certificate/1``
  (no per-step losses) is shown as ``ddp`` when ``training`` has none.
* ``scaling``: its scalar fields (one level of mappings flattened), ``efficiency`` first.

The page loads nothing from elsewhere (no external CSS, script, font or image; a
Content-Security-Policy of ``default-src 'none'`` says so to the browser). Every string of
the certificate reaches the page through jinja2's autoescape (template
``templates/report.html.j2``); the plots are SVG drawn by matplotlib (imported only here, when a
report is drawn; never on the ``envbuild check`` path) with the Agg backend for pyplot, text as
paths and no math parsing, and the only certificate strings they hold (data types, rank names)
are cut to ``[A-Za-z0-9._+-]``. Work is bounded on any input: at most :data:`MAX_COLLECTIVES`
collectives and training checks, :data:`MAX_ROWS` rows each, :data:`MAX_RANKS` ranks,
:data:`MAX_STEPS` loss points per series, :data:`MAX_TEXT` characters per string shown.
"""

from __future__ import annotations

import contextlib
import io
import logging
import math
import os
import re
import sys
import tempfile
import threading
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

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
    """A scalar as shown: ``-`` for None, ``true``/``false``, numbers in short form, strings as
    one line of at most ``limit`` characters (control characters escaped)."""
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
        ("recipe", _text(doc.get("recipe"))), ("lock hash", _text(doc.get("lock_hash"))),
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
    """``(what the reference is, its values)``: the certificate's ``stack`` (issue 10: the
    image's lock, ``--recipe``'s lock, or a foreign image's stack discovered by a rank's
    probe) when present, else the recipe lock's pins."""
    stack = _map(doc.get("stack"))
    if stack:
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
    rows = []
    for name, values in seen.items():
        if not values:
            shown = "(no probe)"
        elif len(values) == 1:
            shown = next(iter(values))
        else:
            shown = "; ".join(f"{v} (rank {', '.join(r[:8])}{'...' if len(r) > 8 else ''})" for v, r in values.items())
        rows.append({"name": name, "seen": shown, "expected": _text(expected.get(name), 200) if expected else "-",
                     "differs": len(values) > 1})
    return {"reference": reference, "rows": rows}


_RANK_COLUMNS = ("rank", "node", "hostname", "device", "reported", "elapsed (s)", "DDP images/s", "final loss",
                 "errors", "lock mismatches", "problem")


def _rank_row(rank: str, entry: Mapping[str, Any], ddp: Mapping[str, Any]) -> list[dict[str, str]]:
    errors = _list(entry.get("errors"), MAX_LINES)
    mism = _list(entry.get("lock_mismatches"), MAX_LINES)
    problem = entry.get("problem") or (f"exit code {_text(entry.get('exit_code'))}"
                                       if entry.get("exit_code") not in (None, 0) else None)
    reported = entry.get("reported") is True
    cells = [(_text(rank, 20), ""), (_text(entry.get("node"), 20), "num"), (_text(entry.get("hostname"), 200), ""),
             (_text(entry.get("device"), 200), ""), ("yes" if reported else "no", "" if reported else "bad"),
             (_fmt(entry.get("elapsed_s"), ".2f"), "num"), (_fmt(ddp.get("images_per_s"), ".2f"), "num"),
             (_fmt(ddp.get("final_loss"), ".6g"), "num"),
             ("; ".join(_text(e, 300) for e in errors[:5]) or "-", "bad" if errors else ""),
             ("; ".join(_text(m, 300) for m in mism[:5]) or "-", "bad" if mism else ""),
             (_text(problem, 400), "bad" if problem else "")]
    return [{"text": t, "css": c} for t, c in cells]


def _ranks(doc: Mapping[str, Any]) -> dict[str, Any]:
    ranks = _map(doc.get("ranks"))
    ddp = _map(_map(doc.get("ddp")).get("ranks"))
    keys = sorted(list(ranks)[: MAX_RANKS * 4], key=_rank_order)
    rows = [_rank_row(k, _map(ranks[k]), _map(ddp.get(k))) for k in keys[:MAX_RANKS]]
    return {"columns": _RANK_COLUMNS, "rows": rows, "more": max(0, len(ranks) - len(rows))}


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
    in its order (module doc: ``collectives.<name>``, else ``allreduce`` as ``all_reduce``);
    at most :data:`MAX_ROWS` rows; rows None when unsupported."""
    found: list[tuple[str, list[Any] | None, str | None, int]] = []
    coll = _map(doc.get("collectives"))
    for name, value in list(coll.items())[:MAX_COLLECTIVES]:
        if isinstance(value, Mapping) and value.get("unsupported") is not None:
            found.append((_text(name, 200), None, _text(value.get("unsupported")), 0))
        else:
            found.append((_text(name, 200), _list(value, MAX_ROWS), None, len(value) if isinstance(value, list) else 0))
    legacy = doc.get("allreduce")
    if "all_reduce" not in coll and isinstance(legacy, list) and len(found) < MAX_COLLECTIVES:
        found.insert(0, ("all_reduce", _list(legacy, MAX_ROWS), None, len(legacy)))
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
    """Per training check (module doc): name, ``reference_match`` (None: not recorded),
    unsupported reason, the loss series and the other facts."""
    checks = dict(list(_map(doc.get("training")).items())[:MAX_COLLECTIVES])
    if "ddp" not in checks and isinstance(doc.get("ddp"), Mapping):
        checks = {"ddp": doc["ddp"], **checks}
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
    """The bandwidth-vs-size plot of one collective's rows: per data type, algbw (solid) and
    busbw (dashed) in GB/s over the size in bytes (log x); None when no row has a positive
    size and a finite bandwidth."""
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
    """The loss per step of a training check, one line per series (the reference dashed
    black); None without a series."""
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


def render_html(doc: Mapping[str, Any], source: str = "") -> str:
    """The report page of certificate ``doc`` (JSON data); ``source`` names the certificate
    file in the page's footer. Draws with matplotlib (imported now)."""
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
        collectives=colls, training=checks, scaling=_scaling(doc)))


def write_report(doc: Mapping[str, Any], path: str | os.PathLike[str], source: str = "") -> Path:
    """Draw the report of ``doc`` and write it at ``path`` atomically: a temporary file in the
    same folder (fsync'd, mode 0644), then ``os.replace``, so that a reader sees the old page
    or the new one, never half of one; the temporary file is removed in every case.

    Raises:
        OSError: the folder is missing or the file cannot be written (e.g. no space left).
        Exception: whatever drawing raises (a bug, or matplotlib missing).
    """
    path = Path(path)
    data = render_html(doc, source=source).encode("utf-8")
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.stem}.", suffix=".html.tmp")
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    finally:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
    return path


def write_beside(doc: Mapping[str, Any], cert_path: str | os.PathLike[str]) -> tuple[Path | None, str | None]:
    """Write the report next to the certificate at ``cert_path`` (:func:`report_path`).

    Never raises (but for KeyboardInterrupt): the certificate is already written and stays the
    record. Returns ``(report path, None)``, or ``(None, one warning line)`` naming the
    report, the reason and that the certificate was kept.
    """
    target = report_path(cert_path)
    try:
        return write_report(doc, target, source=Path(cert_path).name), None
    except Exception as e:  # noqa: BLE001 - a failure to draw must not lose the certificate
        reason = (e.strerror or str(e)) if isinstance(e, OSError) else f"{type(e).__name__}: {e}"
        return None, (f"report not written: {one_line(target, 300)}: {one_line(reason, 300)} "
                      f"(the certificate {one_line(cert_path, 300)} is kept)")
