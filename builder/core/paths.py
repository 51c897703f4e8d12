"""The images-dir layout: the one place that knows where a recipe's files live."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

DOCKERFILE = "Dockerfile"
SINGULARITY_DEF = "Singularity.def"
LOCK_FILE = "envbuild.lock.json"
RESOLVED_FILE = "envbuild.resolved.json"
CERTIFICATES = "certificates"
#: The files ``envbuild render`` writes, as one set.
RENDERED_FILES = (DOCKERFILE, SINGULARITY_DEF, LOCK_FILE)


@dataclass(frozen=True)
class ImageDir:
    """The folder of ``recipe`` under ``root`` (the images dir) and its files."""

    root: Path
    recipe: str

    @property
    def folder(self) -> Path:
        return self.root / self.recipe

    def file(self, name: str) -> Path:
        return self.folder / name

    @property
    def lock(self) -> Path:
        return self.folder / LOCK_FILE

    @property
    def resolved(self) -> Path:
        return self.folder / RESOLVED_FILE

    @property
    def certificates(self) -> Path:
        return self.folder / CERTIFICATES


def image_dir(images_dir: str | os.PathLike[str], recipe: str) -> ImageDir:
    """The :class:`ImageDir` of ``recipe`` under ``images_dir`` (nothing is created)."""
    return ImageDir(Path(images_dir), recipe)
