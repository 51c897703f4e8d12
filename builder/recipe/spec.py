"""The checked recipe: the findings of the compatibility rules and the pins they resolved.

:class:`Spec` is what render, build and ``envbuild lock`` consume; :meth:`Spec.lock` gives
the :class:`~builder.recipe.model.Lock` document (``images/<recipe>/envbuild.lock.json``).
"""

from __future__ import annotations

from dataclasses import dataclass

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

ERROR, WARNING, NOTE = "error", "warning", "note"


@dataclass(frozen=True)
class Finding:
    """One rule's result: ``level`` error|warning|note, the ``rule`` id, the ``fields`` it
    concerns, a one-line ``message`` and the ``source`` of the fact (e.g. ``S1 (V)``)."""

    level: str
    rule: str
    fields: tuple[str, ...]
    message: str
    source: str

    def line(self, file: str) -> str:
        """``recipes/x.yaml: torch.variant: <message> [source]``, one escaped line."""
        fields = ", ".join(self.fields)
        return f"{inputs.escape(file, 200)}: {fields}: {inputs.one_line(self.message, 600)} [{self.source}]"


@dataclass(frozen=True)
class Spec:
    """The resolved pins of recipe ``name`` (file ``path``): what render and build consume.

    ``torch_local`` is the exact wheel version (``2.8.0+cu128``); ``torch_index_url`` the
    index it comes from (the recipe's ``index.torch_url``, else the variant's folder of the
    PyTorch index); ``nccl_package``/``nccl`` the ``nvidia-nccl-cu1X`` wheel and its version
    pinned by that torch build (None for CPU or when torch bundles NCCL); ``driver_min`` the
    full-support driver of the variant's CUDA GA release and ``driver_minor_compat_min`` its
    minor-version-compatibility floor (NVIDIA CUDA release notes Table 3;
    minor-version-compatibility docs). ``schema_errors`` are the recipe's schema errors
    (:func:`builder.recipe.load.parse`): a spec with any is never rendered.
    """

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
        """True when the recipe broke the schema or a rule gave an error."""
        return bool(self.schema_errors or self.errors)

    def pip_requirements(self) -> list[str]:
        """The pip requirement lines, torch first: ``torch==2.8.0+cu128``, the NCCL pin, then extras."""
        reqs = [f"torch=={self.torch_local}"]
        if self.nccl_package and self.nccl:
            reqs.append(f"{self.nccl_package}=={self.nccl}")
        reqs.extend(self.recipe.packages.pip)
        return reqs

    def lock(self, resolved: Resolved | None = None) -> Lock:
        """The lock document of this spec; with ``resolved`` (checked, from
        :func:`builder.render.resolved.load_resolved`) it gains the ``resolved`` section: the
        base digest, the pip wheels with their hashes, the apt versions."""
        r = self.recipe
        lock = Lock(
            schema=LOCK_SCHEMA,
            recipe=self.name,
            base_image=r.base.image,
            os=LockOs(id=r.os.id, version_id=r.os.version, glibc=self.glibc),
            python=r.python,
            cuda=self.cuda,
            torch=LockTorch(version=r.torch.version, variant=self.variant, local=self.torch_local),
            nccl=self.nccl,
            nccl_package=self.nccl_package,
            cudnn=self.cudnn,
            driver=LockDriver(min=self.driver_min, minor_compat_min=self.driver_minor_compat_min),
            apt=r.packages.apt,
            pip=tuple(self.pip_requirements()),
            index=LockIndex(url=r.index.url, torch_url=self.torch_index_url),
            env=r.env,
            certify=lock_certify(r.certify),
        )
        if resolved is None:
            return lock
        return msgspec.structs.replace(lock, resolved=LockResolved(
            base=LockBase(ref=resolved.base.ref, digest=resolved.base.digest),
            pip=tuple(PinnedWheel(name=p.name, version=p.version, hashes=p.hashes) for p in resolved.pip),
            apt=dict(sorted(resolved.apt.items())),
        ))
