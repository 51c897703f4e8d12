"""The node report: one JSON document per node, the typed :class:`NodeReport`, validated
whenever it is read.

A node report is what :mod:`builder.agent.probe` prints (``envbuild probe --host`` on a node,
``python3 -m probe`` inside an image). ``verify`` and ``doctor`` only ever read reports
through :func:`validate` (or :func:`parse` / :func:`load_file`), so a report that is cut
short, hand-edited into the wrong shape or written by an unknown probe is refused with one
line naming the file, the field and the value (exit 3, "could not check": ``shared/design.md``).

Schema ``envbuild.probe/1`` (the field list with sources is in :mod:`builder.agent.probe`;
the JSON Schema is ``schemas/node-report.schema.json``)::

    schema            "envbuild.probe/1"                       required
    scope             "host" | "image" | null                  (issue 11, optional: see below)
    probed_at         "2025-06-01T12:00:00Z" | null            (issue 11, optional)
    hostname          str | null                               required
    kernel            str                                      required
    os                {id, version_id, pretty_name: str|null}  required
    glibc             str | null                               required
    python            {version: "3.11.2", executable: str|null}
    torch             null | {version: str, cuda: str|null, cuda_available: bool,
                              cudnn: str|null, nccl_compiled: "X.Y.Z"|null}
    nccl              {loaded: null | {version: "X.Y.Z", code: int, path: str},
                       found: [{path, realpath, version, code, error}],
                       pip_packages: {name: version},
                       net_plugin?: null | {requested, path, realpath, sha256, name,
                                            api: "v8", version}}      (issue 11)
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
    -- added in issue 11, optional on read --
    cuda_runtime      null | {loaded: [{path: str, version: "12.8"|null}]}

``scope`` says where the probe ran: ``host`` (``envbuild probe --host``, ssh, srun, ``gate``)
or ``image`` (inside a container of an image); null when its caller did not say (the
in-image probe of a certification run). ``verify --against`` compares the image's fields
(torch, Python, NCCL, the OS and environment) only between reports of the same scope.

A key not listed is refused (the probe that writes reports ships with this envbuild); a
listed key of the wrong type, a version that does not parse, or a missing required key is
an error.

Bounds (a report is hostile until checked; each limit is far above what a real node gives):

* the document: at most :data:`builder.core.inputs.MAX_REPORT_BYTES` (16 MiB) read, from a file
  or a process's output; JSON nesting at most 64 levels, integers of at most 30 digits,
  no NaN/Infinity, no lone surrogate (:func:`builder.core.inputs.load_json`);
* every pattern matches the whole value (``\\A...\\Z``: a trailing newline is refused):
  ``hostname`` a host name, versions (``python.version``, ``torch.version``,
  ``torch.cuda``, ``torch.cudnn``, ``torch.nccl_compiled``, ``nccl.loaded.version``,
  ``nccl.found[].version``, ``driver``, pip versions), package names, GPU ``uuid``
  (``GPU-...``/``MIG-...``), ``pci_bus_id`` (``00000000:18:00.0``), ``pci_id``
  (``10de:2330``), interface names (<= 15 characters, no ``/``, ``:`` or blank: the
  kernel's ``dev_valid_name``), addresses (IPv4/IPv6 as :mod:`ipaddress` reads them,
  ``%scope`` allowed), ``family`` (``inet``/``inet6``), ``image.digest``/``image.id``
  (OCI digests), ``env`` names;
* strings: at most 4096 characters (``PATH_MAX``), ``env`` values 131072
  (``MAX_ARG_STRLEN``), ``errors`` items 65536, mapping keys 256;
* lists and mappings: ``gpus`` 1024, ``gpu_processes`` 65536, ``nccl.found`` 1024,
  ``nccl.pip_packages`` 1024, ``network.interfaces`` 65536, ``addresses`` per interface
  4096, ``hostname_addresses`` 4096, ``env`` 65536, ``errors`` 4096,
  ``container.installed`` 1024;
* integers with a physical meaning: ports (``ip_local_port_range``) 0..65535 with
  low <= high, PIDs 1..4194304 (``PID_MAX_LIMIT``), byte counts 0..2**63-1, indices,
  NCCL codes and MTUs >= 0, ``prefixlen`` 0..128.

The model carries the bounds (``msgspec.Meta``; its ``description`` is the wording of
errors); msgspec checks them and :mod:`builder.nodes.reporterrors` words the first problem.
Strings without a pattern (``kernel``, paths, ``env`` values, ``errors``...) may hold any
character: ``verify``/``doctor`` show them escaped (:func:`builder.core.inputs.one_line`).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal

import msgspec
from msgspec import Meta

from builder.core import inputs
from builder.core.errors import EnvbuildError, ExitCode
from builder.core.model import Model

if TYPE_CHECKING:
    from .sources.base import Target

#: Schemas this envbuild reads.
SUPPORTED_SCHEMAS = ("envbuild.probe/1",)

#: Largest node report read, in bytes (a file or a process's output).
MAX_REPORT_BYTES = inputs.MAX_REPORT_BYTES


class InvalidReport(EnvbuildError):
    """A node report that cannot be read or does not follow its schema (exit 3)."""

    def __init__(self, message: str, **kw: Any) -> None:
        kw.setdefault("exit_code", ExitCode.UNREACHABLE)
        super().__init__(message, **kw)


# --------------------------------------------------------------------------- field types
# ``description`` says what a value must be: errors read "is not <description>".

#: An interface name as the kernel's ``dev_valid_name`` allows it: 1-15 printable
#: characters without ``/``, ``:`` or blank, and not ``.`` or ``..``.
IFNAME_REGEX = (r"[\x21-\x2d\x30-\x39\x3b-\x7e][\x21-\x2e\x30-\x39\x3b-\x7e]{0,14}"
                r"|\.[\x21-\x2d\x30-\x39\x3b-\x7e][\x21-\x2e\x30-\x39\x3b-\x7e]{0,13}"
                r"|\.\.[\x21-\x2e\x30-\x39\x3b-\x7e]{1,13}")

Text = Annotated[str, Meta(max_length=4096)]
Key = Annotated[str, Meta(pattern=r"\A(?:[^\x00-\x1f\x7f]{1,256})\Z", max_length=256,
                          description="a name of at most 256 characters without control characters")]
VersionXYZ = Annotated[str, Meta(pattern=r"\A(?:[0-9]{1,6}\.[0-9]{1,6}\.[0-9]{1,6})\Z", max_length=256,
                                 description="an X.Y.Z version")]
Version = Annotated[str, Meta(pattern=r"\A(?:[0-9][0-9A-Za-z.+_!-]{0,127})\Z", max_length=256,
                              description="a version (digits, letters, . + _ ! -)")]
CudaVersion = Annotated[str, Meta(pattern=r"\A(?:[0-9]{1,4}\.[0-9]{1,4}(\.[0-9]{1,4})?)\Z", max_length=256,
                                  description="a CUDA version like 12.8")]
Cudnn = Annotated[str, Meta(pattern=r"\A(?:[0-9]{1,10})\Z", max_length=256,
                            description="a cuDNN version number like 91002")]
Driver = Annotated[str, Meta(pattern=r"\A(?:[0-9]{1,6}(\.[0-9]{1,6}){1,3})\Z", max_length=256,
                             description="a driver version like 570.124.06")]
PyVersion = Annotated[str, Meta(pattern=r"\A(?:[0-9]{1,4}\.[0-9]{1,4}(\.[0-9]{1,4})?([abc]|rc)?[0-9]{0,4}\+?)\Z",
                                max_length=256, description="a Python version")]
Hostname = Annotated[str, Meta(pattern=r"\A(?:[A-Za-z0-9_][A-Za-z0-9_.-]{0,254})\Z", max_length=256,
                               description="a host name (letters, digits, _ . -)")]
IfName = Annotated[str, Meta(pattern=r"\A(?:[\x21-\x2d\x30-\x39\x3b-\x7e][\x21-\x2e\x30-\x39\x3b-\x7e]{0,14}"
                                     r"|\.[\x21-\x2d\x30-\x39\x3b-\x7e][\x21-\x2e\x30-\x39\x3b-\x7e]{0,13}"
                                     r"|\.\.[\x21-\x2e\x30-\x39\x3b-\x7e]{1,13})\Z", max_length=15,
                             description="an interface name (at most 15 characters, no / : or blank)")]
GpuUuid = Annotated[str, Meta(pattern=r"\A(?:(GPU|MIG)-[0-9A-Za-z/_.:-]{1,92})\Z", max_length=256,
                              description="a GPU UUID like GPU-8f6a1c52-...")]
PciBus = Annotated[str, Meta(pattern=r"\A(?:[0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.[0-7])\Z", max_length=256,
                             description="a PCI bus id like 00000000:18:00.0")]
PciId = Annotated[str, Meta(pattern=r"\A(?:[0-9a-f]{4}:[0-9a-f]{4})\Z", max_length=256,
                            description="a PCI vendor:device id like 10de:2330")]
Digest = Annotated[str, Meta(pattern=r"\A(?:[a-z0-9]{1,32}([+._-][a-z0-9]{1,32}){0,4}:[A-Za-z0-9=_-]{32,256})\Z",
                             max_length=256, description="a digest like sha256:<64 hex>")]
PipName = Annotated[str, Meta(pattern=r"\A(?:[A-Za-z0-9]([A-Za-z0-9._-]{0,126}[A-Za-z0-9])?)\Z", max_length=256,
                              description="a package name")]
EnvName = Annotated[str, Meta(pattern=r"\A(?:[!-<>-~]{1,256})\Z", max_length=256,
                              description="an environment variable name (printable, no = or blank)")]
#: The shape of an address; :func:`builder.nodes.reporterrors.semantic_problem` reads it
#: whole with :mod:`ipaddress`.
IpAddress = Annotated[str, Meta(pattern=r"\A(?:[0-9A-Fa-f:.]{2,45}(%[!-~]{1,15})?)\Z", max_length=64,
                                description="an IP address")]
Family = Annotated[Literal["inet", "inet6"], Meta(description="'inet' or 'inet6'")]
Bytes = Annotated[int, Meta(ge=0, le=2**63 - 1, description="a byte count (0..2**63-1)")]
Index = Annotated[int, Meta(ge=0, le=2**31 - 1, description="an index (>= 0)")]
Port = Annotated[int, Meta(ge=0, le=65535, description="a port (0..65535)")]
Pid = Annotated[int, Meta(ge=1, le=4194304, description="a PID (1..4194304)")]
Code = Annotated[int, Meta(ge=0, le=2**31 - 1, description="a version code (>= 0)")]
Mtu = Annotated[int, Meta(ge=0, le=2**31 - 1, description="an MTU (>= 0)")]
PrefixLen = Annotated[int, Meta(ge=0, le=128, description="a prefix length (0..128)")]
PortRange = Annotated[list[Port], Meta(min_length=2, max_length=2, description="a list of two ports [low, high]")]
EnvValue = Annotated[str, Meta(max_length=131072)]
Stamp = Annotated[str, Meta(pattern=r"\A(?:[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}(\.[0-9]{1,9})?Z)\Z",
                            max_length=64, description="a UTC time like 2025-06-01T12:00:00Z")]
Sha256 = Annotated[str, Meta(pattern=r"\A(?:sha256:[0-9a-f]{64})\Z", max_length=71,
                             description="a sha256:<64 hex> digest")]
PluginApi = Annotated[str, Meta(pattern=r"\A(?:v[0-9]{1,3})\Z", max_length=4,
                                description="a plugin API version like v8")]
Name = Annotated[str, Meta(max_length=256)]
ErrorText = Annotated[str, Meta(max_length=65536)]


# --------------------------------------------------------------------------- the model


class OsRelease(Model, frozen=True):
    """``/etc/os-release`` fields."""

    id: Text | None
    version_id: Text | None
    pretty_name: Text | None


class Python(Model, frozen=True):
    """The interpreter that ran the probe."""

    version: PyVersion
    executable: Text | None


class Torch(Model, frozen=True):
    """torch as imported: its release, the CUDA it was built with, cuDNN, compiled NCCL."""

    version: Version
    cuda: CudaVersion | None
    cuda_available: bool
    cudnn: Cudnn | None
    nccl_compiled: VersionXYZ | None


class NcclLoaded(Model, frozen=True):
    """The libnccl mapped into the probing process (after importing torch)."""

    version: VersionXYZ
    code: Code
    path: Text


class NcclFound(Model, frozen=True):
    """One libnccl file on disk."""

    path: Text
    realpath: Text | None
    version: VersionXYZ | None
    code: Code | None
    error: Text | None


class NetPlugin(Model, frozen=True):
    """The NCCL network plugin NCCL would load (:mod:`builder.agent.probe.libs`): what
    ``NCCL_NET_PLUGIN`` asked for, the file found (``path`` None: none, NCCL uses its own
    transports), its content hash, the name its ``ncclNetPlugin_vN`` struct gives, the API
    version N and the version in its file name."""

    requested: EnvValue | None
    path: Text | None
    realpath: Text | None
    sha256: Sha256 | None
    name: Name | None
    api: PluginApi | None
    version: Version | None


class Nccl(Model, frozen=True):
    """NCCL loaded, on disk and as pip packages, and its network plugin."""

    loaded: NcclLoaded | None
    found: Annotated[list[NcclFound], Meta(max_length=1024)]
    pip_packages: Annotated[dict[PipName, Version], Meta(max_length=1024)]
    net_plugin: NetPlugin | None = None


class Gpu(Model, frozen=True):
    """One GPU as NVML lists it."""

    index: Index
    name: Text
    uuid: GpuUuid
    pci_bus_id: PciBus | None
    memory_total_bytes: Bytes | None
    pci_id: PciId | None = None


class Container(Model, frozen=True):
    """The container runtime the probe ran in, and the runtimes installed there."""

    runtime: Text | None
    version: Text | None
    installed: Annotated[dict[Key, Text], Meta(max_length=1024)]


class Image(Model, frozen=True):
    """The image the probe ran in: reference, registry digest, engine image ID."""

    ref: Text | None
    digest: Digest | None
    id: Digest | None


class Address(Model, frozen=True):
    """One address of an interface."""

    family: Family
    address: IpAddress
    prefixlen: PrefixLen | None


class Interface(Model, frozen=True):
    """One network interface."""

    name: IfName
    index: Index | None
    up: bool | None
    loopback: bool
    mtu: Mtu | None
    addresses: Annotated[list[Address], Meta(max_length=4096)]


class Network(Model, frozen=True):
    """Interfaces, default route, hostname addresses, ephemeral port range."""

    interfaces: Annotated[list[Interface], Meta(max_length=65536)]
    default_route_interface: IfName | None
    hostname_addresses: Annotated[list[IpAddress], Meta(max_length=4096)]
    ip_local_port_range: PortRange | None


class Shm(Model, frozen=True):
    """``/dev/shm`` size and free space."""

    path: Text
    size_bytes: Bytes | None
    free_bytes: Bytes | None


class GpuProcess(Model, frozen=True):
    """One NVML compute process (a host PID)."""

    gpu_index: Index
    gpu_uuid: GpuUuid
    pid: Pid
    used_memory_bytes: Bytes | None
    name: Text | None


class CudaRuntimeLib(Model, frozen=True):
    """One CUDA runtime library mapped into the probing process."""

    path: Text
    version: CudaVersion | None


class CudaRuntime(Model, frozen=True):
    """The CUDA runtime libraries (``libcudart``) mapped after importing torch."""

    loaded: Annotated[list[CudaRuntimeLib], Meta(max_length=1024)]


class NodeReport(Model, frozen=True):
    """A node report, schema ``envbuild.probe/1`` (see the module docstring)."""

    schema: Literal["envbuild.probe/1"]
    hostname: Hostname | None
    kernel: Text
    os: OsRelease
    glibc: Text | None
    python: Python
    torch: Torch | None
    nccl: Nccl
    gpus: Annotated[list[Gpu], Meta(max_length=1024)]
    driver: Driver | None
    env: Annotated[dict[EnvName, EnvValue], Meta(max_length=65536)]
    errors: Annotated[list[ErrorText], Meta(max_length=4096)]
    container: Container | None = None
    image: Image | None = None
    network: Network | None = None
    shm: Shm | None = None
    gpu_processes: Annotated[list[GpuProcess], Meta(max_length=65536)] | None = None
    cuda_runtime: CudaRuntime | None = None
    scope: Literal["host", "image"] | None = None
    probed_at: Stamp | None = None

    @property
    def is_host(self) -> bool:
        """True when the probe ran on the host, outside any image (``scope`` ``host``)."""
        return self.scope == "host"


# --------------------------------------------------------------------------- reading


def validate(doc: Any, source: str | None = None) -> NodeReport:
    """``doc`` (parsed JSON) as a :class:`NodeReport`.

    Args:
        doc: the parsed JSON document.
        source: where it came from, shown first in errors (a file path, ``"ssh node-a"``).

    Raises:
        InvalidReport: (exit 3) one line naming source, field and value, e.g.
            ``reports/a.json: torch.version: 5 is not a version (...)``, or an unknown ``schema``.
    """
    from .reporterrors import first_problem, semantic_problem

    if not isinstance(doc, dict):
        raise InvalidReport("is not a JSON object (a node report)", file=source,
                            value=type(doc).__name__)
    schema = doc.get("schema")
    if schema not in SUPPORTED_SCHEMAS:
        raise InvalidReport(
            f"is not a node-report schema this envbuild reads ({', '.join(SUPPORTED_SCHEMAS)})",
            file=source, field="schema", value=schema)
    try:
        report = msgspec.convert(doc, NodeReport, strict=True)
    except msgspec.ValidationError as e:
        raise first_problem(e, doc, NodeReport, source) from None
    problem = semantic_problem(report, source)
    if problem is not None:
        raise problem
    return report


def parse(text: str | bytes, source: str | None = None) -> NodeReport:
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


def load_file(path: str | Path) -> NodeReport:
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


# --------------------------------------------------------------------------- nodes


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
        target: how to run agent modules on the node
            (:class:`builder.nodes.sources.base.Target`), or None (report files).
    """

    name: str
    source: str
    report: NodeReport | None = None
    error: EnvbuildError | None = None
    address: str | None = None
    target: Target | None = None

    @property
    def ok(self) -> bool:
        """True when the node has a valid report."""
        return self.report is not None and self.error is None
