"""The whole ``envbuild.probe/1`` document (:func:`collect`) and the command (:func:`main`)."""

from __future__ import annotations

import json
import os
import platform
import socket
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

from . import container, libs, nccl, network, nvml, osinfo, torchinfo

SCHEMA = "envbuild.probe/1"

ENV_PREFIXES = ("NCCL_", "GLOO_", "TORCH_")
ENV_NAMES = ("CUDA_VISIBLE_DEVICES", "NVIDIA_VISIBLE_DEVICES", "LD_LIBRARY_PATH", "NVIDIA_REQUIRE_CUDA",
             "NVIDIA_DISABLE_REQUIRE")
#: What ``scope`` may say: probed on the host (``--host``) or inside an image (``--image``).
SCOPES = ("host", "image")


def shm_info() -> dict[str, Any]:
    path = "/dev/shm"
    try:
        st = os.statvfs(path)
    except OSError:
        return {"path": path, "size_bytes": None, "free_bytes": None}
    return {"path": path, "size_bytes": st.f_frsize * st.f_blocks, "free_bytes": st.f_frsize * st.f_bavail}


def _nccl(errors: list[str]) -> dict[str, Any]:
    out: dict[str, Any] = {"loaded": None, "found": [], "pip_packages": {}, "net_plugin": None}
    parts: tuple[tuple[str, Callable[[list[str]], Any]], ...] = (
        ("loaded", nccl.loaded_nccl), ("found", nccl.found_nccl), ("pip_packages", nccl.pip_packages),
        ("net_plugin", lambda errs: libs.net_plugin(errs, (out["loaded"] or {}).get("path"))))
    for key, fn in parts:
        try:
            out[key] = fn(errors)
        except Exception as e:  # belt and braces: the probe never crashes
            errors.append(f"nccl: {key}: {type(e).__name__}: {e}")
    return out


def collect(scope: str | None = None) -> dict[str, Any]:
    """The ``envbuild.probe/1`` dict, never raising; torch imported first: its NCCL mapped before reading maps."""
    errors: list[str] = []
    out: dict[str, Any] = {"schema": SCHEMA, "scope": scope if scope in SCOPES else None,
                           "probed_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    try:
        out["hostname"] = socket.gethostname()
    except Exception as e:
        out["hostname"] = None
        errors.append(f"hostname: {e}")
    out["kernel"] = platform.release()
    out["os"] = osinfo.os_release(errors)
    out["glibc"] = osinfo.glibc(errors)
    out["python"] = {"version": platform.python_version(), "executable": sys.executable}
    out["torch"] = torchinfo.torch_info(errors)
    out["nccl"] = _nccl(errors)
    try:
        out["gpus"], out["driver"] = nvml.gpus_and_driver(errors)
    except Exception as e:
        out["gpus"], out["driver"] = [], None
        errors.append(f"nvml: {type(e).__name__}: {e}")
    out["env"] = {k: v for k, v in sorted(os.environ.items()) if k.startswith(ENV_PREFIXES) or k in ENV_NAMES}
    later: tuple[tuple[str, Callable[[list[str]], Any]], ...] = (
        ("cuda_runtime", libs.cuda_runtime), ("container", container.container_info),
        ("image", lambda errs: container.image_info()),
        ("network", network.network_info), ("shm", lambda errs: shm_info()),
        ("gpu_processes", nvml.gpu_processes))
    for key, fn in later:
        try:
            out[key] = fn(errors)
        except Exception as e:  # the probe never crashes
            out[key] = None
            errors.append(f"{key}: {type(e).__name__}: {e}")
    out["errors"] = errors
    return out


def main(argv: Sequence[str] | None = None) -> int:
    """Print :func:`collect` as JSON; ``--host`` or ``--image`` (the first argument) sets ``scope``."""
    args = list(sys.argv[1:] if argv is None else argv)
    scope = args[0][2:] if args and args[0] in ("--host", "--image") else None
    json.dump(collect(scope), sys.stdout, indent=2)
    sys.stdout.write("\n")
    return 0
