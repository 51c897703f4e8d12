"""Untrusted input, read with bounds: files, YAML, JSON, and values shown in one escaped line."""

from __future__ import annotations

import errno
import math
import os
import re
import reprlib
import stat
import unicodedata
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from .errors import EnvbuildError, ExitCode, Unreachable

#: Largest recipe file read, in bytes (1 MiB).
MAX_RECIPE_BYTES = 1 << 20
#: Largest node report, rank result or certificate read, in bytes (16 MiB).
MAX_REPORT_BYTES = 16 << 20
#: Deepest nesting of mappings/lists accepted in YAML or JSON input.
MAX_DEPTH = 64
#: Most YAML nodes a document may expand to (aliases counted at every use).
MAX_YAML_NODES = 100_000
#: Longest integer literal accepted, in digits (a 64-bit value has at most 20).
MAX_INT_DIGITS = 30
#: Characters :func:`show` keeps of a value's escaped form.
SHOW_LIMIT = 200


# ------------------------------------------------------------------------------ showing
_repr = reprlib.Repr()
_repr.maxlevel = 3
_repr.maxdict = 6
_repr.maxlist = 6
_repr.maxtuple = 6
_repr.maxset = 6
_repr.maxstring = SHOW_LIMIT
_repr.maxlong = 40
_repr.maxother = 60


def show(value: object, limit: int = SHOW_LIMIT) -> str:
    """``value`` as one escaped line of at most ``limit`` (+3) characters."""
    try:
        if isinstance(value, str):
            text = repr(value[: limit + 1])
        else:
            text = _repr.repr(value)
    except Exception:  # noqa: BLE001 - a hostile __repr__ must not break an error message
        text = f"<{type(value).__name__}>"
    text = one_line(text, limit=None)
    return text if len(text) <= limit else text[: limit - 3] + "..."


_CONTROL_CATEGORIES = frozenset({"Cc", "Cf", "Cs", "Co", "Cn", "Zl", "Zp"})


def is_control(ch: str) -> bool:
    """True for characters that must not reach a file line or terminal raw: Cc (C0/C1, DEL), Cf (bidi overrides), Cs,
    private-use, unassigned, Zl, Zp."""
    if " " <= ch <= "~":
        return False
    return unicodedata.category(ch) in _CONTROL_CATEGORIES


def has_control(text: str) -> bool:
    """True when ``text`` holds a character :func:`is_control` refuses."""
    if text.isascii() and text.isprintable():
        return False
    return any(is_control(c) for c in text)


def _escape_char(ch: str) -> str:
    code = ord(ch)
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}"


def escape(text: object, limit: int | None = 300) -> str:
    """``text`` with every control character (newlines, tabs too) escaped as ``\\xNN``/``\\uNNNN``, cut to ``limit``:
    for names that must stay exact (paths, field paths, hostnames). Never raises."""
    s = text if isinstance(text, str) else str(text)
    if limit is not None and len(s) > limit:
        s = s[:limit]
    if s.isascii() and s.isprintable():
        return s if limit is None or len(s) < limit else s[: limit - 3] + "..."
    out = "".join(_escape_char(ch) if is_control(ch) else ch for ch in s)
    return out if limit is None or len(out) <= limit else out[: limit - 3] + "..."


def one_line(text: object, limit: int | None = 300) -> str:
    """``text`` (a program's message, a node's string) as one terminal-safe line, cut. Never raises."""
    s = text if isinstance(text, str) else str(text)
    if limit is not None and len(s) > 4 * limit:
        s = s[: 4 * limit]
    if s.isascii() and s.isprintable() and "  " not in s:  # nothing to escape or collapse (C speed)
        line = s.strip()
        return line if limit is None or len(line) <= limit else line[: limit - 3] + "..."
    out: list[str] = []
    for ch in s:
        if ch in _SPACES:
            if out and out[-1] != " ":
                out.append(" ")
        else:
            out.append(_escape_char(ch) if is_control(ch) else ch)
    line = "".join(out).strip()
    if limit is not None and len(line) > limit:
        line = line[: limit - 3] + "..."
    return line


