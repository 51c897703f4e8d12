"""Words for a node report (or agent output) that breaks its model, e.g.
:class:`builder.nodes.report.NodeReport`.

msgspec checks a report against the model and stops at the first problem with a message
such as ``Expected `str` matching regex '...' - at `$.gpus[0].uuid```. :func:`first_problem`
turns it into the one line verify and doctor show: the field path in the report's own
notation (``gpus[0].uuid``, ``env.NCCL_DEBUG``), the value, and what the value must be
(the ``description`` of the field's ``msgspec.Meta``)::

    reports/a.json: gpus[0].uuid: 'GPU-1\\n' is not a GPU UUID like GPU-8f6a1c52-...
    reports/a.json: kernel: is 4097 characters long, over the limit of 4096
    reports/a.json: env: 'A\\n' has a key that is not an environment variable name (...)

:func:`semantic_problem` checks what a pattern cannot: addresses as :mod:`ipaddress` reads
them, and a port range's low <= high.
"""

from __future__ import annotations

import ipaddress
import re
import types
import typing
from typing import Any

import msgspec

from .report import IFNAME_REGEX, InvalidReport, NodeReport

_NO_VALUE = object()
_AT = re.compile(r"\A(?P<message>.*?)(?: - at (?:`(?P<key>key)` in )?`\$(?P<path>[^`]*)`)?\Z", re.S)
_SEGMENT = re.compile(r"\.([A-Za-z_][A-Za-z0-9_]*)|\[([0-9]+)\]|\[\.\.\.\]")
_LENGTH = re.compile(r"\AExpected `(?P<kind>[a-z]+)` of length [<>]= (?P<limit>[0-9]+)\Z")
_FIELD = re.compile(r"\AObject (?P<what>missing required|contains unknown) field `(?P<name>[^`]+)`\Z")
_TYPE_WORDS = {str: "a string", bool: "true or false", int: "an integer", float: "a number", list: "a list"}
_IFNAME = re.compile(IFNAME_REGEX)


# --------------------------------------------------------------------------- annotations


def _members(ann: Any) -> tuple[Any, bool]:
    """``(the annotation without None, whether None is allowed)``."""
    if typing.get_origin(ann) in (typing.Union, types.UnionType):
        real = [a for a in typing.get_args(ann) if a is not type(None)]
        return (real[0] if len(real) == 1 else ann), len(real) < len(typing.get_args(ann))
    return ann, False


def _base(ann: Any) -> Any:
    """``ann`` without ``Optional`` and ``Annotated``."""
    ann = _members(ann)[0]
    while typing.get_origin(ann) is typing.Annotated:
        ann = _members(typing.get_args(ann)[0])[0]
    return ann


def _description(ann: Any) -> str | None:
    """The ``Meta(description=...)`` of ``ann`` (through ``Optional``), or None."""
    ann = _members(ann)[0]
    if typing.get_origin(ann) is typing.Annotated:
        for meta in typing.get_args(ann)[1:]:
            if getattr(meta, "description", None):
                return str(meta.description)
    return None


def _words(ann: Any) -> str:
    """What a value of ``ann`` must be: its description, else its JSON type in words."""
    found = _description(ann)
    if found:
        return found
    base = _base(ann)
    if isinstance(base, type) and issubclass(base, msgspec.Struct):
        return "an object"
    origin = typing.get_origin(base) or base
    if origin is dict:
        return "an object of strings" if _base(typing.get_args(base)[1]) is str else "an object"
    return _TYPE_WORDS.get(origin, "a valid value")


def _field_type(struct: Any, name: str) -> Any:
    return typing.get_type_hints(struct, include_extras=True)[name]


def _fails(value: Any, ann: Any) -> bool:
    try:
        msgspec.convert(value, ann, strict=True)
    except msgspec.ValidationError:
        return True
    return False


# --------------------------------------------------------------------------- paths


def _join(path: str, name: Any) -> str:
    return f"{path}.{name}" if path else str(name)


