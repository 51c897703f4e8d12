"""The NCCL network plugin NCCL would load, and the CUDA runtimes (``libcudart``) this process maps.
Plugin lookup as NVIDIA/nccl ``src/plugin/plugin_open.cc``, loaded in a subprocess so this process
maps nothing new. Two CUDA runtimes: a wheel's bundled one next to a system one."""

from __future__ import annotations

import ctypes
import hashlib
import json
import os
import re
import stat
import subprocess
import sys
from typing import Any

from .nccl import NCCL_SUBPROCESS_TIMEOUT_S, mapped_libraries

#: Largest plugin file hashed, in bytes (real plugins are a few MiB).
MAX_PLUGIN_BYTES = 1 << 30
#: Plugin API versions looked for, newest first (``ncclNetPlugin_v11`` .. ``_v2``).
PLUGIN_APIS = tuple(range(11, 1, -1))

# Run as `python -c SNIPPET NAME...`: dlopen each name in turn (as NCCL does) and print one
# JSON line {"name": tried name, "path": file, "api": N, "plugin_name": str} or {"errors": [...]}.
_PLUGIN_SNIPPET = r"""
import ctypes, json, os, sys
class Info(ctypes.Structure):
    _fields_ = [("fname", ctypes.c_char_p), ("fbase", ctypes.c_void_p),
                ("sname", ctypes.c_char_p), ("saddr", ctypes.c_void_p)]
def maps():
    with open("/proc/self/maps") as f:
        return [l.split(None, 5)[5].strip() for l in f if len(l.split(None, 5)) == 6]
errors = []
for name in sys.argv[2:]:
    before = set(maps())
    try:
        lib = ctypes.CDLL(name, mode=os.RTLD_NOW | os.RTLD_LOCAL)
    except OSError as e:
        errors.append(str(e))
        continue
    out = {"name": name, "path": None, "api": None, "plugin_name": None}
    for n in [int(x) for x in sys.argv[1].split(",")]:
        try:
            sym = ctypes.c_char.in_dll(lib, "ncclNetPlugin_v%d" % n)
        except ValueError:
            continue
        addr = ctypes.addressof(sym)
        info = Info()
        if ctypes.CDLL(None).dladdr(ctypes.c_void_p(addr), ctypes.byref(info)) and info.fname:
            out["path"] = os.fsdecode(info.fname)
        name_ptr = ctypes.c_char_p.from_address(addr).value
        out["api"], out["plugin_name"] = n, (name_ptr or b"").decode("utf-8", "replace")[:256] or None
        break
    if out["path"] is None:
        new = [p for p in maps() if p not in before and p.startswith("/")]
        out["path"] = new[0] if new else None
    print(json.dumps(out))
    sys.exit(0)
print(json.dumps({"errors": errors}))
"""


def plugin_names(env: dict[str, str]) -> list[str]:
    """Names NCCL tries: ``[NAME, "libnccl-net-NAME.so"]`` with ``NCCL_NET_PLUGIN=NAME``, else ``libnccl-net.so``."""
    name = env.get("NCCL_NET_PLUGIN") or ""
    return [name, f"libnccl-net-{name}.so"] if name else ["libnccl-net.so"]


def so_version(path: str | None) -> str | None:
    """The dotted version after ``.so.`` (``libnccl-net.so.1.14.0`` gives ``"1.14.0"``), or None."""
    m = re.search(r"\.so\.([0-9]+(?:\.[0-9]+){0,3})$", path or "")
    return m.group(1) if m else None


def file_sha256(path: str, limit: int = MAX_PLUGIN_BYTES) -> str | None:
    """``sha256:<hex>`` of a regular file of at most ``limit`` bytes, else None (a FIFO is never opened)."""
    st = os.stat(path)
    if not stat.S_ISREG(st.st_mode) or st.st_size > limit:
        return None
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return "sha256:" + h.hexdigest()


