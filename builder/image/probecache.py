"""The probe document of an image, kept by image ID so that a probe runs once per image.
An image ID hashes the image's configuration, so an edited or rebuilt image is probed again; so is
any image after the probe's code changed. Only probes without GPUs are kept (GPUs are live host
state). A missing or malformed entry is a miss, never an error. Source: XDG base directory spec."""

from __future__ import annotations

import hashlib
import json
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from builder.core import inputs
from builder.core.errors import EnvbuildError
from builder.core.files import write_atomic

#: Schema of an entry.
SCHEMA = "envbuild.probe-cache/1"
#: Largest entry read (a probe document is a few KiB).
MAX_ENTRY_BYTES = 1 << 20
_IMAGE_ID = re.compile(r"\Asha256:([0-9a-f]{64})\Z")


def default_dir(env: Mapping[str, str] | None = None) -> Path:
    env = os.environ if env is None else env
    root = env.get("ENVBUILD_CACHE_DIR") or (
        os.path.join(env["XDG_CACHE_HOME"], "envbuild") if env.get("XDG_CACHE_HOME") else None)
    return Path(root or Path.home() / ".cache" / "envbuild") / "probes"


def probe_code_digest(agent_dir: str | os.PathLike[str]) -> str:
    """sha256 (hex) of every ``*.py`` under ``agent_dir/probe`` (or ``agent_dir/probe.py``)."""
    root = Path(agent_dir)
    digest = hashlib.sha256()
    paths = sorted((root / "probe").rglob("*.py")) if (root / "probe").is_dir() else [root / "probe.py"]
    for path in paths:
        if "__pycache__" in path.parts or not path.is_file():
            continue
        data = path.read_bytes()
        digest.update(f"{path.relative_to(root).as_posix()}\0{len(data)}\0".encode() + data)
    return digest.hexdigest()


def _entry_path(cache_dir: Path, image_id: str) -> Path | None:
    m = _IMAGE_ID.fullmatch(image_id)
    return cache_dir / f"{m.group(1)}.json" if m else None


def _key(image_id: str, agent_dir: str | os.PathLike[str]) -> dict[str, str]:
    return {"schema": SCHEMA, "image_id": image_id, "probe_code_sha256": probe_code_digest(agent_dir)}


def load(cache_dir: Path, image_id: str, agent_dir: str | os.PathLike[str]) -> dict[str, Any] | None:
    """The probe document kept for ``image_id`` (``sha256:<64 hex>``) and this probe code, or None."""
    path = _entry_path(cache_dir, image_id)
    if path is None:
        return None
    try:
        doc = inputs.load_json(inputs.read_regular(path, MAX_ENTRY_BYTES, "probe cache entry"), str(path))
    except (EnvbuildError, OSError):
        return None
    if not isinstance(doc, dict) or not isinstance(doc.get("probe"), dict):
        return None
    key = _key(image_id, agent_dir)
    return doc["probe"] if all(doc.get(k) == v for k, v in key.items()) else None


def store(cache_dir: Path, image_id: str, agent_dir: str | os.PathLike[str], probe: Mapping[str, Any]) -> Path | None:
    """Keep ``probe`` of ``image_id`` atomically; its path, or None if unwritable (next caller probes)."""
    path = _entry_path(cache_dir, image_id)
    if path is None:
        return None
    data = json.dumps({**_key(image_id, agent_dir), "probe": probe}, sort_keys=True).encode()
    try:
        return write_atomic(path, data)
    except (EnvbuildError, OSError):
        return None
