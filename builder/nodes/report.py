"""The node report: one JSON document per node, validated whenever it is read.

A node report is what :mod:`builder.agent.probe` prints (``envbuild probe --host`` on a node,
``python3 - < probe.py`` inside an image). ``verify`` and ``doctor`` only ever read reports
through :func:`validate` (or :func:`load_file`), so a report that is cut short, hand-edited
into the wrong shape or written by an unknown probe is refused with one line naming the
file, the field and the value (exit 3, "could not check": ``shared/design.md``).

Schema ``envbuild.probe/1`` (the field list with sources is in ``builder/agent/probe.py``)::

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

Bounds (a report is hostile until checked; each limit is far above what a real node gives):

* the document: at most :data:`builder.core.inputs.MAX_REPORT_BYTES` (16 MiB) read, from a file
  or a process's output; JSON nesting at most 64 levels, integers of at most 30 digits,
  no NaN/Infinity, no lone surrogate (:func:`builder.core.inputs.load_json`);
* every pattern matches the whole value (``re.fullmatch``: a trailing newline is refused):
  ``hostname`` a host name, versions (``python.version``, ``torch.version``,
  ``torch.cuda``, ``torch.cudnn``, ``torch.nccl_compiled``, ``nccl.loaded.version``,
  ``nccl.found[].version``, ``driver``, pip versions), package names, GPU ``uuid``
  (``GPU-...``/``MIG-...``), ``pci_bus_id`` (``00000000:18:00.0``), ``pci_id``
  (``10de:2330``), interface names (<= 15 characters, no ``/``, ``:`` or blank: the
  kernel's ``dev_valid_name``), addresses (IPv4/IPv6, ``%scope`` allowed), ``family``
  (``inet``/``inet6``), ``image.digest``/``image.id`` (OCI digests), ``env`` names;
* strings: at most 4096 characters (``PATH_MAX``), ``env`` values 131072
  (``MAX_ARG_STRLEN``), ``errors`` items 65536, mapping keys 256;
* lists and mappings: ``gpus`` 1024, ``gpu_processes`` 65536, ``nccl.found`` 1024,
  ``nccl.pip_packages`` 1024, ``network.interfaces`` 65536, ``addresses`` per interface
  4096, ``hostname_addresses`` 4096, ``env`` 65536, ``errors`` 4096,
  ``container.installed`` 1024;
* integers with a physical meaning: ports (``ip_local_port_range``) 0..65535 with
  low <= high, PIDs 1..4194304 (``PID_MAX_LIMIT``), byte counts 0..2**63-1, indices,
  NCCL codes and MTUs >= 0, ``prefixlen`` 0..128.

Strings without a pattern (``kernel``, paths, ``env`` values, ``errors``...) may hold any
character: ``verify``/``doctor`` show them escaped (:func:`builder.core.inputs.one_line`).
"""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from builder.core import inputs
from builder.core.errors import EnvbuildError, ExitCode

#: Schemas this envbuild reads.
SUPPORTED_SCHEMAS = ("envbuild.probe/1",)

#: Largest node report read, in bytes (a file or a process's output).
MAX_REPORT_BYTES = inputs.MAX_REPORT_BYTES


class InvalidReport(EnvbuildError):
    """A node report that cannot be read or does not follow its schema (exit 3)."""

    def __init__(self, message: str, **kw) -> None:
        kw.setdefault("exit_code", ExitCode.UNREACHABLE)
        super().__init__(message, **kw)


# --------------------------------------------------------------------------- the schema
# A spec is an instance of one of the classes below; ``check(value, path, file)`` raises
# InvalidReport naming the field. Every check is bounded: lists and mappings by their
# ``max``, strings by theirs, patterns are matched whole (re.fullmatch).


