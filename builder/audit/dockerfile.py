"""Dockerfiles and Containerfiles: instructions from dockerfile-parse, ARG/ENV expanded as Docker does. Two things
dockerfile-parse reads differently from BuildKit are settled first (line numbers kept): a blank line inside a
continuation and here-documents. Variable scoping follows the Dockerfile reference ("ARG", "ENV", "Understand how ARG
and FROM interact"); what the base image sets is unknown, so a variable this file does not set is named, not guessed."""

from __future__ import annotations

import dataclasses
import io
import json
import posixpath
import re
from dataclasses import dataclass, field

from dockerfile_parse import DockerfileParser

from .parsed import PLATFORM_ARGS, Base, EnvSet, Malformed, Note, Parsed, Stage, platform_var, read_lines
from .shell import Command, Scanner, Source, Var, Word

#: Instructions of the Dockerfile reference (plus dockerfile-parse's COMMENT).
INSTRUCTIONS = frozenset({"FROM", "RUN", "CMD", "LABEL", "MAINTAINER", "EXPOSE", "ENV", "ADD", "COPY",
                          "ENTRYPOINT", "VOLUME", "USER", "WORKDIR", "ARG", "ONBUILD", "STOPSIGNAL",
                          "HEALTHCHECK", "SHELL", "COMMENT"})
_KEYWORD = re.compile(r"\A\s*([A-Za-z]+)")
_HEREDOC = re.compile(r"<<(-?)([\"']?)([A-Za-z_][A-Za-z0-9_]*)\2")
_SHELLS = frozenset({"sh", "bash", "/bin/sh", "/bin/bash", "/usr/bin/bash", "/usr/bin/env"})
_DIRECTIVE = re.compile(r"#[ \t]*([A-Za-z][A-Za-z0-9_-]*)[ \t]*=[ \t]*(.*?)[ \t]*")
_NO_DEFAULT = "ARG {name} (line {line}) has no default: its value is given with --build-arg"


@dataclass
class _Heredoc:
    """The here-document bodies of the instruction at 0-based line ``start``."""

    start: int
    bodies: list[tuple[str, bool, list[tuple[int, str]]]] = field(default_factory=list)


def _prepare(file: str, lines: list[str]) -> tuple[list[str], dict[int, _Heredoc]]:
    """The text dockerfile-parse reads (same line count) and the here-documents by instruction line. Continuations reach
    it as stubs: it joins them by repeated string addition, quadratic in length."""
    feed = list(lines)
    heredocs: dict[int, _Heredoc] = {}
    i, cont, current = 0, False, None
    while i < len(lines):
        line = lines[i]
        stripped = line.strip()
        if cont and (not stripped or stripped.startswith("#")):
            feed[i] = "#"
            i += 1
            continue
        if not cont:
            if not stripped or stripped.startswith("#"):
                i += 1
                continue
            m = _KEYWORD.match(line)
            current = (m.group(1).upper() if m else "", i)
            if len(stripped.split(None, 1)) == 1 and not stripped.endswith("\\"):
                raise Malformed(file, i + 1, f"{stripped[:40]!r} has no arguments")
        cont = line.rstrip().endswith("\\")
        if current and current[1] != i:
            feed[i] = " \\" if cont else " x"
        i += 1
        if current and current[0] in ("RUN", "COPY", "ADD") and not cont:
            marks = _HEREDOC.findall(" ".join(lines[current[1]: i]))
            if marks:
                doc = heredocs.setdefault(current[1], _Heredoc(current[1]))
                for dash, _quote, delim in marks:
                    body: list[tuple[int, str]] = []
                    while i < len(lines):
                        text = lines[i]
                        feed[i] = "#"
                        i += 1
                        if (text.lstrip("\t") if dash else text) == delim:
                            break
                        body.append((i, text))
                    doc.bodies.append((delim, bool(dash), body))
    return feed, heredocs


