"""Describe the software and GPUs of this machine or image as one JSON document.

Runs inside images (mounted read-only at ``/opt/envbuild/probe.py``) and on bare hosts.
Self-contained: the standard library only; ``torch`` and ``pynvml`` are imported lazily
and only if present; NVML and NCCL are otherwise reached through ``ctypes``.
Python >= 3.8. Two ways to run it::

    python3 - < probe.py          # prints the JSON document to stdout, exit 0
    import probe; probe.collect() # returns the same document as a dict

It never raises for a missing or broken component: problems go into ``errors``.

Output schema ``envbuild.probe/1`` (every key always present)::

    {
      "schema": "envbuild.probe/1",
      "hostname": str,                      # socket.gethostname()
      "kernel": str,                        # platform.release(), e.g. "6.1.0-18-amd64"
      "os": {"id": str|null, "version_id": str|null, "pretty_name": str|null},
                                            # /etc/os-release (or /usr/lib/os-release)
      "glibc": str|null,                    # "2.36"; platform.libc_ver() or
                                            # os.confstr("CS_GNU_LIBC_VERSION")
      "python": {"version": "3.11.2", "executable": str},
      "torch": null                         # torch not importable
             | {"version": "2.13.0+cpu",
                "cuda": str|null,           # torch.version.cuda: CUDA torch was built with
                "cuda_available": bool,     # torch.cuda.is_available()
                "cudnn": "91002"|null,      # torch.backends.cudnn.version() as a string
                "nccl_compiled": "2.27.3"|null},
                                            # torch.cuda.nccl.version(): the NCCL header
                                            # torch was compiled against, NOT the library
                                            # loaded (pytorch#116977); only for CUDA builds
      "nccl": {
        "loaded": null | {"version": "2.27.3", "code": 22703, "path": str},
                                            # the libnccl mapped into THIS process (after
                                            # importing torch), asked via ncclGetVersion
        "found": [{"path": str, "realpath": str, "version": str|null, "code": int|null,
                   "error": str|null}, ...],
                                            # every libnccl.so* on disk in the searched
                                            # dirs (see _nccl_search_dirs), deduplicated
                                            # by realpath (path: the real file when met
                                            # by name, else its first symlink), sorted by
                                            # path; each version
                                            # asked via ncclGetVersion in a subprocess
        "pip_packages": {"nvidia-nccl-cu12": "2.27.3", ...}
                                            # installed distributions named nvidia-nccl*
      },
      "gpus": [{"index": 0, "name": str, "uuid": str, "pci_bus_id": str,
                "memory_total_bytes": int,
                "pci_id": "10de:2330"|null}, ...],
                                            # NVML (pynvml if importable, else ctypes on
                                            # libnvidia-ml.so.1); [] without a driver;
                                            # pci_id: vendor:device (as `lspci -n`) from
                                            # nvmlPciInfo_t.pciDeviceId
      "driver": "570.124.06"|null,          # NVML, else /proc/driver/nvidia/version
      "env": {name: value},                 # NCCL_*, GLOO_*, TORCH_*, CUDA_VISIBLE_DEVICES,
                                            # NVIDIA_VISIBLE_DEVICES, sorted by name
      "container": {                        # the container this probe runs in, if any
        "runtime": "docker"|"podman"|"apptainer"|"kubernetes"|"lxc"|str|null,
                                            # /.dockerenv, /run/.containerenv, $container,
                                            # $APPTAINER_CONTAINER/$SINGULARITY_CONTAINER,
                                            # $KUBERNETES_SERVICE_HOST; null on a bare host
        "version": str|null,                # $ENVBUILD_RUNTIME_VERSION (set by whoever
                                            # starts the probe in a container)
        "installed": {"docker": "20.10.24+dfsg1", ...}
                                            # runtimes on PATH here (`NAME --version`):
                                            # docker, podman, apptainer, singularity, enroot
      },
      "image": {"ref": str|null, "digest": "sha256:..."|null, "id": "sha256:..."|null},
                                            # $ENVBUILD_IMAGE, $ENVBUILD_IMAGE_DIGEST (the
                                            # registry digest), $ENVBUILD_IMAGE_ID (the
                                            # engine's image ID); ref falls back to
                                            # $APPTAINER_CONTAINER / $SINGULARITY_CONTAINER
      "network": {
        "interfaces": [{"name": "eth0", "index": int|null, "up": bool|null,
                        "loopback": bool, "mtu": int|null,
                        "addresses": [{"family": "inet"|"inet6", "address": str,
                                       "prefixlen": int|null}, ...]}, ...],
                                            # names: socket.if_nameindex() (else
                                            # /proc/net/dev); flags and mtu:
                                            # /sys/class/net/NAME; IPv4: `ip -j addr` if
                                            # present, else ioctl SIOCGIFADDR/NETMASK;
                                            # IPv6: /proc/net/if_inet6; sorted by name
        "default_route_interface": str|null,  # /proc/net/route, destination 0.0.0.0
        "hostname_addresses": [str, ...],   # getaddrinfo(hostname): what gloo binds to
                                            # when GLOO_SOCKET_IFNAME is unset
        "ip_local_port_range": [int, int]|null
                                            # /proc/sys/net/ipv4/ip_local_port_range: the
                                            # ephemeral ports NCCL/gloo listen on
      },
      "shm": {"path": "/dev/shm", "size_bytes": int|null, "free_bytes": int|null},
                                            # os.statvfs("/dev/shm"); null when absent
      "gpu_processes": [{"gpu_index": int, "gpu_uuid": str, "pid": int,
                         "used_memory_bytes": int|null, "name": str|null}, ...],
                                            # NVML compute processes (PIDs as NVML sees
                                            # them: the host's PID namespace); name from
                                            # /proc/PID/comm when visible here
      "errors": [str, ...]                  # non-fatal problems met while probing
    }

The keys ``container``, ``image``, ``network``, ``shm``, ``gpu_processes`` and the GPU
``pci_id`` were added to schema 1 without changing any earlier field: reports written
before them stay valid (``builder/nodes/report.py`` treats them as unknown when absent).

NCCL version codes follow ``NCCL_VERSION(X,Y,Z)`` in ``nccl.h``: ``X*1000 + Y*100 + Z``
up to 2.8, ``X*10000 + Y*100 + Z`` from 2.9 (see :func:`nccl_version_from_code`).
"""