class Spec:
    """One field's type and bounds; :meth:`check` raises :class:`InvalidReport`."""

    words = "a value"

    def accepts(self, value: Any) -> bool:  # pragma: no cover - overridden
        """True when ``value`` has this spec's JSON type (bounds not checked)."""
        raise NotImplementedError

    def check(self, value: Any, path: str, file: str | None) -> None:
        """Raise :class:`InvalidReport` (field ``path``) unless ``value`` fits."""
        if not self.accepts(value):
            raise _bad(f"is not {self.words}", path, file, value)
        self.check_bounds(value, path, file)

    def check_bounds(self, value: Any, path: str, file: str | None) -> None:
        """The bounds of a value of the right type (nothing by default)."""


_NO_VALUE = object()


def _bad(message: str, path: str, file: str | None, value: Any = _NO_VALUE) -> InvalidReport:
    """The error for field ``path`` (the value shown escaped unless left out)."""
    if value is _NO_VALUE:
        return InvalidReport(message, file=file, field=path or "(top)")
    return InvalidReport(message, file=file, field=path or "(top)", value=value)


class Str(Spec):
    """A string of at most ``max`` characters."""

    words = "a string"

    def __init__(self, max: int = 4096) -> None:
        self.max = max

    def accepts(self, value: Any) -> bool:
        return isinstance(value, str)

    def check_bounds(self, value: str, path: str, file: str | None) -> None:
        if len(value) > self.max:
            raise _bad(f"is {len(value)} characters long, over the limit of {self.max}", path, file)


class Pattern(Str):
    """A string matching ``regex`` whole (fullmatch), at most ``max`` characters;
    ``words`` says what it is ("a driver version like 570.124.06")."""

    def __init__(self, regex: str, words: str, max: int = 256) -> None:
        super().__init__(max)
        self.regex = re.compile(regex)
        self.words = words

    def check_bounds(self, value: str, path: str, file: str | None) -> None:
        if len(value) > self.max or not self.regex.fullmatch(value):
            raise _bad(f"is not {self.words}", path, file, value)


class Address(Str):
    """An IPv4 or IPv6 address (``fe80::1%eth0``: a scope is allowed)."""

    words = "an IP address"

    def __init__(self) -> None:
        super().__init__(64)

    def check_bounds(self, value: str, path: str, file: str | None) -> None:
        addr, _, scope = value.partition("%")
        try:
            ok = len(value) <= self.max and bool(addr) and addr.isascii() and bool(ipaddress.ip_address(addr))
        except ValueError:
            ok = False
        if not ok or (scope and not _IFNAME_RE.fullmatch(scope) and not scope.isdigit()):
            raise _bad(f"is not {self.words}", path, file, value)


class Int(Spec):
    """An integer (not a boolean) in ``lo..hi``; ``words`` names it in errors."""

    def __init__(self, lo: int, hi: int, words: str | None = None) -> None:
        self.lo, self.hi = lo, hi
        self.words = words or f"an integer in {lo}..{hi}"

    def accepts(self, value: Any) -> bool:
        return isinstance(value, int) and not isinstance(value, bool)

    def check_bounds(self, value: int, path: str, file: str | None) -> None:
        if not self.lo <= value <= self.hi:
            raise _bad(f"is not {self.words}", path, file, value)


class Num(Spec):
    """A finite number (int or float, not a boolean) in ``lo..hi``."""

    def __init__(self, lo: float, hi: float) -> None:
        self.lo, self.hi = lo, hi
        self.words = f"a number in {lo:g}..{hi:g}"

    def accepts(self, value: Any) -> bool:
        return isinstance(value, (int, float)) and not isinstance(value, bool)

    def check_bounds(self, value: float, path: str, file: str | None) -> None:
        if not self.lo <= value <= self.hi:  # NaN fails too
            raise _bad(f"is not {self.words}", path, file, value)


class Bool(Spec):
    """``true`` or ``false``."""

    words = "true or false"

    def accepts(self, value: Any) -> bool:
        return isinstance(value, bool)


class OneOf(Spec):
    """One of the given strings."""

    def __init__(self, *choices: str) -> None:
        self.choices = frozenset(choices)
        self.words = " or ".join(repr(c) for c in choices)

    def accepts(self, value: Any) -> bool:
        return isinstance(value, str)

    def check_bounds(self, value: str, path: str, file: str | None) -> None:
        if value not in self.choices:
            raise _bad(f"is not {self.words}", path, file, value)


