"""The ``gpu-health`` judgement: one node's readings against ``builder/nodes/data/gpu_health.yaml``,
overridden per GPU model by an operator's file."""

from __future__ import annotations

import functools
from dataclasses import asdict, dataclass, replace
from importlib import resources
from typing import Annotated, Any

import msgspec
import yaml
from msgspec import Meta

from builder.core import inputs
from builder.core.errors import EnvbuildError, FailureClass, ManyErrors, next_step, with_step
from builder.core.inputs import one_line
from builder.core.model import Model, convert

from .agent_output import GpuHealth, GpuReading
from .base import FAIL, WARN

Count = Annotated[int, Meta(ge=0, le=1 << 40, description="an integer in 0..2**40")]
#: Largest threshold file read, in bytes.
MAX_THRESHOLDS_BYTES = 1 << 20
#: nvmlClocksThrottleReasons GpuIdle: link generation drops at idle to save power (not a fault).
_IDLE = 0x1
#: nvmlGpuFabricState_t: not supported, not started, in progress, completed.
_FABRIC_NOT_STARTED, _FABRIC_IN_PROGRESS, _FABRIC_COMPLETED = 1, 2, 3
_SOURCES = {"nvml": "NVML's events", "kernel log": "the kernel log"}


class Thresholds(Model, frozen=True):
    ecc_dbe_volatile_max: Count
    ecc_dbe_aggregate_max: Count
    ecc_sbe_volatile_max: Count
    retired_pages_max: Count
    temperature_margin_c: Annotated[int, Meta(ge=0, le=200, description="an integer in 0..200")]
    power_ratio_max: Annotated[float, Meta(ge=0, le=10, description="a number in 0..10")]
    nvlink_crc_errors_max: Count
    nvlink_replay_errors_max: Count
    ib_rate_min_gbps: Annotated[float, Meta(ge=0, le=1e6, description="a number in 0..1e6")]
    persistence_required: bool
    memory_held_max_mib: Count


@dataclass(frozen=True)
class Finding:
    """One problem: where (``GPU 0 (UUID, bus id)``, a port, the node), what, the value and the threshold."""

    status: str
    where: str
    what: str
    value: str
    threshold: str
    cls: FailureClass
    next_step: str

    def line(self, node: str) -> str:
        return with_step(f"{node} {self.where}: {self.what} {self.value} (threshold {self.threshold})", self.cls,
                         self.next_step)

    def to_json(self) -> dict:
        return {**asdict(self), "cls": self.cls.value}


@functools.lru_cache(maxsize=1)
def table() -> dict[str, Any]:
    """``data/gpu_health.yaml``, parsed once."""
    text = resources.files("builder.nodes").joinpath("data/gpu_health.yaml").read_text(encoding="utf-8")
    return dict(yaml.safe_load(text))


@dataclass(frozen=True)
class Limits:
    """The thresholds of every GPU model: the table's, then the operator's ``defaults`` and ``skus``."""

    defaults: Thresholds
    skus: dict[str, Thresholds]

    def of(self, gpu_name: str) -> Thresholds:
        return self.skus.get(gpu_name, self.defaults)


def _merge(base: dict, over: Any, file: str, field: str) -> Thresholds:
    if not isinstance(over, dict):
        raise EnvbuildError("is not a mapping of thresholds", file=file, field=field, value=over)
    try:
        return convert({**base, **over}, Thresholds, file=file, prefix=field)
    except ManyErrors as e:
        raise e.errors[0] from None


def limits(path: str | None = None) -> Limits:
    """The table's thresholds overridden by the file at ``path`` (YAML or JSON).
    Raises EnvbuildError: (exit 2) a bad key or value, naming it; (exit 3) the file cannot be read."""
    docs: list[tuple[str, Any]] = [("gpu_health.yaml", {k: table()[k] for k in ("defaults", "skus")})]
    if path:
        docs.append((path, inputs.load_yaml(inputs.read_text(path, MAX_THRESHOLDS_BYTES, "threshold file"), path)))
    base: dict = {}
    skus: dict[str, dict] = {}
    for file, doc in docs:
        if not isinstance(doc, dict) or not set(doc) <= {"defaults", "skus"}:
            raise EnvbuildError("must be a mapping with the keys defaults and skus", file=file, value=doc)
        base = _merge(base, doc.get("defaults") or {}, file, "defaults").to_dict()
        named = doc.get("skus") or {}
        if not isinstance(named, dict):
            raise EnvbuildError("is not a mapping of GPU names", file=file, field="skus", value=named)
        for name, over in named.items():
            if not isinstance(name, str) or not 0 < len(name) <= 96 or inputs.has_control(name):
                raise EnvbuildError("is not a GPU name (1-96 printable characters)", file=file, field="skus",
                                    value=name)
            _merge({**base, **skus.get(name, {})}, over, file, f"skus.{name}")  # refused here, naming the file
            skus[name] = {**skus.get(name, {}), **over}
    return Limits(_merge(base, {}, "gpu_health.yaml", "defaults"),
                  {n: _merge(base, over, "gpu_health.yaml", f"skus.{n}") for n, over in skus.items()})


