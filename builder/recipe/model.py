"""The documents of the recipe stage as typed models (:mod:`builder.core.model`, msgspec).

- :class:`Recipe`: what a recipe file (``recipes/<name>.yaml``) holds; README "Recipe schema".
- :class:`CertifySettings`: how ``envbuild certify`` runs, with THE one default table
  (:data:`DEFAULT_CERTIFY`): a recipe that leaves a setting out gets it from here, and so
  does certification of a lock without one. A CUDA recipe that names no backend or GPU
  count gets ``nccl`` and one GPU per node (:func:`builder.recipe.load.parse`).
- :class:`Lock`: the resolved pins, ``images/<recipe>/envbuild.lock.json`` and the image
  label ``envbuild.lock`` (every key present; nullable ones may be null).
- :class:`Resolved`: what ``envbuild lock`` resolved, ``images/<recipe>/envbuild.resolved.json``.

Value types (patterns, bounds, messages) come from :mod:`builder.recipe.fields`.
:func:`schemas` names each model's published JSON Schema (``schemas/<name>.schema.json``).
"""

from __future__ import annotations

import typing
from typing import Any, Literal

import msgspec
from msgspec import UNSET, UnsetType

from builder.core.model import Model

from .fields import (
    AptList,
    AptPins,
    Backend,
    BatchSize,
    BusbwGbps,
    BusbwSize,
    Description,
    Env,
    GpusPerNode,
    Hashes,
    ImageRef,
    ImageSize,
    Iters,
    KeepPip,
    LockPipList,
    LockSchema,
    Nodes,
    Note,
    OsId,
    PipList,
    PipName,
    PipVersion,
    PlatformTag,
    Port,
    PythonVersion,
    RecipeName,
    Release,
    ResolvedSchema,
    Sha256,
    ShmSize,
    Size,
    Sizes,
    Steps,
    TimeoutS,
    TorchLocal,
    Url,
    Variant,
    Warmup,
    WheelFile,
)

DEFAULT_INDEX_URL = "https://pypi.org/simple"
DEFAULT_SIZES: tuple[Size, ...] = (8, 1024, 65536, 1048576, 4194304)


# ---------------------------------------------------------------------------- certify settings
class AllreduceSettings(Model, frozen=True):
    """All-reduce sweep: message ``sizes`` in bytes, ``iters`` timed and ``warmup`` untimed iterations."""

    sizes: Sizes = DEFAULT_SIZES
    iters: Iters = 20
    warmup: Warmup = 5


class DdpSettings(Model, frozen=True):
    """DDP training check: ``steps`` of ResNet-18 on ``batch_size`` synthetic images of ``image_size``² pixels."""

    steps: Steps = 3
    batch_size: BatchSize = 8
    image_size: ImageSize = 64


class Thresholds(Model, frozen=True):
    """Pass/fail gates. ``min_busbw_gbps`` (GB/s = 1e9 B/s) applies at ``busbw_size`` bytes
    (the largest size when null)."""

    min_busbw_gbps: BusbwGbps | None = None
    busbw_size: BusbwSize | None = None


class CertifySettings(Model, frozen=True):
    """How ``envbuild certify`` runs: simulated ``nodes``, ``gpus_per_node``, backend, rendezvous ``port``,
    ``shm_size`` (docker syntax, e.g. ``1g``), ``timeout_s`` (seconds) for the whole run.

    The field defaults are THE default table of certification (:data:`DEFAULT_CERTIFY`)."""

    backend: Backend = "gloo"
    nodes: Nodes = 2
    gpus_per_node: GpusPerNode = 0
    port: Port = 29500
    shm_size: ShmSize = "1g"
    timeout_s: TimeoutS = 600
    allreduce: AllreduceSettings = AllreduceSettings()
    ddp: DdpSettings = DdpSettings()
    thresholds: Thresholds = Thresholds()


#: The one default table of certification settings (a recipe's and a lock's missing values).
DEFAULT_CERTIFY = CertifySettings()


# ---------------------------------------------------------------------------- recipe
class Base(Model, frozen=True):
    image: ImageRef


class Os(Model, frozen=True):
    id: OsId
    version: Release


class Cuda(Model, frozen=True):
    """The CUDA release the image targets; ``driver``: the cluster's driver, checked against the floors."""

    version: Release
    driver: Release | None = None


class Torch(Model, frozen=True):
    """The torch release; ``variant`` (``cpu``, ``cu128``) derived from ``cuda.version`` when left out."""

    version: Release
    variant: Variant | None = None


class Packages(Model, frozen=True):
    """Extra Debian packages (``name`` or ``name=version``) and pip requirements (PEP 508, no URLs or markers).

    ``keep_pip``: keep pip (and setuptools/wheel) in the image; by default the build removes
    them once the packages are installed (a lean image: README "Rendering"), except
    setuptools or wheel where an installed package requires them (torch 2.13's wheel requires
    setuptools: ``torch.utils.cpp_extension`` and the inductor's C++ builder import it)."""

    apt: AptList = ()
    pip: PipList = ()
    keep_pip: KeepPip = False


class Index(Model, frozen=True):
    """The pip index and the torch wheel index (None: the variant's folder of the PyTorch index)."""

    url: Url = DEFAULT_INDEX_URL
    torch_url: Url | None = None


