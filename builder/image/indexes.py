"""Which package indexes a build asks: only those the wheel folder does not make unneeded.
pip asks every index for every package and retries an unreachable one (~7.7 s a package on the
reference machine) although ``--wheels`` may hold the pinned wheel. Sources: PEP 427,
https://packaging.python.org/en/latest/specifications/platform-compatibility-tags/."""

from __future__ import annotations

import hashlib
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import unquote

from builder.core.inputs import escape
from builder.recipe.model import Lock, LockResolved

#: The build arguments of the rendered Dockerfile that choose the indexes.
EXTRA_INDEX_ARG = "PIP_EXTRA_INDEX_URL"
NO_INDEX_ARG = "PIP_NO_INDEX"
#: Docker's image architectures -> the wheel platform tags' machine names.
WHEEL_ARCH = {"amd64": "x86_64", "arm64": "aarch64", "386": "i686", "ppc64le": "ppc64le", "s390x": "s390x"}
#: Most wheel files looked at in a wheel folder.
MAX_WHEELS = 100_000
#: The legacy manylinux aliases (PEP 600): ``manylinux2014`` is ``manylinux_2_17``, ...
_LEGACY_MANYLINUX = {17: "manylinux2014", 12: "manylinux2010", 5: "manylinux1"}


@dataclass(frozen=True)
class WheelPin:
    """A pinned wheel: canonical ``name``, exact ``version`` (``2.13.0+cpu``), allowed ``sha256:<hex>`` (empty: any)."""

    name: str
    version: str
    hashes: tuple[str, ...] = ()


@dataclass(frozen=True)
class IndexPlan:
    """What :func:`plan` decided; ``note``: the index not asked (and the wheel why) or the one asked, why."""

    build_args: dict[str, str] = field(default_factory=dict)
    note: str | None = None
    asks_torch_index: str | None = None


def declared_args(dockerfile: bytes) -> frozenset[str]:
    """The names of the ``ARG`` instructions of a Dockerfile (``ARG NAME`` or ``ARG NAME=...``)."""
    text = dockerfile.decode("utf-8", "replace")
    return frozenset(re.findall(r"(?im)^[ \t]*ARG[ \t]+([A-Za-z_][A-Za-z0-9_]*)(?:=|[ \t]|$)", text))


def image_tags(python: str, glibc: str | None, arch: str) -> frozenset[Any]:
    """Tags CPython ``python`` (``3.11``) installs on Linux, ``glibc`` (None: no manylinux), ``arch``."""
    from packaging import tags

    major, minor = (int(p) for p in python.split(".")[:2])
    platforms = []
    if glibc is not None:
        g_major, g_minor = (int(p) for p in glibc.split(".")[:2])
        for m in range(g_minor if g_major == 2 else 0, 4, -1):
            platforms.append(f"manylinux_2_{m}_{arch}")
            if m == 17 or (m in _LEGACY_MANYLINUX and arch in ("x86_64", "i686")):
                platforms.append(f"{_LEGACY_MANYLINUX[m]}_{arch}")
    platforms.append(f"linux_{arch}")
    interpreter = f"cp{major}{minor}"
    found = set(tags.cpython_tags((major, minor), abis=[interpreter, "abi3", "none"], platforms=platforms))
    found.update(tags.compatible_tags((major, minor), interpreter, platforms))
    return frozenset(found)


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return "sha256:" + digest.hexdigest()


def folder_wheels(folder: Path) -> list[tuple[Path, str, Any, frozenset[Any]]]:
    """``(path, name, Version, tags)`` of ``folder``'s ``*.whl`` (``%2B`` as ``+``), at most :data:`MAX_WHEELS`."""
    from packaging.utils import InvalidWheelFilename, parse_wheel_filename

    out: list[tuple[Path, Any, Any, frozenset[Any]]] = []
    for n, path in enumerate(sorted(folder.glob("*.whl"))):
        if n >= MAX_WHEELS:
            break
        if not path.is_file():
            continue
        try:
            name, version, _build, wheel_tags = parse_wheel_filename(unquote(path.name))
        except (InvalidWheelFilename, ValueError):
            continue
        out.append((path, name, version, wheel_tags))
    return out


def find_wheel(wheels: Sequence[tuple[Path, str, Any, frozenset[Any]]], pin: WheelPin,
               accepted: frozenset[Any]) -> Path | None:
    """The first of ``wheels`` that is ``pin`` at its version, a tag in ``accepted``, one of its hashes."""
    from packaging.utils import canonicalize_name
    from packaging.version import InvalidVersion, Version

    try:
        want = Version(pin.version)
    except InvalidVersion:
        return None
    name = canonicalize_name(pin.name)
    for path, wheel_name, version, wheel_tags in wheels:
        if wheel_name != name or version != want or not (wheel_tags & accepted):
            continue
        if pin.hashes and _sha256(path) not in pin.hashes:
            continue
        return path
    return None


def _pins(lock: Lock) -> tuple[WheelPin, list[WheelPin]]:
    """(the torch pin, resolved wheel pins or []) of a lock; a resolved torch pin has hashes (``--require-hashes``)."""
    resolved = lock.resolved if isinstance(lock.resolved, LockResolved) else None
    pinned = [WheelPin(w.name, w.version, tuple(w.hashes)) for w in (resolved.pip if resolved else ())]
    torch = next((p for p in pinned if p.name == "torch" and p.version == lock.torch.local),
                 WheelPin("torch", lock.torch.local))
    return torch, pinned


def plan(lock: Lock, dockerfile: bytes, wheel_dir: Path | None, arch: str) -> IndexPlan:
    """The indexes the build asks: none if the folder holds every hash-pinned wheel, not torch's if it holds torch's."""
    declared = declared_args(dockerfile)
    torch_url = lock.index.torch_url
    if EXTRA_INDEX_ARG not in declared or not torch_url:
        return IndexPlan()
    torch, pinned = _pins(lock)
    if wheel_dir is None:
        return IndexPlan(note=f"pip asks the torch index {torch_url} for torch=={torch.version} "
                              "(no wheel folder: --wheels or pip's find-links)", asks_torch_index=torch_url)
    machine = WHEEL_ARCH.get(arch, arch)
    accepted = image_tags(lock.python, lock.os.glibc, machine)
    wheels = folder_wheels(wheel_dir)
    folder = escape(str(wheel_dir), 300)
    if pinned and NO_INDEX_ARG in declared and all(find_wheel(wheels, p, accepted) for p in pinned):
        return IndexPlan(build_args={EXTRA_INDEX_ARG: "", NO_INDEX_ARG: "1"},
                         note=f"the wheel folder {folder} holds all {len(pinned)} hash-pinned wheels: "
                              "pip asks no index (PIP_NO_INDEX=1)")
    found = find_wheel(wheels, torch, accepted)
    if found is None:
        return IndexPlan(note=f"pip asks the torch index {torch_url}: the wheel folder {folder} holds no "
                              f"torch=={torch.version} wheel for cp{lock.python.replace('.', '')} "
                              f"{machine}", asks_torch_index=torch_url)
    return IndexPlan(build_args={EXTRA_INDEX_ARG: ""},
                     note=f"torch=={torch.version} from the wheel folder ({escape(found.name, 200)}): "
                          f"pip does not ask the torch index {torch_url}")
