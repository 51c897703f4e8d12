"""GPUs through NVML: models, UUIDs, PCI ids, memory, the driver, compute processes.

Standard library only: ``pynvml`` when importable, else ``ctypes`` on
``libnvidia-ml.so.1``; no driver gives ``[]`` and no error (the normal case on CPU
hosts). The driver version falls back to ``/proc/driver/nvidia/version``. Structures and
constants follow ``nvml.h``. Python >= 3.8.
"""

from __future__ import annotations

import ctypes
from typing import Any, Callable

from .common import text as _text


def _gpus_pynvml(errors: list[str]) -> tuple[list[dict[str, Any]], str | None] | None:
    """(gpus, driver) via pynvml, or None when pynvml is not importable."""
    try:
        import pynvml
    except ImportError:
        return None
    except Exception as e:
        errors.append(f"nvml: pynvml import failed: {e}")
        return None
    try:
        pynvml.nvmlInit()
    except Exception as e:
        errors.append(f"nvml: pynvml nvmlInit failed: {e}")
        return [], None
    gpus: list[dict[str, Any]] = []
    driver: str | None = None
    try:
        driver = _text(pynvml.nvmlSystemGetDriverVersion())
        for i in range(pynvml.nvmlDeviceGetCount()):
            h = pynvml.nvmlDeviceGetHandleByIndex(i)
            pci = pynvml.nvmlDeviceGetPciInfo(h)
            gpus.append(
                {
                    "index": i,
                    "name": _text(pynvml.nvmlDeviceGetName(h)),
                    "uuid": _text(pynvml.nvmlDeviceGetUUID(h)),
                    "pci_bus_id": _text(pci.busId),
                    "memory_total_bytes": int(pynvml.nvmlDeviceGetMemoryInfo(h).total),
                    "pci_id": pci_id_from_device_id(getattr(pci, "pciDeviceId", None)),
                }
            )
    except Exception as e:
        errors.append(f"nvml: pynvml query failed: {e}")
    finally:
        try:
            pynvml.nvmlShutdown()
        except Exception:
            pass
    return gpus, driver


class _NvmlPciInfo(ctypes.Structure):
    # nvmlPciInfo_t in nvml.h
    _fields_ = [
        ("busIdLegacy", ctypes.c_char * 16),
        ("domain", ctypes.c_uint),
        ("bus", ctypes.c_uint),
        ("device", ctypes.c_uint),
        ("pciDeviceId", ctypes.c_uint),
        ("pciSubSystemId", ctypes.c_uint),
        ("busId", ctypes.c_char * 32),
    ]


class _NvmlMemory(ctypes.Structure):
    # nvmlMemory_t in nvml.h (bytes)
    _fields_ = [
        ("total", ctypes.c_ulonglong),
        ("free", ctypes.c_ulonglong),
        ("used", ctypes.c_ulonglong),
    ]