class Recipe(Model, kw_only=True, frozen=True):
    """A recipe file: base image, OS, Python, CUDA, PyTorch, NCCL and cuDNN of an image, the extra
    apt/pip packages, the package indexes, the image's environment and the certification
    settings. ``cuda`` is None for a CPU image. Versions are strings in release form ("2.8.0")."""

    description: Description = ""
    base: Base
    os: Os
    python: PythonVersion
    cuda: Cuda | None = None
    torch: Torch
    nccl: Release | None = None
    cudnn: Release | None = None
    packages: Packages = Packages()
    index: Index = Index()
    env: Env = {}
    certify: CertifySettings = DEFAULT_CERTIFY


# ---------------------------------------------------------------------------- resolved pins
class ResolvedBase(Model, frozen=True):
    """The base image ``ref`` and its manifest ``digest``; ``source``: where the digest came from."""

    ref: ImageRef
    digest: Sha256 | None = None
    source: Literal["recipe", "engine", "registry", "none"] = "none"


class ResolvedWheel(Model, frozen=True):
    """One wheel pip's resolver chose: ``name==version`` with the sha256 of its file."""

    name: PipName
    version: PipVersion
    hashes: Hashes
    file: WheelFile = ""
    requested: bool = False


class PipResolver(Model, frozen=True):
    """What pip resolved for: the image's Python and platform tag, the indexes, whether site wheels were seen."""

    python: PythonVersion | UnsetType = UNSET
    platform: PlatformTag | UnsetType = UNSET
    indexes: tuple[Url, ...] | UnsetType = UNSET
    site_wheels: bool | UnsetType = UNSET


class AptSource(Model, frozen=True):
    image: Note


class Resolved(Model, frozen=True):
    """``envbuild.resolved.json``: the pins ``envbuild lock`` resolved for the lock of hash
    ``lock_hash``; ``unresolved`` lists what stayed open, one line each."""

    schema: ResolvedSchema
    recipe: RecipeName
    lock_hash: Sha256
    base: ResolvedBase
    pip: tuple[ResolvedWheel, ...] = ()
    pip_resolver: PipResolver = PipResolver()
    apt: AptPins = {}
    apt_source: AptSource | None = None
    unresolved: tuple[Note, ...] = ()


# ---------------------------------------------------------------------------- lock
class LockOs(Model, frozen=True):
    id: OsId
    version_id: Release
    glibc: Release


class LockTorch(Model, frozen=True):
    version: Release
    variant: Variant
    local: TorchLocal


class LockDriver(Model, frozen=True):
    """Driver floors of the variant's CUDA: full support (``min``) and minor-version compatibility."""

    min: Release | None = None
    minor_compat_min: Release | None = None


class LockIndex(Model, frozen=True):
    url: Url
    torch_url: Url | None = None


class PinnedWheel(Model, frozen=True):
    name: PipName
    version: PipVersion
    hashes: Hashes


class LockBase(Model, frozen=True):
    ref: ImageRef | None
    digest: Sha256 | None


class LockResolved(Model, frozen=True):
    """The ``resolved`` section of a lock: the pins of :class:`Resolved` the build uses."""

    base: LockBase
    pip: tuple[PinnedWheel, ...] = ()
    apt: AptPins = {}


def _all_required(model: type[Model], name: str) -> Any:
    """``model`` with every field required except those that may be null (a lock holds every
    setting, as :meth:`builder.recipe.spec.Spec.lock` writes it)."""
    fields = []
    hints = typing.get_type_hints(model, include_extras=True)
    for f in msgspec.structs.fields(model):
        t = hints[f.name]
        if isinstance(f.default, Model):
            t = _all_required(type(f.default), f"Lock{type(f.default).__name__}")
        nullable = f.default is None
        fields.append((f.name, t, None) if nullable else (f.name, t))
    return msgspec.defstruct(name, fields, bases=(Model,), module=__name__, kw_only=True)


#: The certify section of a lock: :class:`CertifySettings` with every setting present.
LockCertify = _all_required(CertifySettings, "LockCertifySettings")


def lock_certify(settings: CertifySettings) -> Any:
    """``settings`` as the certify section of a lock (:data:`LockCertify`)."""
    return msgspec.convert(msgspec.to_builtins(settings), LockCertify, strict=True)


def certify_settings(section: Any) -> CertifySettings:
    """The certify section of a :class:`Lock` as :class:`CertifySettings`."""
    return msgspec.convert(msgspec.to_builtins(section), CertifySettings, strict=True)


class Lock(Model, frozen=True):
    """``envbuild.lock.json`` / the image label ``envbuild.lock``: the resolved pins of a recipe
    and its certification settings; ``resolved`` only once ``envbuild lock`` ran."""

    schema: LockSchema
    recipe: RecipeName
    base_image: ImageRef
    os: LockOs
    python: PythonVersion
    cuda: Release | None
    torch: LockTorch
    nccl: Release | None
    nccl_package: PipName | None
    cudnn: Release | None
    driver: LockDriver
    apt: AptList
    pip: LockPipList
    index: LockIndex
    env: Env
    certify: LockCertify  # type: ignore[valid-type]
    resolved: LockResolved | UnsetType = UNSET


def schemas() -> dict[str, tuple[Any, str, str]]:
    """The published schemas: file stem -> (model, ``$id``, title)."""
    base = "https://envbuild.invalid/schemas"
    return {
        "recipe": (Recipe, f"{base}/recipe.schema.json", "envbuild recipe"),
        "lock": (Lock, f"{base}/lock.schema.json", "envbuild lock (envbuild.lock.json, image label envbuild.lock)"),
        "resolved": (Resolved, f"{base}/resolved.schema.json", "envbuild resolved pins (envbuild.resolved.json)"),
        "certify-settings": (CertifySettings, f"{base}/certify-settings.schema.json",
                             "envbuild certification settings"),
    }
