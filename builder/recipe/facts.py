"""The bundled compatibility facts (``builder/recipe/data/compat.yaml``) as a typed model, parsed once.

Copied from ``shared/reference/compat.md`` with their sources and confidence tags (V
verified from the artifact, M a maintainer's statement, S a secondary copy, U
unverified). Parsed with PyYAML's C loader (``CSafeLoader``, libyaml) when present, else the
pure-Python ``SafeLoader`` (the same data, ~8x slower): the file is envbuild's own, so the
bounded loader of :mod:`builder.core.inputs` (for untrusted files) is not needed; the model
(:class:`Facts`) checks its shape once.

``data/compat.json`` (:data:`JSON_FILE`, generated: :func:`write_json`) holds the same facts
as JSON with the sha256 of the ``compat.yaml`` they came from: when that digest matches,
:func:`facts` decodes it (~0.1 ms, checked by the same model) instead of parsing the YAML
(~20 ms, most of what ``envbuild check`` spends on the facts; issue 13 item 5). An edited
``compat.yaml`` is always read itself until the JSON is regenerated
(``.venv/bin/python tests/unit/test_fast_paths.py --regen``; a test fails while it is stale).
"""

from __future__ import annotations

import hashlib
from functools import lru_cache
from pathlib import Path
from typing import Literal

import msgspec

from builder.core.model import Model

#: The facts file, inside the package (``package-data`` in pyproject.toml).
FILE = Path(__file__).resolve().parent / "data" / "compat.yaml"
#: The same facts as JSON, generated from :data:`FILE` (:func:`write_json`).
JSON_FILE = FILE.with_suffix(".json")

Tag = Literal["V", "M", "S", "U"]


class Variants(Model, frozen=True):
    """The wheel variants of a torch release (``cu126``, ``cu128``...) and the tag of that list."""

    tag: Tag
    list: tuple[str, ...]


class NcclPin(Model, frozen=True):
    """The NCCL wheel a torch build pins: ``package`` (None: bundled) and ``version`` (None: unknown)."""

    package: str | None
    version: str | None
    tag: Tag


class CudnnPin(Model, frozen=True):
    version: str
    tag: Tag


class TorchRelease(Model, frozen=True):
    """One torch release: variants, the Python range of its wheels, their manylinux tag
    (per variant where it differs), the NCCL and cuDNN each variant pins."""

    variants: Variants
    default: str
    python: tuple[str, str]
    manylinux: str
    manylinux_by_variant: dict[str, str] = {}
    nccl: dict[str, NcclPin] = {}
    cudnn: dict[str, CudnnPin] = {}


class OsRelease(Model, frozen=True):
    """An OS release's glibc and system Python 3, and its codenames (``bookworm``)."""

    glibc: str
    python: str
    codenames: tuple[str, ...] = ()


class DriverFloor(Model, frozen=True):
    """Driver floors of a CUDA release: full support (``ga``) and minor-version compatibility."""

    ga: str
    minor_compat: str
    tag: Tag = "V"


class BaseImageRow(Model, frozen=True):
    """Base images (``pattern``, a whole-repository regex) that already ship PyTorch."""

    pattern: str
    tag: Tag
    source: str


class PackageRow(Model, frozen=True):
    """Packages (``pattern``, a whole-name regex) that are a second ``stack`` beside torch's."""

    pattern: str
    stack: Literal["nccl", "cuda", "cudnn", "driver", "torch"]
    tag: Tag
    source: str


class SecondStack(Model, frozen=True):
    apt: tuple[PackageRow, ...]
    pip: tuple[PackageRow, ...]
    base: tuple[BaseImageRow, ...]


class Companion(Model, frozen=True):
    """A torchvision/torchaudio release: the torch its wheel requires (a specifier), the wheel read."""

    torch: str
    tag: Tag
    wheel: str


class TorchIndex(Model, frozen=True):
    url: str
    tag: Tag


class Facts(Model, frozen=True):
    """The facts, by topic: ``torch`` releases, ``os`` releases (by id, then version),
    ``cuda_driver`` floors and ``cuda_image_nccl`` (the system NCCL of an nvidia/cuda image)
    by CUDA version, ``second_stack`` rows, ``companions`` (by package, then release), the
    ``torch_index`` URL template, the ``sources``."""

    sources: dict[str, str]
    torch: dict[str, TorchRelease]
    cuda_driver: dict[str, DriverFloor]
    torch_index: TorchIndex
    companions: dict[str, dict[str, Companion]]
    second_stack: SecondStack
    os: dict[str, dict[str, OsRelease]]
    cuda_image_nccl: dict[str, str]


class FactsJson(Model, frozen=True):
    """``data/compat.json``: the facts and the sha256 (hex) of the ``compat.yaml`` they are of."""

    source_sha256: str
    facts: Facts


def loader() -> type:
    """The YAML loader of the facts: libyaml's (``CSafeLoader``) when PyYAML was built with it."""
    import yaml

    return getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def from_yaml(raw: bytes) -> Facts:
    """The facts of ``compat.yaml`` bytes ``raw``, parsed and checked (no JSON)."""
    import yaml

    data = yaml.load(raw.decode("utf-8"), Loader=loader())  # noqa: S506 - a safe loader
    return msgspec.convert(data, Facts, strict=True)


def json_bytes(raw: bytes) -> bytes:
    """The content of :data:`JSON_FILE` for ``compat.yaml`` bytes ``raw`` (one line and a newline)."""
    doc = FactsJson(source_sha256=hashlib.sha256(raw).hexdigest(), facts=from_yaml(raw))
    return msgspec.json.encode(doc) + b"\n"


def write_json() -> Path:
    """Regenerate :data:`JSON_FILE` from :data:`FILE`; returns its path."""
    JSON_FILE.write_bytes(json_bytes(FILE.read_bytes()))
    return JSON_FILE


@lru_cache(maxsize=1)
def facts() -> Facts:
    """The bundled facts, parsed and checked once: from :data:`JSON_FILE` when it was made from
    this :data:`FILE` (its sha256), else from the YAML (module doc)."""
    raw = FILE.read_bytes()
    try:
        doc = msgspec.json.decode(JSON_FILE.read_bytes(), type=FactsJson)
    except (OSError, msgspec.DecodeError):  # missing, unreadable or another shape: the YAML decides
        doc = None
    if doc is not None and doc.source_sha256 == hashlib.sha256(raw).hexdigest():
        return doc.facts
    return from_yaml(raw)
