"""Printing: the rich consoles of stdout and stderr, made on first use, and plain lines.

Every line handed here is already escaped (no markup, no raw control character). A plain
line (:func:`say`, :func:`put`) is written as rich writes an unstyled soft-wrapped line (the
text, a newline, a flush; a closed stdout exits 1), without importing rich: ``envbuild
check`` of a clean recipe prints through these only. Styled lines, tables, JSON and status
spinners go through :func:`console` (stderr) and :func:`out` (stdout).
"""

from __future__ import annotations

import functools
import os
import sys
from typing import TYPE_CHECKING, TextIO

if TYPE_CHECKING:
    from rich.console import Console

#: Style of each finding level (recipe rules, audit).
LEVEL_STYLE = {"error": "red", "warning": "yellow", "note": "cyan"}


@functools.cache
def console() -> Console:
    """The rich console of stderr (messages, warnings, progress); it writes to the
    ``sys.stderr`` of the moment (tests redirect it)."""
    from rich.console import Console

    return Console(stderr=True, highlight=False, emoji=False)


@functools.cache
def out() -> Console:
    """The rich console of stdout (results)."""
    from rich.console import Console

    return Console(highlight=False, emoji=False)


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
    """One line on stdout as it is (already escaped)."""
    _write(sys.stdout, line)


def finding(level: str, line: str) -> None:
    """``LEVEL: line`` on stderr, the level in its colour (:data:`LEVEL_STYLE`)."""
    from rich.text import Text

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
    if _stderr_plain():
        say(f"warning: {line}")
        return
    console().print(f"warning: {line}", style="yellow", markup=False, soft_wrap=True)


def progress(line: str) -> None:
    """A progress line of a stage on stderr (the stage escaped it)."""
    console().print(line, markup=False, soft_wrap=True)
