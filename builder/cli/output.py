"""Printing: the rich consoles of stdout and stderr, made on first use, and plain lines."""

from __future__ import annotations

import functools
import os
import sys
from typing import TYPE_CHECKING, TextIO

if TYPE_CHECKING:
    from rich.console import Console

#: Style of each finding level (recipe rules, audit).
LEVEL_STYLE = {"error": "red", "warning": "yellow", "note": "cyan"}

#: Warning lines this run printed (set to 0 when a run starts): an exit 0 becomes 1, "done with
#: warnings only" (:func:`exit_code`), whichever command printed them.
warned = [0]


def count_warnings(n: int = 1) -> None:
    """Count ``n`` warning lines printed (by :func:`warn`, :func:`finding`, or a stage's own table)."""
    warned[0] += n


def exit_code(code: int) -> int:
    """``code``, or 1 (done with warnings only) for a 0 of a run that printed a warning line."""
    return 1 if code == 0 and warned[0] else code


#: ``--progress`` of this run (auto, tty, plain, quiet), ``--verbose`` and ``--json``.
mode: list = ["auto", False, False]

#: The schema (``schemas/<stem>.schema.json``) of each command's ``--json`` document; every command
#: that has one gets the flag (:mod:`builder.cli.parser`). An error is ``error.schema.json``'s document.
JSON_SCHEMAS = {"check": "check", "audit": "audit", "render": "render", "lock": "resolved", "build": "build",
                "certify": "certify", "make": "make", "report": "report", "verify": "verify-result",
                "doctor": "doctor", "gate": "gate", "push": "push", "pull": "pull",
                "rebuild": "rebuild"}


def set_mode(progress: str, verbose: bool, json: bool = False) -> None:
    mode[:] = [progress, verbose, json]
    console.cache_clear()
    out.cache_clear()


def emit(doc: object) -> None:
    """With ``--json``: ``doc`` (a Model) as the run's one JSON document on stdout, the strings whole with
    every non-ASCII character as a ``\\uXXXX`` escape (no bidi override or control reaches a terminal raw)."""
    import json

    import msgspec

    if mode[2] is True:  # once: an error after the document (a metrics file) adds none
        mode[2] = "sent"
        _write(sys.stdout, json.dumps(msgspec.to_builtins(doc), indent=2))


@functools.cache
def console() -> Console:
    """The rich console of stderr (messages, warnings, progress); it writes to the
    ``sys.stderr`` of the moment (tests redirect it); live only on a terminal or ``--progress tty``."""
    from rich.console import Console

    force = {"tty": True, "plain": False}.get(mode[0])
    c = Console(stderr=True, highlight=False, emoji=False, force_terminal=force)
    c.every_line = mode[1]  # type: ignore[attr-defined]  # --verbose: read by plain progress
    return c


@functools.cache
def out() -> Console:
    """The rich console of stdout (results); with ``--json`` it prints nothing (:func:`emit` does)."""
    from rich.console import Console

    return Console(highlight=False, emoji=False, quiet=mode[2])


def _write(stream: TextIO, line: str) -> None:
    """``line`` and a newline on ``stream``, flushed; a broken stdout pipe ends the program
    with exit 1 and stdout on ``/dev/null``, as :meth:`rich.console.Console.on_broken_pipe`."""
    try:
        stream.write(line + "\n")
        stream.flush()
    except BrokenPipeError:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        raise SystemExit(1) from None


def say(line: str) -> None:
    """One line on stderr as it is (already escaped: no markup, no raw control character)."""
    _write(sys.stderr, line)


def put(line: str) -> None:
    """One line on stdout as it is (already escaped); none with ``--json``."""
    if not mode[2]:
        _write(sys.stdout, line)


def finding(level: str, line: str) -> None:
    """``LEVEL: line`` on stderr, the level in its colour (:data:`LEVEL_STYLE`)."""
    from rich.text import Text

    if level == "warning":
        count_warnings()
    console().print(Text.assemble((level, LEVEL_STYLE[level]), ": ", line), soft_wrap=True)


def _stderr_plain() -> bool:
    """True when the stderr console would write no colour: stderr is no terminal and neither
    ``FORCE_COLOR`` nor ``TTY_COMPATIBLE=1`` makes rich treat it as one."""
    if os.environ.get("TTY_COMPATIBLE") == "1" or os.environ.get("FORCE_COLOR"):
        return False
    try:
        return not sys.stderr.isatty()
    except (AttributeError, ValueError):
        return False


def warn(line: str) -> None:
    """``warning: line`` on stderr in yellow; plain (without importing rich) where the console
    would not colour it."""
    count_warnings()
    if _stderr_plain():
        say(f"warning: {line}")
        return
    console().print(f"warning: {line}", style="yellow", markup=False, soft_wrap=True)


def progress(line: str) -> None:
    """A progress line of a stage on stderr (the stage escaped it); none with ``--quiet``."""
    if mode[0] == "quiet":
        return
    console().print(line, markup=False, soft_wrap=True)


def publish(args: object, samples: list, events: list) -> None:
    """A run's ``--metrics-file`` and its events to ``--log-json``/``ENVBUILD_LOG_JSON``/``--syslog``."""
    import time

    from builder.core import events as ev
    from builder.core import metrics

    if getattr(args, "metrics_file", None):
        metrics.write(getattr(args, "metrics_file"), samples, time.time())  # noqa: B009
    ev.Sinks(getattr(args, "log_json", None), getattr(args, "syslog", None)).emit(*events)


def level_of(status: str) -> str:
    """The event level of a check status or a ``fail:``/``warn:`` line's prefix."""
    return {"fail": "error", "unknown": "error", "warn": "warning"}.get(status.split(":")[0], "info")