import ctypes
import glob
import json
import os
import platform
import socket
import subprocess
import sys

SCHEMA = "envbuild.probe/1"

ENV_PREFIXES = ("NCCL_", "GLOO_", "TORCH_")
ENV_NAMES = ("CUDA_VISIBLE_DEVICES", "NVIDIA_VISIBLE_DEVICES")

# System locations of libnccl (Debian/Ubuntu multiarch, RHEL lib64, CUDA toolkits).
SYSTEM_NCCL_DIRS = (
    "/usr/lib/x86_64-linux-gnu",
    "/usr/lib/aarch64-linux-gnu",
    "/usr/lib64",
    "/usr/lib",
    "/usr/local/lib",
)
CUDA_NCCL_GLOBS = ("/usr/local/cuda*/lib64", "/usr/local/cuda*/targets/*/lib")

# Seconds allowed for one subprocess that loads a libnccl to ask its version.
NCCL_SUBPROCESS_TIMEOUT_S = 60

# Run as `python -c SNIPPET PATH`: prints "<ncclResult_t> <version code>".
_NCCL_VERSION_SNIPPET = (
    "import ctypes,sys\n"
    "lib=ctypes.CDLL(sys.argv[1])\n"
    "v=ctypes.c_int(0)\n"
    "rc=lib.ncclGetVersion(ctypes.byref(v))\n"
    "print(rc, v.value)\n"
)


def nccl_version_from_code(code):
    """Turn an NCCL version code into ``"X.Y.Z"``.

    Args:
        code: int from ``ncclGetVersion`` / ``NCCL_VERSION_CODE``, e.g. 22703 or 2804.

    Returns:
        ``"2.27.3"`` for 22703, ``"2.8.4"`` for 2804. Inverse of ``NCCL_VERSION(X,Y,Z)``
        in NCCL's ``nccl.h``: codes >= 10000 are ``X*10000 + Y*100 + Z`` (2.9 and later),
        smaller ones ``X*1000 + Y*100 + Z``.

    Raises:
        ValueError: code is not a positive int.
    """
    if isinstance(code, bool) or not isinstance(code, int) or code <= 0:
        raise ValueError("not an NCCL version code: %r" % (code,))
    if code >= 10000:
        major, minor, patch = code // 10000, code % 10000 // 100, code % 100
    else:
        major, minor, patch = code // 1000, code % 1000 // 100, code % 100
    return "%d.%d.%d" % (major, minor, patch)