def _load_plugin(names: list[str], extra_dirs: list[str]) -> tuple[dict[str, Any] | None, str | None]:
    """(what the snippet found, error): the names dlopen'ed in a subprocess, then in ``extra_dirs``."""
    tries = names + [os.path.join(d, n) for d in extra_dirs for n in names if "/" not in n]
    exe = sys.executable
    if not exe:
        return None, "no sys.executable to start a subprocess"
    try:
        proc = subprocess.run([exe, "-c", _PLUGIN_SNIPPET, ",".join(map(str, PLUGIN_APIS)), *tries],
                              capture_output=True, timeout=NCCL_SUBPROCESS_TIMEOUT_S, text=True)
    except (OSError, subprocess.SubprocessError) as e:
        return None, f"subprocess failed: {e}"
    lines = (proc.stdout or "").strip().splitlines()
    try:
        doc = json.loads(lines[-1]) if lines else None
    except ValueError:
        doc = None
    if proc.returncode != 0 or not isinstance(doc, dict):
        tail = (proc.stderr or "").strip().splitlines()
        return None, "subprocess exit {}: {}".format(proc.returncode, tail[-1] if tail else "no output")
    return (None, None) if "errors" in doc else (doc, None)


def net_plugin(errors: list[str], nccl_path: str | None = None) -> dict[str, Any]:
    """The network plugin NCCL would load here (``path`` None: its own transports); libnccl's folder searched too."""
    requested = os.environ.get("NCCL_NET_PLUGIN") or None
    out: dict[str, Any] = {"requested": requested, "path": None, "realpath": None, "sha256": None,
                           "name": None, "api": None, "version": None}
    extra = [os.path.dirname(nccl_path)] if nccl_path else []
    found, err = _load_plugin(plugin_names(dict(os.environ)), extra)
    if err:
        errors.append(f"nccl: net plugin: {err}")
    if not found or not found.get("path"):
        return out
    path = str(found["path"])
    real = os.path.realpath(path)
    out.update(path=path, realpath=real, name=found.get("plugin_name"),
               api=f"v{found['api']}" if found.get("api") else None, version=so_version(real))
    try:
        out["sha256"] = file_sha256(real)
    except OSError as e:
        errors.append(f"nccl: net plugin: cannot read {real}: {e}")
    return out


def _runtime_version(path: str) -> str | None:
    lib = ctypes.CDLL(path)
    fn = lib.cudaRuntimeGetVersion
    fn.argtypes = [ctypes.POINTER(ctypes.c_int)]
    fn.restype = ctypes.c_int
    v = ctypes.c_int(0)
    if fn(ctypes.byref(v)) != 0 or v.value <= 0:
        return None
    return f"{v.value // 1000}.{v.value % 1000 // 10}"


def is_cudart_name(basename: str) -> bool:
    """``libcudart.so``, ``libcudart.so.12``, ``libcudart-<hash>.so.12`` (torch's bundled copy); not the archive."""
    return re.match(r"libcudart(-[0-9a-f]{8})?\.so(\.|$)", basename) is not None


def cuda_runtime(errors: list[str], maps_text: str | None = None) -> dict[str, Any]:
    """Every CUDA runtime library mapped into this process, in address order."""
    if maps_text is None:
        try:
            with open("/proc/self/maps", encoding="utf-8", errors="replace") as f:
                maps_text = f.read()
        except OSError as e:
            errors.append(f"cuda runtime: cannot read /proc/self/maps: {e}")
            return {"loaded": []}
    loaded = []
    for path in mapped_libraries(maps_text):
        if not is_cudart_name(os.path.basename(path)):
            continue
        try:
            version = _runtime_version(path)
        except Exception as e:  # not a CUDA runtime after all: keep the path, say why
            errors.append(f"cuda runtime: cudaRuntimeGetVersion on {path}: {e}")
            version = None
        loaded.append({"path": path, "version": version})
    return {"loaded": loaded}