class _Reader:
    """Walks the instructions, keeping Docker's variable scopes."""

    def __init__(self, file: str, lines: list[str], build_args: dict[str, str]) -> None:
        self.file = file
        self.lines = lines
        self.build_args = build_args
        self.global_args: dict[str, Var] = {}
        self.stages: list[Stage] = []
        self.notes: list[Note] = []
        self.others: list[tuple[int, str]] = []
        self.names: dict[str, int] = {}
        self.args: dict[str, Var] = {}
        self.env: dict[str, Var] = {}
        self.env_by_stage: list[dict[str, Var]] = []
        self.workdir = "/"

    # --------------------------------------------------------------- helpers
    def source(self, item: dict, keyword: bool = True) -> Source:
        """The instruction's text without the keyword, comment and blank lines, each piece with its line."""
        start, end = item["startline"], item["endline"]
        pieces: list[tuple[int, str]] = []
        for k in range(start, end + 1):
            text = self.lines[k]
            if k > start and (not text.strip() or text.lstrip().startswith("#")):
                continue
            if k == start and keyword:
                text = _KEYWORD.sub("", text, count=1)
            pieces.append((k + 1, text))
        return Source(pieces)

    def lookup_stage(self, name: str) -> Var | None:
        var = self.env.get(name) or self.args.get(name)
        if var is None and name in self.global_args:  # Docker: a global ARG is not visible in a stage
            g = self.global_args[name]
            return Var(None, g.line, "ARG", f"ARG {name} (line {g.line}) is declared before FROM only: declare it "
                       f"again in the stage (ARG {name}) to use it there", name)
        return var

    def lookup_global(self, name: str) -> Var | None:
        return self.global_args.get(name) or platform_var(name)

    def words(self, item: dict, lookup,
              undeclared: str = "is not set by this file (the base image may set it)") -> list[Word]:
        return Scanner(self.source(item), lookup, shell=False, undeclared=undeclared).words()

    def note_unknown(self, word: Word, what: str) -> None:
        self.notes.append(Note("warning", "unexpanded", word.line, word.raw,
                               f"{what} cannot be expanded: {word.why}; audited without it"))

    # --------------------------------------------------------------- instructions
    def arg(self, item: dict) -> None:
        scope_global = not self.stages
        lookup = self.lookup_global if scope_global else self.lookup_stage
        line = item["startline"] + 1
        for w in self.words(item, lookup):
            raw_name = w.raw.split("=", 1)[0]
            if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", raw_name):
                continue
            name = raw_name
            if name in self.build_args:
                var = Var(self.build_args[name], None, "--build-arg", None, name)
            elif "=" in w.raw:
                var = (Var(w.text.split("=", 1)[1], line, "ARG", None, name) if w.text is not None
                       else Var(None, line, "ARG", w.why, name))
            elif not scope_global and name in self.global_args:
                var = self.global_args[name]
            elif (platform := platform_var(name)) is not None:
                var = platform
            else:
                var = Var(None, line, "ARG", _NO_DEFAULT.format(name=name, line=line), name)
            (self.global_args if scope_global else self.args)[name] = var

    def env_(self, item: dict) -> None:
        words = self.words(item, self.lookup_stage)
        line = item["startline"] + 1
        pairs: list[tuple[str, Word, str | None]] = []
        if words and "=" not in words[0].raw.split("$", 1)[0]:  # legacy form: ENV NAME value...
            rest = words[1:]
            unknown = next((w for w in rest if w.text is None), None)
            value = None if unknown else " ".join(w.text or "" for w in rest)  # all known here
            pairs.append((words[0].raw, unknown or (rest[0] if rest else words[0]), value))
        else:
            for w in words:
                if "=" not in w.raw:
                    continue
                name = w.raw.split("=", 1)[0]
                pairs.append((name, w, w.text.split("=", 1)[1] if w.text is not None and "=" in w.text else None))
        for name, w, value in pairs:
            if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_.-]*", name):
                continue
            self.env[name] = Var(value, line, "ENV", None if value is not None else w.why, name)
            self.stages[-1].env.append(EnvSet(name, value, line, None if value is not None else w.why, w.raw))

    def from_(self, item: dict) -> None:
        words = self.words(item, self.lookup_global, "is not declared by an ARG before the first FROM")
        line = item["startline"] + 1
        platform = None
        while words and (words[0].text or "").startswith("--"):
            flag = words.pop(0).text or ""
            if flag.startswith("--platform="):
                platform = flag.split("=", 1)[1]
                if platform != PLATFORM_ARGS["TARGETPLATFORM"]:
                    self.notes.append(Note("note", "platform", line, flag, "audit's facts are for linux/amd64 wheels "
                                           f"and images; this stage is built for {platform}"))
        if not words:
            raise Malformed(self.file, line, "FROM names no image")
        image = words[0]
        name = None
        if len(words) >= 3 and (words[1].text or "").lower() == "as":
            name = (words[2].text or words[2].raw).lower()
        if image.text is None:
            self.note_unknown(image, "the base image")
        parent = self.stage_index(image.text) if image.text is not None else None
        self.args = {}
        self.workdir = "/"
        self.env = dict(self.env_by_stage[parent]) if parent is not None else {}
        stage = Stage(len(self.stages), name, line, Base(image, line, "docker", platform), parent)
        self.stages.append(stage)
        if name:
            if name in self.names:
                first = self.stages[self.names[name]].line
                raise Malformed(self.file, line, f"duplicate stage name {name[:60]!r} (first at line {first})")
            self.names[name] = stage.index
        self.env_by_stage.append(self.env)

    def stage_index(self, ref: str) -> int | None:
        low = ref.lower()
        if low in self.names:
            return self.names[low]
        if re.fullmatch(r"[0-9]{1,4}", ref) and int(ref) < len(self.stages):
            return int(ref)
        return None

    def copy(self, item: dict) -> None:
        words = [w.text for w in self.words(item, self.lookup_stage)]
        while words and (words[0] or "").startswith("--"):
            text = words.pop(0) or ""
            if text.startswith("--from="):
                src = self.stage_index(text.split("=", 1)[1])
                if src is not None:
                    self.stages[-1].copies.append((src, item["startline"] + 1))
                return
        if len(words) < 2 or None in words or (words[0] or "").startswith("["):
            return
        *sources, dest = [w for w in words if w is not None]
        into = posixpath.normpath(posixpath.join(self.workdir, dest))
        many = len(sources) > 1 or dest.endswith("/") or posixpath.basename(dest) in (".", "..")
        self.stages[-1].files.extend((into, src, many) for src in sources if "://" not in src)

    def run(self, item: dict, heredoc: _Heredoc | None) -> None:
        src = self.source(item)
        text = src.text
        i = 0
        while True:  # RUN flags: --mount=..., --network=..., --security=...
            m = re.compile(r"(?:\s|\\\n)*(--[A-Za-z-]+(?:=\S*)?)").match(text, i)
            if not m:
                break
            i = m.end()
        snapshot = {**self.args, **self.env}
        hidden = self.lookup_stage

        def lookup(name: str) -> Var | None:
            return snapshot.get(name) or (hidden(name) if name in self.global_args else None)
        rest = text[i:]
        start_line = src.line_at(i)
        if rest.strip().startswith("[") and heredoc is None:
            self.stages[-1].commands.extend(self.exec_form(rest, start_line, lookup))
            return
        body = Source(self.heredoc_pieces(rest, start_line, heredoc)) if heredoc is not None else _slice(src, i)
        cmds = Scanner(body, lookup, shell=True).commands()
        self.stages[-1].commands += [dataclasses.replace(c, cwd=self.workdir) for c in cmds]

    @staticmethod
    def heredoc_pieces(rest: str, line: int, heredoc: _Heredoc) -> list[tuple[int, str]]:
        """The script of a RUN with here-documents: the body itself for ``RUN <<EOF``, else line and bodies."""
        before = rest.split("<<", 1)[0].replace("\\\n", " ").split()
        delim, _tabs, body = heredoc.bodies[0]
        if not before or (before[0] in _SHELLS and all(b.startswith("-") for b in before[1:])):
            return body
        pieces = [(line, rest)]
        for delim, _tabs, body in heredoc.bodies:
            pieces.extend(body)
            pieces.append((body[-1][0] + 1 if body else line + 1, delim))
        return pieces

    @staticmethod
    def exec_form(text: str, line: int, lookup) -> list[Command]:
        """``RUN ["pip", ...]``: no shell, no expansion; ``["sh", "-c", SCRIPT]`` runs SCRIPT as shell."""
        try:
            argv = json.loads(text.replace("\\\n", ""))
        except ValueError:
            return Scanner(Source([(line, text)]), lookup, shell=True).commands()
        if not (isinstance(argv, list) and argv and all(isinstance(a, str) for a in argv)):
            return []
        if argv[0] in _SHELLS and "-c" in argv[1:-1]:
            script = argv[argv.index("-c") + 1]
            return Scanner(Source([(line, script)]), lookup, shell=True).commands()
        return [Command([Word(a, a, line) for a in argv], line, {}, lookup)]


