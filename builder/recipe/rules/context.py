"""What every compatibility rule reads and writes: :class:`Ctx`, and the version helpers."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from packaging.version import Version

from ..facts import Facts, TorchRelease, facts
from ..load import Loaded
from ..model import Recipe
from ..spec import ERROR, WARNING, Finding


def version(text: Any) -> Version:
    return Version(str(text))


def major_minor(text: str) -> str:
    """Major.minor of a version string: ``12.8.1`` -> ``12.8``."""
    return ".".join(str(text).split(".")[:2])


def variant_cuda(variant: str) -> str | None:
    """``cu128`` -> ``12.8``, ``cu118`` -> ``11.8``, ``cu90`` -> ``9.0``, ``cpu`` -> None (PyTorch's variant naming)."""
    if variant == "cpu":
        return None
    digits = variant[2:]
    return f"{digits[:-1]}.{digits[-1]}"


def cuda_variant(cuda: str) -> str:
    """The torch variant of a CUDA version: ``12.8`` and ``12.8.1`` -> ``cu128``."""
    return "cu" + major_minor(cuda).replace(".", "")


def torch_index_for(variant: str) -> str:
    """The PyTorch wheel index of ``variant``: ``https://download.pytorch.org/whl/cu128`` [PT-IDX]."""
    return facts().torch_index.url.format(variant=variant)


def severity(tag: str) -> str:
    """Facts tagged V (verified) or M (maintainer) give errors; S or U give warnings."""
    return ERROR if tag in ("V", "M") else WARNING


CUDA_TAG = re.compile(r"\A(?P<cuda>[0-9]+\.[0-9]+(?:\.[0-9]+)?)-(?P<flavour>[a-z0-9-]+?)-"
                      r"(?P<os>ubuntu|rockylinux|ubi)(?P<osver>[0-9.]+)\Z")


def base_tag(image: str) -> tuple[str, str | None]:
    """Split ``nvidia/cuda:12.8.1-base-ubuntu24.04@sha256:..`` into (repository, tag)."""
    ref = image.split("@", 1)[0]
    last = ref.rsplit("/", 1)[-1]
    repo, _, tag = ref.rpartition(":") if ":" in last else (ref, "", None)
    return repo, tag


@dataclass
class Ctx:
    """What every rule reads (recipe, facts, derived variant and its release row) and what the rules resolve, with
    their findings."""

    loaded: Loaded
    data: Facts
    variant: str | None
    rel: TorchRelease | None
    vcuda: str | None
    findings: list[Finding] = field(default_factory=list)
    nccl_pkg: str | None = None
    nccl: str | None = None
    cudnn: str | None = None
    glibc: str | None = None
    dmin: str | None = None
    dcompat: str | None = None
    torch_index_url: str | None = None

    @property
    def r(self) -> Recipe:
        return self.loaded.recipe

    def valid(self, *fields: str) -> bool:
        return self.loaded.valid(*fields)

    @property
    def cuda(self) -> str | None:
        return self.r.cuda.version if self.r.cuda else None

    @property
    def driver(self) -> str | None:
        return self.r.cuda.driver if self.r.cuda else None

    def add(self, level: str, rule: str, fields: list[str] | tuple[str, ...], msg: str, src: str) -> None:
        self.findings.append(Finding(level, rule, tuple(fields), msg, src))

    @property
    def local(self) -> str:
        """The torch wheel version, ``2.8.0+cu128``; the part known alone when one is invalid or unknown."""
        return "+".join(p for p in (self.r.torch.version, self.variant) if p) or "(release unknown)"

    def variant_list(self) -> list[str]:
        return list(self.rel.variants.list) if self.rel else []

    def variants_for_major(self, major: str) -> list[str]:
        """The variants of this torch release whose CUDA has ``major`` (``12`` -> cu126, cu128...)."""
        return [v for v in self.variant_list() if (variant_cuda(v) or "").split(".")[0] == major]


def derive_variant(loaded: Loaded) -> str | None:
    """The recipe's variant, else one derived from ``cuda.version`` (None: cannot tell)."""
    r = loaded.recipe
    if r.torch.variant:
        return r.torch.variant
    if not loaded.valid("torch.variant", "cuda"):
        return None
    return cuda_variant(r.cuda.version) if r.cuda and r.cuda.version else "cpu"
