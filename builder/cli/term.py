"""Terminal output of the CLI without importing rich where a command does not need it.

``rich`` costs ~0.1 s to import (``rich.console``); ``envbuild check`` must start within 3x
of ``python -c "import yaml"`` (issue 13 item 5), so the check path writes its lines with
:func:`level_line` (plain text, the level coloured with ANSI codes only on a terminal and
without ``NO_COLOR``) and the other commands get their rich ``Console`` on first use
(:class:`LazyConsole`).
"""

from __future__ import annotations

import os
import sys
from typing import Any, TextIO

#: ANSI colour of each finding level (as rich styled them: red, yellow, cyan).
LEVEL_COLOURS = {"error": "31", "warning": "33", "note": "36"}


class LazyConsole:
    """A ``rich.console.Console`` made on the first attribute access (``print``, ``status``,
    ``print_json``, ...) with the keyword arguments given here; the same object after that.

    ``stderr=True`` writes to ``sys.stderr`` as rich does; ``highlight`` and ``emoji`` are off
    by default (envbuild's lines are data, not markup)."""

    def __init__(self, **kwargs: Any) -> None:
        self._kwargs = {"highlight": False, "emoji": False, **kwargs}
        self._console: Any = None

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)
        if self._console is None:
            from rich.console import Console

            self._console = Console(**self._kwargs)
        return getattr(self._console, name)


def use_colour(stream: TextIO) -> bool:
    """Whether ``stream`` gets ANSI colours: a terminal, ``NO_COLOR`` unset or empty, ``TERM``
    not ``dumb`` (the rules rich follows; https://no-color.org)."""
    if os.environ.get("NO_COLOR") or os.environ.get("TERM") == "dumb":
        return False
    try:
        return stream.isatty()
    except (AttributeError, ValueError, OSError):
        return False


def level_line(level: str, text: str, stream: TextIO | None = None) -> None:
    """Write ``"<level>: <text>"`` and a newline to ``stream`` (default ``sys.stderr``), the
    level in its :data:`LEVEL_COLOURS` colour on a terminal. ``text`` is written as given:
    the caller escapes it (:func:`builder.core.inputs.escape`)."""
    stream = stream or sys.stderr
    colour = LEVEL_COLOURS.get(level)
    head = f"\x1b[{colour}m{level}\x1b[0m" if colour and use_colour(stream) else level
    stream.write(f"{head}: {text}\n")
    stream.flush()


def plain_line(text: str, stream: TextIO | None = None) -> None:
    """Write ``text`` and a newline to ``stream`` (default ``sys.stdout``) and flush."""
    stream = stream or sys.stdout
    stream.write(text + "\n")
    stream.flush()
