"""The documents of the recipe stage; :class:`CertifySettings`' field defaults are the one default table."""

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
#: The profiles run when the command line names none (``--profile``; part of the table).
DEFAULT_PROFILES: tuple[str, ...] = ("ddp",)


# ---------------------------------------------------------------------------- certify settings
class AllreduceSettings(Model, frozen=True):
    """The profiles' collective sweeps: message ``sizes`` in bytes, ``iters`` timed and
    ``warmup`` untimed iterations per size."""

    sizes: Sizes = DEFAULT_SIZES
    iters: Iters = 10
    warmup: Warmup = 2


class DdpSettings(Model, frozen=True):
    """The ddp profile's check and scaling: ``steps`` of ResNet-18 on ``batch_size``
    synthetic images per rank of ``image_size``² pixels."""

    steps: Steps = 3
    batch_size: BatchSize = 4
    image_size: ImageSize = 32


class Thresholds(Model, frozen=True):
    """Pass/fail gates. ``min_busbw_gbps`` (GB/s = 1e9 B/s) applies at ``busbw_size`` bytes
    (the largest size when null)."""

    min_busbw_gbps: BusbwGbps | None = None
    busbw_size: BusbwSize | None = None


class CertifySettings(Model, frozen=True):
    """How ``envbuild certify`` runs: ``shm_size`` in docker syntax (``1g``), ``timeout_s`` seconds.

    The defaults are sized for a 2-core CPU machine: a run near a minute, 256m of /dev/shm
    covers gloo, and 300 s bounds a hung run.
    """

    backend: Backend = "gloo"
    nodes: Nodes = 2
    gpus_per_node: GpusPerNode = 0
    port: Port = 29500
    shm_size: ShmSize = "256m"
    timeout_s: TimeoutS = 300
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
    """Extra Debian packages and pip requirements (PEP 508, no URLs or markers). ``keep_pip``: else the
    build removes pip, and setuptools/wheel unless required (torch's ``cpp_extension`` imports setuptools)."""

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
    """``model`` with every field required except the nullable ones (a lock holds every setting)."""
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
    return msgspec.convert(msgspec.to_builtins(settings), LockCertify, strict=True)


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
