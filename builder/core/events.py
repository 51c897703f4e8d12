"""The one event model of a run (phase, rank result, finding, run end, a node's log line) and its sinks: JSON
lines (``--log-json``/``ENVBUILD_LOG_JSON``, the fields Loki, Elasticsearch and Fluent Bit take
without parsing rules) and RFC 5424 syslog over UDP (``--syslog HOST:PORT``)."""

from __future__ import annotations

import datetime
import fcntl
import os
import socket
from typing import Annotated, Literal

import msgspec

from . import retention
from .errors import Unreachable
from .files import append, make_folder, write_atomic
from .inputs import one_line
from .model import Model

Level = Literal["info", "warning", "error"]
#: RFC 5424 severities of the levels (facility user, 1).
SEVERITY = {"info": 6, "warning": 4, "error": 3}
#: Longest message kept, in characters (one UDP datagram of syslog stays under 8 KiB).
MAX_MSG = 2000
#: Bytes of a log's tail read to cut it to its retention (older lines beyond go).
MAX_LOG_READ = 64 << 20


class Event(Model, frozen=True):
    """One thing a run did; ``run``, ``node``, ``rank`` None where the event has none."""

    ts: Annotated[str, msgspec.Meta(max_length=40)]
    level: Level
    run: Annotated[str, msgspec.Meta(max_length=200)] | None
    node: Annotated[str, msgspec.Meta(max_length=200)] | None
    rank: Annotated[int, msgspec.Meta(ge=0)] | None
    event: Literal["phase", "rank-result", "finding", "run-end", "log"]
    msg: Annotated[str, msgspec.Meta(max_length=MAX_MSG)]


def schemas() -> dict[str, tuple[type[Model], str, str]]:
    return {"log-event": (Event, "https://envbuild.dev/schemas/log-event.schema.json",
                          "envbuild log event (JSON lines)")}


def stamp(at: float | None = None) -> str:
    """``at`` (Unix seconds; None: now) as the events' ``ts``: UTC, milliseconds, ``Z``."""
    when = datetime.datetime.now(datetime.UTC) if at is None else datetime.datetime.fromtimestamp(at, datetime.UTC)
    return when.isoformat(timespec="milliseconds").replace("+00:00", "Z")


def event(kind: str, msg: str, level: str = "info", run: str | None = None, node: str | None = None,
          rank: int | None = None, ts: str | None = None) -> Event:
    """An event stamped ``ts`` (default now), every string one escaped line."""
    ts = ts or stamp()
    run, node = (None if s is None else one_line(s, 200) for s in (run, node))
    return msgspec.convert({"ts": ts, "level": level, "run": run, "node": node, "rank": rank,
                            "event": kind, "msg": one_line(msg, MAX_MSG)}, Event)


def _sd(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("]", "\\]")


def syslog_line(e: Event, host: str | None = None) -> bytes:
    """``e`` as one RFC 5424 line: the JSON as message, run and node as structured data."""
    pri = 8 + SEVERITY[e.level]
    sd = "".join(f' {k}="{_sd(v)}"' for k, v in (("run", e.run), ("node", e.node)) if v)
    head = f"<{pri}>1 {e.ts} {host or socket.gethostname() or '-'} envbuild {os.getpid()} {e.event}"
    return f"{head} {f'[envbuild@32473{sd}]' if sd else '-'} ".encode() + msgspec.json.encode(e)


class Sinks:
    """Where the events of this run go (nothing when neither option is given)."""

    def __init__(self, log_json: str | None = None, syslog: tuple[str, int] | None = None) -> None:
        self.log_json = log_json or os.environ.get("ENVBUILD_LOG_JSON") or None
        self.syslog = syslog

    def emit(self, *events: Event) -> None:
        """Send ``events``; raises :class:`Unreachable` (exit 3) naming the file or address."""
        if self.log_json and events:
            append_log(self.log_json, b"".join(msgspec.json.encode(e) + b"\n" for e in events))
        if self.syslog:
            try:
                with socket.socket(socket.AF_INET6 if ":" in self.syslog[0] else socket.AF_INET,
                                   socket.SOCK_DGRAM) as s:
                    for e in events:
                        s.sendto(syslog_line(e), self.syslog)
            except OSError as exc:
                raise Unreachable(f"syslog {self.syslog[0]}:{self.syslog[1]}: {one_line(exc, 200)}") from None


def append_log(path: str, data: bytes) -> None:
    """Append, then cut to retention (:mod:`.retention`) under a folder lock (no append lost); Unreachable (3)."""
    fd = -1
    try:
        fd = os.open(make_folder(os.path.dirname(path) or "."), os.O_RDONLY | os.O_DIRECTORY)
        fcntl.flock(fd, fcntl.LOCK_EX)
        append(path, data)
        with open(path, "rb") as f:
            start = max(0, f.seek(0, os.SEEK_END) - MAX_LOG_READ)
            f.seek(start)
            kept = retention.cut_log(f.read(), partial=start > 0)
        if kept is not None:
            write_atomic(path, kept)
    except OSError as e:
        raise Unreachable(f"cannot append to the log: {one_line(e, 200)}", file=path) from None
    finally:
        if fd >= 0:
            os.close(fd)
