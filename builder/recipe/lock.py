"""The lock document: its canonical bytes and hash, and reading one back (a file, the image label ``envbuild.lock``)
under the recipe's own value types and bounds."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from typing import Any

from builder.core import inputs
from builder.core.errors import EnvbuildError
from builder.core.model import convert

from .fields import control_message
from .model import Lock

#: Largest lock document read from an image label or a file, in bytes.
MAX_LOCK_BYTES = 1 << 20


def _plain(lock: Lock | Mapping[str, Any]) -> Any:
    return lock.to_dict() if isinstance(lock, Lock) else lock


def lock_bytes(lock: Lock | Mapping[str, Any]) -> bytes:
    """Canonical serialisation: sorted keys, 2-space indent, trailing newline."""
    return (json.dumps(_plain(lock), indent=2, sort_keys=True) + "\n").encode()


def lock_label(lock: Lock | Mapping[str, Any]) -> str:
    return json.dumps(_plain(lock), sort_keys=True, separators=(",", ":"))


def lock_hash(lock: Lock | Mapping[str, Any]) -> str:
    """``sha256:<hex>`` of :func:`lock_bytes` (a parsed label hashes as the lock it was made from)."""
    return "sha256:" + hashlib.sha256(lock_bytes(lock)).hexdigest()


def validate_lock(doc: Any, source: str) -> Lock:
    if not isinstance(doc, dict):
        raise EnvbuildError("is not a JSON object", file=source, value=type(doc).__name__)
    return convert(doc, Lock, file=source, control=control_message)


def read_lock_text(text: Any, source: str) -> Lock:
    """Parse and check a lock given as JSON text (an image label); EnvbuildError (exit 2)."""
    if not isinstance(text, str):
        raise EnvbuildError("is not text", file=source, value=type(text).__name__)
    if len(text) > MAX_LOCK_BYTES:
        raise EnvbuildError(f"is {len(text)} characters, over the {MAX_LOCK_BYTES}-byte limit of a lock", file=source)
    return validate_lock(inputs.load_json(text, source), source)
