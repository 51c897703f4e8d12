"""The lock document: its canonical bytes and hash, and reading one back.

A lock (:class:`~builder.recipe.model.Lock`, built by :meth:`builder.recipe.spec.Spec.lock`)
is written as ``images/<recipe>/envbuild.lock.json`` and, compact, as the image label
``envbuild.lock``. Read back (a file, a label), it is checked against the model with the
recipe's own value types and bounds: every key present, exact types (no bool for an int,
no string for a number), no control character in any string.
"""

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
    """Canonical serialisation of a lock (sorted keys, 2-space indent, trailing newline)."""
    return (json.dumps(_plain(lock), indent=2, sort_keys=True) + "\n").encode()


def lock_label(lock: Lock | Mapping[str, Any]) -> str:
    """The lock as the compact JSON of the ``envbuild.lock`` label (sorted keys)."""
    return json.dumps(_plain(lock), sort_keys=True, separators=(",", ":"))


def lock_hash(lock: Lock | Mapping[str, Any]) -> str:
    """``sha256:<hex>`` of :func:`lock_bytes` (a parsed lock label hashes as the lock it was made from)."""
    return "sha256:" + hashlib.sha256(lock_bytes(lock)).hexdigest()


def validate_lock(doc: Any, source: str) -> Lock:
    """Check a parsed lock document (``images/<recipe>/envbuild.lock.json`` or the image
    label ``envbuild.lock``, named ``source`` in errors) against :class:`Lock`.

    Returns: the :class:`Lock`.
    Raises:
        EnvbuildError: (exit 2) not a JSON object.
        ManyErrors: (exit 2) one line per invalid field, e.g.
            ``label envbuild.lock: certify.nodes: 'abc' must be an integer in 1..1024``.
    """
    if not isinstance(doc, dict):
        raise EnvbuildError("is not a JSON object", file=source, value=type(doc).__name__)
    return convert(doc, Lock, file=source, control=control_message)


def read_lock_text(text: Any, source: str) -> Lock:
    """Parse and check a lock document given as JSON text (an image label): at most
    :data:`MAX_LOCK_BYTES`, bounded JSON (:func:`builder.core.inputs.load_json`), then
    :func:`validate_lock`. Raises :class:`EnvbuildError` (exit 2) naming ``source``."""
    if not isinstance(text, str):
        raise EnvbuildError("is not text", file=source, value=type(text).__name__)
    if len(text) > MAX_LOCK_BYTES:
        raise EnvbuildError(f"is {len(text)} characters, over the {MAX_LOCK_BYTES}-byte limit of a lock", file=source)
    return validate_lock(inputs.load_json(text, source), source)