_SPACES = frozenset(" \t\n\r\v\f\x1c\x1d\x1e\x85\u2028\u2029")


def control_char_paths(data: Any, prefix: str = "") -> Iterator[tuple[str, str]]:
    """``(field path, string)`` of every string or key in bounded ``data`` holding a control character."""
    stack: list[tuple[str, Any]] = [(prefix, data)]
    while stack:
        path, node = stack.pop()
        if isinstance(node, str):
            if has_control(node):
                yield path or "(top level)", node
        elif isinstance(node, dict):
            items = list(node.items())
            for key, value in reversed(items):
                sub = f"{path}.{key}" if path else str(key)
                if isinstance(key, str) and has_control(key):
                    yield sub, key
                stack.append((sub, value))
        elif isinstance(node, (list, tuple)):
            for i in range(len(node) - 1, -1, -1):
                stack.append((f"{path}[{i}]", node[i]))


# ------------------------------------------------------------------------------ files
def read_regular(path: str | os.PathLike[str], limit: int, what: str = "file") -> bytes:
    """The bytes of the regular file at ``path``, at most ``limit`` bytes."""
    name = str(path)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except FileNotFoundError:
        raise Unreachable(f"no such {what}", file=name) from None
    except PermissionError:
        raise Unreachable(f"cannot read {what}: permission denied", file=name) from None
    except OSError as e:
        raise Unreachable(f"cannot read {what}: {e.strerror or e}", file=name) from None
    try:
        st = os.fstat(fd)
        if stat.S_ISDIR(st.st_mode):
            raise Unreachable(f"is a directory, not a {what}", file=name)
        if not stat.S_ISREG(st.st_mode):
            raise Unreachable(f"is not a regular file (a {_kind_of(st.st_mode)}); give a {what}", file=name)
        if st.st_size > limit:
            raise Unreachable(f"is {st.st_size} bytes, over the {limit}-byte limit of a {what}", file=name)
        chunks, total = [], 0
        while total <= limit:
            try:
                chunk = os.read(fd, min(1 << 20, limit + 1 - total))
            except BlockingIOError:  # pragma: no cover - regular files do not block
                continue
            if not chunk:
                break
            chunks.append(chunk)
            total += len(chunk)
        if total > limit:
            raise Unreachable(f"is over the {limit}-byte limit of a {what}", file=name)
        return b"".join(chunks)
    except OSError as e:
        if e.errno == errno.EISDIR:
            raise Unreachable(f"is a directory, not a {what}", file=name) from None
        raise Unreachable(f"cannot read {what}: {e.strerror or e}", file=name) from None
    finally:
        os.close(fd)


def _kind_of(mode: int) -> str:
    for test, word in ((stat.S_ISFIFO, "FIFO"), (stat.S_ISCHR, "character device"),
                       (stat.S_ISBLK, "block device"), (stat.S_ISSOCK, "socket")):
        if test(mode):
            return word
    return "special file"


def read_text(path: str | os.PathLike[str], limit: int, what: str = "file") -> str:
    """:func:`read_regular` as UTF-8: Unreachable (exit 3) as it; EnvbuildError (exit 2): not UTF-8."""
    data = read_regular(path, limit, what)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise EnvbuildError(f"is not UTF-8 text (byte {e.start})", file=str(path)) from None


