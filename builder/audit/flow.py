"""Which commands of a script run: ``&&``/``||``, ``if``/``elif``/``else`` and ``case`` decided where ``[``/``test``
or a pattern can be evaluated over known words, else "cannot tell" (None), never a guess. Loop bodies run once."""

from __future__ import annotations

import functools
import operator
import re
from dataclasses import dataclass, field
from fnmatch import fnmatchcase
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .shell import Word

#: Words ``sh`` reads as reserved at the start of a command; dropped before the command name.
RESERVED = frozenset({"if", "then", "else", "elif", "fi", "do", "done", "while", "until", "for", "case",
                      "esac", "!", "{", "}", "in"})
_INT = {"-eq": operator.eq, "-ne": operator.ne, "-gt": operator.gt, "-ge": operator.ge, "-lt": operator.lt,
        "-le": operator.le}
Tri = bool | None
_TRUE: Tri = True
_FALSE: Tri = False


def _and(a: Tri, b: Tri) -> Tri:
    return False if a is False or b is False else None if a is None or b is None else True


def _or(a: Tri, b: Tri) -> Tri:
    return True if a is True or b is True else None if a is None or b is None else False


def _not(a: Tri) -> Tri:
    return None if a is None else not a


def test(a: list[str | None]) -> Tri:
    """``[``/``test`` over known words: ``-z``, ``-n``, ``=``, ``!=``, integer comparisons, ``!``; else None."""
    if a[:1] == ["!"]:
        return _not(test(a[1:]))
    if None in a or not 1 <= len(a) <= 3:
        return None
    if len(a) == 1:
        return a[0] != ""
    if len(a) == 2:
        return (a[1] == "") == (a[0] == "-z") if a[0] in ("-z", "-n") else None
    x, op, y = (t or "" for t in a)
    if op in ("=", "==", "!="):
        return (x == y) == (op != "!=")
    ints = all(re.fullmatch(r"-?[0-9]{1,18}", t) for t in (x, y))
    return bool(_INT[op](int(x), int(y))) if op in _INT and ints else None


@dataclass
class _Frame:
    """An open ``if`` or ``case``: does its branch ``run``, was one ``taken`` before (None: cannot tell)."""

    kind: str
    part: str = "cond"
    word: str | None = None
    why: str = ""
    run: Tri = True
    taken: Tri = False
    patterns: list[str | None] = field(default_factory=list)


class Flow:
    """The state of one script as its commands end, each with the operator that ended it."""

    def __init__(self) -> None:
        self.frames: list[_Frame] = []
        self.op = self.before = ";"
        self.status: Tri = True
        self.status_why = "the command before it succeeds"

    def reserved(self, words: list[Word], op: str) -> list[Word] | None:
        """``words`` past the reserved words at their start, each applied; None: no command (patterns, blank)."""
        self.before, self.op = self.op, op
        f = self.frames[-1] if self.frames else None
        if f is not None and f.kind == "case" and f.part == "pattern" and words and words[0].text != "esac":
            f.patterns += [w.text for w in words if w.text != "("]
            if op == ")":
                self._branch(f)
            return None
        if not words:
            self._close(op)
            self.op = self.before if op in ("\n", ";;") else op
            return None
        k = 0
        while k < len(words) and words[k].text in RESERVED:
            w, k = words[k].text, k + 1
            f = self.frames[-1] if self.frames else None
            if w == "if":
                self.frames.append(_Frame("if"))
            elif w == "case" and k < len(words):
                w2 = words[k]
                self.frames.append(_Frame("case", "pattern", w2.text, f"case {w2.raw[:30]} (line {w2.line})"))
                k += 2 if k + 1 < len(words) and words[k + 1].text == "in" else 1
                if k < len(words):  # a pattern on the case line
                    return self.reserved(words[k:], op)
            elif f is not None and f.kind == "if" and w in ("then", "elif", "else"):
                if w == "then":
                    f.run, f.why = _and(_not(f.taken), self.status), self.status_why
                else:
                    f.taken, f.run = _or(f.taken, f.run), _not(_or(f.taken, f.run)) if w == "else" else True
                f.part, self.status = "cond" if w == "elif" else "body", True
            elif f is not None and w in ("fi", "esac"):
                self.frames.pop()
        return words[k:]

    def runs(self, rest: list[Word]) -> str | None:
        """Whether the command ``rest`` runs: None no, "" yes, else the condition audit cannot decide."""
        chain = self.status if self.before == "&&" else _not(self.status) if self.before == "||" else True
        runs = _and(chain, self._active())
        why = "" if runs else None if runs is False else \
            "; ".join(f.why for f in self.frames if f.run is None) or self.status_why
        if runs is not False:
            status: Tri = rest[0].text != "false" if rest else True
            if rest and rest[0].text in ("[", "test"):
                args = [w.text for w in rest[1:]]
                status = test(args[:-1] if rest[0].text == "[" and args[-1:] == ["]"] else args)
                self.status_why = f"the outcome of {' '.join(w.raw for w in rest)[:40]} (line {rest[0].line})"
            self.status = status if runs else None
        self._close(self.op)
        return why

    def _close(self, op: str) -> None:
        if op == ";;" and self.frames and self.frames[-1].kind == "case":
            f = self.frames[-1]
            f.taken, f.part, f.patterns = _or(f.taken, f.run), "pattern", []

    def _branch(self, f: _Frame) -> None:
        """The case branch whose patterns were just read: runs when the word matches one and none before did."""
        match = functools.reduce(_or, [None if f.word is None or p is None else fnmatchcase(f.word, p)
                                       for p in f.patterns], _FALSE)
        f.run, f.part = _and(_not(f.taken), match), "body"

    def _active(self) -> Tri:
        return functools.reduce(_and, [f.run for f in self.frames if f.part != "cond"], _TRUE)