def is_nccl_library_name(basename):
    """True for the NCCL core library file names ``libnccl.so``, ``libnccl.so.2[.x.y]``.

    Plugins (``libnccl-net.so``, ``libnccl-tuner.so``, ...) and the static archive are
    excluded: they do not export ``ncclGetVersion``.
    """
    return basename == "libnccl.so" or basename.startswith("libnccl.so.")


def parse_os_release(text):
    """Parse os-release text (``KEY=value`` lines, optional quotes) into a dict.

    Returns ``{"id", "version_id", "pretty_name"}``, each a str or None when absent.
    Format: freedesktop os-release(5).
    """
    values = {}
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#") or "=" not in line:
            continue
        key, _, val = line.partition("=")
        val = val.strip()
        if len(val) >= 2 and val[0] == val[-1] and val[0] in "\"'":
            val = val[1:-1]
        values[key.strip()] = val
    return {
        "id": values.get("ID"),
        "version_id": values.get("VERSION_ID"),
        "pretty_name": values.get("PRETTY_NAME"),
    }


def _os_release(errors):
    for path in ("/etc/os-release", "/usr/lib/os-release"):
        try:
            with open(path, "r", encoding="utf-8", errors="replace") as f:
                return parse_os_release(f.read())
        except FileNotFoundError:
            continue
        except OSError as e:
            errors.append("os-release: %s: %s" % (path, e))
    return {"id": None, "version_id": None, "pretty_name": None}


def _glibc(errors):
    try:
        lib, ver = platform.libc_ver()
        if lib == "glibc" and ver:
            return ver
    except Exception as e:  # platform.libc_ver reads the executable; never fatal
        errors.append("glibc: platform.libc_ver: %s" % (e,))
    try:
        val = os.confstr("CS_GNU_LIBC_VERSION")  # "glibc 2.36"
        if val:
            return val.split()[-1]
    except (ValueError, OSError, AttributeError):
        pass
    return None


def _torch(errors):
    try:
        import torch  # noqa: F401  (lazy: probe runs without torch too)
    except ImportError:
        return None
    except Exception as e:  # a broken install: report it, carry on
        errors.append("torch: import failed: %s: %s" % (type(e).__name__, e))
        return None
    info = {
        "version": str(getattr(torch, "__version__", None)),
        "cuda": None,
        "cuda_available": False,
        "cudnn": None,
        "nccl_compiled": None,
    }
    try:
        info["cuda"] = torch.version.cuda
    except Exception as e:
        errors.append("torch: version.cuda: %s" % (e,))
    try:
        info["cuda_available"] = bool(torch.cuda.is_available())
    except Exception as e:
        errors.append("torch: cuda.is_available: %s" % (e,))
    try:
        v = torch.backends.cudnn.version()
        info["cudnn"] = None if v is None else str(v)
    except Exception as e:
        errors.append("torch: cudnn.version: %s" % (e,))
    if info["cuda"] is not None or info["cuda_available"]:
        try:
            v = torch.cuda.nccl.version()
            if isinstance(v, (tuple, list)):
                info["nccl_compiled"] = ".".join(str(int(x)) for x in v)
            elif isinstance(v, int):  # torch < 1.11 returned the version code
                info["nccl_compiled"] = nccl_version_from_code(v)
        except Exception as e:
            errors.append("torch: cuda.nccl.version: %s" % (e,))
    return info


def mapped_libraries(maps_text):
    """File paths mapped into a process, from ``/proc/<pid>/maps`` text, in first-seen order.

    Each maps line is ``address perms offset dev inode [path]``; the path is the 6th field
    and may contain spaces (proc(5)). Pseudo entries such as ``[heap]`` are skipped.
    """
    seen = []
    for line in maps_text.splitlines():
        parts = line.split(None, 5)
        if len(parts) < 6:
            continue
        path = parts[5].strip()
        if not path.startswith("/"):
            continue
        if path.endswith(" (deleted)"):
            path = path[: -len(" (deleted)")]
        if path not in seen:
            seen.append(path)
    return seen


def _call_nccl_get_version(lib):
    fn = lib.ncclGetVersion
    fn.argtypes = [ctypes.POINTER(ctypes.c_int)]
    fn.restype = ctypes.c_int
    v = ctypes.c_int(0)
    rc = fn(ctypes.byref(v))
    if rc != 0:
        raise OSError("ncclGetVersion returned ncclResult_t %d" % rc)
    return v.value


