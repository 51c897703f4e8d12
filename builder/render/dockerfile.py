"""The Dockerfile of a recipe (template ``templates/Dockerfile.j2``): a build stage that
makes the venv, a runtime stage that copies it, the labels as double-quoted strings."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any, ClassVar

from builder.core.paths import DOCKERFILE

from .context import Context


def dockerquote(value: str) -> str:
    """Quote ``value`` as a Dockerfile double-quoted string (``"`` and ``\\`` escaped, ``$`` not expanded)."""
    return json.dumps(value, ensure_ascii=False).replace("$", "\\$")


class Dockerfile(Context):
    """The Dockerfile writer: the shared context and :func:`dockerquote` for label values."""

    file_name: ClassVar[str] = DOCKERFILE
    template: ClassVar[str] = "Dockerfile.j2"
    filters: ClassVar[dict[str, Callable[..., Any]]] = {"dockerquote": dockerquote}
