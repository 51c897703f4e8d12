"""What the two parsers hand to the extraction: the stages of one file, with words expanded. A malformed file is
:class:`Malformed`: one line ``FILE: line N: <what>``, exit 3."""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from builder.core import inputs
from builder.core.errors import Unreachable

from .model import Level
from .shell import Command, Var, Word

#: Largest file audited, in bytes (1 MiB, as a recipe).
MAX_FILE_BYTES = inputs.MAX_RECIPE_BYTES
_CONFLICT = re.compile(r"\A(?:<{7}|>{7}|\|{7})(?:[ \t].*)?\Z")
#: Predefined platform arguments of BuildKit, as audit assumes them: linux/amd64, the
#: platform envbuild's compatibility facts are for (Docker docs, "Automatic platform ARGs").
PLATFORM_ARGS = {"TARGETPLATFORM": "linux/amd64", "TARGETOS": "linux", "TARGETARCH": "amd64", "TARGETVARIANT": "",
                 "BUILDPLATFORM": "linux/amd64", "BUILDOS": "linux", "BUILDARCH": "amd64", "BUILDVARIANT": ""}


class Malformed(Unreachable):
    """A file that cannot be audited: ``FILE: line N: <what>`` (exit 3)."""

    def __init__(self, file: str, line: int, message: str) -> None:
        super().__init__(f"line {line}: {message}", file=file)
        self.line = line


@dataclass
class Note:
    """Something a parser met that the verdict should name."""

    level: Level
    rule: str
    line: int
    value: str | None
    message: str


@dataclass
class Base:
    """The base of a stage: the expanded reference (``text`` None when it cannot be) and bootstrap agent."""

    word: Word
    line: int
    bootstrap: str = "docker"
    platform: str | None = None
    header: dict[str, str] = field(default_factory=dict)


@dataclass
class EnvSet:
    """``ENV NAME=value`` (or a ``%environment`` export): ``value`` None when it cannot be expanded."""

    name: str
    value: str | None
    line: int
    why: str | None = None
    raw: str = ""


@dataclass
class Stage:
    """One build stage: ``parent`` the stage it starts FROM (None: an image), ``copies`` from others."""

    index: int
    name: str | None
    line: int
    base: Base
    parent: int | None = None
    copies: list[tuple[int, int]] = field(default_factory=list)
    #: ``(path in the image, path in the build context, into)`` of what COPY/ADD or ``%files`` brings in, in file
    #: order; ``into``: the image path is a folder a file source goes into (a folder source's content always does)
    files: list[tuple[str, str, bool]] = field(default_factory=list)
    commands: list[Command] = field(default_factory=list)
    env: list[EnvSet] = field(default_factory=list)


@dataclass
class Parsed:
    """A parsed file: its ``stages`` in file order (the last makes the image) and the parser's notes."""

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
        """The stages the final image depends on (FROM, COPY --from, %files from), in file order."""
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
    """The lines of ``path`` (bounded, UTF-8, LF), checked: no control character but tab, no merge conflict. Raises
    Unreachable (exit 3) when unreadable, Malformed (exit 3) naming the line."""
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
    return Var(PLATFORM_ARGS[name], None, "platform", None, name) if name in PLATFORM_ARGS else None
