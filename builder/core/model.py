"""The one mechanism for typed documents: msgspec Structs, strict, every violation listed in words."""

from __future__ import annotations

import functools
import os
import re
import types
import typing
from collections.abc import Callable, Collection, Iterator, Mapping
from pathlib import Path
from typing import Any, TypeVar

import msgspec

from .errors import EnvbuildError, ExitCode, ManyErrors
from .inputs import has_control

T = TypeVar("T")
#: ``(field path, value or NO_VALUE, message)`` of one violation.
Violation = tuple[str, Any, str]
Control = Callable[[str], str]


class _Document:
    def to_dict(self) -> dict[str, Any]:
        """Plain JSON data (tuples become lists; UNSET fields left out), as ``json.loads`` gives it."""
        data: dict[str, Any] = msgspec.json.decode(msgspec.json.encode(self))
        return data


class Model(_Document, msgspec.Struct, forbid_unknown_fields=True, frozen=True, kw_only=True):
    """Base of every envbuild document: strict, immutable, keyword-only."""


#: The value of a violation about a key that is missing or unknown (no value to show).
NO_VALUE: Any = object()


def convert(data: Any, model: type[T], *, file: str | None = None, prefix: str = "",
            exit_code: ExitCode = ExitCode.CHECK_FAILED, control: Control | None = None) -> T:
    """``data`` as ``model`` (a :class:`Model` or any type msgspec converts), strictly: no str->int, bool is not int."""
    found: list[Violation] = []
    if control is not None or has_checks(typing.cast(Any, model)):
        found = list(violations(data, model, prefix, control=control))
    if not found:
        try:
            return msgspec.convert(data, model, strict=True)
        except msgspec.ValidationError as first:
            found = list(violations(data, model, prefix, control=control)) or [
                (prefix, NO_VALUE, _msgspec_message(first))]  # the walk found nothing: msgspec's own words
    raise ManyErrors(errors(found, file=file, exit_code=exit_code))


def errors(found: Collection[Violation], *, file: str | None = None,
           exit_code: ExitCode = ExitCode.CHECK_FAILED) -> list[EnvbuildError]:
    """One :class:`EnvbuildError` per violation, naming ``file``."""
    return [EnvbuildError(message, file=file, field=field or "(top level)", exit_code=exit_code,
                          **({} if value is NO_VALUE else {"value": value}))
            for field, value, message in found]


_AT = re.compile(r" - at `\$[^`]*`$")


def _msgspec_message(exc: Exception) -> str:
    return _AT.sub("", str(exc))


def _metas(annotation: Any) -> list[Any]:
    """The ``Meta`` of an ``Annotated`` type and of those inside it, outermost first."""
    out: list[Any] = []
    while typing.get_origin(annotation) is typing.Annotated:
        args = typing.get_args(annotation)
        out.extend(args[1:])
        annotation = args[0]
    return out


def _extra(annotation: Any) -> dict[str, Any]:
    """The merged ``Meta(extra=...)`` of an ``Annotated`` type (outermost wins)."""
    out: dict[str, Any] = {}
    for meta in _metas(annotation):
        for k, v in (getattr(meta, "extra", None) or {}).items():
            out.setdefault(k, v)
    return out


def _strip(annotation: Any) -> Any:
    while typing.get_origin(annotation) is typing.Annotated:
        annotation = typing.get_args(annotation)[0]
    return annotation


def _join(prefix: str, key: Any) -> str:
    return f"{prefix}.{key}" if prefix else str(key)


@functools.cache
def struct_fields(model: type[msgspec.Struct]) -> tuple[tuple[msgspec.structs.FieldInfo, Any], ...]:
    """Cached: msgspec resolves the type hints on every call."""
    hints = typing.get_type_hints(model, include_extras=True)
    return tuple((f, hints[f.name]) for f in msgspec.structs.fields(model))


def _is_struct(t: Any) -> bool:
    return isinstance(t, type) and issubclass(t, msgspec.Struct)


