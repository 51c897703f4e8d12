"""Words as ``/bin/sh`` and Docker read them, with every variable expanded that can be. ``shell=True``: a ``RUN`` line
or ``%post`` script as POSIX sh reads it; ``shell=False``: Docker's expansion of instruction values (split on
blanks, ``$(`` kept). What cannot be expanded (an unset variable, ``$(...)``, ``$1``, bash-only forms) is never
guessed: ``text=None`` and ``why``. Bounded by :data:`MAX_VALUE`, :data:`MAX_DEPTH` and :data:`MAX_PATTERN_VALUE`;
linear."""

from __future__ import annotations

import bisect
import fnmatch
import re
from collections.abc import Callable
from dataclasses import dataclass, field

from .flow import Flow

#: Longest expanded value, in characters.
MAX_VALUE = 65536
#: Deepest ``${...}`` nesting expanded.
MAX_DEPTH = 16
#: Longest value ``#``/``%`` pattern removal runs on (it is quadratic in the value).
MAX_PATTERN_VALUE = 1024
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_ASSIGN = re.compile(r"\A([A-Za-z_][A-Za-z0-9_]*)=")
_PLAIN_SHELL = re.compile(r"[^\s\\'\"$`;&|()<>#]+")
_PLAIN_INSTR = re.compile(r"[^\s\\'\"$]+")
_PARAM = re.compile(r"([A-Za-z_][A-Za-z0-9_]*)(.*)\Z", re.S)
_OPS = (":-", ":=", ":+", ":?", "##", "%%", "-", "=", "+", "?", "#", "%")
_BLANKS = re.compile(r"[ \t\n]+")
_TEMPLATE = re.compile(r"\{\{[ \t]*([A-Za-z_][A-Za-z0-9_]*)[ \t]*\}\}")


@dataclass(frozen=True)
class Var:
    """A variable's value where it was set (``value`` None: unknown, ``why``); ``line`` None: not in the file."""

    value: str | None
    line: int | None
    kind: str
    why: str | None = None
    name: str = ""


Lookup = Callable[[str], "Var | None"]


@dataclass
class Word:
    """One word after quote removal and expansion (``text`` None: cannot be, ``why``), and as written."""

    text: str | None
    raw: str
    line: int
    why: str | None = None
    uses: tuple[Var, ...] = ()


@dataclass
class Command:
    """One simple command: words without prefix assignments, and the variables visible to it."""

    words: list[Word]
    line: int
    assigns: dict[str, Var] = field(default_factory=dict)
    lookup: Lookup = lambda name: None
    cwd: str = "/"
    #: the condition audit cannot decide under which it runs (``case $CUDA in 12*)``); None: it runs
    alternative: str | None = None


class Source:
    """Text with the line each piece came from; :meth:`line_at` maps an offset back to its line."""

    def __init__(self, pieces: list[tuple[int, str]]) -> None:
        self.offsets: list[int] = []
        self.lines: list[int] = []
        parts, pos = [], 0
        for line, text in pieces:
            self.offsets.append(pos)
            self.lines.append(line)
            parts.append(text)
            pos += len(text) + 1
        self.text = "\n".join(parts)

    def line_at(self, offset: int) -> int:
        k = bisect.bisect_right(self.offsets, offset) - 1
        return self.lines[max(k, 0)] if self.lines else 1


class _Unknown(Exception):
    def __init__(self, why: str) -> None:
        super().__init__(why)
        self.why = why


@dataclass
class _Part:
    text: str | None
    split: bool = False
    keep: bool = False  # a quoted part makes a word even when empty
    why: str | None = None


def _known(parts: list[_Part]) -> list[str] | _Part:
    """Every part's text, else the part saying why not: none (cannot be expanded), over MAX_VALUE in all."""
    texts = [p.text for p in parts if p.text is not None]
    if len(texts) < len(parts):
        return next(p for p in parts if p.text is None)
    if sum(map(len, texts)) > MAX_VALUE:  # before anything is joined
        return _Part(None, why=f"expands to more than {MAX_VALUE} characters")
    return texts


