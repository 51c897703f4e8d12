"""The checked recipe: the findings of the compatibility rules and the pins they resolved."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

import msgspec

from builder.core import inputs
from builder.core.errors import EnvbuildError

from .fields import LOCK_SCHEMA
from .model import (
    Lock,
    LockBase,
    LockDriver,
    LockIndex,
    LockOs,
    LockResolved,
    LockTorch,
    PinnedWheel,
    Recipe,
    Resolved,
    lock_certify,
)

ERROR: Final = "error"
WARNING: Final = "warning"
NOTE: Final = "note"


@dataclass(frozen=True)
class Finding:
    """One rule's result; ``source`` names the fact (e.g. ``S1 (V)``)."""

    level: str
    rule: str
    fields: tuple[str, ...]
    message: str
    source: str

    def line(self, file: str) -> str:
        fields = ", ".join(self.fields)
        return f"{inputs.escape(file, 200)}: {fields}: {inputs.one_line(self.message, 600)} [{self.source}]"


@dataclass(frozen=True)
class Spec:
    """The resolved pins of a recipe. ``driver_min``/``driver_minor_compat_min``: NVIDIA CUDA release
    notes Table 3 and the minor-version-compatibility docs. One with ``schema_errors`` is never rendered."""

    name: str
    path: str
    recipe: Recipe
    variant: str
    torch_local: str
    cuda: str | None
    nccl_package: str | None
    nccl: str | None
    cudnn: str | None
    glibc: str
    driver_min: str | None
    driver_minor_compat_min: str | None
    findings: tuple[Finding, ...]
    torch_index_url: str | None = None
    schema_errors: tuple[EnvbuildError, ...] = ()

    @property
    def errors(self) -> list[Finding]:
        return [f for f in self.findings if f.level == ERROR]

    @property
    def warnings(self) -> list[Finding]:
        return [f for f in self.findings if f.level == WARNING]

    @property
    def failed(self) -> bool:
        return bool(self.schema_errors or self.errors)

    def pip_requirements(self) -> list[str]:
        """The pip requirement lines: torch, the NCCL pin, then the extras."""
        reqs = [f"torch=={self.torch_local}"]
        if self.nccl_package and self.nccl:
            reqs.append(f"{self.nccl_package}=={self.nccl}")
        reqs.extend(self.recipe.packages.pip)
        return reqs

    def lock(self, resolved: Resolved | None = None) -> Lock:
        """The lock document; with ``resolved`` it gains the base digest, wheel hashes, apt versions."""
        r = self.recipe
        lock = Lock(schema=LOCK_SCHEMA, recipe=self.name, base_image=r.base.image,
                    os=LockOs(id=r.os.id, version_id=r.os.version, glibc=self.glibc), python=r.python, cuda=self.cuda,
                    torch=LockTorch(version=r.torch.version, variant=self.variant, local=self.torch_local),
                    nccl=self.nccl, nccl_package=self.nccl_package, cudnn=self.cudnn,
                    driver=LockDriver(min=self.driver_min, minor_compat_min=self.driver_minor_compat_min),
                    apt=r.packages.apt, pip=tuple(self.pip_requirements()),
                    index=LockIndex(url=r.index.url, torch_url=self.torch_index_url), env=r.env,
                    certify=lock_certify(r.certify))
        if resolved is None:
            return lock
        return msgspec.structs.replace(lock, resolved=LockResolved(
            base=LockBase(ref=resolved.base.ref, digest=resolved.base.digest),
            pip=tuple(PinnedWheel(name=p.name, version=p.version, hashes=p.hashes) for p in resolved.pip),
            apt=dict(sorted(resolved.apt.items())),
        ))
