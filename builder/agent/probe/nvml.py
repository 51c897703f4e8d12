"""GPUs through NVML with ``ctypes`` (no ``pynvml`` to install); structures and symbol versions as
``nvml.h``. No library gives ``[]`` and no error (CPU hosts)."""

from __future__ import annotations

import contextlib
import ctypes
from typing import Any, Callable, Iterator

from .common import text as _text

#: nvml.h: nvmlReturn_t NVML_ERROR_INSUFFICIENT_SIZE, and "not available" for a byte count.
_INSUFFICIENT_SIZE = 7
_INVALID_ARGUMENT, _NOT_SUPPORTED, _TIMEOUT = 2, 3, 10
#: nvml.h: NVML_NVLINK_MAX_LINKS, nvmlEventTypeXidCriticalError, nvmlNvLinkErrorCounter_t DL_REPLAY and DL_CRC_FLIT.
_NVLINK_MAX, _XID_EVENT, _NVLINK_REPLAY, _NVLINK_CRC = 18, 0x8, 0, 2
_NOT_AVAILABLE = 0xFFFFFFFFFFFFFFFF
_BUF = 96  # NVML_DEVICE_NAME_V2_BUFFER_SIZE and NVML_DEVICE_UUID_V2_BUFFER_SIZE


class _PciInfo(ctypes.Structure):
    _fields_ = [("busIdLegacy", ctypes.c_char * 16), ("domain", ctypes.c_uint), ("bus", ctypes.c_uint),
                ("device", ctypes.c_uint), ("pciDeviceId", ctypes.c_uint), ("pciSubSystemId", ctypes.c_uint),
                ("busId", ctypes.c_char * 32)]


class _Memory(ctypes.Structure):
    _fields_ = [("total", ctypes.c_ulonglong), ("free", ctypes.c_ulonglong), ("used", ctypes.c_ulonglong)]


class _ProcessV1(ctypes.Structure):
    _fields_ = [("pid", ctypes.c_uint), ("usedGpuMemory", ctypes.c_ulonglong)]


class _ProcessV2(ctypes.Structure):
    _fields_ = [("pid", ctypes.c_uint), ("usedGpuMemory", ctypes.c_ulonglong),
                ("gpuInstanceId", ctypes.c_uint), ("computeInstanceId", ctypes.c_uint)]


class _EventData(ctypes.Structure):
    _fields_ = [("device", ctypes.c_void_p), ("eventType", ctypes.c_ulonglong), ("eventData", ctypes.c_ulonglong),
                ("gpuInstanceId", ctypes.c_uint), ("computeInstanceId", ctypes.c_uint)]


class _FabricInfo(ctypes.Structure):  # nvmlGpuFabricInfo_t
    _fields_ = [("clusterUuid", ctypes.c_char * 16), ("status", ctypes.c_uint), ("cliqueId", ctypes.c_uint),
                ("state", ctypes.c_ubyte)]


class Nvml:
    """An initialised ``libnvidia-ml.so.1``; a failing call raises OSError naming it and its ``nvmlReturn_t``."""

    def __init__(self, lib: Any) -> None:
        self.lib = lib
        self.call("nvmlInit_v2", "nvmlInit")

    def sym(self, *names: str) -> Callable[..., int]:
        for n in names:
            if hasattr(self.lib, n):
                return getattr(self.lib, n)
        raise OSError(f"libnvidia-ml.so.1 lacks {names[0]}")

    def call(self, *names_then_args: Any) -> None:
        names = tuple(a for a in names_then_args if isinstance(a, str))
        rc = self.sym(*names)(*names_then_args[len(names):])
        if rc != 0:
            raise OSError(f"{names[0]} returned nvmlReturn_t {rc}")

    def offered(self, name: str, *args: Any, ok: tuple[int, ...] = (0,),
                absent: tuple[int, ...] = (_NOT_SUPPORTED,)) -> bool:
        """Call ``name``: False when the driver lacks it or answers one of ``absent`` (not offered here)."""
        if not hasattr(self.lib, name):
            return False
        rc = getattr(self.lib, name)(*args)
        if rc in absent:
            return False
        if rc not in ok:
            raise OSError(f"{name} returned nvmlReturn_t {rc}")
        return True

    def value(self, name: str, *args: Any, kind: Any = ctypes.c_uint,
              absent: tuple[int, ...] = (_NOT_SUPPORTED,)) -> int | None:
        """One out-parameter reading; None when not offered."""
        out = kind(0)
        return int(out.value) if self.offered(name, *args, ctypes.byref(out), absent=absent) else None

    def string(self, name: str, handle: Any) -> str:
        buf = ctypes.create_string_buffer(_BUF)
        self.call(name, handle, buf, ctypes.c_uint(_BUF))
        return _text(buf.value)

    def handles(self) -> Iterator[tuple[int, Any]]:
        count = ctypes.c_uint(0)
        self.call("nvmlDeviceGetCount_v2", "nvmlDeviceGetCount", ctypes.byref(count))
        for i in range(count.value):
            h = ctypes.c_void_p()
            self.call("nvmlDeviceGetHandleByIndex_v2", "nvmlDeviceGetHandleByIndex", ctypes.c_uint(i), ctypes.byref(h))
            yield i, h

    def shutdown(self) -> None:
        with contextlib.suppress(Exception):
            self.lib.nvmlShutdown()