def _loaded_nccl(errors):
    try:
        with open("/proc/self/maps", "r", encoding="utf-8", errors="replace") as f:
            maps = f.read()
    except OSError as e:
        errors.append("nccl: cannot read /proc/self/maps: %s" % (e,))
        return None
    for path in mapped_libraries(maps):
        if not is_nccl_library_name(os.path.basename(path)):
            continue
        try:
            # Already mapped: dlopen on the same file returns the loaded copy.
            code = _call_nccl_get_version(ctypes.CDLL(path))
            return {"version": nccl_version_from_code(code), "code": code, "path": path}
        except Exception as e:
            errors.append("nccl: ncclGetVersion on loaded %s: %s" % (path, e))
            return None
    return None


def _site_dirs():
    dirs = []
    for entry in sys.path:
        if entry and os.path.isdir(entry):
            dirs.append(entry)
    try:
        import site

        dirs.extend(site.getsitepackages())
        dirs.append(site.getusersitepackages())
    except Exception:
        pass
    return dirs


def _nccl_search_dirs():
    """Directories searched for libnccl.so*, in order, without duplicates.

    ``<site dir>/nvidia/nccl/lib`` for every ``sys.path`` entry and site-packages dir
    (pip's ``nvidia-nccl-cu*`` wheels), the system dirs in ``SYSTEM_NCCL_DIRS``,
    ``/usr/local/cuda*/lib64`` and ``/usr/local/cuda*/targets/*/lib``, and every
    ``LD_LIBRARY_PATH`` entry.
    """
    candidates = [os.path.join(d, "nvidia", "nccl", "lib") for d in _site_dirs()]
    candidates.extend(SYSTEM_NCCL_DIRS)
    for pattern in CUDA_NCCL_GLOBS:
        candidates.extend(sorted(glob.glob(pattern)))
    for entry in os.environ.get("LD_LIBRARY_PATH", "").split(os.pathsep):
        if entry:
            candidates.append(entry)
    out = []
    for d in candidates:
        d = os.path.abspath(d)
        if d not in out and os.path.isdir(d):
            out.append(d)
    return out


def _nccl_version_in_subprocess(path):
    """(code, error) for the libnccl at path, loaded in a fresh interpreter.

    A subprocess keeps the probing process free of extra NCCL copies, so ``loaded``
    still names only what torch itself mapped.
    """
    exe = sys.executable
    if not exe:
        return None, "no sys.executable to start a subprocess"
    try:
        proc = subprocess.run(
            [exe, "-c", _NCCL_VERSION_SNIPPET, path],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            timeout=NCCL_SUBPROCESS_TIMEOUT_S,
            universal_newlines=True,
        )
    except (OSError, subprocess.SubprocessError) as e:
        return None, "subprocess failed: %s" % (e,)
    if proc.returncode != 0:
        tail = (proc.stderr or "").strip().splitlines()
        return None, "subprocess exit %d: %s" % (proc.returncode, tail[-1] if tail else "")
    try:
        rc, code = (int(x) for x in proc.stdout.split())
    except ValueError:
        return None, "unexpected subprocess output %r" % (proc.stdout,)
    if rc != 0:
        return None, "ncclGetVersion returned ncclResult_t %d" % rc
    return code, None


def _found_nccl(errors):
    by_real = {}
    for d in _nccl_search_dirs():
        try:
            names = sorted(os.listdir(d))
        except OSError:
            continue
        for name in names:
            if not is_nccl_library_name(name):
                continue
            path = os.path.join(d, name)
            if not os.path.isfile(path):
                continue
            real = os.path.realpath(path)
            by_real.setdefault(real, []).append(path)
    found = []
    for real, paths in by_real.items():
        # One entry per file: named by the file itself when it was met under its own
        # name, else by the first of its symlinks in sorted order.
        path = real if real in paths else min(paths)
        code, err = _nccl_version_in_subprocess(path)
        version = None
        if code is not None:
            try:
                version = nccl_version_from_code(code)
            except ValueError as e:
                err = str(e)
        if err:
            errors.append("nccl: %s: %s" % (path, err))
        found.append(
            {"path": path, "realpath": real, "version": version, "code": code, "error": err}
        )
    found.sort(key=lambda item: item["path"])
    return found