def _resolve(doc: Any, model: Any, path: str) -> tuple[Any, Any, str]:
    """Follow msgspec's ``path`` (``.name``, ``[3]``, ``[...]`` for an unnamed dict entry)
    through ``doc`` and ``model``: ``(value, annotation, path in report notation)``."""
    value, ann, where = doc, model, ""
    for m in _SEGMENT.finditer(path):
        base = _base(ann)
        if m.group(1) is not None:
            ann, value, where = _field_type(base, m.group(1)), value[m.group(1)], _join(where, m.group(1))
        elif m.group(2) is not None:
            ann, value, where = typing.get_args(base)[0], value[int(m.group(2))], f"{where}[{m.group(2)}]"
        else:  # a dict entry: msgspec names no key; the first entry that fails is the one
            item = typing.get_args(base)[1]
            key = next(k for k, v in value.items() if _fails(v, item))
            ann, value, where = item, value[key], _join(where, key)
    return value, ann, where


def _error(message: str, source: str | None, field: str, value: Any = _NO_VALUE) -> InvalidReport:
    if value is _NO_VALUE:
        return InvalidReport(message, file=source, field=field or "(top)")
    return InvalidReport(message, file=source, field=field or "(top)", value=value)


def first_problem(exc: msgspec.ValidationError, doc: Any, model: Any, source: str | None,
                  document: str = "envbuild.probe/1") -> InvalidReport:
    """The :class:`InvalidReport` (exit 3) that says in one line what msgspec's first
    problem ``exc`` with ``doc`` against ``model`` is (see the module docstring);
    ``document`` names the document in "is not a field of ..." (an unknown key)."""
    m = _AT.fullmatch(str(exc))
    assert m is not None  # the pattern matches any text
    text = m.group("message")
    value, ann, where = _resolve(doc, model, m.group("path") or "")
    if m.group("key"):
        key_ann = typing.get_args(_base(ann))[0]
        key = next(k for k in value if _fails(k, key_ann))
        return _error(f"has a key that is not {_words(key_ann)}", source, where, key)
    field = _FIELD.fullmatch(text)
    if field:
        if field.group("what") == "missing required":
            return _error("is missing", source, _join(where, field.group("name")))
        return _error(f"is not a field of {document}", source, _join(where, field.group("name")))
    length = _LENGTH.fullmatch(text)
    if length and not _description(ann):
        kind, limit = length.group("kind"), length.group("limit")
        count = {"str": f"is {len(value)} characters long", "array": f"has {len(value)} items",
                 "object": f"has {len(value)} entries"}.get(kind, f"has length {len(value)}")
        return _error(f"{count}, over the limit of {limit}", source, where)
    nullable = text.startswith("Expected `") and "| null`, got" in text
    return _error(f"is not {_words(ann)}{' or null' if nullable else ''}", source, where, value)


# --------------------------------------------------------------------------- beyond patterns


def _is_address(text: str) -> bool:
    addr, _, scope = text.partition("%")
    try:
        ipaddress.ip_address(addr)
    except ValueError:
        return False
    return addr.isascii() and (not scope or bool(_IFNAME.fullmatch(scope)) or scope.isdigit())


def semantic_problem(report: NodeReport, source: str | None) -> InvalidReport | None:
    """The first address that :mod:`ipaddress` does not read (a scope after ``%`` must be
    an interface name or a number), or a port range with low > high; None when there is
    none."""
    net = report.network
    if net is None:
        return None
    for i, iface in enumerate(net.interfaces):
        for j, a in enumerate(iface.addresses):
            if not _is_address(a.address):
                return _error("is not an IP address", source, f"network.interfaces[{i}].addresses[{j}].address",
                              a.address)
    for i, addr in enumerate(net.hostname_addresses):
        if not _is_address(addr):
            return _error("is not an IP address", source, f"network.hostname_addresses[{i}]", addr)
    rng = net.ip_local_port_range
    if rng is not None and rng[0] > rng[1]:
        return _error("is not a port range: low > high", source, "network.ip_local_port_range", list(rng))
    return None