def _f(status: str, where: str, what: str, value: object, threshold: object, cls: FailureClass,
       step: str | None = None) -> Finding:
    return Finding(status, where, what, one_line(value, 200), one_line(threshold, 200), cls, next_step(cls, step))


def gpu_label(g: GpuReading) -> str:
    return f"GPU {g.index} ({one_line(g.uuid, 96)}, {one_line(g.pci_bus_id, 32)})"


def _memory(g: GpuReading, t: Thresholds, at: str) -> list[Finding]:
    out = []
    for r in table()["counters"]:
        value, limit = getattr(g, r["reading"]), r["max"] if isinstance(r["max"], int) else getattr(t, r["max"])
        if (value or 0) > limit:
            out.append(_f(r["status"], at, r["what"], value, f"<= {limit}", FailureClass(r["class"]), r["next"]))
    retired = (g.retired_sbe or 0) + (g.retired_dbe or 0)
    if retired > t.retired_pages_max:
        out.append(_f(FAIL, at, "retired pages", retired, f"<= {t.retired_pages_max}", FailureClass.HARDWARE))
    return out


def _clocks(g: GpuReading, t: Thresholds, at: str) -> list[Finding]:
    out = []
    for bit, r in table()["throttle"].items():
        if (g.throttle_reasons or 0) & int(bit):
            out.append(_f(r["status"], at, f"clocks throttled: {r['name']}", f"reasons 0x{g.throttle_reasons:x}",
                          f"bit 0x{int(bit):x} clear", FailureClass(r["class"]), r["next"]))
    if g.temperature_c is not None and g.slowdown_c and g.temperature_c >= g.slowdown_c - t.temperature_margin_c:
        out.append(_f(FAIL if g.temperature_c >= g.slowdown_c else WARN, at, "temperature", f"{g.temperature_c} C",
                      f"< {g.slowdown_c - t.temperature_margin_c} C (slowdown {g.slowdown_c} C - "
                      f"{t.temperature_margin_c} C)", FailureClass.THRESHOLD, "cooling"))
    if g.power_mw is not None and g.power_limit_mw and g.power_mw > g.power_limit_mw * t.power_ratio_max:
        out.append(_f(WARN, at, "power", f"{g.power_mw / 1000:.0f} W",
                      f"<= {t.power_ratio_max:g} x {g.power_limit_mw / 1000:.0f} W limit", FailureClass.THRESHOLD,
                      "threshold"))
    return out


def _links(g: GpuReading, t: Thresholds, at: str) -> list[Finding]:
    out, hw = [], FailureClass.HARDWARE
    if g.pcie_width is not None and g.pcie_width_max and g.pcie_width < g.pcie_width_max:
        out.append(_f(FAIL, at, "PCIe link width", f"x{g.pcie_width}", f"x{g.pcie_width_max} (the maximum)", hw,
                      "reseat"))
    busy = g.throttle_reasons is not None and not g.throttle_reasons & _IDLE
    if busy and g.pcie_gen is not None and g.pcie_gen_max and g.pcie_gen < g.pcie_gen_max:
        out.append(_f(WARN, at, "PCIe link generation (busy GPU)", f"gen{g.pcie_gen}", f"gen{g.pcie_gen_max}", hw,
                      "reseat"))
    links = g.nvlinks or []
    down = [str(n.link) for n in links if not n.up]
    if down:
        out.append(_f(FAIL, at, "NVLink links down", ",".join(down), f"all {len(links)} up", hw, "reseat"))
    for n in links:
        for what, value, limit in (("CRC", n.crc_errors, t.nvlink_crc_errors_max),
                                   ("replay", n.replay_errors, t.nvlink_replay_errors_max)):
            if (value or 0) > limit:
                out.append(_f(WARN, at, f"NVLink {n.link} {what} errors", value, f"<= {limit}", FailureClass.NETWORK,
                              "reseat"))
    return out


def _software(g: GpuReading, t: Thresholds, at: str) -> list[Finding]:
    out, image = [], FailureClass.IMAGE
    if t.persistence_required and g.persistence == 0:
        out.append(_f(WARN, at, "persistence mode", "disabled", "enabled", image, "persistence"))
    if g.fabric_state in (_FABRIC_NOT_STARTED, _FABRIC_IN_PROGRESS):
        out.append(_f(FAIL if g.fabric_state == _FABRIC_NOT_STARTED else WARN, at, "Fabric Manager state",
                      "not started" if g.fabric_state == _FABRIC_NOT_STARTED else "in progress", "completed",
                      image, "fabric"))
    elif g.fabric_state == _FABRIC_COMPLETED and g.fabric_status:
        out.append(_f(FAIL, at, "Fabric Manager registration", f"nvmlReturn_t {g.fabric_status}", "0 (success)",
                      FailureClass.NETWORK, "reboot"))
    for p in g.pids:
        if p.exists is False:
            out.append(_f(FAIL, at, "held by a process that no longer exists", f"pid {p.pid}",
                          "every holder running", FailureClass.WORKLOAD, "reset"))
    return out


