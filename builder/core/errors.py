"""The one exception type of envbuild and the exit-code table shared by every command.

Exit codes (``shared/design.md``):

====  =====================================================================
code  meaning
====  =====================================================================
0     done; every check passed
1     done with warnings only
2     a check failed: invalid recipe, incompatible versions, nodes that
      differ, a failing certification verdict, a refused pull
3     could not check: engine, registry or node unreachable, timeout,
      unreadable or invalid report
64    command-line usage error
70    internal error: an exception envbuild did not expect (a bug)
130   interrupted (SIGINT/SIGTERM); what was started is removed
====  =====================================================================
"""

from __future__ import annotations

from enum import IntEnum
from typing import Any


class ExitCode(IntEnum):
    """Exit codes of every ``envbuild`` command."""

    OK = 0
    WARNINGS = 1
    CHECK_FAILED = 2
    UNREACHABLE = 3
    USAGE = 64
    #: An unexpected exception (a bug in envbuild): ``EX_SOFTWARE`` of sysexits.h, as 64 is its
    #: ``EX_USAGE``; never 1, which means "done with warnings only".
    INTERNAL_ERROR = 70
    #: SIGINT/SIGTERM: 128 + SIGINT, as a shell reports a command it interrupted.
    INTERRUPTED = 130


_UNSET = object()


class EnvbuildError(Exception):
    """An error the CLI turns into one line and an exit code (no traceback).

    Args:
        message: what is wrong, e.g. ``"is not a version"``.
        file: the file concerned (shown first), e.g. ``"recipes/x.yaml"``.
        field: dotted field path, e.g. ``"torch.version"``.
        value: the offending value; shown escaped and cut to ~200 characters
            (:func:`builder.core.inputs.show`) after the field.
        exit_code: one of :class:`ExitCode`; defaults to ``CHECK_FAILED`` (2).

    ``str(err)`` gives ``"recipes/x.yaml: torch.version: '2.8;rm' is not a version"``: always
    one line (control characters escaped), at most ~600 characters.
    """

    def __init__(
        self,
        message: str,
        *,
        file: str | None = None,
        field: str | None = None,
        value: object = _UNSET,
        exit_code: ExitCode = ExitCode.CHECK_FAILED,
    ) -> None:
        self.message = message
        self.file = file
        self.field = field
        self.value = value
        self.exit_code = ExitCode(exit_code)
        super().__init__(str(self))

    def __str__(self) -> str:
        from .inputs import escape, one_line, show

        parts = []
        if self.file:
            parts.append(f"{escape(self.file, 200)}: ")
        if self.field:
            parts.append(f"{escape(self.field, 200)}: ")
        if self.value is not _UNSET:
            parts.append(f"{show(self.value)} ")
        parts.append(one_line(self.message, limit=400))
        return "".join(parts)


class Unreachable(EnvbuildError):
    """Something needed could not be reached or timed out (exit 3)."""

    def __init__(self, message: str, **kw: Any) -> None:
        kw.setdefault("exit_code", ExitCode.UNREACHABLE)
        super().__init__(message, **kw)


class ManyErrors(EnvbuildError):
    """Several errors found at once (e.g. every invalid field of a recipe).

    ``errors`` holds the individual :class:`EnvbuildError` values; ``str()`` gives
    one line per error. The exit code is the highest of theirs.
    """

    def __init__(self, errors: list[EnvbuildError]) -> None:
        self.errors = list(errors)
        code = max((e.exit_code for e in self.errors), default=ExitCode.CHECK_FAILED)
        super().__init__("several errors", exit_code=code)

    #: Errors shown at most; the rest are counted in one last line.
    SHOWN = 50

    def __str__(self) -> str:
        lines = [str(e) for e in self.errors[: self.SHOWN]]
        if len(self.errors) > self.SHOWN:
            lines.append(f"... and {len(self.errors) - self.SHOWN} more errors")
        return "\n".join(lines)
