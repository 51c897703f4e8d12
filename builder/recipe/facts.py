"""The bundled compatibility facts (``data/compat.yaml``, from ``shared/reference/compat.md``). Tags: V verified from
the artifact, M a maintainer's statement, S a secondary copy, U unverified. The file is envbuild's own: the fast
libyaml loader reads it, :class:`Facts` checks its shape."""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path
from typing import Literal

import msgspec

from builder.core.model import Model

#: The facts file, inside the package (``package-data`` in pyproject.toml).
FILE = Path(__file__).resolve().parent / "data" / "compat.yaml"

Tag = Literal["V", "M", "S", "U"]


class Variants(Model, frozen=True):

    tag: Tag
    list: tuple[str, ...]


class NcclPin(Model, frozen=True):
    """The NCCL wheel a torch build pins: ``package`` (None: bundled), ``version`` (None: unknown)."""

    package: str | None
    version: str | None
    tag: Tag


class CudnnPin(Model, frozen=True):
    version: str
    tag: Tag


class TorchRelease(Model, frozen=True):

    variants: Variants
    default: str
    python: tuple[str, str]
    manylinux: str
    python_tag: Tag = "V"
    manylinux_by_variant: dict[str, str] = {}
    nccl: dict[str, NcclPin] = {}
    cudnn: dict[str, CudnnPin] = {}


class OsRelease(Model, frozen=True):

    glibc: str
    python: str
    codenames: tuple[str, ...] = ()


class DriverFloor(Model, frozen=True):
    """Driver floors of a CUDA release: full support (``ga``) and minor-version compatibility."""

    ga: str
    minor_compat: str
    tag: Tag = "V"


class BaseImageRow(Model, frozen=True):
    """Base images (a whole-repository regex) that already ship PyTorch."""

    pattern: str
    tag: Tag
    source: str


class PackageRow(Model, frozen=True):
    """Packages (a whole-name regex) that are a second ``stack`` beside torch's."""

    pattern: str
    stack: Literal["nccl", "cuda", "cudnn", "driver", "torch"]
    tag: Tag
    source: str


class SecondStack(Model, frozen=True):
    apt: tuple[PackageRow, ...]
    pip: tuple[PackageRow, ...]
    base: tuple[BaseImageRow, ...]


class Companion(Model, frozen=True):
    """A torchvision/torchaudio release: the torch its wheel requires, and the wheel read."""

    torch: str
    tag: Tag
    wheel: str


class TorchIndex(Model, frozen=True):
    url: str
    tag: Tag


class Facts(Model, frozen=True):
    """``cuda_image_nccl``: the system NCCL of an nvidia/cuda image, by CUDA version."""

    sources: dict[str, str]
    torch: dict[str, TorchRelease]
    cuda_driver: dict[str, DriverFloor]
    torch_index: TorchIndex
    companions: dict[str, dict[str, Companion]]
    second_stack: SecondStack
    os: dict[str, dict[str, OsRelease]]
    cuda_image_nccl: dict[str, str]


def loader() -> type:
    """libyaml's ``CSafeLoader`` when PyYAML has it (~8x faster), else ``SafeLoader``."""
    import yaml

    return getattr(yaml, "CSafeLoader", yaml.SafeLoader)


@lru_cache(maxsize=1)
def facts() -> Facts:
    """The bundled facts, parsed once (libyaml: ~4 ms of CPU)."""
    import yaml

    data = yaml.load(FILE.read_text(encoding="utf-8"), Loader=loader())  # noqa: S506 - a safe loader
    return msgspec.convert(data, Facts, strict=True)
