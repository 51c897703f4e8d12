"""Test helpers: write recipe YAML from dicts (no envbuild code involved)."""

from __future__ import annotations

import contextlib
import copy
import subprocess
from collections.abc import Iterator
from pathlib import Path

import yaml

CPU = {
    "base": {"image": "debian:bookworm-slim"},
    "os": {"id": "debian", "version": "12"},
    "python": "3.11",
    "cuda": None,
    "torch": {"version": "2.13.0", "variant": "cpu"},
}

CUDA = {
    "base": {"image": "nvidia/cuda:12.8.1-base-ubuntu24.04"},
    "os": {"id": "ubuntu", "version": "24.04"},
    "python": "3.12",
    "cuda": {"version": "12.8"},
    "torch": {"version": "2.8.0", "variant": "cu128"},
    "nccl": "2.27.3",
}


def merge(base: dict, changes: dict) -> dict:
    """Deep-merge ``changes`` into a copy of ``base``; a value of ``...`` deletes the key."""
    out = copy.deepcopy(base)
    for key, value in changes.items():
        if value is ...:
            out.pop(key, None)
        elif isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = merge(out[key], value)
        else:
            out[key] = value
    return out


def write_recipe(tmp_path: Path, data: dict | str, name: str = "t") -> Path:
    """Write ``data`` (a dict or raw YAML text) to ``tmp_path/<name>.yaml``."""
    path = tmp_path / f"{name}.yaml"
    path.write_text(data if isinstance(data, str) else yaml.safe_dump(data, sort_keys=False))
    return path


@contextlib.contextmanager
def tmpfs(mnt: Path, size: str) -> Iterator[Path]:
    """A tmpfs of ``size`` (mount's syntax: ``4k``, ``64k``) mounted at ``mnt`` (created;
    root only), unmounted afterwards: a full disk for tests of writes that must not be
    left half-done."""
    mnt.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(mnt)], check=True)
    try:
        yield mnt
    finally:
        subprocess.run(["umount", str(mnt)], check=True)
