"""The agent's documents, typed once for every stage: the node report (``envbuild.probe/1``,
what :mod:`builder.agent.probe` prints) and the rank result (``envbuild.rank-result/3``, what
one rank of the in-image bench writes, its ``probe`` a node report).
"""

from __future__ import annotations

import ipaddress
import re
from typing import Annotated, Any, Literal

import msgspec
from msgspec import Meta

from .model import Model, Violation

#: Node-report schemas this envbuild reads.
SUPPORTED_SCHEMAS = ("envbuild.probe/1",)


# --------------------------------------------------------------------------- field types

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
#: The shape of an address; :func:`report_problem` reads it whole with :mod:`ipaddress`.
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
    """A node report; ``scope`` says where the probe ran: ``host`` (``envbuild probe --host``,
    ssh, srun, ``gate``), ``image`` (in a container), null when its caller did not say."""

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


_IFNAME = re.compile(IFNAME_REGEX)


def _is_address(text: str) -> bool:
    addr, _, scope = text.partition("%")
    try:
        ipaddress.ip_address(addr)
    except ValueError:
        return False
    return addr.isascii() and (not scope or bool(_IFNAME.fullmatch(scope)) or scope.isdigit())


def report_problem(report: NodeReport) -> Violation | None:
    """What a pattern cannot say: the first address :mod:`ipaddress` does not read (a scope
    after ``%`` is an interface name or a number), or a port range with low > high."""
    net = report.network
    if net is None:
        return None
    for i, iface in enumerate(net.interfaces):
        for j, a in enumerate(iface.addresses):
            if not _is_address(a.address):
                return f"network.interfaces[{i}].addresses[{j}].address", a.address, "is not an IP address"
    for i, addr in enumerate(net.hostname_addresses):
        if not _is_address(addr):
            return f"network.hostname_addresses[{i}]", addr, "is not an IP address"
    rng = net.ip_local_port_range
    if rng is not None and rng[0] > rng[1]:
        return "network.ip_local_port_range", list(rng), "is not a port range: low > high"
    return None


# --------------------------------------------------------------------------- the rank result

#: Schema of the per-rank result the in-image bench writes.
RESULT_SCHEMA = "envbuild.rank-result/3"
#: Largest result document or progress line read, in bytes (as node reports: 16 MiB).
MAX_RESULT_BYTES = 16 << 20
#: Most ranks of one run (1024 nodes x 64 GPUs, the command line's bounds).
MAX_WORLD = 1024 * 64

Rank = Annotated[int, Meta(ge=0, lt=MAX_WORLD)]
Count = Annotated[int, Meta(ge=0, le=2**53)]
Seconds = Annotated[float, Meta(ge=0)]
Rate = Annotated[float, Meta(ge=0)]
Line = Annotated[str, Meta(max_length=65536)]
RankStamp = Annotated[str, Meta(max_length=64)]
PerRank = Annotated[list[Seconds], Meta(max_length=MAX_WORLD)]
#: Ranks a certificate row names as wrong (the count is ``wrong``).
MAX_WRONG_RANKS = 64


class CollectiveRow(Model, frozen=True):
    """One size of one collective and dtype in nccl-tests' columns (``bench.collectives``):
    ``size_bytes`` of one rank, GB/s = 1e9 B/s. The run's figures, reduced in the job:
    ``time_us`` the slowest rank's mean (the bandwidths' time), its min and median over ranks,
    ``slowest_rank``, ``wrong`` the total; then this rank's own mean and wrong count (``own_*``:
    a rank reports only its own, so a run's results grow with N, not N^2). In a certificate,
    ``wrong_ranks``: the first ranks whose own count was not 0, of ``wrong_rank_count`` (host-filled); certificates
    written before rank-result/3 carry ``rank_time_us`` and ``wrong_by_rank`` instead.
    """

    size_bytes: Annotated[int, Meta(ge=0, le=2**40)]
    count: Count
    type: Name
    redop: Name
    time_us: Seconds
    algbw_gbps: Rate
    busbw_gbps: Rate
    wrong: Count
    root: Annotated[int, Meta(ge=-1, lt=MAX_WORLD)] = -1
    api: Name | None = None
    min_time_us: Seconds | None = None
    median_time_us: Seconds | None = None
    slowest_rank: Rank | None = None
    own_time_us: Seconds | None = None
    own_wrong: Count | None = None
    wrong_ranks: Annotated[list[Rank], Meta(max_length=MAX_WRONG_RANKS)] = []
    wrong_rank_count: Annotated[int, Meta(ge=0, le=MAX_WORLD)] | None = None
    rank_time_us: PerRank | None = None
    wrong_by_rank: Annotated[list[Count], Meta(max_length=MAX_WORLD)] | None = None


class Unsupported(Model, frozen=True):
    """What the image's torch or backend lacks (not a failure)."""

    unsupported: Line


Floats = Annotated[list[float | None], Meta(max_length=10_000)]