def _open(errors: list[str]) -> Nvml | None:
    """The initialised library, or None (absent: no error; failing to initialise: one error)."""
    try:
        lib = ctypes.CDLL("libnvidia-ml.so.1")
    except OSError:
        return None  # no NVIDIA driver here
    try:
        return Nvml(lib)
    except OSError as e:
        errors.append(f"nvml: {e}")
        return None


def _gpu(nvml: Nvml, i: int, h: Any, used: bool = False) -> dict:
    pci, mem = _PciInfo(), _Memory()
    nvml.call("nvmlDeviceGetPciInfo_v3", "nvmlDeviceGetPciInfo_v2", "nvmlDeviceGetPciInfo", h, ctypes.byref(pci))
    nvml.call("nvmlDeviceGetMemoryInfo", h, ctypes.byref(mem))
    return {"index": i, "name": nvml.string("nvmlDeviceGetName", h), "uuid": nvml.string("nvmlDeviceGetUUID", h),
            "pci_bus_id": _text(pci.busId), "memory_total_bytes": int(mem.total),
            "pci_id": pci_id_from_device_id(pci.pciDeviceId), **({"memory_used_bytes": int(mem.used)} if used else {})}


def gpus_and_driver(errors: list[str]) -> tuple[list[dict], str | None]:
    gpus: list[dict] = []
    driver: str | None = None
    nvml = _open(errors)
    if nvml is not None:
        try:
            buf = ctypes.create_string_buffer(_BUF)
            nvml.call("nvmlSystemGetDriverVersion", buf, ctypes.c_uint(_BUF))
            driver = _text(buf.value)
            gpus = [_gpu(nvml, i, h) for i, h in nvml.handles()]
        except OSError as e:
            errors.append(f"nvml: {e}")
        finally:
            nvml.shutdown()
    if driver is None:
        with contextlib.suppress(OSError), open("/proc/driver/nvidia/version") as f:
            driver = parse_proc_driver_version(f.read())
    return gpus, driver


def parse_proc_driver_version(text: str) -> str | None:
    """The first dotted token after ``Kernel Module`` in ``/proc/driver/nvidia/version``, or None."""
    for line in text.splitlines():
        if "Kernel Module" in line:
            for tok in line.split("Kernel Module", 1)[1].split():
                if tok[:1].isdigit() and "." in tok:
                    return tok
    return None


def pci_id_from_device_id(device_id: Any) -> str | None:
    """``nvmlPciInfo_t.pciDeviceId`` as ``"vendor:device"`` (0x233010DE -> ``10de:2330``), or None."""
    if isinstance(device_id, bool) or not isinstance(device_id, int) or device_id <= 0:
        return None
    return f"{device_id & 0xFFFF:04x}:{(device_id >> 16) & 0xFFFF:04x}"


def _process_name(pid: int) -> str | None:
    try:
        with open(f"/proc/{pid}/comm", encoding="utf-8", errors="replace") as f:
            return f.read().strip() or None
    except (OSError, ValueError):
        return None  # another PID namespace (a container): NVML reports host PIDs


