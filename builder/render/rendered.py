"""Stage 3: render a resolved :class:`~builder.recipe.spec.Spec` into image definitions.

One recipe gives, under ``images/<recipe>/`` (:mod:`builder.core.paths`):

- ``Dockerfile`` (:class:`builder.render.dockerfile.Dockerfile`),
- ``Singularity.def`` (:class:`builder.render.singularity.SingularityDef`, Apptainer/SingularityCE),
- ``envbuild.lock.json`` (the resolved pins, :meth:`Spec.lock`).

When ``images/<recipe>/envbuild.resolved.json`` exists (written by ``envbuild lock``,
:mod:`builder.resolve`) and was resolved for this very lock, its pins are carried over: the
lock gains the key ``resolved`` (base digest, pip packages with hashes, apt versions),
the base becomes ``image@sha256:...``, apt packages are installed as ``name=version`` and
pip installs ``--require-hashes`` from the resolved list (:func:`render_for`). A resolved
file made for another lock is an error, never ignored (:mod:`builder.render.resolved`).
The files are written as one set (:func:`builder.render.write.write`).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from builder.core.paths import LOCK_FILE
from builder.recipe.lock import lock_bytes
from builder.recipe.model import Resolved
from builder.recipe.spec import Spec

from .context import Context
from .dockerfile import Dockerfile
from .resolved import load_resolved
from .singularity import SingularityDef

#: The writers of the image definitions, in the order their files are written.
WRITERS: tuple[type[Context], ...] = (Dockerfile, SingularityDef)


@dataclass(frozen=True)
class Rendered:
    """The rendered files of one recipe: ``files`` maps file name -> bytes."""

    recipe: str
    files: dict[str, bytes]


def render(spec: Spec, resolved: Resolved | None = None) -> Rendered:
    """Render every file of ``spec``. Returns :class:`Rendered`; raises
    :class:`~builder.core.errors.EnvbuildError` (exit 2) for a value the templates refuse
    (:func:`builder.render.context._finalize`), jinja2 errors only on template bugs.

    ``resolved``: the checked content of ``envbuild.resolved.json``
    (:func:`builder.render.resolved.load_resolved`) or None (the recipe's pins only).
    """
    files = {writer.file_name: writer(spec, resolved).render() for writer in WRITERS}
    files[LOCK_FILE] = lock_bytes(spec.lock(resolved))
    return Rendered(recipe=spec.name, files=files)


def render_for(spec: Spec, images_dir: str | os.PathLike[str] = "images") -> Rendered:
    """:func:`render` with the resolved pins of ``images_dir/<recipe>/envbuild.resolved.json``
    when that file exists. Raises what :func:`builder.render.resolved.load_resolved` raises."""
    return render(spec, load_resolved(spec, images_dir))
