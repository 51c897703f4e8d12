"""Libraries that decide how NCCL talks and which CUDA runtime runs: the NCCL network
plugin NCCL would load, and the CUDA runtime libraries (``libcudart``) this process maps.

Standard library only (``ctypes``), Python >= 3.8.

The network plugin, as NCCL looks for it (NVIDIA/nccl ``src/net.cc`` up to 2.22,
``src/plugin/plugin_open.cc`` from 2.23): with ``NCCL_NET_PLUGIN=NAME`` NCCL dlopens
``NAME`` as given (2.19 and later; a path works) and then ``libnccl-net-NAME.so``; without
it, ``libnccl-net.so``; nothing found means NCCL's own IB and socket transports. dlopen
searches ``LD_LIBRARY_PATH``, the caller's ``RUNPATH`` (libnccl's folder: searched here too)
and the ld.so cache. The plugin exports a struct ``ncclNetPlugin_vN`` (N, the plugin API
version, 2..11) whose first member is the plugin's name (``const char *name``). The library
is loaded in a subprocess, as the NCCL versions on disk are (:mod:`.nccl`), so the probing
process maps nothing new; its file is named by ``dladdr`` on that symbol (or, for a library
without one, the first file mapped by loading it), hashed with SHA-256.

``cuda_runtime.loaded``: every ``libcudart.so*`` in ``/proc/self/maps`` after torch was
imported, with ``cudaRuntimeGetVersion`` (no GPU needed). Two of them in one process is the
mixed-runtime trap of a wheel's bundled runtime next to a system one.
"""

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
    """The library names NCCL tries for its network plugin, in order:
    ``[NAME, "libnccl-net-NAME.so"]`` with ``NCCL_NET_PLUGIN=NAME``, else
    ``["libnccl-net.so"]``."""
    name = env.get("NCCL_NET_PLUGIN") or ""
    return [name, f"libnccl-net-{name}.so"] if name else ["libnccl-net.so"]


def so_version(path: str | None) -> str | None:
    """The dotted version after ``.so.`` in a library's file name (``libnccl-net.so.1.14.0``
    gives ``"1.14.0"``), or None."""
    m = re.search(r"\.so\.([0-9]+(?:\.[0-9]+){0,3})$", path or "")
    return m.group(1) if m else None


def file_sha256(path: str, limit: int = MAX_PLUGIN_BYTES) -> str | None:
    """``sha256:<hex>`` of a regular file of at most ``limit`` bytes; None for anything
    else (never opened: a FIFO would block). Raises OSError when it cannot be read."""
    st = os.stat(path)
    if not stat.S_ISREG(st.st_mode) or st.st_size > limit:
        return None
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return "sha256:" + h.hexdigest()


def _load_plugin(names: list[str], extra_dirs: list[str]) -> tuple[dict[str, Any] | None, str | None]:
    """(what the snippet found, error): the names dlopen'ed in a subprocess, then the same
    names in ``extra_dirs`` (libnccl's folder: its RUNPATH)."""
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
    """The NCCL network plugin NCCL would load here: ``{"requested", "path", "realpath",
    "sha256", "name", "api", "version"}``; ``path`` None when there is none (NCCL then uses
    its own transports). ``nccl_path``: the loaded libnccl, whose folder is searched too."""
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
    """``cudaRuntimeGetVersion`` of the mapped ``path`` (12080 gives ``"12.8"``), or None."""
    lib = ctypes.CDLL(path)
    fn = lib.cudaRuntimeGetVersion
    fn.argtypes = [ctypes.POINTER(ctypes.c_int)]
    fn.restype = ctypes.c_int
    v = ctypes.c_int(0)
    if fn(ctypes.byref(v)) != 0 or v.value <= 0:
        return None
    return f"{v.value // 1000}.{v.value % 1000 // 10}"


def is_cudart_name(basename: str) -> bool:
    """True for CUDA runtime library file names: ``libcudart.so``, ``libcudart.so.12``,
    ``libcudart-<hash>.so.12`` (torch's bundled copy); not the static archive."""
    return re.match(r"libcudart(-[0-9a-f]{8})?\.so(\.|$)", basename) is not None


def cuda_runtime(errors: list[str], maps_text: str | None = None) -> dict[str, Any]:
    """``{"loaded": [{"path", "version"}]}``: every CUDA runtime library mapped into this
    process (``/proc/self/maps``, or ``maps_text``), in address order."""
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
