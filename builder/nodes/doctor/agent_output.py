"""What the in-node agent prints, as models: as untrusted as a node report (InvalidReport, exit 3)."""

from __future__ import annotations

from typing import Annotated, Literal, TypeVar

from msgspec import Meta

from builder.core import inputs
from builder.core.errors import EnvbuildError, ExitCode, ManyErrors
from builder.core.model import Model, convert

from ..report import InvalidReport

T = TypeVar("T", bound=Model)

Seconds = Annotated[float, Meta(ge=0, le=1e9, description="a number in 0..1e+09")]
#: A timing; a ratio to the median divides by it: never 0.
Timing = Annotated[float, Meta(ge=1e-9, le=1e9, description="a number in 1e-09..1e+09")]
Port = Annotated[int, Meta(ge=0, le=65535, description="a port (0..65535)")]
Small = Annotated[int, Meta(ge=0, le=65535, description="an integer in 0..65535")]
PortKey = Annotated[str, Meta(pattern=r"\A(?:[0-9]{1,5})\Z", max_length=256, description="a port number")]
ProbeId = Annotated[str, Meta(pattern=r"\A(?:[^\x00-\x1f\x7f]{1,2048})\Z", max_length=2048, description="a probe id")]


class Listen(Model, frozen=True):
    ports: Annotated[dict[PortKey, Annotated[str, Meta(max_length=512)]], Meta(max_length=1024)]
    sample: Annotated[list[Port], Meta(max_length=1024)]


class Probe(Model, frozen=True):
    status: Annotated[Literal["ok", "open", "refused", "timeout", "unreachable", "error"],
                      Meta(description="'ok' or 'open' or 'refused' or 'timeout' or 'unreachable' or 'error'")]
    detail: Annotated[str, Meta(max_length=4096)]
    seconds: Seconds | None


class Connect(Model, frozen=True):
    results: Annotated[dict[ProbeId, Probe], Meta(max_length=1 << 20)]


class ComputeTiming(Model, frozen=True):
    backend: Annotated[str, Meta(max_length=64)]
    iters: Annotated[int, Meta(ge=0, le=2**31 - 1, description="an integer in 0..2147483647")]
    seconds: Annotated[list[Seconds], Meta(max_length=10000)]
    best_s: Timing | None


class Compute(Model, frozen=True):
    compute: ComputeTiming


class Pair(Model, frozen=True):
    peer: Small
    round: Small
    seconds: Timing | None
    error: Annotated[str, Meta(max_length=4096)] | None


class Pairs(Model, frozen=True, omit_defaults=True):
    pairs: Annotated[list[Pair], Meta(max_length=65536)]
    error: Annotated[str, Meta(max_length=4096)] | None = None


def json_line(line: str | None, model: type[T], where: str = "agent") -> T | None:
    """``line`` as a ``model`` when it is a JSON object, else None; InvalidReport (exit 3)."""
    if not line or not line.lstrip().startswith("{"):
        return None
    try:
        doc = inputs.load_json(line, where, exit_code=ExitCode.UNREACHABLE)
    except EnvbuildError:
        return None
    if not isinstance(doc, dict):
        return None
    try:
        return convert(doc, model, file=f"{where}: agent output", exit_code=ExitCode.UNREACHABLE)
    except ManyErrors as e:
        raise InvalidReport.first(e) from None


def last_json(text: str, model: type[T], where: str = "agent") -> T | None:
    """The last line of ``text`` that is a JSON object, as a ``model``, or None."""
    for line in reversed(text.strip().splitlines()):
        doc = json_line(line, model, where)
        if doc is not None:
            return doc
    return None


Count = Annotated[int, Meta(ge=0, le=2**63 - 1, description="an integer in 0..2**63-1")]
Text = Annotated[str, Meta(max_length=512)]


class NvLinkReading(Model, frozen=True):
    link: Small
    up: bool
    crc_errors: Count | None
    replay_errors: Count | None


class PidReading(Model, frozen=True):
    pid: Count
    exists: bool | None


class GpuReading(Model, frozen=True):
    """One GPU's NVML health readings (``probe.health``); None: not offered by this GPU or driver."""

    index: Small
    name: Text
    uuid: Text
    pci_bus_id: Text
    pci_id: Text | None = None
    memory_total_bytes: Count | None = None
    memory_used_bytes: Count | None = None
    ecc_dbe_volatile: Count | None = None
    ecc_dbe_aggregate: Count | None = None
    ecc_sbe_volatile: Count | None = None
    ecc_sbe_aggregate: Count | None = None
    retired_sbe: Count | None = None
    retired_dbe: Count | None = None
    retired_pending: Count | None = None
    remap_correctable: Count | None = None
    remap_uncorrectable: Count | None = None
    remap_pending: Count | None = None
    remap_failed: Count | None = None
    throttle_reasons: Count | None = None
    temperature_c: Count | None = None
    slowdown_c: Count | None = None
    power_mw: Count | None = None
    power_limit_mw: Count | None = None
    pcie_gen: Count | None = None
    pcie_gen_max: Count | None = None
    pcie_width: Count | None = None
    pcie_width_max: Count | None = None
    persistence: Count | None = None
    nvlinks: Annotated[list[NvLinkReading], Meta(max_length=64)] | None = None
    fabric_state: Count | None = None
    fabric_status: Count | None = None
    pids: Annotated[list[PidReading], Meta(max_length=4096)] = []


class XidEvent(Model, frozen=True):
    gpu_index: Small | None
    xid: Small
    source: Literal["nvml", "kernel log"]
    line: Annotated[str, Meta(max_length=4096)] | None = None


class IbPort(Model, frozen=True):
    device: Text
    port: Text
    state: Text
    rate_gbps: Annotated[float, Meta(ge=0, le=1e9)] | None
    link_layer: Text


class GpuHealth(Model, frozen=True):
    """What ``probe.health`` prints: the readings, judged on the host (:mod:`.gpu_health`)."""

    nvml: Literal["ok", "timeout", "error"]
    gpus: Annotated[list[GpuReading], Meta(max_length=1024)]
    xids: Annotated[list[XidEvent], Meta(max_length=4096)]
    kernel_log: Annotated[str, Meta(max_length=4096)]
    kernel_log_error: Annotated[str, Meta(max_length=4096)] | None
    ib_ports: Annotated[list[IbPort], Meta(max_length=1024)]
    errors: Annotated[list[Annotated[str, Meta(max_length=4096)]], Meta(max_length=1024)]
