"""Where ``envbuild k8s render RECIPE`` takes a run's settings from: the recipe's lock file."""

from __future__ import annotations

import os
from typing import Any

from builder.core.errors import EnvbuildError, ExitCode
from builder.core.inputs import MAX_REPORT_BYTES, read_json
from builder.core.paths import image_dir


def lock_from_file(images_dir: str | os.PathLike[str], recipe: str) -> tuple[dict[str, Any], dict[str, str]]:
    """``(lock, labels)`` for a recipe name: ``<images_dir>/<recipe>/envbuild.lock.json``
    (written by ``envbuild render``) and the labels an image built from it would carry
    that matter here: ``envbuild.recipe``, ``envbuild.lock-hash`` (of this file's lock;
    an image built after ``envbuild lock`` also holds the resolved pins, so its hash
    differs) and ``envbuild.backend``.

    Raises:
        EnvbuildError: (exit 2) the file is missing, not JSON (bounded:
            :func:`builder.core.inputs.read_json`) or not a lock (``schema`` ``envbuild.lock/1``);
            (exit 3) not a regular file or over 16 MiB.
    """
    from builder.recipe.fields import LOCK_SCHEMA
    from builder.recipe.lock import lock_hash

    path = image_dir(images_dir, recipe).lock
    if not os.path.lexists(path):
        raise EnvbuildError(f"not found; run `envbuild render {recipe}`", file=str(path))
    lock = read_json(path, MAX_REPORT_BYTES, "lock file", ExitCode.CHECK_FAILED)
    if not isinstance(lock, dict) or lock.get("schema") != LOCK_SCHEMA:
        raise EnvbuildError(f"is not an envbuild lock (schema {LOCK_SCHEMA})", file=str(path))
    labels = {
        "envbuild.recipe": str(lock.get("recipe") or recipe),
        "envbuild.lock-hash": lock_hash(lock),
    }
    backend = (lock.get("certify") or {}).get("backend")
    if backend:
        labels["envbuild.backend"] = str(backend)
    return lock, labels
