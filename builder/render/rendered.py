"""Render a Spec into its image definitions and lock file, with the pins of an
``envbuild.resolved.json`` for this very lock (one for another lock is an error)."""

from __future__ import annotations

import os
from dataclasses import dataclass

from builder.core.paths import LOCK_FILE
from builder.recipe.lock import lock_bytes
from builder.recipe.model import Resolved
from builder.recipe.spec import Spec

from .context import FORMATS, Context
from .resolved import load_resolved


@dataclass(frozen=True)
class Rendered:
    """The rendered files of one recipe: file name -> bytes."""

    recipe: str
    files: dict[str, bytes]


def render(spec: Spec, resolved: Resolved | None = None) -> Rendered:
    """Render every file of ``spec`` with the ``resolved`` pins or the recipe's own; EnvbuildError (exit 2)."""
    context = Context(spec, resolved)
    files = {name: context.render(template) for name, template in FORMATS.items()}
    files[LOCK_FILE] = lock_bytes(spec.lock(resolved))
    return Rendered(recipe=spec.name, files=files)


def render_for(spec: Spec, images_dir: str | os.PathLike[str] = "images") -> Rendered:
    """:func:`render` with the pins of ``envbuild.resolved.json`` when present."""
    return render(spec, load_resolved(spec, images_dir))