class Opt(Spec):
    """``null`` or ``inner``."""

    def __init__(self, inner: Spec) -> None:
        self.inner = inner
        self.words = f"{inner.words} or null"

    def accepts(self, value: Any) -> bool:
        return value is None or self.inner.accepts(value)

    def check_bounds(self, value: Any, path: str, file: str | None) -> None:
        if value is not None:
            self.inner.check_bounds(value, path, file)


class ListOf(Spec):
    """A list of at most ``max`` items, each ``item``."""

    words = "a list"

    def __init__(self, item: Spec, max: int) -> None:
        self.item, self.max = item, max

    def accepts(self, value: Any) -> bool:
        return isinstance(value, list)

    def check_bounds(self, value: list, path: str, file: str | None) -> None:
        if len(value) > self.max:
            raise _bad(f"has {len(value)} items, over the limit of {self.max}", path, file)
        for i, item in enumerate(value):
            self.item.check(item, f"{path}[{i}]", file)


class MapOf(Spec):
    """An object of at most ``max`` entries; each key matches ``key``, each value ``item``."""

    def __init__(self, item: Spec, max: int, key: Pattern | None = None) -> None:
        self.item, self.max, self.key = item, max, key or _KEY
        self.words = "an object of strings" if isinstance(item, Str) else "an object"

    def accepts(self, value: Any) -> bool:
        return isinstance(value, dict)

    def check_bounds(self, value: dict, path: str, file: str | None) -> None:
        if len(value) > self.max:
            raise _bad(f"has {len(value)} entries, over the limit of {self.max}", path, file)
        for k, item in value.items():
            if len(k) > self.key.max or not self.key.regex.fullmatch(k):
                raise _bad(f"has a key that is not {self.key.words}", path, file, k)
            self.item.check(item, f"{path}.{k}" if path else k, file)


class Obj(Spec):
    """An object with the listed keys (``"name?"``: optional); other keys are ignored."""

    words = "an object"

    def __init__(self, fields: dict[str, Spec]) -> None:
        self.fields = [(k.rstrip("?"), k.endswith("?"), spec) for k, spec in fields.items()]

    def accepts(self, value: Any) -> bool:
        return isinstance(value, dict)

    def check_bounds(self, value: dict, path: str, file: str | None) -> None:
        for name, optional, spec in self.fields:
            where = f"{path}.{name}" if path else name
            if name not in value:
                if optional:
                    continue
                raise _bad("is missing", where, file)
            spec.check(value[name], where, file)


class PortRange(ListOf):
    """``[low, high]``: two ports with low <= high."""

    words = "a list of two ports [low, high]"

    def __init__(self) -> None:
        super().__init__(_PORT, 2)

    def check_bounds(self, value: list, path: str, file: str | None) -> None:
        if len(value) != 2:
            raise _bad(f"is not {self.words}", path, file, value)
        super().check_bounds(value, path, file)
        if value[0] > value[1]:
            raise _bad("is not a port range: low > high", path, file, value)