def _nccl_pip_packages(errors):
    try:
        from importlib import metadata
    except ImportError:  # Python < 3.8
        return {}
    out = {}
    try:
        for dist in metadata.distributions():
            name = (dist.metadata.get("Name") or "").strip()
            norm = name.lower().replace("_", "-").replace(".", "-")
            if norm.startswith("nvidia-nccl") and norm not in out:
                out[norm] = dist.version
    except Exception as e:
        errors.append("nccl: listing distributions: %s" % (e,))
    return dict(sorted(out.items()))


def _text(value):
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    return str(value)


def _gpus_pynvml(errors):
    """(gpus, driver) via pynvml, or None when pynvml is not importable."""
    try:
        import pynvml
    except ImportError:
        return None
    except Exception as e:
        errors.append("nvml: pynvml import failed: %s" % (e,))
        return None
    try:
        pynvml.nvmlInit()
    except Exception as e:
        errors.append("nvml: pynvml nvmlInit failed: %s" % (e,))
        return [], None
    gpus, driver = [], None
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
        errors.append("nvml: pynvml query failed: %s" % (e,))
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


def _gpus_ctypes(errors):
    """(gpus, driver) via ctypes on libnvidia-ml.so.1; ([], None) when it is absent."""
    try:
        nvml = ctypes.CDLL("libnvidia-ml.so.1")
    except OSError:
        return [], None  # no NVIDIA driver here: the normal case on CPU hosts

    def check(rc, what):
        if rc != 0:
            raise OSError("%s returned nvmlReturn_t %d" % (what, rc))

    def sym(*names):
        for n in names:
            if hasattr(nvml, n):
                return getattr(nvml, n)
        raise OSError("libnvidia-ml.so.1 lacks %s" % names[0])

    try:
        check(sym("nvmlInit_v2", "nvmlInit")(), "nvmlInit")
    except Exception as e:
        errors.append("nvml: %s" % (e,))
        return [], None
    gpus, driver = [], None
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
        errors.append("nvml: %s" % (e,))
    finally:
        try:
            nvml.nvmlShutdown()
        except Exception:
            pass
    return gpus, driver


def parse_proc_driver_version(text):
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


def _gpus_and_driver(errors):
    res = _gpus_pynvml(errors)
    if res is None:
        res = _gpus_ctypes(errors)
    gpus, driver = res
    if driver is None:
        try:
            with open("/proc/driver/nvidia/version", "r") as f:
                driver = parse_proc_driver_version(f.read())
        except OSError:
            pass
    return gpus, driver


def pci_id_from_device_id(device_id):
    """``nvmlPciInfo_t.pciDeviceId`` as ``"vendor:device"`` in lowercase hex, or None.

    NVML packs the 16-bit device id in the upper half and the vendor id in the lower half
    (``nvml.h``), so 0x233010DE gives ``"10de:2330"`` (as ``lspci -n`` prints it).
    """
    if isinstance(device_id, bool) or not isinstance(device_id, int) or device_id <= 0:
        return None
    return "%04x:%04x" % (device_id & 0xFFFF, (device_id >> 16) & 0xFFFF)


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


def _process_name(pid):
    try:
        with open("/proc/%d/comm" % pid, "r", encoding="utf-8", errors="replace") as f:
            return f.read().strip() or None
    except (OSError, ValueError):
        return None  # another PID namespace (a container): NVML reports host PIDs


def _process_entry(gpu_index, uuid, pid, used):
    used = None if used is None or int(used) == _NVML_VALUE_NOT_AVAILABLE else int(used)
    return {"gpu_index": gpu_index, "gpu_uuid": uuid, "pid": int(pid),
            "used_memory_bytes": used, "name": _process_name(int(pid))}


def _gpu_processes_pynvml(errors):
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
    out = []
    try:
        for i in range(pynvml.nvmlDeviceGetCount()):
            h = pynvml.nvmlDeviceGetHandleByIndex(i)
            uuid = _text(pynvml.nvmlDeviceGetUUID(h))
            for proc in pynvml.nvmlDeviceGetComputeRunningProcesses(h):
                out.append(_process_entry(i, uuid, proc.pid, getattr(proc, "usedGpuMemory", None)))
    except Exception as e:
        errors.append("nvml: pynvml compute processes: %s" % (e,))
    finally:
        try:
            pynvml.nvmlShutdown()
        except Exception:
            pass
    return out