def _processes(nvml: Nvml, i: int, h: Any) -> list[dict]:
    """One GPU's compute processes; the list is asked again while it grows between the calls."""
    v2 = hasattr(nvml.lib, "nvmlDeviceGetComputeRunningProcesses_v2")
    fn = nvml.sym("nvmlDeviceGetComputeRunningProcesses_v2", "nvmlDeviceGetComputeRunningProcesses")
    struct = _ProcessV2 if v2 else _ProcessV1
    uuid = nvml.string("nvmlDeviceGetUUID", h)
    n = ctypes.c_uint(0)
    infos: Any = None
    rc = fn(h, ctypes.byref(n), None)
    while rc == _INSUFFICIENT_SIZE:
        size = n.value + 8
        infos, n = (struct * size)(), ctypes.c_uint(size)
        rc = fn(h, ctypes.byref(n), infos)
    if rc != 0:
        raise OSError(f"nvmlDeviceGetComputeRunningProcesses returned nvmlReturn_t {rc}")
    out = []
    for k in range(n.value if infos is not None else 0):
        used = int(infos[k].usedGpuMemory)
        out.append({"gpu_index": i, "gpu_uuid": uuid, "pid": int(infos[k].pid),
                    "used_memory_bytes": None if used == _NOT_AVAILABLE else used,
                    "name": _process_name(int(infos[k].pid))})
    return out


def gpu_processes(errors: list[str]) -> list[dict]:
    """NVML compute processes of every GPU (host PIDs)."""
    nvml = _open([])  # a failing initialisation is reported once, by gpus_and_driver
    if nvml is None:
        return []
    out: list[dict] = []
    try:
        for i, h in nvml.handles():
            out += _processes(nvml, i, h)
    except OSError as e:
        errors.append(f"nvml: compute processes: {e}")
    finally:
        nvml.shutdown()
    return out


def _retired(nvml: Nvml, h: Any, cause: int) -> int | None:
    """Pages retired for ``cause`` (0 multiple single-bit, 1 double-bit errors): the count of a call without room."""
    n = ctypes.c_uint(0)
    ok = nvml.offered("nvmlDeviceGetRetiredPages", h, ctypes.c_int(cause), ctypes.byref(n), None,
                      ok=(0, _INSUFFICIENT_SIZE))
    return int(n.value) if ok else None


def _remapped(nvml: Nvml, h: Any) -> dict:
    rows = [ctypes.c_uint(0) for _ in range(4)]
    if not nvml.offered("nvmlDeviceGetRemappedRows", h, *(ctypes.byref(r) for r in rows)):
        return {}
    return dict(zip(("remap_correctable", "remap_uncorrectable", "remap_pending", "remap_failed"),
                    (int(r.value) for r in rows)))


def _nvlinks(nvml: Nvml, h: Any) -> list[dict]:
    """The links this GPU has (a link it lacks answers invalid argument or not supported)."""
    out: list[dict] = []
    for link in range(_NVLINK_MAX):
        up = nvml.value("nvmlDeviceGetNvLinkState", h, ctypes.c_uint(link), kind=ctypes.c_int,
                        absent=(_INVALID_ARGUMENT, _NOT_SUPPORTED))
        if up is None:
            continue
        errs = [nvml.value("nvmlDeviceGetNvLinkErrorCounter", h, ctypes.c_uint(link), ctypes.c_int(c),
                           kind=ctypes.c_ulonglong) for c in (_NVLINK_CRC, _NVLINK_REPLAY)]
        out.append({"link": link, "up": bool(up), "crc_errors": errs[0], "replay_errors": errs[1]})
    return out


def _fabric(nvml: Nvml, h: Any) -> dict:
    info = _FabricInfo()
    if not nvml.offered("nvmlDeviceGetGpuFabricInfo", h, ctypes.byref(info)):
        return {}
    return {"fabric_state": int(info.state), "fabric_status": int(info.status)}