def _xids(doc: GpuHealth, labels: dict[int, str]) -> list[Finding]:
    out, seen = [], set()
    known = table()["xids"]
    for x in doc.xids:
        if (x.gpu_index, x.xid) in seen:
            continue
        seen.add((x.gpu_index, x.xid))
        at = labels.get(x.gpu_index, "GPU ?") if x.gpu_index is not None else "a GPU not listed"
        r = known.get(x.xid) or {"name": "not in the common list", "status": WARN, "class": "hardware",
                                 "next": "lookup"}
        out.append(_f(r["status"], at, f"XID {x.xid} ({r['name']}) in {_SOURCES[x.source]}",
                      one_line(x.line or x.xid, 120), "no XID since boot", FailureClass(r["class"]), r["next"]))
    return out


def _ports(doc: GpuHealth, t: Thresholds) -> list[Finding]:
    out, net = [], FailureClass.NETWORK
    fastest: dict[str, float] = {}
    for p in doc.ib_ports:
        fastest[p.link_layer] = max(fastest.get(p.link_layer, 0.0), p.rate_gbps or 0.0)
    for p in doc.ib_ports:
        at = f"{one_line(p.device, 64)} port {one_line(p.port, 8)} ({one_line(p.link_layer, 20)})"
        if not p.state.endswith("ACTIVE"):
            out.append(_f(FAIL, at, "port state", p.state or "unknown", "4: ACTIVE", net, "cable"))
        elif (p.rate_gbps or 0) < max(t.ib_rate_min_gbps, fastest[p.link_layer]):
            out.append(_f(WARN, at, "port rate", f"{p.rate_gbps} Gb/s",
                          f">= {max(t.ib_rate_min_gbps, fastest[p.link_layer]):g} Gb/s", net, "cable"))
    return out


def judge(doc: GpuHealth, lim: Limits, expected: int | None) -> list[Finding]:
    """Every finding of one node, failures first."""
    hw = FailureClass.HARDWARE
    out: list[Finding] = []
    if doc.nvml == "timeout":
        out.append(_f(FAIL, "NVML", "did not answer", doc.errors[0] if doc.errors else "", "an answer", hw, "reboot"))
    elif expected is not None and len(doc.gpus) != expected:
        out.append(_f(FAIL if len(doc.gpus) < expected else WARN, "node", "GPU count", len(doc.gpus),
                      f"{expected} expected", hw if len(doc.gpus) < expected else FailureClass.IMAGE,
                      "reboot" if len(doc.gpus) < expected else "image"))
    out += [_f(WARN, "NVML", "call failed", e, "no error", hw, "reboot") for e in doc.errors[:20]
            if doc.nvml != "timeout"]
    for g in doc.gpus:
        t, at = lim.of(g.name), gpu_label(g)
        out += _memory(g, t, at) + _clocks(g, t, at) + _links(g, t, at) + _software(g, t, at)
    out += _xids(doc, {g.index: gpu_label(g) for g in doc.gpus}) + _ports(doc, lim.defaults)
    return sorted(out, key=lambda f: f.status != FAIL)


def job_findings(before: GpuHealth, now: GpuHealth, lim: Limits) -> list[Finding]:
    """What a job left on the GPUs (``gate --epilog``): XIDs and double-bit ECC errors that are new since
    the Prolog's reading ``before``, GPU memory still used above it; failures first."""
    was = {g.uuid: g for g in before.gpus}
    out: list[Finding] = []
    for g in now.gpus:
        b, at = was.get(g.uuid), gpu_label(g)
        if b is None:
            continue
        for key, what in (("ecc_dbe_volatile", "volatile"), ("ecc_dbe_aggregate", "aggregate")):
            if (getattr(g, key) or 0) > (getattr(b, key) or 0):
                out.append(_f(FAIL, at, f"{what} double-bit ECC errors during the job", getattr(g, key),
                              f"{getattr(b, key) or 0} at the Prolog", FailureClass.HARDWARE, "reset"))
        margin = lim.of(g.name).memory_held_max_mib << 20
        if g.memory_used_bytes is not None and g.memory_used_bytes > (b.memory_used_bytes or 0) + margin:
            out.append(_f(FAIL, at, "GPU memory still used after the job", f"{g.memory_used_bytes >> 20} MiB",
                          f"<= {(b.memory_used_bytes or 0) >> 20} MiB at the Prolog + {margin >> 20} MiB",
                          FailureClass.WORKLOAD, "reset"))
    seen = {(x.gpu_index, x.xid, x.line) for x in before.xids if x.source == "kernel log"}
    new = msgspec.structs.replace(now, xids=[x for x in now.xids if (x.gpu_index, x.xid, x.line) not in seen])
    out += [replace(f, what=f"{f.what} during the job", threshold="no new XID since the Prolog")
            for f in _xids(new, {g.index: gpu_label(g) for g in now.gpus})]
    return sorted(out, key=lambda f: f.status != FAIL)