def _gpu_processes_ctypes(errors):
    try:
        nvml = ctypes.CDLL("libnvidia-ml.so.1")
    except OSError:
        return []
    init = getattr(nvml, "nvmlInit_v2", None) or getattr(nvml, "nvmlInit", None)
    if init is None or init() != 0:
        return []  # reported by _gpus_ctypes
    out = []
    try:
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
                raise OSError("nvmlDeviceGetHandleByIndex(%d) failed" % i)
            buf = ctypes.create_string_buffer(96)
            if nvml.nvmlDeviceGetUUID(h, buf, 96) != 0:
                raise OSError("nvmlDeviceGetUUID(%d) failed" % i)
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
                raise OSError("nvmlDeviceGetComputeRunningProcesses returned nvmlReturn_t %d" % rc)
    except Exception as e:
        errors.append("nvml: compute processes: %s" % (e,))
    finally:
        try:
            nvml.nvmlShutdown()
        except Exception:
            pass
    return out


def _gpu_processes(errors):
    res = _gpu_processes_pynvml(errors)
    return _gpu_processes_ctypes(errors) if res is None else res


# Container runtimes asked for their version when on PATH (the host side of a node).
RUNTIME_COMMANDS = (
    ("docker", ("docker", "--version")),
    ("podman", ("podman", "--version")),
    ("apptainer", ("apptainer", "--version")),
    ("singularity", ("singularity", "--version")),
    ("enroot", ("enroot", "version")),
)
# Seconds allowed for one `NAME --version` or `ip -j addr`.
COMMAND_TIMEOUT_S = 10


def _which(name):
    for d in os.environ.get("PATH", os.defpath).split(os.pathsep):
        path = os.path.join(d or ".", name)
        if os.path.isfile(path) and os.access(path, os.X_OK):
            return path
    return None


def _run_text(argv):
    """stdout of argv, or None when it cannot run, fails or times out."""
    try:
        proc = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                              stdin=subprocess.DEVNULL, timeout=COMMAND_TIMEOUT_S,
                              universal_newlines=True)
    except (OSError, subprocess.SubprocessError):
        return None
    return proc.stdout if proc.returncode == 0 else None


def parse_version_output(text):
    """The first dotted version token in ``NAME --version`` output, or None.

    ``"Docker version 20.10.24+dfsg1, build 297e128"`` gives ``"20.10.24+dfsg1"``;
    ``"apptainer version 1.3.4"`` gives ``"1.3.4"``.
    """
    for tok in (text or "").replace(",", " ").split():
        tok = tok[1:] if tok[:1] in "vV" and tok[1:2].isdigit() else tok
        if tok[:1].isdigit() and "." in tok:
            return tok
    return None


def _container(errors):
    env = os.environ
    runtime = None
    if os.path.exists("/.dockerenv"):
        runtime = "docker"
    elif os.path.exists("/run/.containerenv"):
        runtime = "podman"
    elif env.get("APPTAINER_CONTAINER") or env.get("APPTAINER_NAME"):
        runtime = "apptainer"
    elif env.get("SINGULARITY_CONTAINER") or env.get("SINGULARITY_NAME"):
        runtime = "singularity"
    elif env.get("container"):
        runtime = env["container"]  # systemd's convention: lxc, podman, oci, ...
    elif env.get("KUBERNETES_SERVICE_HOST"):
        runtime = "kubernetes"
    installed = {}
    for name, argv in RUNTIME_COMMANDS:
        if _which(argv[0]) is None:
            continue
        version = parse_version_output(_run_text(list(argv)))
        if version is None:
            errors.append("container: `%s` printed no version" % " ".join(argv))
        else:
            installed[name] = version
    return {"runtime": runtime, "version": env.get("ENVBUILD_RUNTIME_VERSION") or None,
            "installed": installed}


def _image():
    env = os.environ
    ref = (env.get("ENVBUILD_IMAGE") or env.get("APPTAINER_CONTAINER")
           or env.get("SINGULARITY_CONTAINER") or None)
    return {"ref": ref, "digest": env.get("ENVBUILD_IMAGE_DIGEST") or None,
            "id": env.get("ENVBUILD_IMAGE_ID") or None}


# ioctl request numbers of <linux/sockios.h>.
_SIOCGIFADDR = 0x8915
_SIOCGIFNETMASK = 0x891B
# Interface flags of <linux/if.h>.
_IFF_UP = 0x1
_IFF_LOOPBACK = 0x8