# Patterns (whole values; see the module docstring for the sources of the bounds).
_IFNAME_RE = re.compile(r"(?!\.\.?\Z)[\x21-\x2e\x30-\x39\x3b-\x7e]{1,15}")
_KEY = Pattern(r"[^\x00-\x1f\x7f]{1,256}", "a name of at most 256 characters without control characters")
_VERSION_XYZ = Pattern(r"[0-9]{1,6}\.[0-9]{1,6}\.[0-9]{1,6}", "an X.Y.Z version")
_VERSION = Pattern(r"[0-9][0-9A-Za-z.+_!-]{0,127}", "a version (digits, letters, . + _ ! -)")
_CUDA = Pattern(r"[0-9]{1,4}\.[0-9]{1,4}(\.[0-9]{1,4})?", "a CUDA version like 12.8")
_DRIVER = Pattern(r"[0-9]{1,6}(\.[0-9]{1,6}){1,3}", "a driver version like 570.124.06")
_PY_VERSION = Pattern(r"[0-9]{1,4}\.[0-9]{1,4}(\.[0-9]{1,4})?([abc]|rc)?[0-9]{0,4}\+?", "a Python version")
_HOSTNAME = Pattern(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,254}", "a host name (letters, digits, _ . -)")
_IFNAME = Pattern(_IFNAME_RE.pattern, "an interface name (at most 15 characters, no / : or blank)", max=15)
_GPU_UUID = Pattern(r"(GPU|MIG)-[0-9A-Za-z/_.:-]{1,92}", "a GPU UUID like GPU-8f6a1c52-...")
_PCI_BUS = Pattern(r"[0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.[0-7]", "a PCI bus id like 00000000:18:00.0")
_PCI_ID = Pattern(r"[0-9a-f]{4}:[0-9a-f]{4}", "a PCI vendor:device id like 10de:2330")
_DIGEST = Pattern(r"[a-z0-9]{1,32}([+._-][a-z0-9]{1,32}){0,4}:[A-Za-z0-9=_-]{32,256}", "a digest like sha256:<64 hex>")
_PIP_NAME = Pattern(r"[A-Za-z0-9]([A-Za-z0-9._-]{0,126}[A-Za-z0-9])?", "a package name")
_ENV_NAME = Pattern(r"[!-<>-~]{1,256}", "an environment variable name (printable, no = or blank)")

_TEXT = Str(4096)
_OTEXT = Opt(_TEXT)
_BYTES = Opt(Int(0, 2**63 - 1, "a byte count (0..2**63-1)"))
_INDEX = Int(0, 2**31 - 1, "an index (>= 0)")
_PORT = Int(0, 65535, "a port (0..65535)")
_PID = Int(1, 4194304, "a PID (1..4194304)")
_CODE = Int(0, 2**31 - 1, "a version code (>= 0)")

_GPU = Obj({"index": _INDEX, "name": _TEXT, "uuid": _GPU_UUID, "pci_bus_id": Opt(_PCI_BUS),
            "memory_total_bytes": _BYTES, "pci_id?": Opt(_PCI_ID)})
_ADDRESS = Obj({"family": OneOf("inet", "inet6"), "address": Address(),
                "prefixlen": Opt(Int(0, 128, "a prefix length (0..128)"))})
_INTERFACE = Obj({"name": _IFNAME, "index": Opt(_INDEX), "up": Opt(Bool()), "loopback": Bool(),
                  "mtu": Opt(Int(0, 2**31 - 1, "an MTU (>= 0)")), "addresses": ListOf(_ADDRESS, 4096)})

SCHEMA_1 = Obj({
    "schema": _TEXT,
    "hostname": Opt(_HOSTNAME),
    "kernel": _TEXT,
    "os": Obj({"id": _OTEXT, "version_id": _OTEXT, "pretty_name": _OTEXT}),
    "glibc": _OTEXT,
    "python": Obj({"version": _PY_VERSION, "executable": _OTEXT}),
    "torch": Opt(Obj({"version": _VERSION, "cuda": Opt(_CUDA), "cuda_available": Bool(),
                      "cudnn": Opt(Pattern(r"[0-9]{1,10}", "a cuDNN version number like 91002")),
                      "nccl_compiled": Opt(_VERSION_XYZ)})),
    "nccl": Obj({
        "loaded": Opt(Obj({"version": _VERSION_XYZ, "code": _CODE, "path": _TEXT})),
        "found": ListOf(Obj({"path": _TEXT, "realpath": _OTEXT, "version": Opt(_VERSION_XYZ),
                             "code": Opt(_CODE), "error": _OTEXT}), 1024),
        "pip_packages": MapOf(_VERSION, 1024, key=_PIP_NAME),
    }),
    "gpus": ListOf(_GPU, 1024),
    "driver": Opt(_DRIVER),
    "env": MapOf(Str(131072), 65536, key=_ENV_NAME),
    "errors": ListOf(Str(65536), 4096),
    "container?": Opt(Obj({"runtime": _OTEXT, "version": _OTEXT, "installed": MapOf(_TEXT, 1024)})),
    "image?": Opt(Obj({"ref": _OTEXT, "digest": Opt(_DIGEST), "id": Opt(_DIGEST)})),
    "network?": Opt(Obj({"interfaces": ListOf(_INTERFACE, 65536),
                         "default_route_interface": Opt(_IFNAME),
                         "hostname_addresses": ListOf(Address(), 4096),
                         "ip_local_port_range": Opt(PortRange())})),
    "shm?": Opt(Obj({"path": _TEXT, "size_bytes": _BYTES, "free_bytes": _BYTES})),
    "gpu_processes?": Opt(ListOf(Obj({"gpu_index": _INDEX, "gpu_uuid": _GPU_UUID, "pid": _PID,
                                      "used_memory_bytes": _BYTES, "name": _OTEXT}), 65536)),
})


