"""The one mechanism for typed documents: msgspec Structs, strict, every violation listed.

Every document envbuild reads or writes (recipe, lock, certify settings, rank result,
certificate, node report, verify result) is a :class:`Model` subclass: unknown keys
refused (``forbid_unknown_fields``), values checked whole by their annotations
(``Annotated[str, Meta(pattern=r"\\A...\\Z")]``, ``Meta(ge=, le=, max_length=)``).

:func:`convert` turns plain data (from :func:`builder.core.inputs.load_yaml` /
``load_json``) into a model. msgspec stops at the first problem; when there is one,
:func:`violations` walks the data against the model's annotations and lists *every*
violation with its field path and value, so a user fixes a file in one round:
``recipes/x.yaml: certify.nodes: 0 must be an integer in 1..1024``. A human message for a
field comes from its ``Meta(extra={"message": ...})``; else msgspec's own text is used.

:func:`json_schema` exports a model's JSON Schema (draft 2020-12) with patterns rewritten
from Python's ``\\A...\\Z`` to ECMA-262's ``^...$`` (which, without the m flag, matches only
at the very end), for the files published under ``schemas/``.
"""

from __future__ import annotations

import re
import types
import typing
from typing import Any, Iterator, TypeVar

import msgspec

from .errors import EnvbuildError, ExitCode, ManyErrors

T = TypeVar("T")


