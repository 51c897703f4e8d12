"""The whole ``envbuild.probe/1`` document (:func:`collect`) and the command (:func:`main`).

Standard library only, Python >= 3.8; the field list with its sources is in the package
docstring (:mod:`builder.agent.probe`).
"""

from __future__ import annotations

import json
import os
import platform
import socket
import sys
from typing import Any, Callable

from . import container, nccl, network, nvml, osinfo, torchinfo

SCHEMA = "envbuild.probe/1"

ENV_PREFIXES = ("NCCL_", "GLOO_", "TORCH_")
ENV_NAMES = ("CUDA_VISIBLE_DEVICES", "NVIDIA_VISIBLE_DEVICES")


def shm_info() -> dict[str, Any]:
    """``{"path": "/dev/shm", "size_bytes", "free_bytes"}`` (``os.statvfs``; None when absent)."""
    path = "/dev/shm"
    try:
        st = os.statvfs(path)
    except OSError:
        return {"path": path, "size_bytes": None, "free_bytes": None}
    return {"path": path, "size_bytes": st.f_frsize * st.f_blocks,
            "free_bytes": st.f_frsize * st.f_bavail}


def env_vars() -> dict[str, str]:
    """``NCCL_*``, ``GLOO_*``, ``TORCH_*``, ``CUDA_VISIBLE_DEVICES`` and
    ``NVIDIA_VISIBLE_DEVICES`` of this process, sorted by name."""
    return {
        k: v
        for k, v in sorted(os.environ.items())
        if k.startswith(ENV_PREFIXES) or k in ENV_NAMES
    }


def _nccl(errors: list[str]) -> dict[str, Any]:
    out: dict[str, Any] = {"loaded": None, "found": [], "pip_packages": {}}
    parts: tuple[tuple[str, Callable[[list[str]], Any]], ...] = (
        ("loaded", nccl.loaded_nccl), ("found", nccl.found_nccl), ("pip_packages", nccl.pip_packages))
    for key, fn in parts:
        try:
            out[key] = fn(errors)
        except Exception as e:  # belt and braces: the probe never crashes
            errors.append(f"nccl: {key}: {type(e).__name__}: {e}")
    return out


def collect() -> dict[str, Any]:
    """Probe this process's environment; returns the ``envbuild.probe/1`` dict.

    Imports torch if it is installed (so that torch's own NCCL gets mapped) before
    reading ``/proc/self/maps``. Never raises for missing components; problems are
    listed under ``errors``. Loading each libnccl found on disk happens in a
    subprocess (at most ``nccl.NCCL_SUBPROCESS_TIMEOUT_S`` s each).
    """
    errors: list[str] = []
    out: dict[str, Any] = {"schema": SCHEMA}
    try:
        out["hostname"] = socket.gethostname()
    except Exception as e:
        out["hostname"] = None
        errors.append(f"hostname: {e}")
    out["kernel"] = platform.release()
    out["os"] = osinfo.os_release(errors)
    out["glibc"] = osinfo.glibc(errors)
    out["python"] = torchinfo.python_info()
    out["torch"] = torchinfo.torch_info(errors)
    out["nccl"] = _nccl(errors)
    try:
        out["gpus"], out["driver"] = nvml.gpus_and_driver(errors)
    except Exception as e:
        out["gpus"], out["driver"] = [], None
        errors.append(f"nvml: {type(e).__name__}: {e}")
    out["env"] = env_vars()
    later: tuple[tuple[str, Callable[[list[str]], Any]], ...] = (
        ("container", container.container_info), ("image", lambda errs: container.image_info()),
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


def main() -> int:
    """Print :func:`collect` as indented JSON on stdout; exit status 0."""
    json.dump(collect(), sys.stdout, indent=2)
    sys.stdout.write("\n")
    return 0