def check_shape(doc: Any, spec: Spec, source: str | None) -> Any:
    """``doc`` checked against ``spec`` (any :class:`Spec`); returned unchanged.

    Raises:
        InvalidReport: (exit 3) one line naming ``source``, the field and the value.
    """
    spec.check(doc, "", source)
    return doc


def validate(doc: Any, source: str | None = None) -> dict:
    """Check ``doc`` against its node-report schema and return it unchanged.

    Args:
        doc: the parsed JSON document.
        source: where it came from, shown first in errors (a file path, ``"ssh node-a"``).

    Returns:
        ``doc`` (a dict following :data:`SCHEMA_1`).

    Raises:
        InvalidReport: (exit 3) one line naming source, field and value, e.g.
            ``reports/a.json: torch.version: 5 is not a version (...)``, or an unknown ``schema``.
    """
    if not isinstance(doc, dict):
        raise InvalidReport("is not a JSON object (a node report)", file=source,
                            value=type(doc).__name__)
    schema = doc.get("schema")
    if schema not in SUPPORTED_SCHEMAS:
        raise InvalidReport(
            f"is not a node-report schema this envbuild reads ({', '.join(SUPPORTED_SCHEMAS)})",
            file=source, field="schema", value=schema)
    return check_shape(doc, SCHEMA_1, source)


def parse(text: str | bytes, source: str | None = None) -> dict:
    """Parse JSON ``text`` with the bounds of :func:`builder.core.inputs.load_json` and
    :func:`validate` it.

    Raises:
        InvalidReport: (exit 3) over :data:`MAX_REPORT_BYTES`, not JSON (with line and
            column), not bounded JSON (depth, huge integers, NaN, lone surrogates), or
            not a valid report.
    """
    size = len(text) if isinstance(text, (bytes, bytearray)) else len(text.encode("utf-8", "surrogatepass"))
    if size > MAX_REPORT_BYTES:
        raise InvalidReport(f"is {size} bytes, over the {MAX_REPORT_BYTES}-byte limit of a node report",
                            file=source)
    try:
        doc = inputs.load_json(text, source or "node report", exit_code=ExitCode.UNREACHABLE)
    except EnvbuildError as e:
        raise InvalidReport(e.message, file=source) from None
    return validate(doc, source)


def load_file(path: str | Path) -> dict:
    """Read and validate the node report in ``path``: a regular file of at most
    :data:`MAX_REPORT_BYTES` (a FIFO, device or directory is refused without blocking).

    Raises:
        InvalidReport: (exit 3) no such file, not a regular file, over the limit,
            unreadable, not UTF-8 JSON, or not a valid report; one line naming the file.
    """
    try:
        data = inputs.read_regular(path, MAX_REPORT_BYTES, "node report")
    except EnvbuildError as e:
        raise InvalidReport(e.message, file=str(path)) from None
    return parse(data, str(path))


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
        target: how to run a script on the node (:class:`builder.nodes.gather.Target`), or
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