def _gpus_ctypes(errors: list[str]) -> tuple[list[dict[str, Any]], str | None]:
    """(gpus, driver) via ctypes on libnvidia-ml.so.1; ([], None) when it is absent."""
    try:
        nvml = ctypes.CDLL("libnvidia-ml.so.1")
    except OSError:
        return [], None  # no NVIDIA driver here: the normal case on CPU hosts

    def check(rc: int, what: str) -> None:
        if rc != 0:
            raise OSError(f"{what} returned nvmlReturn_t {rc}")

    def sym(*names: str) -> Callable[..., int]:
        for n in names:
            if hasattr(nvml, n):
                return getattr(nvml, n)
        raise OSError(f"libnvidia-ml.so.1 lacks {names[0]}")

    try:
        check(sym("nvmlInit_v2", "nvmlInit")(), "nvmlInit")
    except Exception as e:
        errors.append(f"nvml: {e}")
        return [], None
    gpus: list[dict[str, Any]] = []
    driver: str | None = None
    try:
        buf = ctypes.create_string_buffer(96)
        check(nvml.nvmlSystemGetDriverVersion(buf, 96), "nvmlSystemGetDriverVersion")
        driver = _text(buf.value)
        count = ctypes.c_uint(0)
        check(sym("nvmlDeviceGetCount_v2", "nvmlDeviceGetCount")(ctypes.byref(count)),
              "nvmlDeviceGetCount")
        get_handle = sym("nvmlDeviceGetHandleByIndex_v2", "nvmlDeviceGetHandleByIndex")
        get_pci = sym("nvmlDeviceGetPciInfo_v3", "nvmlDeviceGetPciInfo_v2",
                      "nvmlDeviceGetPciInfo")
        for i in range(count.value):
            h = ctypes.c_void_p()
            check(get_handle(ctypes.c_uint(i), ctypes.byref(h)), "nvmlDeviceGetHandleByIndex")
            name = ctypes.create_string_buffer(96)
            check(nvml.nvmlDeviceGetName(h, name, 96), "nvmlDeviceGetName")
            uuid = ctypes.create_string_buffer(96)
            check(nvml.nvmlDeviceGetUUID(h, uuid, 96), "nvmlDeviceGetUUID")
            pci = _NvmlPciInfo()
            check(get_pci(h, ctypes.byref(pci)), "nvmlDeviceGetPciInfo")
            mem = _NvmlMemory()
            check(nvml.nvmlDeviceGetMemoryInfo(h, ctypes.byref(mem)), "nvmlDeviceGetMemoryInfo")
            gpus.append(
                {
                    "index": i,
                    "name": _text(name.value),
                    "uuid": _text(uuid.value),
                    "pci_bus_id": _text(pci.busId),
                    "memory_total_bytes": int(mem.total),
                    "pci_id": pci_id_from_device_id(pci.pciDeviceId),
                }
            )
    except Exception as e:
        errors.append(f"nvml: {e}")
    finally:
        try:
            nvml.nvmlShutdown()
        except Exception:
            pass
    return gpus, driver


def parse_proc_driver_version(text: str) -> str | None:
    """Driver version from ``/proc/driver/nvidia/version`` text, or None.

    The first line reads ``NVRM version: NVIDIA UNIX x86_64 Kernel Module  570.124.06  ...``;
    the version is the first dotted token after ``Kernel Module``.
    """
    for line in text.splitlines():
        if "Kernel Module" in line:
            for tok in line.split("Kernel Module", 1)[1].split():
                if tok[:1].isdigit() and "." in tok:
                    return tok
    return None


def gpus_and_driver(errors: list[str]) -> tuple[list[dict[str, Any]], str | None]:
    """``(gpus, driver)``: pynvml, else ctypes; the driver from ``/proc`` when NVML has none."""
    res = _gpus_pynvml(errors)
    if res is None:
        res = _gpus_ctypes(errors)
    gpus, driver = res
    if driver is None:
        try:
            with open("/proc/driver/nvidia/version") as f:
                driver = parse_proc_driver_version(f.read())
        except OSError:
            pass
    return gpus, driver


def pci_id_from_device_id(device_id: Any) -> str | None:
    """``nvmlPciInfo_t.pciDeviceId`` as ``"vendor:device"`` in lowercase hex, or None.

    NVML packs the 16-bit device id in the upper half and the vendor id in the lower half
    (``nvml.h``), so 0x233010DE gives ``"10de:2330"`` (as ``lspci -n`` prints it).
    """
    if isinstance(device_id, bool) or not isinstance(device_id, int) or device_id <= 0:
        return None
    return f"{device_id & 0xFFFF:04x}:{(device_id >> 16) & 0xFFFF:04x}"


# NVML constants (nvml.h).
_NVML_ERROR_INSUFFICIENT_SIZE = 7
_NVML_VALUE_NOT_AVAILABLE = 0xFFFFFFFFFFFFFFFF


class _NvmlProcessInfoV1(ctypes.Structure):
    # nvmlProcessInfo_v1_t in nvml.h
    _fields_ = [("pid", ctypes.c_uint), ("usedGpuMemory", ctypes.c_ulonglong)]


class _NvmlProcessInfoV2(ctypes.Structure):
    # nvmlProcessInfo_v2_t in nvml.h (used by nvmlDeviceGetComputeRunningProcesses_v2)
    _fields_ = [
        ("pid", ctypes.c_uint),
        ("usedGpuMemory", ctypes.c_ulonglong),
        ("gpuInstanceId", ctypes.c_uint),
        ("computeInstanceId", ctypes.c_uint),
    ]


def _process_name(pid: int) -> str | None:
    try:
        with open(f"/proc/{pid}/comm", encoding="utf-8", errors="replace") as f:
            return f.read().strip() or None
    except (OSError, ValueError):
        return None  # another PID namespace (a container): NVML reports host PIDs


