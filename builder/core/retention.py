"""What envbuild keeps of the gate's history per node, the JSON-lines logs and the certificates per recipe:
:data:`RETENTION`, the one table of defaults, which the environment overrides (docs/operating.md, "Retention")."""

from __future__ import annotations

import contextlib
import datetime
import os
import re
import time
from collections.abc import Iterable
from pathlib import Path

from .errors import UsageError

#: kind -> (at most this many entries, none older than this many days); ``ENVBUILD_KEEP_<KIND>`` and
#: ``ENVBUILD_KEEP_<KIND>_DAYS`` override. An entry: a history report, a log line, a certificate.
RETENTION: dict[str, tuple[int, float]] = {"history": (1000, 90.0), "logs": (20000, 90.0),
                                           "certificates": (1000, 365.0)}
_COUNT_RE = re.compile(r"[1-9][0-9]{0,8}")
_DAYS_RE = re.compile(r"(?=[0-9.]*[1-9])[0-9]{1,5}(?:\.[0-9]{1,3})?")
_TS_RE = re.compile(rb'\{ ?"ts": ?"([^"]{1,40})"')


def limits(kind: str) -> tuple[int, float]:
    """``(entries, seconds)`` kept of ``kind``. Raises UsageError (exit 64) naming a bad variable."""
    name, (keep, days) = f"ENVBUILD_KEEP_{kind.upper()}", RETENTION[kind]
    for var, regex, what in ((name, _COUNT_RE, "a count, 1 to 999999999"),
                             (f"{name}_DAYS", _DAYS_RE, "days, 0.001 to 99999.999")):
        if (value := os.environ.get(var)) is not None and not regex.fullmatch(value):
            raise UsageError(f"must be {what}", field=var, value=value[:40])
    return int(os.environ.get(name) or keep), float(os.environ.get(f"{name}_DAYS") or days) * 86400.0


def split(paths: Iterable[Path], kind: str) -> tuple[list[Path], list[Path]]:
    """``(kept, gone)`` of the files ``paths``, newest first by modification time: beyond the newest N
    or older than D days is gone. A file that vanished meanwhile is in neither."""
    (keep, max_age_s), dated = limits(kind), []
    for p in paths:
        with contextlib.suppress(OSError):
            dated.append((p.stat().st_mtime, p.name, p))
    cut, ordered = time.time() - max_age_s, sorted(dated, reverse=True)
    return ([p for i, (m, _, p) in enumerate(ordered) if i < keep and m >= cut],
            [p for i, (m, _, p) in enumerate(ordered) if i >= keep or m < cut])


def remove(paths: Iterable[Path]) -> None:
    for p in paths:
        with contextlib.suppress(OSError):
            p.unlink()


def cut_log(data: bytes, partial: bool = False, now: float | None = None) -> bytes | None:
    """``data`` (JSON lines, oldest first, ``ts`` the first key) without the lines past the logs' retention
    (the cut by age stops at a line without ``ts``); None when none goes. ``partial``: its first line is cut."""
    keep, max_age_s = limits("logs")
    lines = data.splitlines(keepends=True)[1 if partial else 0:]
    cut = datetime.datetime.fromtimestamp((time.time() if now is None else now) - max_age_s, datetime.UTC)
    stamp = cut.isoformat(timespec="milliseconds").replace("+00:00", "Z").encode()
    start = max(0, len(lines) - keep)
    while start < len(lines) and (m := _TS_RE.match(lines[start])) is not None and m.group(1) < stamp:
        start += 1
    return b"".join(lines[start:]) if start or partial else None