class TrainingCheck(Model, frozen=True):
    """One profile's training check against its single-process reference (``bench.training``),
    or ``{"unsupported": reason}``.
    """

    unsupported: Line | None = None
    needs_numpy: bool = False
    reference_match: bool | None = None
    losses_match: bool | None = None
    params_match: bool | None = None
    tolerance: dict[Name, float | Line] | None = None
    losses: Floats = []
    reference_losses: Floats = []
    max_param_diff: float | None = None
    samples_per_s: Rate | None = None
    wall_s: Seconds | None = None
    steps: Count | None = None
    model: Line | None = None
    check_wall_s: Seconds | None = None
    # per-check details
    dtype: Name | None = None
    batch_per_rank: Count | None = None
    global_batch: Count | None = None
    image_size: Count | None = None
    reference_wall_s: Seconds | None = None
    schedule: Name | None = None
    stages: Count | None = None
    microbatches: Count | None = None
    microbatch_size: Count | None = None
    batch: Count | None = None
    hidden: Count | None = None
    experts: Count | None = None
    tokens_per_rank: Count | None = None
    routed: Annotated[list[Count], Meta(max_length=MAX_WORLD)] | None = None


class Scaling(Model, frozen=True):
    """The DDP step at world size 1 and N (``bench.scaling``): throughputs in images/s,
    ``efficiency`` = throughput_n / (N x throughput_1) (None: not measurable).
    """

    model: Line
    batch_per_rank: Count
    image_size: Count
    steps: Count
    world_size: Annotated[int, Meta(ge=1, le=MAX_WORLD)]
    throughput_1: Rate
    throughput_n: Rate
    time_1_s: Seconds
    time_n_s: Seconds
    efficiency: Rate | None


class NumpyState(Model, frozen=True):
    available: bool
    problem: Line | None
    ranks_without: Annotated[list[Rank], Meta(max_length=MAX_WORLD)]


class FeatureUnsupported(Model, frozen=True):
    unsupported: Line
    needs_numpy: bool = False
    ran: bool = True


class Features(Model, frozen=True):

    """The torch.distributed features that need numpy (``bench.features``): ``"ok"`` or why not."""
    numpy: NumpyState
    all_gather_object: Literal["ok"] | FeatureUnsupported
    pipeline_shape_inference: Literal["ok"] | FeatureUnsupported
    dcp_save: Literal["ok"] | FeatureUnsupported


class ProfilesResult(Model, frozen=True):
    """What ``bench.profiles.run_profiles`` returned on this rank (None: not run)."""

    profiles: Annotated[list[Name], Meta(max_length=16)]
    world_size: Annotated[int, Meta(ge=1, le=MAX_WORLD)]
    backend: Name
    device: Name
    dtypes: Annotated[list[Name], Meta(max_length=16)]
    sizes: Annotated[list[Count], Meta(max_length=4096)]
    iters: Count
    warmup: Count
    seed: int
    faults: Annotated[list[Name], Meta(max_length=64)] = []
    fault_notes: Annotated[list[Line], Meta(max_length=64)] = []
    collectives: dict[Name, list[CollectiveRow] | Unsupported] = {}
    unsupported_types: dict[Name, dict[Name, Line]] = {}
    training: dict[Name, TrainingCheck] = {}
    scaling: Scaling | None = None
    features: Features | None = None
    wall_s: dict[Name, Any] = {}


class RankOptions(Model, frozen=True):

    sizes: Annotated[list[Count], Meta(max_length=4096)] | None = None
    iters: Count | None = None
    warmup: Count | None = None
    ddp_steps: Count | None = None
    ddp_batch: Count | None = None
    ddp_image_size: Count | None = None
    seed: int | None = None
    pg_timeout_s: Seconds | None = None


class RankSocket(Model, frozen=True):

    GLOO_SOCKET_IFNAME: Name | None = None
    NCCL_SOCKET_IFNAME: Name | None = None


class RankResult(Model, frozen=True):
    """One rank's result document; only ``schema``, ``rank`` and ``world_size`` are required."""

    schema: Literal["envbuild.rank-result/3"]
    rank: Rank
    world_size: Annotated[int, Meta(ge=1, le=MAX_WORLD)]
    run_id: Name | None = None
    hostname: Name | None = None
    backend: Name | None = None
    device: Name | None = None
    profiles: ProfilesResult | None = None
    probe: NodeReport | None = None
    local_rank: Rank | None = None
    node_rank: Rank | None = None
    options: RankOptions = msgspec.field(default_factory=RankOptions)
    socket: RankSocket | None = None
    fault: Name | None = None
    errors: Annotated[list[Line], Meta(max_length=1000)] = []
    started_at: RankStamp | None = None
    finished_at: RankStamp | None = None
    elapsed_s: Seconds | None = None


def schemas() -> dict[str, tuple[type[Model], str, str]]:
    """``{file stem: (model, $id, title)}`` of these documents (``schemas/``)."""
    base = "https://envbuild.dev/schemas/"
    return {"node-report": (NodeReport, f"{base}node-report.schema.json", "envbuild node report (envbuild.probe/1)"),
            "rank-result": (RankResult, f"{base}rank-result.schema.json",
                            "envbuild rank result (envbuild.rank-result/3)")}