def _slice(src: Source, offset: int) -> Source:
    """``src`` from ``offset`` on, lines kept."""
    pieces: list[tuple[int, str]] = []
    for k, start in enumerate(src.offsets):
        end = src.offsets[k + 1] - 1 if k + 1 < len(src.offsets) else len(src.text)
        if end < offset:
            continue
        pieces.append((src.lines[k], src.text[max(start, offset): end]))
    return Source(pieces)


def _directives(file: str, lines: list[str]) -> list[str]:
    """``lines`` after the parser directives (Dockerfile reference, "Parser directives"); with ``# escape=``` a
    backtick ends a continued line and a backslash is plain text."""
    escape, out = "\\", list(lines)
    for n, line in enumerate(lines):
        m = _DIRECTIVE.fullmatch(line.strip())
        if m is None or m.group(1).lower() not in ("syntax", "escape", "check"):
            break
        out[n] = "#"
        if m.group(1).lower() == "escape":
            if m.group(2) not in ("\\", "`"):
                raise Malformed(file, n + 1, f"invalid escape token {m.group(2)[:20]!r}: Docker takes only \\ or `")
            escape = m.group(2)
    if escape == "`":
        for n, line in enumerate(out):
            text = line.rstrip()
            out[n] = text[:-1] + "\\" if text.endswith("`") else text[:-1] if text.endswith("\\") else line
    return out