# ------------------------------------------------------------------------------ YAML
def _check_node_graph(root: Any) -> None:
    """Node count and key kinds of a composed YAML graph, each node once; ``ComposerError`` past :data:`MAX_YAML_NODES`,
    for a recursive alias or a complex key."""
    import yaml
    from yaml.nodes import MappingNode, ScalarNode, SequenceNode

    sizes: dict[int, int] = {}
    active: set[int] = set()

    def size(node: Any) -> int:
        key = id(node)
        if key in sizes:
            return sizes[key]
        if key in active:
            raise yaml.composer.ComposerError(None, None, "a recursive alias", node.start_mark)
        active.add(key)
        total = 1
        if isinstance(node, SequenceNode):
            for child in node.value:
                total += size(child)
                if total > MAX_YAML_NODES:
                    break
        elif isinstance(node, MappingNode):
            for k, v in node.value:
                if not isinstance(k, ScalarNode):
                    raise yaml.composer.ComposerError(
                        None, None, "a mapping key must be a plain value (no '? [a, b]' complex keys)",
                        k.start_mark)
                total += 1 + size(v)
                if total > MAX_YAML_NODES:
                    break
        active.discard(key)
        if total > MAX_YAML_NODES:
            raise yaml.composer.ComposerError(
                None, None, f"expands to more than {MAX_YAML_NODES} values (aliases counted at each use)",
                node.start_mark)
        sizes[key] = total
        return total

    size(root)


def _yaml_loader_class() -> Any:
    import yaml

    class BoundedLoader(yaml.SafeLoader):
        """pyyaml's SafeLoader with bounded composition."""

        def __init__(self, stream) -> None:
            super().__init__(stream)
            self._depth = 0

        def compose_node(self, parent, index):
            self._depth += 1
            try:
                if self._depth > MAX_DEPTH:
                    mark = self.peek_event().start_mark
                    raise yaml.composer.ComposerError(None, None, f"nesting deeper than {MAX_DEPTH} levels", mark)
                return super().compose_node(parent, index)
            finally:
                self._depth -= 1

        def get_single_node(self):
            node = super().get_single_node()
            if node is not None:
                _check_node_graph(node)
            return node

        def construct_mapping(self, node, deep=False):
            seen = set()
            for key_node, _ in node.value:
                key = self.construct_object(key_node, deep=deep)
                if key in seen:
                    raise yaml.constructor.ConstructorError(None, None, f"duplicate key {show(key, 60)}",
                                                            key_node.start_mark)
                seen.add(key)
            return super().construct_mapping(node, deep=deep)

        def construct_yaml_int(self, node):
            digits = sum(c.isdigit() for c in str(node.value))
            if digits > MAX_INT_DIGITS:
                return str(node.value)  # the schema refuses it, naming the field
            return super().construct_yaml_int(node)

    BoundedLoader.add_constructor("tag:yaml.org,2002:int", BoundedLoader.construct_yaml_int)
    return BoundedLoader


_LOADER = None


def load_yaml(text: str, file: str) -> Any:
    """One YAML document, bounded, as plain data. Raises EnvbuildError (exit 2) naming file and line."""
    global _LOADER
    import yaml

    if _LOADER is None:
        _LOADER = _yaml_loader_class()
    loader = None
    try:
        loader = _LOADER(text)  # its reader refuses unprintable characters (a raw NUL) here
        return loader.get_single_data()
    except yaml.reader.ReaderError as exc:
        line = text.count("\n", 0, exc.position) + 1
        column = exc.position - (text.rfind("\n", 0, exc.position) + 1) + 1
        raise EnvbuildError(f"malformed YAML: line {line}, column {column}: unacceptable character "
                            f"U+{exc.character:04X}", file=file) from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None) or getattr(exc, "context_mark", None)
        where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark else ""
        problem = getattr(exc, "problem", None) or "invalid YAML"
        raise EnvbuildError(f"malformed YAML: {where}{one_line(problem, 160)}", file=file) from None
    except RecursionError:
        raise EnvbuildError(f"malformed YAML: nesting deeper than {MAX_DEPTH} levels", file=file) from None
    finally:
        if loader is not None:
            loader.dispose()


# ------------------------------------------------------------------------------ JSON
class _JsonProblem(ValueError):
    pass


def _refuse_constant(name: str) -> Any:
    raise _JsonProblem(f"{name} is not a number (NaN and Infinity are refused)")


