"""The bundled compatibility facts (``builder/recipe/data/compat.yaml``), parsed once.

Copied from ``shared/reference/compat.md`` with their sources and confidence tags (V
verified from the artifact, M a maintainer's statement, S a secondary copy, U
unverified). Parsed with PyYAML's C loader (``CSafeLoader``, libyaml) when present, else the
pure-Python ``SafeLoader`` (the same data, ~8x slower): the file is envbuild's own, so the
bounded loader of :mod:`builder.core.inputs` (for untrusted files) is not needed.
"""

from __future__ import annotations

from functools import lru_cache
from importlib import resources
from typing import Any

import yaml

#: The YAML loader of the facts: libyaml's when PyYAML was built with it.
LOADER: type = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


@lru_cache(maxsize=1)
def facts() -> dict[str, Any]:
    """The facts as plain data: ``torch`` (release -> variants, Python range, manylinux tag,
    NCCL and cuDNN pins), ``os``, ``cuda_driver``, ``cuda_image_nccl``, ``second_stack``,
    ``companions``, ``torch_index``, ``sources``."""
    text = resources.files("builder.recipe").joinpath("data/compat.yaml").read_text(encoding="utf-8")
    data: dict[str, Any] = yaml.load(text, Loader=LOADER)  # noqa: S506 - a safe loader (CSafeLoader or SafeLoader)
    return data