def _members(base: Any) -> tuple[Any, ...] | None:
    """The members of a union type, else None."""
    return typing.get_args(base) if typing.get_origin(base) in (typing.Union, types.UnionType) else None


@functools.cache
def has_checks(model: Any) -> bool:
    """True when ``model`` or a type inside it carries a ``Meta(extra={"check": ...})``."""
    return _has_checks(model, set())


def _has_checks(t: Any, seen: set[int]) -> bool:
    if "check" in _extra(t):
        return True
    base = _strip(t)
    if id(base) in seen:
        return False
    seen.add(id(base))
    if _is_struct(base):
        return any(_has_checks(h, seen) for _f, h in struct_fields(base))
    return any(_has_checks(a, seen) for a in typing.get_args(base) if a is not Ellipsis)


def violations(data: Any, model: Any, prefix: str = "", *, control: Control | None = None) -> Iterator[Violation]:
    """Every violation of ``model`` in ``data``, in document order: msgspec checks the leaves (the same
    rules), then their ``check`` (None, a message or ``(message, value shown)``). ``control``: a message
    maker; every string holding a control character is then one violation and gets no other check."""
    return _Walk(control).node(data, model, prefix)


class _Walk:
    def __init__(self, control: Control | None) -> None:
        self.control = control

    def _controlled(self, value: Any) -> bool:
        return self.control is not None and isinstance(value, str) and has_control(value)

    def node(self, data: Any, model: Any, path: str) -> Iterator[Violation]:
        if self._controlled(data):
            yield path, data, self.control(data)  # type: ignore[misc]
            return
        extra = _extra(model)
        base = _strip(model)
        members = _members(base)
        if members is not None:
            yield from self.union(data, model, members, path, extra.get("message"))
        elif _is_struct(base):
            yield from self.struct(data, base, path, extra.get("message"))
        elif typing.get_origin(base) in (list, tuple) and _variadic(base):
            yield from self.sequence(data, model, base, path, extra)
        elif typing.get_origin(base) is dict:
            yield from self.mapping(data, model, base, path, extra)
        else:
            yield from self.leaf(data, model, path, extra)

    def union(self, data: Any, model: Any, members: tuple[Any, ...], path: str,
              message: str | None) -> Iterator[Violation]:
        if data is None and type(None) in members:
            return
        real = [m for m in members if m is not type(None)]
        if len(real) == 1:
            found = list(self.node(data, real[0], path))
            if found and message:
                found = [(p, v, message if p == path else m) for p, v, m in found]
            yield from found
            return
        for member in real:
            if not list(self.node(data, member, path)):
                return
        yield path, data, message or _leaf_message(data, model)

    def struct(self, data: Any, model: type[msgspec.Struct], path: str, message: str | None) -> Iterator[Violation]:
        if not isinstance(data, dict):
            yield path, data, message or "must be a mapping"
            return
        by_name = {f.encode_name: (f, hint) for f, hint in struct_fields(model)}
        for key, value in data.items():
            sub = _join(path, key)
            if self._controlled(key):
                yield sub, key, self.control(key)  # type: ignore[misc]
            elif key not in by_name:
                if self._controlled(value):
                    yield sub, value, self.control(value)  # type: ignore[misc]
                else:
                    yield sub, NO_VALUE, _unknown_key(key, list(by_name))
            else:
                yield from self.node(value, by_name[key][1], sub)
        for name, (f, _hint) in by_name.items():
            if name not in data and f.required:
                yield _join(path, name), NO_VALUE, "is required"

    def sequence(self, data: Any, model: Any, base: Any, path: str, extra: dict[str, Any]) -> Iterator[Violation]:
        if not isinstance(data, (list, tuple)):
            yield _refusal(path, data, model, extra)
            return
        refused = self._checked(data, path, extra)
        if refused:
            yield from refused
            return
        metas = _metas(model)
        if metas and not _converts(data, typing.Annotated[(list[Any], *metas)]):
            yield _refusal(path, data, model, extra)
            return
        item = typing.get_args(base)[0] if typing.get_args(base) else Any
        for i, value in enumerate(data):
            yield from self.node(value, item, f"{path}[{i}]")

    def mapping(self, data: Any, model: Any, base: Any, path: str, extra: dict[str, Any]) -> Iterator[Violation]:
        if not isinstance(data, dict):
            yield _refusal(path, data, model, extra)
            return
        metas = _metas(model)
        if metas and not _converts(data, typing.Annotated[(dict[Any, Any], *metas)]):
            yield _refusal(path, data, model, extra)
            return
        key_t, value_t = typing.get_args(base) or (Any, Any)
        for key, value in data.items():
            sub = _join(path, key)
            if self._controlled(key):
                yield sub, key, self.control(key)  # type: ignore[misc]
                continue
            bad_key = next(iter(self.node(key, key_t, sub)), None)
            if bad_key is not None:
                yield sub, key, bad_key[2]
            else:
                yield from self.node(value, value_t, sub)

    def leaf(self, data: Any, model: Any, path: str, extra: dict[str, Any]) -> Iterator[Violation]:
        if not _converts(data, model):
            yield _refusal(path, data, model, extra)
            return
        yield from self._checked(data, path, extra)

    @staticmethod
    def _checked(data: Any, path: str, extra: dict[str, Any]) -> list[Violation]:
        """The ``check`` of ``extra`` on ``data``: [] when it passes (or there is none)."""
        check = extra.get("check")
        result = check(data) if check is not None else None
        if result is None:
            return []
        message, shown = result if isinstance(result, tuple) else (result, data)
        return [(path, shown, message)]


