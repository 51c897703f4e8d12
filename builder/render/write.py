"""Write the rendered files of a recipe as one set, or tell which ones are stale."""

from __future__ import annotations

import os
from pathlib import Path

from builder.core.files import changed_files, write_set
from builder.core.paths import image_dir

from .rendered import Rendered


def write(rendered: Rendered, images_dir: str | os.PathLike[str] = "images") -> tuple[Path, list[str]]:
    """``(folder, names written)``: all changed files or, on any error, none (EnvbuildError, exit 3)."""
    folder = image_dir(images_dir, rendered.recipe).folder
    return folder, write_set(folder, rendered.files)


def stale(rendered: Rendered, images_dir: str | os.PathLike[str] = "images") -> list[str]:
    """Names of the files under ``images_dir/<recipe>/`` that differ from ``rendered`` or are missing."""
    return changed_files(image_dir(images_dir, rendered.recipe).folder, rendered.files)
