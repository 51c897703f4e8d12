"""What the two parsers (:mod:`.dockerfile`, :mod:`.definition`) hand to the extraction:
the stages of one file, each with its base, the stages it copies from, its shell commands
(words expanded) and the environment of the image it makes.

A malformed file is :class:`Malformed`: one line ``FILE: line N: <what>``, exit 3 (the
file cannot be audited: an unresolved merge conflict, a command outside any section, a
duplicate section, a Dockerfile without FROM...).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from builder.core import inputs
from builder.core.errors import EnvbuildError, ExitCode

from .model import Level
from .shell import Command, Var, Word

#: Largest file audited, in bytes (1 MiB, as a recipe).
MAX_FILE_BYTES = inputs.MAX_RECIPE_BYTES
_CONFLICT = re.compile(r"\A(?:<{7}|>{7}|\|{7})(?:[ \t].*)?\Z")
#: Predefined platform arguments of BuildKit, as audit assumes them: linux/amd64, the
#: platform envbuild's compatibility facts are for (Docker docs, "Automatic platform ARGs").
PLATFORM_ARGS = {"TARGETPLATFORM": "linux/amd64", "TARGETOS": "linux", "TARGETARCH": "amd64", "TARGETVARIANT": "",
                 "BUILDPLATFORM": "linux/amd64", "BUILDOS": "linux", "BUILDARCH": "amd64", "BUILDVARIANT": ""}


class Malformed(EnvbuildError):
    """A file that cannot be audited: ``FILE: line N: <what>`` (exit 3)."""

    def __init__(self, file: str, line: int, message: str) -> None:
        super().__init__(f"line {line}: {message}", file=file, exit_code=ExitCode.UNREACHABLE)
        self.line = line


@dataclass
class Note:
    """Something a parser met that the verdict should name: ``rule`` (``unexpanded``...),
    ``level``, ``line``, the ``value`` as written and the ``message``."""

    level: Level
    rule: str
    line: int
    value: str | None
    message: str


@dataclass
class Base:
    """The base of a stage: ``word`` the image reference as expanded (``text`` None when
    it cannot be), ``bootstrap`` ``docker`` for a Dockerfile, else the definition's agent
    (``docker``, ``library``, ``localimage``, ``debootstrap``...), ``header`` the other
    definition header keys (``OSVersion``, ``MirrorURL``), lower-cased."""

    word: Word
    line: int
    bootstrap: str = "docker"
    platform: str | None = None
    header: dict[str, str] = field(default_factory=dict)


@dataclass
class EnvSet:
    """``ENV NAME=value`` (or a ``%environment`` export) at ``line``: ``value`` None when it
    cannot be expanded (``why``)."""

    name: str
    value: str | None
    line: int
    why: str | None = None
    raw: str = ""


@dataclass
class Stage:
    """One build stage: ``index`` from 0, ``name`` (lower case, None when unnamed),
    ``parent`` the index of the stage it starts FROM (None: an image), ``copies`` the
    ``(stage index, line)`` it copies files from, ``commands`` of its RUN lines or
    ``%post``, ``env`` the environment variables it sets for the image it makes."""

    index: int
    name: str | None
    line: int
    base: Base
    parent: int | None = None
    copies: list[tuple[int, int]] = field(default_factory=list)
    commands: list[Command] = field(default_factory=list)
    env: list[EnvSet] = field(default_factory=list)


@dataclass
class Parsed:
    """A parsed file: ``kind`` ``dockerfile`` or ``definition``, its ``stages`` in file
    order (the last one makes the image), the parser's ``notes`` and ``others``."""

    file: str
    kind: str
    stages: list[Stage]
    notes: list[Note] = field(default_factory=list)
    #: ``(line, what)`` of every instruction or section neither installs nor sets the
    #: environment (COPY, CMD, %runscript...): what ``--to-recipe`` cannot carry over.
    others: list[tuple[int, str]] = field(default_factory=list)

    @property
    def final(self) -> Stage:
        return self.stages[-1]

    def used(self) -> list[Stage]:
        """The stages the final image depends on (FROM a stage, COPY --from, %files
        from), the final one included, in file order."""
        seen: set[int] = set()
        todo = [self.final.index]
        while todo:
            k = todo.pop()
            if k in seen:
                continue
            seen.add(k)
            st = self.stages[k]
            if st.parent is not None:
                todo.append(st.parent)
            todo.extend(src for src, _line in st.copies)
        return [s for s in self.stages if s.index in seen]

    def chain(self, stage: Stage) -> list[Stage]:
        """``stage`` and the stages it starts FROM, the root (the one FROM an image) first."""
        out = [stage]
        while out[-1].parent is not None and len(out) <= len(self.stages):
            out.append(self.stages[out[-1].parent])
        return out[::-1]


def read_lines(path: str) -> list[str]:
    """The lines of the file at ``path`` (bounded read, UTF-8, CRLF as LF), after the
    checks every audited file gets: no control character but tab (a NUL, an escape
    sequence or a bidi override has no business in a build file) and no unresolved
    merge conflict. Raises :class:`~builder.core.errors.Unreachable` (3) for an unreadable
    file, :class:`Malformed` (3) naming the line."""
    data = inputs.read_regular(path, MAX_FILE_BYTES, "file to audit")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise Malformed(path, data.count(b"\n", 0, e.start) + 1, f"is not UTF-8 text (byte {e.start})") from None
    lines = text.replace("\r\n", "\n").split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    for n, line in enumerate(lines, 1):
        if inputs.has_control(line.replace("\t", " ")):
            ch = next(c for c in line if c != "\t" and inputs.is_control(c))
            raise Malformed(path, n, f"holds a control character ({inputs.escape(ch)}); a build file is printable text")
        if _CONFLICT.fullmatch(line):
            raise Malformed(path, n, f"unresolved merge-conflict marker {inputs.show(line, 60)}")
    return lines


def platform_var(name: str) -> Var | None:
    """A predefined platform argument (:data:`PLATFORM_ARGS`) as a :class:`Var`."""
    if name in PLATFORM_ARGS:
        return Var(PLATFORM_ARGS[name], None, "platform", None, name)
    return None