def _variadic(base: Any) -> bool:
    """True for ``list[X]`` and ``tuple[X, ...]`` (a fixed-length tuple is a leaf)."""
    args = typing.get_args(base)
    return typing.get_origin(base) is list or (len(args) == 2 and args[1] is Ellipsis)


def _unknown_key(key: Any, allowed: list[str]) -> str:
    import difflib

    close = difflib.get_close_matches(str(key)[:100], allowed, n=1, cutoff=0.6)
    return f"unknown key; did you mean '{close[0]}'?" if close else f"unknown key; allowed keys: {', '.join(allowed)}"


def _converts(data: Any, model: Any) -> bool:
    try:
        msgspec.convert(data, model, strict=True)
    except msgspec.ValidationError:
        return False
    return True


_TYPE_WORDS = {str: "a string", bool: "true or false", int: "an integer", float: "a number", list: "a list",
               tuple: "a list", dict: "an object"}
_COUNTED = {str: "is {n} characters long", list: "has {n} items", tuple: "has {n} items", dict: "has {n} entries"}


def _refusal(path: str, data: Any, model: Any, extra: dict[str, Any]) -> Violation:
    """The violation of a value msgspec refuses, in words: the ``message``; else "is not <description>"; else the length
    over ``max_length`` (no value shown), the JSON type or the literals expected; else msgspec's own text."""
    if extra.get("message"):
        return path, data, extra["message"]
    metas = _metas(model)
    described = next((m.description for m in metas if getattr(m, "description", None)), None)
    if described:
        return path, data, f"is not {described}"
    base = _strip(model)
    origin = typing.get_origin(base) or base
    accepted = {float: (int, float), tuple: (list, tuple), list: (list, tuple)}.get(origin, (origin,))
    limit = min((m.max_length for m in metas if getattr(m, "max_length", None) is not None), default=None)
    if limit is not None and origin in _COUNTED and type(data) in accepted and len(data) > limit:
        return path, NO_VALUE, f"{_COUNTED[origin].format(n=len(data))}, over the limit of {limit}"
    if origin in _TYPE_WORDS and type(data) not in accepted:
        return path, data, f"is not {_TYPE_WORDS[origin]}"
    if origin is typing.Literal:
        return path, data, "is not " + " or ".join(repr(a) for a in typing.get_args(base))
    return path, data, _leaf_message(data, model)


