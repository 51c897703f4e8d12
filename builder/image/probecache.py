"""Remember that an image's probe matched its lock, keyed by the image ID, so that a no-change
``envbuild build`` does not start a container to find out again.

An image ID is the sha256 of the image's configuration, which names every layer's content
digest and holds every label: a retagged image (another image under the same tag), an edited
one (``docker commit``, a changed label) or a rebuilt one has another ID, finds no entry, and
is probed again. An entry also holds the sha256 of the lock the probe was compared with and
of the probe's code (:data:`builder.agent.payload.AGENT_DIR` ``/probe``): a changed lock or
probe misses too. Entries are written only after a probe matched (:func:`store`), one file per
image ID, replaced atomically; a missing, unreadable or malformed entry is a miss, never an
error.

Where: ``$ENVBUILD_CACHE_DIR``, else ``$XDG_CACHE_HOME/envbuild``, else
``~/.cache/envbuild`` (the XDG base directory specification), in ``probe-matches/``.
"""

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
SCHEMA = "envbuild.probe-match/1"
#: Largest entry read (a probe document is a few KiB).
MAX_ENTRY_BYTES = 1 << 20
_IMAGE_ID = re.compile(r"\Asha256:([0-9a-f]{64})\Z")


def default_dir(env: Mapping[str, str] | None = None) -> Path:
    """``$ENVBUILD_CACHE_DIR``, ``$XDG_CACHE_HOME/envbuild`` or ``~/.cache/envbuild``, then
    ``probe-matches``."""
    env = os.environ if env is None else env
    root = env.get("ENVBUILD_CACHE_DIR") or (
        os.path.join(env["XDG_CACHE_HOME"], "envbuild") if env.get("XDG_CACHE_HOME") else None)
    return Path(root or Path.home() / ".cache" / "envbuild") / "probe-matches"


def probe_code_digest(agent_dir: str | os.PathLike[str]) -> str:
    """sha256 (hex) of the probe's code: every ``*.py`` under ``agent_dir/probe`` (or
    ``agent_dir/probe.py``), by relative path and content, in sorted order."""
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


def _key(image_id: str, lock_bytes: bytes, agent_dir: str | os.PathLike[str]) -> dict[str, str]:
    return {"schema": SCHEMA, "image_id": image_id, "lock_sha256": hashlib.sha256(lock_bytes).hexdigest(),
            "probe_code_sha256": probe_code_digest(agent_dir)}


def load(cache_dir: Path, image_id: str, lock_bytes: bytes, agent_dir: str | os.PathLike[str]) -> dict[str, Any] | None:
    """The probe document recorded for ``image_id`` with this lock and probe code, or None.

    Args:
        cache_dir: the cache folder (:func:`default_dir`).
        image_id: ``sha256:<64 hex>`` (anything else: None).
        lock_bytes: the lock file's bytes the probe must have matched.
        agent_dir: the agent folder whose probe ran.
    """
    path = _entry_path(cache_dir, image_id)
    if path is None:
        return None
    try:
        doc = inputs.load_json(inputs.read_regular(path, MAX_ENTRY_BYTES, "probe cache entry"), str(path))
    except (EnvbuildError, OSError):
        return None
    if not isinstance(doc, dict) or not isinstance(doc.get("probe"), dict):
        return None
    key = _key(image_id, lock_bytes, agent_dir)
    return doc["probe"] if all(doc.get(k) == v for k, v in key.items()) else None


def store(cache_dir: Path, image_id: str, lock_bytes: bytes, agent_dir: str | os.PathLike[str],
          probe: Mapping[str, Any]) -> Path | None:
    """Record that ``probe`` (a probe document that matched the lock) came from ``image_id``.
    Written to a temporary file in ``cache_dir`` and renamed over the entry; returns its path,
    or None when it cannot be written (a read-only home: the next build probes again)."""
    path = _entry_path(cache_dir, image_id)
    if path is None:
        return None
    data = json.dumps({**_key(image_id, lock_bytes, agent_dir), "probe": probe}, sort_keys=True).encode()
    try:
        cache_dir.mkdir(parents=True, exist_ok=True)
        return write_atomic(path, data)
    except OSError:
        return None