def _bounded_int(text: str) -> int:
    if len(text.lstrip("-")) > MAX_INT_DIGITS:
        raise _JsonProblem(f"an integer of {len(text)} digits (at most {MAX_INT_DIGITS})")
    return int(text)


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise _JsonProblem(f"{show(text, 40)} is out of range for a number")
    return value


def load_json(data: bytes | str, file: str, exit_code: ExitCode = ExitCode.CHECK_FAILED,
              max_depth: int = MAX_DEPTH) -> Any:
    """Bounded JSON: no NaN/Infinity, huge integers, deep nesting, lone surrogates; EnvbuildError (``exit_code``)."""
    import json

    try:
        text = data.decode("utf-8") if isinstance(data, (bytes, bytearray)) else data
    except UnicodeDecodeError as e:
        raise EnvbuildError(f"is not UTF-8 text (byte {e.start})", file=file, exit_code=exit_code) from None
    try:
        doc = json.loads(text, parse_constant=_refuse_constant, parse_int=_bounded_int, parse_float=_finite_float)
    except _JsonProblem as e:
        raise EnvbuildError(f"not valid JSON: {e}", file=file, exit_code=exit_code) from None
    except RecursionError:
        raise EnvbuildError(f"not valid JSON: nesting deeper than {max_depth} levels", file=file,
                            exit_code=exit_code) from None
    except ValueError as e:
        raise EnvbuildError(f"not valid JSON: {one_line(e, 160)}", file=file, exit_code=exit_code) from None
    strings = "\\u" in text and _SURROGATE_ESCAPE.search(text) is not None
    problem = _json_problem(doc, max_depth, strings)
    if problem:
        raise EnvbuildError(f"not valid JSON: {problem}", file=file, exit_code=exit_code)
    return doc


def _json_path(chain: tuple | None) -> str:
    """The field path (``a.b[0].c``) of a ``(parent chain, key or index)`` chain."""
    parts: list[str] = []
    while chain is not None:
        chain, step = chain
        parts.append(f"[{step}]" if isinstance(step, int) else f".{one_line(step, 40)}")
    text = "".join(reversed(parts))
    return text[1:] if text.startswith(".") else text


def _json_problem(doc: Any, max_depth: int, strings: bool = True) -> str | None:
    """The first problem of ``doc``: nesting over ``max_depth``, or (``strings``) a lone surrogate; None when none."""
    # Paths are kept as (parent, key) chains and written out only for the problem found:
    # building every path eagerly cost most of the time of reading 10,000 node reports.
    stack: list[tuple[Any, int, tuple | None]] = [(doc, 1, None)]
    while stack:
        node, depth, chain = stack.pop()
        if isinstance(node, str):
            if _has_surrogate(node):
                return f"{_json_path(chain) or '(top level)'}: a lone surrogate in a string (not valid Unicode)"
            continue
        if depth > max_depth:
            return f"nesting deeper than {max_depth} levels at {_json_path(chain) or '(top level)'}"
        if isinstance(node, dict):
            for k, v in node.items():
                if strings and _has_surrogate(k):
                    return f"{_json_path((chain, k))}: a lone surrogate in a key (not valid Unicode)"
                if isinstance(v, (dict, list)) or (strings and isinstance(v, str)):
                    stack.append((v, depth + 1, (chain, k)))
        elif isinstance(node, list):
            stack.extend((v, depth + 1, (chain, i)) for i, v in enumerate(node)
                         if isinstance(v, (dict, list)) or (strings and isinstance(v, str)))
    return None


#: A ``\\uD800``-``\\uDFFF`` escape: the only way a lone surrogate gets into parsed JSON
#: (decoded UTF-8 never holds one).
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")


def _has_surrogate(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False


def read_json(path: str | os.PathLike[str], limit: int, what: str, exit_code: ExitCode) -> Any:
    """:func:`read_regular` then :func:`load_json`: a bounded JSON document from a file."""
    return load_json(read_regular(Path(path), limit, what), str(path), exit_code=exit_code)