def _short(text: str, limit: int = 60) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."


def remove_pattern(value: str, op: str, pattern: str) -> str:
    """sh's ``${V#p}``, ``##``, ``%``, ``%%`` with glob ``pattern``; ``value`` already bounded by the caller."""
    rx = re.compile(fnmatch.translate(pattern))  # sh's glob: *, ?, [...], [!...]
    n = len(value)
    if op in ("#", "##"):
        order = range(0, n + 1) if op == "#" else range(n, -1, -1)
        for k in order:
            if rx.fullmatch(value, 0, k):
                return value[k:]
        return value
    order = range(n, -1, -1) if op == "%" else range(0, n + 1)
    for k in order:
        if rx.fullmatch(value, k, n):
            return value[:k]
    return value


class Scanner:
    """Splits a :class:`Source` into commands (shell) or words (instructions), expanding with ``lookup``."""

    def __init__(self, src: Source, lookup: Lookup, *, shell: bool,
                 undeclared: str = "is not set by this file (the base image may set it)",
                 templates: Lookup | None = None) -> None:
        self.src = src
        self.s = src.text
        self.n = len(self.s)
        self.i = 0
        self.shell = shell
        self.file_lookup = lookup
        self.local: dict[str, Var] = {}
        self.undeclared = undeclared
        self.plain = _PLAIN_SHELL if shell else _PLAIN_INSTR
        self.templates = templates
        if templates is not None:  # Apptainer build arguments: {{ NAME }}
            self.plain = re.compile(self.plain.pattern.replace("]+", "{]+"))
        self.heredocs: list[tuple[str, bool]] = []
        self.flow = Flow()

    # ------------------------------------------------------------------ lookups
    def lookup(self, name: str) -> Var | None:
        if name in self.local:
            return self.local[name]
        return self.file_lookup(name)

    def _value(self, name: str, uses: list[Var]) -> str:
        var = self.lookup(name)
        if var is None:
            raise _Unknown(f"${name} {self.undeclared}")
        uses.append(var)
        if var.value is None:
            raise _Unknown(var.why or f"${name} has no known value")
        return var.value

    # ------------------------------------------------------------------ words
    def words(self) -> list[Word]:
        """Every word of the text (instruction mode: blanks separate words)."""
        out: list[Word] = []
        while True:
            self._blanks()
            if self.i >= self.n:
                return out
            if self.shell and self.s[self.i] in ";&|()<>\n#":
                self.i += 1
                continue
            out.extend(self._word())

    def _blanks(self) -> None:
        s, n = self.s, self.n
        while self.i < n:
            c = s[self.i]
            if c in " \t" or (c == "\n" and not self.shell):
                self.i += 1
            elif c == "\\" and self.i + 1 < n and s[self.i + 1] == "\n":
                self.i += 2
            else:
                return

    def _word(self) -> list[Word]:
        start = self.i
        parts: list[_Part] = []
        uses: list[Var] = []
        s, n = self.s, self.n
        stop = " \t\n;&|()<>" if self.shell else " \t\n"
        while self.i < n:
            c = s[self.i]
            if c in stop:
                break
            m = self.plain.match(s, self.i)
            if m:
                parts.append(_Part(m.group()))
                self.i = m.end()
            elif c == "\\":
                nxt = s[self.i + 1: self.i + 2]
                self.i += 2
                if nxt != "\n":
                    parts.append(_Part(nxt, keep=True))
            elif c == "'":
                j = s.find("'", self.i + 1)
                if j < 0:
                    parts.append(_Part(None, why="an unterminated single quote"))
                    self.i = n
                else:
                    parts.append(_Part(s[self.i + 1: j], keep=True))
                    self.i = j + 1
            elif c == '"':
                self._dquote(parts, uses)
            elif c == "$":
                parts.append(self._dollar(uses, quoted=False, depth=0))
            elif c == "`" and self.shell:
                parts.append(self._backtick())
            elif c == "{" and self.templates is not None and (t := _TEMPLATE.match(s, self.i)):
                parts.append(self._template(t, uses))
            else:  # '#' inside a word, '`' in instruction mode, '{'
                parts.append(_Part(c))
                self.i += 1
        raw = s[start: self.i]
        return self._fields(parts, raw, self.src.line_at(start), tuple(uses))

    def _fields(self, parts: list[_Part], raw: str, line: int, uses: tuple[Var, ...]) -> list[Word]:
        known = _known(parts)
        if isinstance(known, _Part):
            return [Word(None, raw, line, known.why, uses)]
        fields: list[str] = []
        cur: list[str] = []
        started = False
        for p, text in zip(parts, known, strict=True):
            if not p.split:
                cur.append(text)
                started = started or p.keep or bool(text)
                continue
            pieces = _BLANKS.split(text)
            for k, piece in enumerate(pieces):
                if k > 0 and (started or cur):
                    fields.append("".join(cur))
                    cur, started = [], False
                if piece:
                    cur.append(piece)
                    started = True
        if started:
            fields.append("".join(cur))
        return [Word(f, raw, line, None, uses) for f in fields]

    def _dquote(self, parts: list[_Part], uses: list[Var]) -> None:
        s, n = self.s, self.n
        self.i += 1
        buf: list[str] = []
        while self.i < n:
            c = s[self.i]
            if c == '"':
                self.i += 1
                if sum(len(b) for b in buf) > MAX_VALUE:
                    parts.append(_Part(None, why=f"expands to more than {MAX_VALUE} characters"))
                else:
                    parts.append(_Part("".join(buf), keep=True))
                return
            if c == "\\":
                nxt = s[self.i + 1: self.i + 2]
                self.i += 2
                if nxt == "\n":
                    continue
                buf.append(nxt if nxt in '$`"\\' else "\\" + nxt)
            elif c == "`" and self.shell:
                parts.append(self._backtick())
            elif (t := _TEMPLATE.match(s, self.i) if c == "{" and self.templates is not None else None) or c == "$":
                part = self._template(t, uses) if t else self._dollar(uses, quoted=True, depth=0)
                if part.text is None:
                    parts.append(part)
                else:
                    buf.append(part.text)
            else:
                stops = '"\\$`{' if self.templates is not None else '"\\$`'
                j = self.i + 1
                while j < n and s[j] not in stops:
                    j += 1
                buf.append(s[self.i: j])
                self.i = j
        parts.append(_Part(None, why="an unterminated double quote"))

    def _template(self, m: re.Match, uses: list[Var]) -> _Part:
        """``{{ NAME }}``: an Apptainer build argument, substituted before the shell reads the text."""
        self.i = m.end()
        var = self.templates(m.group(1)) if self.templates else None
        if var is None:
            return _Part(None, why=f"{{{{ {m.group(1)} }}}} is not a build argument of %arguments "
                                   "(give it with --build-arg)")
        uses.append(var)
        return _Part(var.value, why=var.why) if var.value is not None else _Part(None, why=var.why)

    def _backtick(self) -> _Part:
        j = self.s.find("`", self.i + 1)
        end = self.n if j < 0 else j + 1
        raw = self.s[self.i: end]
        self.i = end
        return _Part(None, why=f"{_short(raw)} is a command substitution (its output is known only when it runs)")

    def _match(self, i: int, open_: str, close: str) -> int:
        """Offset just after the ``close`` matching the ``open_`` at ``i``; ``self.n`` when unmatched."""
        s, n, depth = self.s, self.n, 0
        while i < n:
            c = s[i]
            if c == "\\":
                i += 2
                continue
            if c == "'" and open_ == "(":
                j = s.find("'", i + 1)
                i = n if j < 0 else j + 1
                continue
            if c == open_:
                depth += 1
            elif c == close:
                depth -= 1
                if depth == 0:
                    return i + 1
            i += 1
        return n

    def _dollar(self, uses: list[Var], quoted: bool, depth: int) -> _Part:
        s, i = self.s, self.i
        nxt = s[i + 1: i + 2]
        if nxt == "(" and self.shell:
            end = self._match(i + 1, "(", ")")
            self.i = end
            raw = s[i:end]
            what = "an arithmetic expansion" if raw.startswith("$((") else "a command substitution"
            return _Part(None, why=f"{_short(raw)} is {what} (its value is known only when it runs)")
        if nxt == "{":
            end = self._match(i + 1, "{", "}")
            self.i = end
            body = s[i + 2: end - 1] if end <= self.n and s[end - 1: end] == "}" else None
            if body is None:
                return _Part(None, why=f"{_short(s[i:end])} has no closing brace")
            try:
                return _Part(self._param(body, uses, depth), split=not quoted)
            except _Unknown as e:
                return _Part(None, why=e.why)
        m = _NAME.match(s, i + 1)
        if m:
            self.i = m.end()
            try:
                return _Part(self._value(m.group(), uses), split=not quoted)
            except _Unknown as e:
                return _Part(None, why=e.why)
        if nxt and nxt in "@*#?$!-0123456789":
            self.i = i + 2
            return _Part(None, why=f"${nxt} is a special parameter of the shell (known only when it runs)")
        self.i = i + 1
        return _Part("$")

    def _param(self, body: str, uses: list[Var], depth: int) -> str:
        """The value of ``${body}``; raises :class:`_Unknown` naming what cannot be expanded."""
        if depth >= MAX_DEPTH:
            raise _Unknown(f"${{...}} nests deeper than {MAX_DEPTH} levels")
        whole = "${" + _short(body) + "}"
        if body.startswith("#") and _NAME.fullmatch(body[1:]):
            return str(len(self._value(body[1:], uses)))
        m = _PARAM.match(body)
        if not m:
            raise _Unknown(f"{whole} is not a form sh expands")
        name, rest = m.group(1), m.group(2)
        if not rest:
            return self._value(name, uses)
        op = next((o for o in _OPS if rest.startswith(o)), None)
        if op is None:
            raise _Unknown(f"{whole} is a form sh does not expand (bash only)")
        word_text = rest[len(op):]
        value = self._value(name, uses)
        if op in ("#", "##", "%", "%%"):
            if len(value) > MAX_PATTERN_VALUE:
                raise _Unknown(f"{whole}: pattern removal on a value over {MAX_PATTERN_VALUE} characters")
            return remove_pattern(value, op, self._inner(word_text, uses, depth))
        empty = value == "" and op.startswith(":")
        if op in (":-", "-", ":=", "="):
            return self._inner(word_text, uses, depth) if empty else value
        if op in (":+", "+"):
            return "" if empty else self._inner(word_text, uses, depth)
        if empty:  # :? and ? on an empty/unset value: the shell stops with an error
            raise _Unknown(f"{whole} stops the shell when ${name} is empty")
        return value

    def _inner(self, text: str, uses: list[Var], depth: int) -> str:
        """``text`` (the word of ``${A:-word}``) expanded, quotes removed, blanks kept."""
        sub = Scanner(Source([(self.src.line_at(self.i), text)]), self.lookup, shell=self.shell,
                      undeclared=self.undeclared, templates=self.templates)
        sub.plain = re.compile(r"[^\\'\"$`]+")
        parts: list[_Part] = []
        while sub.i < sub.n:
            c = sub.s[sub.i]
            m = sub.plain.match(sub.s, sub.i)
            if m:
                parts.append(_Part(m.group()))
                sub.i = m.end()
            elif c == "\\":
                parts.append(_Part(sub.s[sub.i + 1: sub.i + 2]))
                sub.i += 2
            elif c == "'":
                j = sub.s.find("'", sub.i + 1)
                j = sub.n if j < 0 else j
                parts.append(_Part(sub.s[sub.i + 1: j]))
                sub.i = j + 1
            elif c == '"':
                sub._dquote(parts, uses)
            elif c == "$":
                parts.append(sub._dollar(uses, quoted=True, depth=depth + 1))
            else:
                parts.append(sub._backtick() if self.shell else _Part(c))
                if not self.shell:
                    sub.i += 1
        known = _known(parts)
        if isinstance(known, _Part):
            raise _Unknown(known.why or "cannot be expanded")
        return "".join(known)

    # ------------------------------------------------------------------ commands
    def commands(self) -> list[Command]:
        """The simple commands of a script, the script's own assignments applied to those after them."""
        out: list[Command] = []
        words: list[Word] = []
        s = self.s
        while True:
            self._blanks()
            if self.i >= self.n:
                break
            c = s[self.i]
            if c == "#":
                j = s.find("\n", self.i)
                self.i = self.n if j < 0 else j
                continue
            if c in "\n;&|()":
                op = s[self.i: self.i + 2] if s[self.i: self.i + 2] in ("&&", "||", ";;") else c
                self._end(words, out, op)
                words = []
                self.i += len(op)
                if c == "\n":
                    self._skip_heredocs()
                continue
            if c in "<>":
                self._redirect()
                continue
            got = self._word()
            if self.i < self.n and s[self.i] in "<>" and got and got[0].raw.isdigit():
                continue  # a file descriptor number before a redirection
            words.extend(got)
        self._end(words, out, ";")
        return out

    def _redirect(self) -> None:
        s = self.s
        j = self.i
        while j < self.n and s[j] in "<>&|-":
            j += 1
        op = s[self.i: j]
        self.i = j
        self._blanks()
        target = self._word() if self.i < self.n and s[self.i] not in "\n;&|()" else []
        if op.startswith("<<") and not op.startswith("<<<") and target:
            delim = re.sub(r"[\"'\\]", "", target[0].raw)
            self.heredocs.append((delim, op.startswith("<<-")))

    def _skip_heredocs(self) -> None:
        while self.heredocs:
            delim, tabs = self.heredocs.pop(0)
            while self.i < self.n:
                j = self.s.find("\n", self.i)
                j = self.n if j < 0 else j
                line = self.s[self.i: j]
                self.i = min(j + 1, self.n)
                if (line.lstrip("\t") if tabs else line) == delim:
                    break

    def _end(self, words: list[Word], out: list[Command], op: str) -> None:
        rest = self.flow.reserved(words, op)
        assigns: dict[str, Var] = {}
        k = 0
        while rest is not None and k < len(rest) and (m := _ASSIGN.match(rest[k].raw)):
            assigns[m.group(1)] = self._assigned(m.group(1), rest[k])
            k += 1
        why = self.flow.runs(rest[k:]) if rest is not None else None
        if rest is None or why is None:
            return
        rest = rest[k:]
        if why:
            assigns = {n: Var(None, v.line, "shell", f"${n} is set at line {v.line} depending on {why}: audit "
                              "cannot tell whether it is", n) for n, v in assigns.items()}
        if not rest:
            self.local.update(assigns)
            return
        head = rest[0].text
        if head in ("export", "readonly", "local", "declare", "typeset"):
            for w in rest[1:]:
                m = _ASSIGN.match(w.raw)
                if m:
                    self.local[m.group(1)] = self._assigned(m.group(1), w)
        elif head == "unset":
            for w in rest[1:]:
                if w.text and _NAME.fullmatch(w.text):
                    self.local[w.text] = Var(None, w.line, "shell", f"${w.text} is unset at line {w.line}", w.text)
        local = dict(self.local)
        file_lookup = self.file_lookup

        def lookup(name: str, _local=local, _assigns=assigns) -> Var | None:
            return _assigns.get(name) or _local.get(name) or file_lookup(name)

        out.append(Command(rest, rest[0].line, assigns, lookup, alternative=why or None))

    @staticmethod
    def _assigned(name: str, word: Word) -> Var:
        if word.text is None:
            return Var(None, word.line, "shell", word.why, name)
        return Var(word.text[len(name) + 1:], word.line, "shell", None, name)