def _readings(nvml: Nvml, h: Any) -> list[tuple[str, Callable[[], Any]]]:
    """``(key, reader)`` of one GPU; nvml.h's enums: memory error type 0 corrected, 1 uncorrected; ECC counter
    0 volatile, 1 aggregate; temperature sensor 0 GPU, threshold 1 slowdown."""
    v, ull = nvml.value, ctypes.c_ulonglong
    ecc = "nvmlDeviceGetTotalEccErrors"
    return [("ecc_dbe_volatile", lambda: v(ecc, h, ctypes.c_int(1), ctypes.c_int(0), kind=ull)),
            ("ecc_dbe_aggregate", lambda: v(ecc, h, ctypes.c_int(1), ctypes.c_int(1), kind=ull)),
            ("ecc_sbe_volatile", lambda: v(ecc, h, ctypes.c_int(0), ctypes.c_int(0), kind=ull)),
            ("ecc_sbe_aggregate", lambda: v(ecc, h, ctypes.c_int(0), ctypes.c_int(1), kind=ull)),
            ("retired_sbe", lambda: _retired(nvml, h, 0)), ("retired_dbe", lambda: _retired(nvml, h, 1)),
            ("retired_pending", lambda: v("nvmlDeviceGetRetiredPagesPendingStatus", h, kind=ctypes.c_int)),
            ("remap", lambda: _remapped(nvml, h)),
            ("throttle_reasons", lambda: v("nvmlDeviceGetCurrentClocksThrottleReasons", h, kind=ull)),
            ("temperature_c", lambda: v("nvmlDeviceGetTemperature", h, ctypes.c_int(0))),
            ("slowdown_c", lambda: v("nvmlDeviceGetTemperatureThreshold", h, ctypes.c_int(1))),
            ("power_mw", lambda: v("nvmlDeviceGetPowerUsage", h)),
            ("power_limit_mw", lambda: v("nvmlDeviceGetEnforcedPowerLimit", h)),
            ("pcie_gen", lambda: v("nvmlDeviceGetCurrPcieLinkGeneration", h)),
            ("pcie_gen_max", lambda: v("nvmlDeviceGetMaxPcieLinkGeneration", h)),
            ("pcie_width", lambda: v("nvmlDeviceGetCurrPcieLinkWidth", h)),
            ("pcie_width_max", lambda: v("nvmlDeviceGetMaxPcieLinkWidth", h)),
            ("persistence", lambda: v("nvmlDeviceGetPersistenceMode", h, kind=ctypes.c_int)),
            ("nvlinks", lambda: _nvlinks(nvml, h)), ("fabric", lambda: _fabric(nvml, h)),
            ("pids", lambda: [p["pid"] for p in _processes(nvml, 0, h)])]


def _event_xids(nvml: Nvml, handles: list[Any], errors: list[str], wait_ms: int) -> list[dict]:
    """XIDs NVML delivers within ``wait_ms`` (events only reach a set registered before they happen)."""
    if not hasattr(nvml.lib, "nvmlEventSetCreate"):
        return []
    out: list[dict] = []
    es = ctypes.c_void_p()
    try:
        nvml.call("nvmlEventSetCreate", ctypes.byref(es))
        for h in handles:
            if (nvml.value("nvmlDeviceGetSupportedEventTypes", h, kind=ctypes.c_ulonglong) or 0) & _XID_EVENT:
                nvml.call("nvmlDeviceRegisterEvents", h, ctypes.c_ulonglong(_XID_EVENT), es)
        data = _EventData()
        for _ in range(64):
            rc = nvml.sym("nvmlEventSetWait_v2", "nvmlEventSetWait")(es, ctypes.byref(data), ctypes.c_uint(wait_ms))
            if rc == _TIMEOUT:
                break
            if rc != 0:
                raise OSError(f"nvmlEventSetWait_v2 returned nvmlReturn_t {rc}")
            index = next((i for i, h in enumerate(handles) if h.value == data.device), None)
            out.append({"gpu_index": index, "xid": int(data.eventData), "source": "nvml"})
    except OSError as e:
        errors.append(f"nvml: events: {e}")
    finally:
        if es.value and hasattr(nvml.lib, "nvmlEventSetFree"):
            nvml.lib.nvmlEventSetFree(es)
    return out


def health(errors: list[str], event_wait_ms: int = 100) -> dict:
    """Every GPU's health readings (None: not offered here) and the XIDs of NVML's events."""
    nvml = _open(errors)
    if nvml is None:
        return {"gpus": [], "xids": []}
    gpus: list[dict] = []
    try:
        handles = list(nvml.handles())
        for i, h in handles:
            gpu = _gpu(nvml, i, h, used=True)  # the node report leaves out what changes from one probe to the next
            for key, read in _readings(nvml, h):
                try:
                    value = read()
                except OSError as e:
                    errors.append(f"nvml: GPU {i}: {e}")
                    value = None if key not in ("remap", "fabric") else {}
                gpu.update(value if isinstance(value, dict) else {key: value})
            gpus.append(gpu)
        return {"gpus": gpus, "xids": _event_xids(nvml, [h for _, h in handles], errors, event_wait_ms)}
    except OSError as e:
        errors.append(f"nvml: {e}")
        return {"gpus": gpus, "xids": []}
    finally:
        nvml.shutdown()