def prefixlen_from_netmask(mask):
    """``"255.255.240.0"`` gives 20; None for a non-contiguous or unparsable mask."""
    try:
        value = int.from_bytes(socket.inet_aton(mask), "big")
    except (OSError, TypeError):
        return None
    bits = bin(value)[2:].rstrip("0")
    if "0" in bits:
        return None
    return len(bits)


def parse_if_inet6(text):
    """``/proc/net/if_inet6`` text as ``{ifname: [(address, prefixlen), ...]}``.

    Each line: 32 hex digits of address, ifindex, prefix length, scope, flags (hex), name
    (proc(5), ``net/ipv6/addrconf.c``). The address is returned in compressed form.
    """
    out = {}
    for line in text.splitlines():
        parts = line.split()
        if len(parts) != 6 or len(parts[0]) != 32:
            continue
        try:
            packed = bytes.fromhex(parts[0])
            addr = socket.inet_ntop(socket.AF_INET6, packed)
            plen = int(parts[2], 16)
        except (ValueError, OSError):
            continue
        out.setdefault(parts[5], []).append((addr, plen))
    return out


def parse_proc_net_dev(text):
    """Interface names from ``/proc/net/dev`` text (lines ``  eth0: 123 ...``), in order."""
    names = []
    for line in text.splitlines()[2:]:
        name, sep, _ = line.partition(":")
        if sep and name.strip():
            names.append(name.strip())
    return names


def parse_proc_net_route(text):
    """The interface of the IPv4 default route (destination ``00000000``) in
    ``/proc/net/route`` text, or None. With several, the lowest metric wins."""
    best = None
    for line in text.splitlines()[1:]:
        parts = line.split()
        if len(parts) < 7 or parts[1] != "00000000":
            continue
        try:
            metric = int(parts[6])
        except ValueError:
            continue
        if best is None or metric < best[0]:
            best = (metric, parts[0])
    return best[1] if best else None


def parse_ip_json(text):
    """``ip -j addr`` output as a list of interfaces in the probe's shape (unsorted)."""
    out = []
    for item in json.loads(text):
        flags = item.get("flags") or []
        addrs = []
        for a in item.get("addr_info") or []:
            if a.get("family") in ("inet", "inet6") and a.get("local"):
                addrs.append({"family": a["family"], "address": a["local"],
                              "prefixlen": a.get("prefixlen")})
        out.append({
            "name": item.get("ifname"),
            "index": item.get("ifindex"),
            "up": "UP" in flags,
            "loopback": "LOOPBACK" in flags or item.get("link_type") == "loopback",
            "mtu": item.get("mtu"),
            "addresses": addrs,
        })
    return out


def _read(path):
    with open(path, "r", encoding="utf-8", errors="replace") as f:
        return f.read()


def _interfaces_stdlib(errors):
    try:
        pairs = [(idx, name) for idx, name in socket.if_nameindex()]
    except (OSError, AttributeError):
        try:
            pairs = [(None, n) for n in parse_proc_net_dev(_read("/proc/net/dev"))]
        except OSError as e:
            errors.append("network: no interface list: %s" % (e,))
            return []
    try:
        inet6 = parse_if_inet6(_read("/proc/net/if_inet6"))
    except OSError:
        inet6 = {}  # no IPv6 in this kernel or namespace
    import fcntl
    import struct

    out = []
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        for idx, name in pairs:
            entry = {"name": name, "index": idx, "up": None, "loopback": False, "mtu": None,
                     "addresses": []}
            try:
                flags = int(_read("/sys/class/net/%s/flags" % name).strip(), 16)
                entry["up"] = bool(flags & _IFF_UP)
                entry["loopback"] = bool(flags & _IFF_LOOPBACK)
            except (OSError, ValueError):
                entry["loopback"] = name == "lo"
            try:
                entry["mtu"] = int(_read("/sys/class/net/%s/mtu" % name).strip())
            except (OSError, ValueError):
                pass
            ifreq = struct.pack("256s", name.encode("utf-8")[:15])
            try:
                addr = socket.inet_ntoa(fcntl.ioctl(sock.fileno(), _SIOCGIFADDR, ifreq)[20:24])
                try:
                    mask = socket.inet_ntoa(
                        fcntl.ioctl(sock.fileno(), _SIOCGIFNETMASK, ifreq)[20:24])
                    plen = prefixlen_from_netmask(mask)
                except OSError:
                    plen = None
                entry["addresses"].append({"family": "inet", "address": addr, "prefixlen": plen})
            except OSError:
                pass  # EADDRNOTAVAIL: no IPv4 address on this interface
            for addr, plen in inet6.get(name, []):
                entry["addresses"].append({"family": "inet6", "address": addr, "prefixlen": plen})
            out.append(entry)
    finally:
        sock.close()
    return out