def parse(file: str, build_args: dict[str, str] | None = None) -> Parsed:
    """The :class:`~.parsed.Parsed` stages of the Dockerfile at ``file``. Raises Unreachable (exit 3) when unreadable,
    Malformed (exit 3) naming the line."""
    lines = _directives(file, read_lines(file))
    feed, heredocs = _prepare(file, lines)
    parser = DockerfileParser(fileobj=io.BytesIO("\n".join(feed).encode("utf-8")))
    reader = _Reader(file, lines, dict(build_args or {}))
    structure = parser.structure
    if not any(i["instruction"] == "FROM" for i in structure):
        first = next((i["startline"] + 1 for i in structure if i["instruction"] != "COMMENT"), 1)
        raise Malformed(file, first, "no FROM instruction; a Dockerfile starts its first stage with FROM")
    for item in structure:
        name = item["instruction"]
        line = item["startline"] + 1
        if name == "COMMENT":
            continue
        if name not in INSTRUCTIONS:
            raise Malformed(file, line, f"unknown instruction {lines[line - 1].split()[0][:40]!r}")
        if name == "FROM":
            reader.from_(item)
        elif not reader.stages and name != "ARG":
            raise Malformed(file, line, f"{name} before the first FROM; a Dockerfile starts its first stage with FROM")
        elif name == "ARG":
            reader.arg(item)
        elif name == "ENV":
            reader.env_(item)
        elif name == "RUN":
            reader.run(item, heredocs.get(item["startline"]))
        else:
            if name in ("COPY", "ADD"):
                reader.copy(item)
            elif name == "WORKDIR" and (words := reader.words(item, reader.lookup_stage)) and words[0].text:
                reader.workdir = posixpath.join(reader.workdir, words[0].text)
            text = " ".join(lines[line - 1: min(item["endline"] + 1, line + 3)])
            reader.others.append((line, " ".join(text.split())[:300]))
    return Parsed(file, "dockerfile", reader.stages, reader.notes, reader.others)