def _leaf_message(data: Any, model: Any) -> str:
    try:
        msgspec.convert(data, model, strict=True)
    except msgspec.ValidationError as e:
        return _msgspec_message(e)
    return "is not valid here"


# ----------------------------------------------------------------------- partial documents
def partial(data: Any, model: type[T], invalid: Collection[str], prefix: str = "") -> T:
    """``model`` from ``data`` without the fields at ``invalid`` (their default or None): for rules on valid fields."""
    built: T = _partial(data, model, frozenset(invalid), prefix)
    return built


def _partial(data: Any, model: Any, invalid: frozenset[str], path: str) -> Any:
    base = _strip(model)
    members = _members(base)
    if members is not None:
        if data is None:
            return None
        real = [m for m in members if m is not type(None)]
        return _partial(data, real[0], invalid, path) if len(real) == 1 else data
    if _is_struct(base):
        if not isinstance(data, dict):
            return None
        values = {}
        for f, hint in struct_fields(base):
            sub = _join(path, f.encode_name)
            if f.encode_name in data and sub not in invalid:
                values[f.name] = _partial(data[f.encode_name], hint, invalid, sub)
            elif f.required:  # a section stays a section (its fields None), a value becomes None
                values[f.name] = _partial({}, hint, invalid, sub) if _is_struct(_strip(hint)) else None
        return base(**values)
    origin = typing.get_origin(base)
    if origin in (list, tuple) and _variadic(base):
        item = typing.get_args(base)[0]
        kept = [_partial(v, item, invalid, f"{path}[{i}]") for i, v in enumerate(data or ())
                if f"{path}[{i}]" not in invalid]
        return tuple(kept) if origin is tuple else kept
    if origin is dict:
        key_t, value_t = typing.get_args(base)
        return {k: _partial(v, value_t, invalid, _join(path, k)) for k, v in (data or {}).items()
                if _join(path, k) not in invalid}
    return msgspec.convert(data, model, strict=True)


# ----------------------------------------------------------------------- JSON Schema
_ANCHORS = re.compile(r"^\\A(.*)\\Z$", re.S)


_NAMED_GROUP = re.compile(r"\(\?P<[A-Za-z_][A-Za-z0-9_]*>")


def ecma_pattern(pattern: str) -> str:
    """A whole-value pattern (``\\A...\\Z``) as ECMA-262 and Python read alike: ``^...$``, groups as ``(?:...)``."""
    m = _ANCHORS.match(pattern)
    text = f"^{m.group(1)}$" if m else pattern
    return _NAMED_GROUP.sub("(?:", text)


def _ecma(node: Any) -> Any:
    if isinstance(node, dict):
        return {k: ecma_pattern(v) if k == "pattern" and isinstance(v, str) else _ecma(v) for k, v in node.items()}
    if isinstance(node, list):
        return [_ecma(v) for v in node]
    return node


def json_schema(model: Any, schema_id: str, title: str) -> dict[str, Any]:
    """The JSON Schema (2020-12) of ``model``, patterns in ECMA form (:func:`ecma_pattern`)."""
    doc = _ecma(msgspec.json.schema(model))
    return {"$schema": "https://json-schema.org/draft/2020-12/schema", "$id": schema_id, "title": title, **doc}


#: ``{file stem: (model, $id, title)}``, as each package's ``schemas()`` gives it.
SchemaEntries = Mapping[str, tuple[Any, str, str]]


def schema_files(entries: SchemaEntries) -> dict[str, bytes]:
    """``{"<stem>.schema.json": bytes}`` of ``entries`` (2-space indent, trailing newline)."""
    import json

    return {f"{stem}.schema.json": (json.dumps(json_schema(model, schema_id, title), indent=2) + "\n").encode()
            for stem, (model, schema_id, title) in entries.items()}


def stale_schemas(entries: SchemaEntries, folder: str | os.PathLike[str]) -> list[str]:
    """Names of the schema files of ``entries`` under ``folder`` that differ from the models (or are missing)."""
    from .files import changed_files

    return changed_files(Path(folder), schema_files(entries))