# Set to False to skip `ip -j addr` (tests compare both ways of listing interfaces).
USE_IP_COMMAND = True


def _network(errors):
    interfaces = None
    if USE_IP_COMMAND and _which("ip"):
        text = _run_text(["ip", "-j", "addr"])
        if text:
            try:
                interfaces = parse_ip_json(text)
            except (ValueError, TypeError, AttributeError) as e:
                errors.append("network: unexpected `ip -j addr` output: %s" % (e,))
    if interfaces is None:
        interfaces = _interfaces_stdlib(errors)
    interfaces.sort(key=lambda i: i["name"] or "")
    try:
        default_if = parse_proc_net_route(_read("/proc/net/route"))
    except OSError:
        default_if = None
    host_addrs = []
    try:
        for info in socket.getaddrinfo(socket.gethostname(), None, 0, socket.SOCK_STREAM):
            addr = info[4][0]
            if addr not in host_addrs:
                host_addrs.append(addr)
    except (OSError, UnicodeError) as e:
        errors.append("network: hostname does not resolve: %s" % (e,))
    port_range = None
    try:
        lo, hi = (int(x) for x in _read("/proc/sys/net/ipv4/ip_local_port_range").split())
        port_range = [lo, hi]
    except (OSError, ValueError):
        pass
    return {"interfaces": interfaces, "default_route_interface": default_if,
            "hostname_addresses": host_addrs, "ip_local_port_range": port_range}


def _shm():
    path = "/dev/shm"
    try:
        st = os.statvfs(path)
    except OSError:
        return {"path": path, "size_bytes": None, "free_bytes": None}
    return {"path": path, "size_bytes": st.f_frsize * st.f_blocks,
            "free_bytes": st.f_frsize * st.f_bavail}


def _env():
    return {
        k: v
        for k, v in sorted(os.environ.items())
        if k.startswith(ENV_PREFIXES) or k in ENV_NAMES
    }


def collect():
    """Probe this process's environment; returns the ``envbuild.probe/1`` dict.

    Imports torch if it is installed (so that torch's own NCCL gets mapped) before
    reading ``/proc/self/maps``. Never raises for missing components; problems are
    listed under ``errors``. Loading each libnccl found on disk happens in a
    subprocess (at most ``NCCL_SUBPROCESS_TIMEOUT_S`` s each).
    """
    errors = []
    out = {"schema": SCHEMA}
    try:
        out["hostname"] = socket.gethostname()
    except Exception as e:
        out["hostname"] = None
        errors.append("hostname: %s" % (e,))
    out["kernel"] = platform.release()
    out["os"] = _os_release(errors)
    out["glibc"] = _glibc(errors)
    out["python"] = {"version": platform.python_version(), "executable": sys.executable}
    out["torch"] = _torch(errors)
    nccl = {"loaded": None, "found": [], "pip_packages": {}}
    for key, fn in (("loaded", _loaded_nccl), ("found", _found_nccl),
                    ("pip_packages", _nccl_pip_packages)):
        try:
            nccl[key] = fn(errors)
        except Exception as e:  # belt and braces: the probe never crashes
            errors.append("nccl: %s: %s: %s" % (key, type(e).__name__, e))
    out["nccl"] = nccl
    try:
        out["gpus"], out["driver"] = _gpus_and_driver(errors)
    except Exception as e:
        out["gpus"], out["driver"] = [], None
        errors.append("nvml: %s: %s" % (type(e).__name__, e))
    out["env"] = _env()
    for key, fn in (("container", _container), ("image", lambda errs: _image()),
                    ("network", _network), ("shm", lambda errs: _shm()),
                    ("gpu_processes", _gpu_processes)):
        try:
            out[key] = fn(errors)
        except Exception as e:  # the probe never crashes
            out[key] = None
            errors.append("%s: %s: %s" % (key, type(e).__name__, e))
    out["errors"] = errors
    return out


def main():
    """Print :func:`collect` as indented JSON on stdout; exit status 0."""
    json.dump(collect(), sys.stdout, indent=2)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
