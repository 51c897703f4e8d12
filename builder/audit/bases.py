"""What a base image's name says: CUDA, OS, Python and a preinstalled PyTorch. Read from the tag only (nothing is
pulled): ``nvidia/cuda`` [NV-IMG], NGC pytorch (release table in ``data/bases.yaml`` [NGC-RN]), ``pytorch/pytorch``
[PT-IMG], ``debian``/``ubuntu`` and ``python`` [PY-IMG]. What a name does not say (a moving tag, a local image file,
an unknown repository) is None with ``why`` naming it."""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources

import yaml

from builder.oci import reference
from builder.recipe import facts as recipe_facts
from builder.recipe.rules.context import cuda_variant

_CUDA_TAG = re.compile(r"(?P<cuda>[0-9]+\.[0-9]+(?:\.[0-9]+)?)-(?P<flavour>[a-z0-9-]+?)-"
                       r"(?P<os>ubuntu|rockylinux|ubi|centos)(?P<osver>[0-9.]+)")
_NGC_TAG = re.compile(r"(?P<release>[0-9]{2}\.[0-9]{2})-py3(?:-[a-z0-9]+)?")
_PT_TAG = re.compile(r"(?P<torch>[0-9]+\.[0-9]+(?:\.[0-9]+)?)-cuda(?P<cuda>[0-9]+\.[0-9]+)-cudnn(?P<cudnn>[0-9.]+)-"
                     r"(?P<flavour>runtime|devel)")
_PY_TAG = re.compile(r"(?P<py>3\.[0-9]{1,2})(?:\.[0-9]{1,3})?(?:-(?P<rest>[a-z0-9.-]+))?")
_PY_WORD = re.compile(r"(?:\A|[-_])py(?:thon)?3\.?([0-9]{1,2})(?=\Z|[-_])")
_OS_WORD = re.compile(r"(?P<word>[a-z]+|[0-9]+(?:\.[0-9]+)?)(?:[.-].*)?")
MOVING = frozenset({"latest", "stable", "testing", "unstable", "sid", "rolling", "devel", "oldstable"})


@lru_cache(maxsize=1)
def facts() -> dict:
    """``builder/audit/data/bases.yaml``, parsed once."""
    return yaml.safe_load(resources.files("builder.audit").joinpath("data/bases.yaml").read_text(encoding="utf-8"))


@dataclass
class BaseInfo:
    """What the name of a base says; ``why``: what it does not say, ``source``: the facts used."""

    image: str | None
    kind: str
    repo: str | None = None
    tag: str | None = None
    cuda: str | None = None
    flavour: str | None = None
    os_id: str | None = None
    os_version: str | None = None
    python: str | None = None
    torch: str | None = None
    variant: str | None = None
    why: str | None = None
    source: str = ""


def os_release(os_id: str, word: str) -> str | None:
    """The release number of ``word`` for ``os_id`` (``bookworm`` -> ``12``, ``12.5`` -> ``12``), or None."""
    releases = recipe_facts.facts().os.get(os_id, {})
    for version, rel in releases.items():
        if word == version or word in rel.codenames or (os_id == "debian" and word.split(".")[0] == version):
            return version
    return None


def read(ref: str | None, bootstrap: str = "docker", header: dict[str, str] | None = None) -> BaseInfo:
    """What the base ``ref`` says (a path for ``localimage``), for a Dockerfile or a definition."""
    header = header or {}
    if bootstrap in ("debootstrap",):
        return _debootstrap(header)
    if bootstrap in ("localimage", "docker-archive", "oci-archive", "oci"):
        return BaseInfo(ref, "local",
                        why=f"{bootstrap} {ref!r} is an image file: its CUDA, OS and Python are not in the definition")
    if bootstrap == "scratch" or ref == "scratch":
        return BaseInfo(ref, "other", why="an empty (scratch) base has no OS")
    if ref is None:
        return BaseInfo(None, "other", why="the base image cannot be expanded")
    if bootstrap == "library":
        ref = re.sub(r"\A(?:library://)?(?:library/default/|library/)?", "", ref)
    parsed = reference.try_parse(ref)
    if parsed is None:
        return BaseInfo(ref, "other", why=f"{ref!r} is not an image reference (name[:tag][@sha256:digest])")
    repo, tag = parsed.familiar, parsed.tag  # the repository without docker.io/library/
    reader = _READERS.get(repo)
    py = f"3.{m[1]}" if (m := _PY_WORD.search(tag or "")) else None
    if reader is None:  # a tag word py3.10/py310/python3.10 names the Python even of an image envbuild has no facts on
        said = "CUDA or OS" if py else "CUDA, OS or Python"
        return BaseInfo(ref, "other", repo, tag, python=py, why=f"envbuild cannot read {said} from the name {repo}"
                        + (f" (its tag names Python {py})" if py else ""))
    return reader(ref, repo, tag)


