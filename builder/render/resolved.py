"""The pins ``envbuild lock`` wrote, read back for rendering and checked against the recipe's lock."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from builder.core import inputs
from builder.core.errors import EnvbuildError, ExitCode, ManyErrors
from builder.core.model import convert
from builder.core.paths import image_dir
from builder.recipe.lock import lock_hash
from builder.recipe.model import Resolved
from builder.recipe.spec import Spec

#: Largest ``envbuild.resolved.json`` read, in bytes.
MAX_RESOLVED_BYTES = 4 << 20


def check_resolved(doc: Any, spec: Spec, path: str | os.PathLike[str]) -> Resolved:
    """Raises EnvbuildError or ManyErrors (exit 2); another ``lock_hash``: the recipe changed since the lock."""
    file = str(path)
    if not isinstance(doc, dict):
        raise EnvbuildError("is not a JSON object", file=file, field="schema", value=type(doc).__name__)
    try:
        resolved = convert(doc, Resolved, file=file)
    except ManyErrors as e:
        raise e.errors[0] if len(e.errors) == 1 else e from None
    if resolved.recipe != spec.name:
        raise EnvbuildError(f"is not this recipe ({spec.name!r})", file=file, field="recipe", value=resolved.recipe)
    want = lock_hash(spec.lock())
    if resolved.lock_hash != want:
        raise EnvbuildError(f"was resolved for another lock (now {want}): the recipe changed; run "
                            f"`envbuild lock {spec.name}` again or delete the file",
                            file=file, field="lock_hash", value=resolved.lock_hash)
    return resolved


def load_resolved(spec: Spec, images_dir: str | os.PathLike[str] = "images") -> Resolved | None:
    """None when absent. Raises Unreachable (exit 3): unreadable; EnvbuildError (exit 2): invalid."""
    path: Path = image_dir(images_dir, spec.name).resolved
    if not os.path.lexists(path):
        return None
    doc = inputs.read_json(path, MAX_RESOLVED_BYTES, "resolved-pins file", ExitCode.CHECK_FAILED)
    return check_resolved(doc, spec, path)