def _process_entry(gpu_index: int, uuid: str, pid: Any, used: Any) -> dict[str, Any]:
    used = None if used is None or int(used) == _NVML_VALUE_NOT_AVAILABLE else int(used)
    return {"gpu_index": gpu_index, "gpu_uuid": uuid, "pid": int(pid),
            "used_memory_bytes": used, "name": _process_name(int(pid))}


def _gpu_processes_pynvml(errors: list[str]) -> list[dict[str, Any]] | None:
    try:
        import pynvml
    except ImportError:
        return None
    except Exception:
        return None  # import problems were reported by _gpus_pynvml
    try:
        pynvml.nvmlInit()
    except Exception:
        return []  # no driver: reported by _gpus_pynvml
    out: list[dict[str, Any]] = []
    try:
        for i in range(pynvml.nvmlDeviceGetCount()):
            h = pynvml.nvmlDeviceGetHandleByIndex(i)
            uuid = _text(pynvml.nvmlDeviceGetUUID(h))
            for proc in pynvml.nvmlDeviceGetComputeRunningProcesses(h):
                out.append(_process_entry(i, uuid, proc.pid, getattr(proc, "usedGpuMemory", None)))
    except Exception as e:
        errors.append(f"nvml: pynvml compute processes: {e}")
    finally:
        try:
            pynvml.nvmlShutdown()
        except Exception:
            pass
    return out


def _gpu_processes_ctypes(errors: list[str]) -> list[dict[str, Any]]:
    try:
        nvml = ctypes.CDLL("libnvidia-ml.so.1")
    except OSError:
        return []
    init = getattr(nvml, "nvmlInit_v2", None) or getattr(nvml, "nvmlInit", None)
    if init is None or init() != 0:
        return []  # reported by _gpus_ctypes
    out: list[dict[str, Any]] = []
    try:
        struct: type[ctypes.Structure]
        if hasattr(nvml, "nvmlDeviceGetComputeRunningProcesses_v2"):
            fn, struct = nvml.nvmlDeviceGetComputeRunningProcesses_v2, _NvmlProcessInfoV2
        else:
            fn, struct = nvml.nvmlDeviceGetComputeRunningProcesses, _NvmlProcessInfoV1
        count = ctypes.c_uint(0)
        get_count = getattr(nvml, "nvmlDeviceGetCount_v2", None) or nvml.nvmlDeviceGetCount
        if get_count(ctypes.byref(count)) != 0:
            raise OSError("nvmlDeviceGetCount failed")
        get_handle = (getattr(nvml, "nvmlDeviceGetHandleByIndex_v2", None)
                      or nvml.nvmlDeviceGetHandleByIndex)
        for i in range(count.value):
            h = ctypes.c_void_p()
            if get_handle(ctypes.c_uint(i), ctypes.byref(h)) != 0:
                raise OSError(f"nvmlDeviceGetHandleByIndex({i}) failed")
            buf = ctypes.create_string_buffer(96)
            if nvml.nvmlDeviceGetUUID(h, buf, 96) != 0:
                raise OSError(f"nvmlDeviceGetUUID({i}) failed")
            uuid = _text(buf.value)
            n = ctypes.c_uint(0)
            rc = fn(h, ctypes.byref(n), None)
            size = n.value
            while rc == _NVML_ERROR_INSUFFICIENT_SIZE:
                size = max(size, n.value) + 8  # processes may start between the calls
                infos = (struct * size)()
                n = ctypes.c_uint(size)
                rc = fn(h, ctypes.byref(n), infos)
                if rc == 0:
                    for k in range(n.value):
                        out.append(_process_entry(i, uuid, infos[k].pid, infos[k].usedGpuMemory))
            if rc != 0:
                raise OSError(f"nvmlDeviceGetComputeRunningProcesses returned nvmlReturn_t {rc}")
    except Exception as e:
        errors.append(f"nvml: compute processes: {e}")
    finally:
        try:
            nvml.nvmlShutdown()
        except Exception:
            pass
    return out


def gpu_processes(errors: list[str]) -> list[dict[str, Any]]:
    """NVML compute processes of every GPU (host PIDs), pynvml else ctypes."""
    res = _gpu_processes_pynvml(errors)
    return _gpu_processes_ctypes(errors) if res is None else res


