"""How a build reports progress: a rich live status line (the phase, the current BuildKit step
and its latest output line) and one-line warnings, on a console or on stderr."""

from __future__ import annotations

import contextlib
import re
import sys
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .engine import OnLine


def stderr_warn(message: str) -> None:
    """Print ``envbuild: warning: <message>`` to stderr (no console given)."""
    print(f"envbuild: warning: {message}", file=sys.stderr)


def console_warn(console: Any) -> Callable[[str], None]:
    """A warn callback printing ``warning: <message>`` (yellow, no markup) on ``console``."""

    def warn(message: str) -> None:
        console.print(f"warning: {message}", style="yellow", markup=False, soft_wrap=True)

    return warn


class ConsoleProgress:
    """A rich live status line: the phase, the current BuildKit step and its last line."""

    def __init__(self, console: Any, on_line: OnLine | None) -> None:
        self.console = console
        self.forward = on_line
        self.title = ""
        self.step = ""
        self.status: Any = None

    @contextlib.contextmanager
    def phase(self, title: str) -> Iterator[None]:
        self.title, self.step = title, ""
        if self.console is None:
            yield
            return
        from rich.text import Text

        self._text = Text
        with self.console.status(Text(title)) as status:
            self.status = status
            try:
                yield
            finally:
                self.status = None

    def on_line(self, line: str) -> None:
        if self.forward:
            self.forward(line)
        if self.status is None:
            return
        m = re.fullmatch(r"#\d+ (\[.*)", line)
        if m:
            self.step = m.group(1)
        last = " ".join(line.split())
        text = f"{self.title}: {self.step}" if self.step else self.title
        width = max(20, self.console.width - 4)
        self.status.update(self._text(f"{text[:width]}\n  {last[:width - 2]}"))
