"""NCCL: the library mapped into this process, every libnccl on disk, pip's NCCL wheels. Versions on
disk are asked in a subprocess each, so that ``loaded`` names only what torch itself mapped."""

from __future__ import annotations

import ctypes
import glob
import os
import subprocess
import sys
from typing import Any

# System locations of libnccl (Debian/Ubuntu multiarch, RHEL lib64, CUDA toolkits).
SYSTEM_NCCL_DIRS = ("/usr/lib/x86_64-linux-gnu", "/usr/lib/aarch64-linux-gnu", "/usr/lib64", "/usr/lib",
                    "/usr/local/lib")
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


def nccl_version_from_code(code: int) -> str:
    """``"X.Y.Z"`` of an NCCL version code (22703 is 2.27.3, 2804 is 2.8.4); ValueError unless an int > 0."""
    if isinstance(code, bool) or not isinstance(code, int) or code <= 0:
        raise ValueError(f"not an NCCL version code: {code!r}")
    if code >= 10000:
        major, minor, patch = code // 10000, code % 10000 // 100, code % 100
    else:
        major, minor, patch = code // 1000, code % 1000 // 100, code % 100
    return f"{major}.{minor}.{patch}"


def is_nccl_library_name(basename: str) -> bool:
    """``libnccl.so``, ``libnccl.so.2[.x.y]``: not plugins nor the archive (no ``ncclGetVersion``)."""
    return basename == "libnccl.so" or basename.startswith("libnccl.so.")


def mapped_libraries(maps_text: str) -> list[str]:
    """File paths in ``/proc/<pid>/maps`` text, first seen first; a path may hold spaces (proc(5))."""
    seen: list[str] = []
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


def _call_nccl_get_version(lib: Any) -> int:
    fn = lib.ncclGetVersion
    fn.argtypes = [ctypes.POINTER(ctypes.c_int)]
    fn.restype = ctypes.c_int
    v = ctypes.c_int(0)
    rc = fn(ctypes.byref(v))
    if rc != 0:
        raise OSError(f"ncclGetVersion returned ncclResult_t {rc}")
    return v.value


def loaded_nccl(errors: list[str]) -> dict[str, Any] | None:
    """The libnccl mapped into this process with its version, or None."""
    try:
        with open("/proc/self/maps", encoding="utf-8", errors="replace") as f:
            maps = f.read()
    except OSError as e:
        errors.append(f"nccl: cannot read /proc/self/maps: {e}")
        return None
    for path in mapped_libraries(maps):
        if not is_nccl_library_name(os.path.basename(path)):
            continue
        try:
            # Already mapped: dlopen on the same file returns the loaded copy.
            code = _call_nccl_get_version(ctypes.CDLL(path))
            return {"version": nccl_version_from_code(code), "code": code, "path": path}
        except Exception as e:
            errors.append(f"nccl: ncclGetVersion on loaded {path}: {e}")
            return None
    return None


def _site_dirs() -> list[str]:
    dirs: list[str] = []
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


def nccl_search_dirs() -> list[str]:
    """Directories searched for libnccl.so*: pip's ``nvidia/nccl/lib``, system and CUDA dirs, ``LD_LIBRARY_PATH``."""
    candidates = [os.path.join(d, "nvidia", "nccl", "lib") for d in _site_dirs()]
    candidates.extend(SYSTEM_NCCL_DIRS)
    for pattern in CUDA_NCCL_GLOBS:
        candidates.extend(sorted(glob.glob(pattern)))
    for entry in os.environ.get("LD_LIBRARY_PATH", "").split(os.pathsep):
        if entry:
            candidates.append(entry)
    out: list[str] = []
    for d in candidates:
        d = os.path.abspath(d)
        if d not in out and os.path.isdir(d):
            out.append(d)
    return out


def _nccl_version_in_subprocess(path: str) -> tuple[int | None, str | None]:
    """(code, error) for the libnccl at path, loaded in a fresh interpreter."""
    exe = sys.executable
    if not exe:
        return None, "no sys.executable to start a subprocess"
    try:
        proc = subprocess.run([exe, "-c", _NCCL_VERSION_SNIPPET, path], capture_output=True,
                              timeout=NCCL_SUBPROCESS_TIMEOUT_S, text=True)
    except (OSError, subprocess.SubprocessError) as e:
        return None, f"subprocess failed: {e}"
    if proc.returncode != 0:
        tail = (proc.stderr or "").strip().splitlines()
        return None, f"subprocess exit {proc.returncode}: {tail[-1] if tail else ''}"
    try:
        rc, code = (int(x) for x in proc.stdout.split())
    except ValueError:
        return None, f"unexpected subprocess output {proc.stdout!r}"
    if rc != 0:
        return None, f"ncclGetVersion returned ncclResult_t {rc}"
    return code, None


def found_nccl(errors: list[str]) -> list[dict[str, Any]]:
    """Every libnccl.so* in :func:`nccl_search_dirs`, one per real file, sorted by path."""
    by_real: dict[str, list[str]] = {}
    for d in nccl_search_dirs():
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
    found: list[dict[str, Any]] = []
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
            errors.append(f"nccl: {path}: {err}")
        found.append({"path": path, "realpath": real, "version": version, "code": code, "error": err})
    found.sort(key=lambda item: item["path"])
    return found


def pip_packages(errors: list[str]) -> dict[str, str]:
    """Installed distributions named ``nvidia-nccl*``: ``{normalized name: version}``."""
    try:
        from importlib import metadata
    except ImportError:  # Python < 3.8
        return {}
    out: dict[str, str] = {}
    try:
        for dist in metadata.distributions():
            name = (dist.metadata.get("Name") or "").strip()  # type: ignore[attr-defined]
            norm = name.lower().replace("_", "-").replace(".", "-")
            if norm.startswith("nvidia-nccl") and norm not in out:
                out[norm] = dist.version
    except Exception as e:
        errors.append(f"nccl: listing distributions: {e}")
    return dict(sorted(out.items()))


