"""The node report: one JSON document per node, validated whenever it is read.

A node report is what :mod:`builder.probe` prints (``envbuild probe --host`` on a node,
``python3 - < probe.py`` inside an image). ``verify`` and ``doctor`` only ever read reports
through :func:`validate` (or :func:`load_file`), so a report that is cut short, hand-edited
into the wrong shape or written by an unknown probe is refused with one line naming the
file, the field and the value (exit 3, "could not check": ``shared/design.md``).

Schema ``envbuild.probe/1`` (the field list with sources is in ``builder/probe.py``)::

    schema            "envbuild.probe/1"                       required
    hostname          str | null                               required
    kernel            str                                      required
    os                {id, version_id, pretty_name: str|null}  required
    glibc             str | null                               required
    python            {version: "3.11.2", executable: str|null}
    torch             null | {version: str, cuda: str|null, cuda_available: bool,
                              cudnn: str|null, nccl_compiled: "X.Y.Z"|null}
    nccl              {loaded: null | {version: "X.Y.Z", code: int, path: str},
                       found: [{path, realpath, version, code, error}],
                       pip_packages: {name: version}}
    gpus              [{index: int, name, uuid: str, pci_bus_id: str|null,
                        memory_total_bytes: int|null, pci_id?: "10de:2330"|null}]
    driver            "570.124.06" | null
    env               {NAME: value}                 (NCCL_*, GLOO_*, TORCH_*, ...)
    errors            [str]
    -- added in issue 3, optional on read (reports of older probes lack them) --
    container         null | {runtime: str|null, version: str|null, installed: {name: version}}
    image             null | {ref, digest, id: str|null}
    network           null | {interfaces: [{name: str, index: int|null, up: bool|null,
                                            loopback: bool, mtu: int|null,
                                            addresses: [{family: "inet"|"inet6",
                                                         address: str, prefixlen: int|null}]}],
                              default_route_interface: str|null,
                              hostname_addresses: [str],
                              ip_local_port_range: null | [int, int]}
    shm               null | {path: str, size_bytes: int|null, free_bytes: int|null}
    gpu_processes     null | [{gpu_index: int, gpu_uuid: str, pid: int,
                               used_memory_bytes: int|null, name: str|null}]

Keys not listed are allowed and ignored (a newer probe may add some); a listed key of the
wrong type, a version that does not parse, or a missing required key is an error.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .errors import EnvbuildError, ExitCode

#: Schemas this envbuild reads.
SUPPORTED_SCHEMAS = ("envbuild.probe/1",)

_VERSION_XYZ = re.compile(r"^\d+\.\d+\.\d+$")
_DRIVER = re.compile(r"^\d+(\.\d+){1,3}$")
_PY_VERSION = re.compile(r"^\d+\.\d+(\.\d+)?([abc]|rc)?\d*\+?$")


class InvalidReport(EnvbuildError):
    """A node report that cannot be read or does not follow its schema (exit 3)."""

    def __init__(self, message: str, **kw) -> None:
        kw.setdefault("exit_code", ExitCode.UNREACHABLE)
        super().__init__(message, **kw)


# --------------------------------------------------------------------------- the schema
# A spec is one of: a type name ("str", "int", "bool", "any"), a tuple (alternatives,
# None meaning null), ("list", spec), ("map", spec) (str keys), ("pair", spec), a dict
# {key: spec} where a key ending in "?" is optional, or ("re", regex, spec-name).

_STR, _INT, _BOOL = "str", "int", "bool"
_OSTR = (None, _STR)
_OINT = (None, _INT)

_GPU = {"index": _INT, "name": _STR, "uuid": _STR, "pci_bus_id": _OSTR,
        "memory_total_bytes": _OINT, "pci_id?": _OSTR}
_ADDRESS = {"family": _STR, "address": _STR, "prefixlen": _OINT}
_INTERFACE = {"name": _STR, "index": _OINT, "up": (None, _BOOL), "loopback": _BOOL,
              "mtu": _OINT, "addresses": ("list", _ADDRESS)}

SCHEMA_1: dict[str, Any] = {
    "schema": _STR,
    "hostname": _OSTR,
    "kernel": _STR,
    "os": {"id": _OSTR, "version_id": _OSTR, "pretty_name": _OSTR},
    "glibc": _OSTR,
    "python": {"version": ("re", _PY_VERSION, "a Python version"), "executable": _OSTR},
    "torch": (None, {"version": _STR, "cuda": _OSTR, "cuda_available": _BOOL,
                     "cudnn": _OSTR,
                     "nccl_compiled": (None, ("re", _VERSION_XYZ, "an X.Y.Z version"))}),
    "nccl": {
        "loaded": (None, {"version": ("re", _VERSION_XYZ, "an X.Y.Z version"), "code": _INT,
                          "path": _STR}),
        "found": ("list", {"path": _STR, "realpath": _OSTR, "version": _OSTR,
                           "code": _OINT, "error": _OSTR}),
        "pip_packages": ("map", _STR),
    },
    "gpus": ("list", _GPU),
    "driver": (None, ("re", _DRIVER, "a driver version like 570.124.06")),
    "env": ("map", _STR),
    "errors": ("list", _STR),
    "container?": (None, {"runtime": _OSTR, "version": _OSTR, "installed": ("map", _STR)}),
    "image?": (None, {"ref": _OSTR, "digest": _OSTR, "id": _OSTR}),
    "network?": (None, {"interfaces": ("list", _INTERFACE),
                        "default_route_interface": _OSTR,
                        "hostname_addresses": ("list", _STR),
                        "ip_local_port_range": (None, ("pair", _INT))}),
    "shm?": (None, {"path": _STR, "size_bytes": _OINT, "free_bytes": _OINT}),
    "gpu_processes?": (None, ("list", {"gpu_index": _INT, "gpu_uuid": _STR, "pid": _INT,
                                       "used_memory_bytes": _OINT, "name": _OSTR})),
}

_TYPE_WORDS = {_STR: "a string", _INT: "an integer", _BOOL: "true or false"}


def _describe(spec: Any) -> str:
    if spec is None:
        return "null"
    if isinstance(spec, str):
        return _TYPE_WORDS.get(spec, spec)
    if isinstance(spec, dict):
        return "an object"
    if spec[0] == "list":
        return "a list"
    if spec[0] == "map":
        return "an object of strings" if spec[1] == _STR else "an object"
    if spec[0] == "pair":
        return "a list of two integers"
    if spec[0] == "re":
        return spec[2]
    return " or ".join(_describe(s) for s in spec)


def _matches(value: Any, spec: Any) -> bool:
    """Shallow type test used to pick among alternatives."""
    if spec is None:
        return value is None
    if spec == _STR:
        return isinstance(value, str)
    if spec == _INT:
        return isinstance(value, int) and not isinstance(value, bool)
    if spec == _BOOL:
        return isinstance(value, bool)
    if isinstance(spec, dict):
        return isinstance(value, dict)
    kind = spec[0]
    if kind in ("list", "pair"):
        return isinstance(value, list)
    if kind == "map":
        return isinstance(value, dict)
    if kind == "re":
        return isinstance(value, str)
    return any(_matches(value, s) for s in spec)


def _check(value: Any, spec: Any, path: str, file: str | None) -> None:
    def bad(what: str | None = None, at: str = path, val: Any = value) -> InvalidReport:
        return InvalidReport(what or f"is not {_describe(spec)}", file=file, field=at or "(top)",
                             value=val)

    if isinstance(spec, tuple) and spec and spec[0] not in ("list", "map", "pair", "re"):
        for alt in spec:
            if _matches(value, alt):
                _check(value, alt, path, file)
                return
        raise bad()
    if not _matches(value, spec):
        raise bad()
    if isinstance(spec, dict):
        for key, sub in spec.items():
            name = key.rstrip("?")
            where = f"{path}.{name}" if path else name
            if name not in value:
                if key.endswith("?"):
                    continue
                raise InvalidReport("is missing", file=file, field=where)
            _check(value[name], sub, where, file)
    elif isinstance(spec, tuple) and spec[0] == "list":
        for i, item in enumerate(value):
            _check(item, spec[1], f"{path}[{i}]", file)
    elif isinstance(spec, tuple) and spec[0] == "map":
        for k, item in value.items():
            _check(item, spec[1], f"{path}.{k}", file)
    elif isinstance(spec, tuple) and spec[0] == "pair":
        if len(value) != 2:
            raise bad()
        for i, item in enumerate(value):
            _check(item, spec[1], f"{path}[{i}]", file)
    elif isinstance(spec, tuple) and spec[0] == "re":
        if not spec[1].match(value):
            raise bad()


def validate(doc: Any, source: str | None = None) -> dict:
    """Check ``doc`` against its node-report schema and return it unchanged.

    Args:
        doc: the parsed JSON document.
        source: where it came from, shown first in errors (a file path, ``"ssh node-a"``).

    Returns:
        ``doc`` (a dict following :data:`SCHEMA_1`).

    Raises:
        InvalidReport: (exit 3) one line naming source, field and value, e.g.
            ``reports/a.json: torch.version: 5 is not a string``, or an unknown ``schema``.
    """
    if not isinstance(doc, dict):
        raise InvalidReport("is not a JSON object (a node report)", file=source,
                            value=type(doc).__name__)
    schema = doc.get("schema")
    if schema not in SUPPORTED_SCHEMAS:
        raise InvalidReport(
            f"is not a node-report schema this envbuild reads ({', '.join(SUPPORTED_SCHEMAS)})",
            file=source, field="schema", value=schema)
    _check(doc, SCHEMA_1, "", source)
    return doc


def parse(text: str, source: str | None = None) -> dict:
    """Parse JSON ``text`` and :func:`validate` it.

    Raises:
        InvalidReport: (exit 3) not JSON (with line and column) or not a valid report.
    """
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as e:
        raise InvalidReport(f"is not JSON: {e.msg} at line {e.lineno} column {e.colno}",
                            file=source) from None
    return validate(doc, source)


def load_file(path: str | Path) -> dict:
    """Read and validate the node report in ``path``.

    Raises:
        InvalidReport: (exit 3) the file cannot be read (message with the OS reason),
            is not UTF-8 JSON, or is not a valid report.
    """
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        reason = e.strerror if isinstance(e, OSError) and e.strerror else str(e)
        raise InvalidReport(f"cannot be read: {reason}", file=str(path)) from None
    return parse(text, str(path))


# --------------------------------------------------------------------------- reading helpers


def get(doc: dict, dotted: str, default: Any = None) -> Any:
    """``doc["a"]["b"]`` for ``"a.b"``; ``default`` where a level is missing or null."""
    cur: Any = doc
    for part in dotted.split("."):
        if not isinstance(cur, dict) or cur.get(part) is None:
            return default
        cur = cur[part]
    return cur


@dataclass
class Node:
    """One node as ``verify``/``doctor`` see it.

    Attributes:
        name: the name shown in tables, e.g. ``"node-1"`` (unique within a run).
        source: where the report came from: a file path, ``"container NAME"``,
            ``"ssh HOST"``, ``"slurm NODE"``.
        report: the validated node report, or None when the node could not be checked.
        error: why it could not be checked (an :class:`EnvbuildError`, exit 3), or None.
        address: the address peers reach this node at (container IP, ssh host name), or
            None when unknown (report files).
        target: how to run a script on the node (:class:`builder.gather.Target`), or
            None (report files).
    """

    name: str
    source: str
    report: dict | None = None
    error: EnvbuildError | None = None
    address: str | None = None
    target: Any = None

    @property
    def ok(self) -> bool:
        """True when the node has a valid report."""
        return self.report is not None and self.error is None