class Model(msgspec.Struct, forbid_unknown_fields=True, frozen=True, kw_only=True):
    """Base of every envbuild document: strict, immutable, keyword-only."""

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-able data (tuples become lists)."""
        return msgspec.to_builtins(self)


def convert(data: Any, model: type[T], *, file: str | None = None, prefix: str = "",
            exit_code: ExitCode = ExitCode.CHECK_FAILED) -> T:
    """``data`` as an instance of ``model`` (a :class:`Model` subclass or any type msgspec
    converts), strictly (no str->int coercion, bool is not int).

    Raises: :class:`~builder.core.errors.ManyErrors` with one
        :class:`~builder.core.errors.EnvbuildError` per violation (file, field path, value,
        message), all with ``exit_code``.
    """
    try:
        return msgspec.convert(data, model, strict=True)
    except msgspec.ValidationError as first:
        errors = [EnvbuildError(message, file=file, field=field or "(top level)", exit_code=exit_code,
                                **({} if value is _NO_VALUE else {"value": value}))
                  for field, value, message in violations(data, model, prefix)]
        if not errors:  # the walk found nothing msgspec did: report msgspec's own words
            errors = [EnvbuildError(_msgspec_message(first), file=file, field=prefix or "(top level)",
                                    exit_code=exit_code)]
        raise ManyErrors(errors) from None


_NO_VALUE = object()
_AT = re.compile(r" - at `\$[^`]*`$")


def _msgspec_message(exc: Exception) -> str:
    return _AT.sub("", str(exc))


def _message_of(annotation: Any) -> str | None:
    """The ``Meta(extra={"message": ...})`` of an ``Annotated`` type, if any."""
    if typing.get_origin(annotation) is typing.Annotated:
        for meta in typing.get_args(annotation)[1:]:
            extra = getattr(meta, "extra", None) or {}
            if "message" in extra:
                return str(extra["message"])
    return None


def _strip(annotation: Any) -> Any:
    while typing.get_origin(annotation) is typing.Annotated:
        annotation = typing.get_args(annotation)[0]
    return annotation


def _join(prefix: str, key: Any) -> str:
    return f"{prefix}.{key}" if prefix else str(key)


def violations(data: Any, model: Any, prefix: str = "") -> Iterator[tuple[str, Any, str]]:
    """Every ``(field path, value, message)`` where ``data`` breaks ``model``; the value is
    ``_NO_VALUE`` for a missing or unknown key. Walks Structs, lists/tuples, dicts and
    optional/union types; leaves are checked with msgspec itself (the same rules)."""
    base = _strip(model)
    message = _message_of(model)
    if isinstance(base, type) and issubclass(base, msgspec.Struct):
        yield from _struct_violations(data, base, prefix, message)
        return
    origin = typing.get_origin(base)
    if origin in (typing.Union, types.UnionType):
        members = typing.get_args(base)
        if data is None and type(None) in members:
            return
        for member in members:
            try:
                msgspec.convert(data, member, strict=True)
                return
            except msgspec.ValidationError:
                continue
        real = [m for m in members if m is not type(None)]
        if len(real) == 1 and not _is_leaf(real[0]) and data is not None:
            yield from violations(data, real[0], prefix)
        else:
            yield prefix, data, message or _leaf_message(data, base)
        return
    if origin in (list, tuple) and not _is_leaf(model):
        if not isinstance(data, list):
            yield prefix, data, message or _leaf_message(data, model)
            return
        args = typing.get_args(base)
        item = args[0] if args else Any
        try:
            msgspec.convert(data, model, strict=True)
        except msgspec.ValidationError as e:
            found = False
            for i, value in enumerate(data):
                for v in violations(value, item, f"{prefix}[{i}]"):
                    found = True
                    yield v
            if not found:  # the list as a whole (its length)
                yield prefix, data, message or _msgspec_message(e)
        return
    if origin is dict:
        if not isinstance(data, dict):
            yield prefix, data, message or _leaf_message(data, model)
            return
        key_t, value_t = typing.get_args(base) or (Any, Any)
        try:
            msgspec.convert(data, model, strict=True)
        except msgspec.ValidationError as e:
            found = False
            for k, value in data.items():
                sub = _join(prefix, k)
                for v in violations(k, key_t, sub):
                    found = True
                    yield sub, k, v[2]
                for v in violations(value, value_t, sub):
                    found = True
                    yield v
            if not found:
                yield prefix, data, message or _msgspec_message(e)
        return
    try:
        msgspec.convert(data, model, strict=True)
    except msgspec.ValidationError as e:
        yield prefix, data, message or _msgspec_message(e)


def _is_leaf(model: Any) -> bool:
    """True for a constrained sequence (its Meta applies to the whole value)."""
    return typing.get_origin(model) is typing.Annotated


def _leaf_message(data: Any, model: Any) -> str:
    try:
        msgspec.convert(data, model, strict=True)
    except msgspec.ValidationError as e:
        return _msgspec_message(e)
    return "is not valid here"


def _struct_violations(data: Any, model: type[msgspec.Struct], prefix: str,
                       message: str | None) -> Iterator[tuple[str, Any, str]]:
    if not isinstance(data, dict):
        yield prefix, data, message or "must be a mapping"
        return
    info = msgspec.structs.fields(model)
    hints = typing.get_type_hints(model, include_extras=True)
    by_name = {f.encode_name: f for f in info}
    for key in data:
        if key not in by_name:
            import difflib

            close = difflib.get_close_matches(str(key), list(by_name), n=1, cutoff=0.6)
            hint = f"; did you mean '{close[0]}'?" if close else f"; allowed keys: {', '.join(by_name)}"
            yield _join(prefix, key), _NO_VALUE, f"unknown key{hint}"
    for name, f in by_name.items():
        sub = _join(prefix, name)
        if name not in data:
            if f.required:
                yield sub, _NO_VALUE, "is required"
            continue
        yield from violations(data[name], hints[f.name], sub)


# ----------------------------------------------------------------------- JSON Schema
_ANCHORS = re.compile(r"^\\A(.*)\\Z$", re.S)


def _ecma(node: Any) -> Any:
    if isinstance(node, dict):
        out = {}
        for k, v in node.items():
            if k == "pattern" and isinstance(v, str):
                m = _ANCHORS.match(v)
                v = f"^{m.group(1)}$" if m else v
            out[k] = _ecma(v)
        return out
    if isinstance(node, list):
        return [_ecma(v) for v in node]
    return node


def json_schema(model: Any, schema_id: str, title: str) -> dict[str, Any]:
    """The JSON Schema (2020-12) of ``model`` with ``$id`` and ``title``; patterns in ECMA
    form (see the module docstring)."""
    doc = _ecma(msgspec.json.schema(model))
    return {"$schema": "https://json-schema.org/draft/2020-12/schema", "$id": schema_id, "title": title, **doc}