def _nvidia_cuda(ref: str, repo: str, tag: str | None) -> BaseInfo:
    m = _CUDA_TAG.fullmatch(tag or "")
    if not m:
        return BaseInfo(ref, "nvidia-cuda", repo, tag, why=f"the tag {tag!r} is not <X.Y.Z>-<flavour>-<os><ver>",
                        source="NV-IMG")
    os_id = m.group("os")
    info = BaseInfo(ref, "nvidia-cuda", repo, tag, cuda=m.group("cuda"), flavour=m.group("flavour"), source="NV-IMG")
    if os_id == "ubuntu":
        info.os_id, info.os_version = "ubuntu", m.group("osver")
    else:
        info.why = f"{os_id}{m.group('osver')} is not an OS envbuild's rules know (debian, ubuntu)"
    return info


def _ngc(ref: str, repo: str, tag: str | None) -> BaseInfo:
    m = _NGC_TAG.fullmatch(tag or "")
    row = facts()["ngc_pytorch"].get(m.group("release")) if m else None
    if row is None:
        what = f"NGC release {m.group('release')}" if m else f"the tag {tag!r}"
        return BaseInfo(ref, "ngc-pytorch", repo, tag, torch="(NGC build)",
                        why=f"envbuild has no facts on {what}: its CUDA, OS, Python and PyTorch are not in the tag",
                        source="NGC-RN")
    return BaseInfo(ref, "ngc-pytorch", repo, tag, cuda=str(row["cuda"]), python=str(row["python"]),
                    torch=str(row["torch"]), os_id="ubuntu", os_version=str(row["ubuntu"]),
                    source=f"{row['source']} ({row['tag']})")


def _pytorch(ref: str, repo: str, tag: str | None) -> BaseInfo:
    m = _PT_TAG.fullmatch(tag or "")
    if not m:
        return BaseInfo(ref, "pytorch", repo, tag, torch="(unknown)",
                        why=f"the tag {tag!r} names no torch and CUDA release (it moves)", source="PT-IMG")
    cuda, torch = m.group("cuda"), m.group("torch")
    torch += ".0" if torch.count(".") == 1 else ""  # 1.3-cuda10.1-...: the X.Y tags are the X.Y.0 releases' images
    return BaseInfo(ref, "pytorch", repo, tag, cuda=cuda, flavour=m.group("flavour"), torch=torch,
                    variant=cuda_variant(cuda), why="the OS and Python of pytorch/pytorch images are not in the tag",
                    source="PT-IMG")


def _distro(ref: str, repo: str, tag: str | None) -> BaseInfo:
    m = _OS_WORD.fullmatch(tag or "latest")
    word = m.group("word") if m else (tag or "")
    version = os_release(repo, word)
    if version is None:
        why = (f"{repo}:{tag or 'latest'} moves to each new release" if word in MOVING or tag is None
               else f"{repo} {word!r} is not a release envbuild knows")
        return BaseInfo(ref, repo, repo, tag, os_id=repo, why=why, source="DISTRO")
    return BaseInfo(ref, repo, repo, tag, os_id=repo, os_version=version, source="DISTRO")


def _python(ref: str, repo: str, tag: str | None) -> BaseInfo:
    m = _PY_TAG.fullmatch(tag or "")
    if not m:
        return BaseInfo(ref, "python", repo, tag, why=f"the tag {tag or 'latest'!r} names no Python release (it moves)",
                        source="PY-IMG")
    info = BaseInfo(ref, "python", repo, tag, python=m.group("py"), os_id="debian", source="PY-IMG")
    words = (m.group("rest") or "").split("-")
    if any(w.startswith("alpine") for w in words):
        info.os_id, info.why = None, "alpine (musl) is not an OS envbuild's rules know (debian, ubuntu)"
        return info
    info.os_version = next((os_release("debian", w) for w in words if os_release("debian", w)), None)
    if info.os_version is None:
        info.why = f"python:{tag} names no Debian release: it follows the current one"
    return info


def _debootstrap(header: dict[str, str]) -> BaseInfo:
    word = header.get("osversion", "").strip().lower()
    mirror = header.get("mirrorurl", "").lower()
    os_id = "ubuntu" if "ubuntu" in mirror else "debian" if "debian" in mirror else None
    version = os_release(os_id, word) if os_id else None
    if os_id is None or version is None:
        return BaseInfo(None, "other",
                        why=f"debootstrap of {word or '?'!r} from {mirror or '?'!r}: not a release envbuild knows")
    return BaseInfo(f"{os_id}:{word}", os_id, os_id, word, os_id=os_id, os_version=version, source="DISTRO")


_READERS = {"nvidia/cuda": _nvidia_cuda, "nvcr.io/nvidia/cuda": _nvidia_cuda, "nvcr.io/nvidia/pytorch": _ngc,
            "pytorch/pytorch": _pytorch, "debian": _distro, "ubuntu": _distro, "python": _python}
