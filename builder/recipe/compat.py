"""Stage 2: compatibility rules over a :class:`~builder.recipe.schema.Recipe`, giving a resolved :class:`Spec`.

The facts live in ``builder/recipe/data/compat.yaml`` (copied from ``shared/reference/compat.md``
with their sources and confidence tags). Each rule below names its fact source. Facts
tagged V (verified from the artifact) or M (maintainer's statement) give **errors**; facts
tagged S (secondary copy) or U (unverified) give **warnings** naming their source.

``check`` is offline and deterministic: it reads only the bundled facts. Every violation
is listed, each naming the recipe fields, the values and what would be valid; the rules
also run on a partial recipe (:func:`builder.recipe.schema.parse`), skipping only what concerns a
field that failed the schema, so that one run lists schema errors and rule violations.

:func:`validate_lock` checks a lock document (``images/<recipe>/envbuild.lock.json``, the
image label ``envbuild.lock``) with the recipe's own schema and bounds.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass, field
from functools import lru_cache
from importlib import resources
from typing import Any, Callable

import yaml
from packaging.requirements import Requirement
from packaging.specifiers import InvalidSpecifier, SpecifierSet
from packaging.utils import canonicalize_name
from packaging.version import Version

from builder.core import inputs
from builder.core.errors import EnvbuildError, ManyErrors
from .schema import Recipe

ERROR, WARNING, NOTE = "error", "warning", "note"
LOCK_SCHEMA = "envbuild.lock/1"


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
        return f"{inputs.escape(file, 200)}: {', '.join(self.fields)}: {inputs.one_line(self.message, 600)} [{self.source}]"


@dataclass(frozen=True)
class Spec:
    """The resolved pins of a recipe: what render and build consume.

    ``torch_local`` is the exact wheel version (``2.8.0+cu128``); ``torch_index_url`` the
    index it comes from (the recipe's ``index.torch_url``, else the variant's folder of the
    PyTorch index); ``nccl_package``/``nccl`` the ``nvidia-nccl-cu1X`` wheel and its version
    pinned by that torch build (None for CPU or when torch bundles NCCL); ``driver_min`` the
    full-support driver of the variant's CUDA GA release and ``driver_minor_compat_min`` its
    minor-version-compatibility floor (NVIDIA CUDA release notes Table 3;
    minor-version-compatibility docs). ``schema_errors`` are the recipe's schema errors
    (:func:`builder.recipe.schema.parse`): a spec with any is never rendered.
    """

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
        reqs.extend(self.recipe.pip)
        return reqs

    def lock(self) -> dict[str, Any]:
        """The resolved pins as plain JSON-able data (``images/<recipe>/envbuild.lock.json``)."""
        r = self.recipe
        c = r.certify
        return {
            "schema": LOCK_SCHEMA,
            "recipe": r.name,
            "base_image": r.base_image,
            "os": {"id": r.os_id, "version_id": r.os_version, "glibc": self.glibc},
            "python": r.python,
            "cuda": self.cuda,
            "torch": {"version": r.torch_version, "variant": self.variant, "local": self.torch_local},
            "nccl": self.nccl,
            "nccl_package": self.nccl_package,
            "cudnn": self.cudnn,
            "driver": {"min": self.driver_min, "minor_compat_min": self.driver_minor_compat_min},
            "apt": list(r.apt),
            "pip": self.pip_requirements(),
            "index": {"url": r.index_url, "torch_url": self.torch_index_url},
            "env": dict(r.env),
            "certify": {
                "backend": c.backend,
                "nodes": c.nodes,
                "gpus_per_node": c.gpus_per_node,
                "port": c.port,
                "shm_size": c.shm_size,
                "timeout_s": c.timeout_s,
                "allreduce": {"sizes": list(c.allreduce.sizes), "iters": c.allreduce.iters, "warmup": c.allreduce.warmup},
                "ddp": {"steps": c.ddp.steps, "batch_size": c.ddp.batch_size, "image_size": c.ddp.image_size},
                "thresholds": {"min_busbw_gbps": c.thresholds.min_busbw_gbps, "busbw_size": c.thresholds.busbw_size},
            },
        }


def lock_bytes(lock: dict[str, Any]) -> bytes:
    """Canonical serialisation of a lock (sorted keys, 2-space indent, trailing newline)."""
    return (json.dumps(lock, indent=2, sort_keys=True) + "\n").encode()


def lock_hash(lock: dict[str, Any]) -> str:
    """``sha256:<hex>`` of :func:`lock_bytes`."""
    return "sha256:" + hashlib.sha256(lock_bytes(lock)).hexdigest()


@lru_cache(maxsize=1)
def facts() -> dict[str, Any]:
    """The bundled facts (``builder/recipe/data/compat.yaml``), parsed once."""
    text = resources.files("builder.recipe").joinpath("data/compat.yaml").read_text(encoding="utf-8")
    return yaml.safe_load(text)


def _v(text: Any) -> Version:
    return Version(str(text))


def _mm(version: str) -> str:
    """Major.minor of a version string: ``12.8.1`` -> ``12.8``."""
    return ".".join(str(version).split(".")[:2])


def _variant_cuda(variant: str) -> str | None:
    """``cu128`` -> ``12.8``, ``cu118`` -> ``11.8``, ``cu90`` -> ``9.0``, ``cpu`` -> None (PyTorch's variant naming)."""
    if variant == "cpu":
        return None
    digits = variant[2:]
    return f"{digits[:-1]}.{digits[-1]}"


def cuda_variant(cuda: str) -> str:
    """The torch variant of a CUDA version: ``12.8`` and ``12.8.1`` -> ``cu128``."""
    return "cu" + _mm(cuda).replace(".", "")


def torch_index_for(variant: str) -> str:
    """The PyTorch wheel index of ``variant``: ``https://download.pytorch.org/whl/cu128`` [PT-IDX]."""
    return facts()["torch_index"]["url"].format(variant=variant)


def _severity(tag: str) -> str:
    return ERROR if tag in ("V", "M") else WARNING


_CUDA_TAG = re.compile(r"\A(?P<cuda>[0-9]+\.[0-9]+\.[0-9]+)-(?P<flavour>[a-z0-9-]+?)-(?P<os>ubuntu|rockylinux|ubi)(?P<osver>[0-9.]+)\Z")


def _base_tag(image: str) -> tuple[str, str | None]:
    """Split ``nvidia/cuda:12.8.1-base-ubuntu24.04@sha256:..`` into (repository, tag)
    (:mod:`builder.oci.reference`; the whole text and no tag when it is not a reference)."""
    from builder.oci import reference

    ref = reference.try_parse(image)
    return (ref.name, ref.tag) if ref else (image, None)


# --------------------------------------------------------------------------- rules
@dataclass
class _Ctx:
    """What every rule reads: the recipe, the facts, the derived variant and its release row."""

    r: Recipe
    data: dict[str, Any]
    variant: str | None
    rel: dict[str, Any] | None
    vcuda: str | None
    findings: list[Finding] = field(default_factory=list)
    nccl_pkg: str | None = None
    nccl: str | None = None
    cudnn: str | None = None
    glibc: str | None = None
    dmin: str | None = None
    dcompat: str | None = None
    torch_index_url: str | None = None

    def add(self, level: str, rule: str, fields: list[str] | tuple[str, ...], msg: str, src: str) -> None:
        self.findings.append(Finding(level, rule, tuple(fields), msg, src))

    @property
    def local(self) -> str:
        """The torch wheel version, ``2.8.0+cu128`` (``?`` for a part the recipe has invalid)."""
        return f"{self.r.torch_version or '?'}+{self.variant or '?'}"

    def variants_for_major(self, major: str) -> list[str]:
        """The variants of this torch release whose CUDA has ``major`` (``12`` -> cu126, cu128...)."""
        if not self.rel:
            return []
        return [v for v in self.rel["variants"]["list"] if (_variant_cuda(v) or "").split(".")[0] == major]


def _derive_variant(r: Recipe) -> str | None:
    """The recipe's variant, else one derived from ``cuda.version`` (None: cannot tell)."""
    if r.torch_variant:
        return r.torch_variant
    if not r.valid("torch.variant", "cuda"):
        return None
    return cuda_variant(r.cuda) if r.cuda else "cpu"


def _rule_release_variant(c: _Ctx) -> None:
    """The torch release and variant exist [S2]."""
    r = c.r
    releases = c.data["torch"]
    if r.torch_version and c.rel is None:
        known = ", ".join(sorted(releases, key=Version))
        c.add(ERROR, "torch-release", ["torch.version"], f"torch {r.torch_version} is not in envbuild's compatibility data; known releases: {known}", "S2 (V)")
    if c.rel and c.variant:
        vlist = c.rel["variants"]["list"]
        if c.variant != "cpu" and c.variant not in vlist:
            c.add(_severity(c.rel["variants"]["tag"]), "torch-variant", ["torch.version", "torch.variant" if r.torch_variant else "cuda.version"],
                  f"torch {r.torch_version} has no {c.variant} build; builds exist for {', '.join(vlist)}", f"S2 ({c.rel['variants']['tag']})")
    if c.variant == "cpu" and r.cuda and r.valid("cuda"):
        major = r.cuda.split(".")[0]
        alt = c.variants_for_major(major)
        hint = f"use {' or '.join(alt)}" if alt else f"torch {r.torch_version} has no CUDA {major} build"
        c.add(ERROR, "cpu-with-cuda", ["torch.variant", "cuda.version"], f"torch variant cpu does not use CUDA {r.cuda}; set cuda to null or {hint}", "S2 (V)")


def _rule_cuda(c: _Ctx) -> None:
    """CUDA of the variant vs the recipe's CUDA [compat.md §5.5]."""
    r = c.r
    if not (c.variant and r.valid("cuda")):
        return
    if c.vcuda and r.cuda:
        if c.vcuda.split(".")[0] != r.cuda.split(".")[0]:
            major = r.cuda.split(".")[0]
            alt = c.variants_for_major(major)
            hint = f"use {' or '.join(alt)} or cuda {c.vcuda}" if alt else f"torch {r.torch_version} has no CUDA {major} build; use cuda {c.vcuda}"
            c.add(ERROR, "cuda-major", ["torch.variant", "cuda.version"], f"torch variant {c.variant} is CUDA {c.vcuda} but the recipe's CUDA is {r.cuda}; the major versions must match ({hint})", "compat.md §5.5 (V)")
        elif c.vcuda != _mm(r.cuda):
            c.add(WARNING, "cuda-minor", ["torch.variant", "cuda.version"], f"torch variant {c.variant} brings its own CUDA {c.vcuda} runtime; the recipe's CUDA is {r.cuda} (minor versions differ)", "compat.md §5.5 (U)")
    if c.variant != "cpu" and not r.cuda:
        c.add(ERROR, "cuda-missing", ["torch.variant", "cuda"], f"torch variant {c.variant} needs a cuda section (cuda.version: {c.vcuda})", "S2 (V)")


def _rule_python_os(c: _Ctx) -> None:
    """Python: Requires-Python and wheels [S1]; OS: system Python and glibc [DISTRO];
    manylinux_2_28 needs glibc >= 2.28 [S1, PT141565]."""
    r = c.r
    if c.rel and r.python:
        lo, hi = (str(x) for x in c.rel["python"])
        if not (_v(lo) <= _v(r.python) <= _v(hi)):
            c.add(ERROR, "python-wheel", ["python", "torch.version"], f"torch {r.torch_version} has wheels for Python {lo} to {hi}, not {r.python}", "S1 (V)")
    if not (r.os_id and r.os_version):
        return
    osrel = c.data["os"].get(r.os_id, {}).get(r.os_version)
    if osrel is None:
        known = ", ".join(f"{i} {v}" for i, vs in c.data["os"].items() for v in vs)
        c.add(ERROR, "os-release", ["os.id", "os.version"], f"{r.os_id} {r.os_version} is not a known OS release; known: {known}", "DISTRO (V)")
        return
    c.glibc = str(osrel["glibc"])
    if r.python and str(osrel["python"]) != r.python:
        c.add(ERROR, "os-python", ["python", "os.version"], f"Python {r.python} is not the system Python of {r.os_id} {r.os_version} ({osrel['python']}); use python: \"{osrel['python']}\" or another OS release", "DISTRO (V)")
    if c.rel and c.variant:
        tag = (c.rel.get("manylinux_by_variant") or {}).get(c.variant, c.rel["manylinux"])
        if tag == "manylinux_2_28" and _v(c.glibc) < _v("2.28"):
            c.add(ERROR, "glibc", ["os.version", "torch.version"], f"torch {c.local} wheels are manylinux_2_28 and need glibc >= 2.28; {r.os_id} {r.os_version} has glibc {c.glibc}", "S1, pytorch#141565 (V)")


def _rule_nccl_cudnn(c: _Ctx) -> None:
    """NCCL pinned and cuDNN brought by the torch build [S1]."""
    r = c.r
    known_variant = bool(c.rel and c.variant and c.variant in c.rel["variants"]["list"])
    if c.variant == "cpu":
        if r.nccl:
            c.add(ERROR, "nccl-cpu", ["nccl", "torch.variant"], f"a CPU build of torch has no NCCL; remove nccl ({r.nccl}) or use a CUDA variant", "S1 (V)")
        if r.cudnn:
            c.add(ERROR, "cudnn-cpu", ["cudnn"], f"a CPU build of torch has no cuDNN; remove cudnn ({r.cudnn})", "S1 (V)")
        return
    c.nccl, c.cudnn = r.nccl, r.cudnn
    if not known_variant:
        return
    pin = (c.rel.get("nccl") or {}).get(c.variant)
    if pin is None:
        if r.nccl:
            c.add(WARNING, "nccl-unknown", ["nccl", "torch.variant"], f"envbuild has no fact on the NCCL that torch {c.local} pins; keeping the recipe's {r.nccl} unchecked", "compat.md §1 (U)")
    else:
        c.nccl_pkg = pin["package"]
        pinned = str(pin["version"]) if pin["version"] else None
        c.nccl = pinned if pinned else r.nccl
        if r.nccl and pinned and r.nccl != pinned:
            c.add(_severity(pin["tag"]), "nccl-pin", ["nccl", "torch.version", "torch.variant"],
                  f"torch {c.local} pins {c.nccl_pkg}=={pinned}; the recipe's NCCL {r.nccl} would be a second NCCL or a resolver conflict (use nccl: {pinned})",
                  f"S1 ({pin['tag']})")
            if _severity(pin["tag"]) == WARNING:
                c.nccl = r.nccl
        elif pinned is None and r.nccl:
            c.add(WARNING, "nccl-bundled", ["nccl"], f"torch {c.local} bundles its NCCL (version unverified); the recipe's {r.nccl} cannot be checked", "compat.md §1 (U)")
    dpin = (c.rel.get("cudnn") or {}).get(c.variant)
    c.cudnn = str(dpin["version"]) if dpin else r.cudnn
    if dpin and r.cudnn and r.cudnn != str(dpin["version"]):
        c.add(_severity(dpin["tag"]), "cudnn-pin", ["cudnn", "torch.variant"], f"torch {c.local} brings cuDNN {dpin['version']}, not {r.cudnn}", f"S1 ({dpin['tag']})")
        if _severity(dpin["tag"]) == WARNING:
            c.cudnn = r.cudnn


def _rule_driver(c: _Ctx) -> None:
    """Driver floors [NV-RN Table 3, NV-MVC]."""
    r = c.r
    if not c.vcuda:
        return
    drv = c.data["cuda_driver"].get(c.vcuda)
    if drv is None:
        c.add(WARNING, "driver-unknown", ["torch.variant"], f"envbuild has no driver floor for CUDA {c.vcuda}", "NV-RN (U)")
        return
    tag = drv.get("tag", "V")
    c.dmin, c.dcompat = str(drv["ga"]), str(drv["minor_compat"])
    c.add(NOTE, "driver-floor", ["torch.variant"], f"{c.variant} needs driver >= {c.dmin} (CUDA {c.vcuda} GA); >= {c.dcompat} runs under minor-version compatibility (no PTX JIT)", f"NV-RN, NV-MVC ({tag})")
    if r.driver:
        if _v(r.driver) < _v(c.dcompat):
            c.add(_severity(tag), "driver-too-old", ["cuda.driver"], f"driver {r.driver} is below {c.dcompat}, the oldest that runs CUDA {c.vcuda} ({c.variant}) even with minor-version compatibility; full support needs >= {c.dmin}", f"NV-MVC ({tag})")
        elif _v(r.driver) < _v(c.dmin):
            c.add(WARNING, "driver-minor-compat", ["cuda.driver"], f"driver {r.driver} is below {c.dmin} (CUDA {c.vcuda} GA): runs only under minor-version compatibility (no PTX JIT, some APIs fail)", f"NV-MVC ({tag})")


def _rule_base_image(c: _Ctx) -> None:
    """The base image: its CUDA and OS from the tag [NV-IMG, DISTRO]."""
    r = c.r
    if not r.base_image:
        return
    repo, tag = _base_tag(r.base_image)
    os_ok = bool(r.os_id and r.os_version)
    if repo.endswith("nvidia/cuda") and tag:
        m = _CUDA_TAG.fullmatch(tag)
        if not m:
            c.add(WARNING, "base-tag", ["base.image"], f"cannot read CUDA and OS from the tag {tag!r} (expected X.Y.Z-flavour-osVER)", "NV-IMG (U)")
            return
        bcuda, flavour = m.group("cuda"), m.group("flavour")
        if not r.valid("cuda"):
            pass
        elif not r.cuda:
            c.add(WARNING, "base-cuda-unused", ["base.image", "cuda"], f"base image {r.base_image} carries CUDA {bcuda} but the recipe has no cuda section", "NV-IMG (V)")
        elif bcuda.split(".")[0] != r.cuda.split(".")[0]:
            c.add(ERROR, "base-cuda-major", ["base.image", "cuda.version"], f"base image CUDA {bcuda} and the recipe's CUDA {r.cuda} differ in major version; use an nvidia/cuda:{r.cuda}.x tag", "NV-IMG (V)")
        elif _mm(bcuda) != _mm(r.cuda):
            c.add(WARNING, "base-cuda-minor", ["base.image", "cuda.version"], f"base image CUDA {bcuda} and the recipe's CUDA {r.cuda} differ in minor version", "NV-IMG (V)")
        base_os = (m.group("os"), m.group("osver"))
        if os_ok and base_os != (r.os_id, r.os_version):
            c.add(ERROR, "base-os", ["base.image", "os.id", "os.version"], f"base image {tag} is {base_os[0]} {base_os[1]} but the recipe says {r.os_id} {r.os_version}", "NV-IMG (V)")
        sys_nccl = c.data["cuda_image_nccl"].get(bcuda)
        if flavour != "base" and sys_nccl and c.nccl and str(sys_nccl) != c.nccl:
            c.add(WARNING, "base-second-nccl", ["base.image", "nccl"], f"the {flavour} flavour ships a system libnccl2 {sys_nccl} beside torch's NCCL {c.nccl}: two NCCLs in one image; prefer the base flavour", "compat.md §4 (S)")
    elif repo in ("debian", "library/debian", "docker.io/library/debian", "ubuntu", "library/ubuntu", "docker.io/library/ubuntu") and tag and os_ok:
        distro = repo.rsplit("/", 1)[-1]
        word = tag.split("-")[0]
        versions = c.data["os"].get(distro, {})
        tag_version = next((v for v, rel_ in versions.items() if word == v or word in rel_.get("codenames", [])), None)
        if distro != r.os_id or (tag_version and tag_version != r.os_version):
            c.add(ERROR, "base-os", ["base.image", "os.id", "os.version"], f"base image {r.base_image} is {distro} {tag_version or word} but the recipe says {r.os_id} {r.os_version}", "DISTRO (V)")


def _rule_backend(c: _Ctx) -> None:
    """The nccl backend needs a CUDA build [multinode.md]."""
    if c.r.certify.backend == "nccl" and c.variant == "cpu" and c.r.valid("certify.backend"):
        c.add(ERROR, "backend-nccl-cpu", ["certify.backend", "torch.variant"], "backend nccl needs a CUDA build of torch; use gloo for a CPU image", "multinode.md (V)")


def _rule_torch_index(c: _Ctx) -> None:
    """Where torch comes from: the variant's folder of the PyTorch index [PT-IDX]. Derived
    when ``index.torch_url`` is omitted; one that names another variant, or PyPI (which has
    no ``+cpu``/``+cuXYZ`` builds), is refused."""
    r = c.r
    if not (c.variant and r.valid("index.torch_url")):
        return
    src = f"PT-IDX ({c.data['torch_index']['tag']})"
    derived = torch_index_for(c.variant)
    if not r.torch_index_url:
        c.torch_index_url = derived
        c.add(NOTE, "torch-index", ["index.torch_url"], f"torch {c.local} comes from {derived} (derived from the variant)", src)
        return
    c.torch_index_url = r.torch_index_url
    url = r.torch_index_url.rstrip("/")
    last = url.rsplit("/", 1)[-1]
    host = url.split("/")[2].lower() if url.count("/") >= 2 else ""
    if re.fullmatch(r"cpu|cu[0-9]{2,3}", last) and last != c.variant:
        c.add(ERROR, "torch-index-variant", ["index.torch_url", "torch.variant"],
              f"index.torch_url {r.torch_index_url} is the {last} index but the variant is {c.variant}: pip finds no torch=={c.local} there; use {derived} or leave index.torch_url out", src)
    elif host in ("pypi.org", "pypi.python.org", "files.pythonhosted.org"):
        c.add(ERROR, "torch-index-pypi", ["index.torch_url"],
              f"index.torch_url {r.torch_index_url} is PyPI, which has no torch=={c.local} (local +{c.variant} builds live on the PyTorch index); use {derived} or leave index.torch_url out", src)


def _rule_socket_ifname(c: _Ctx) -> None:
    """A socket interface setting that selects only loopback cannot reach another node [NCCL-ENV]."""
    r = c.r
    if r.certify.nodes <= 1 or not r.valid("certify.nodes"):
        return
    for name, value in r.env:
        if name in ("NCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME") and loopback_only(name, value):
            c.add(ERROR, "socket-ifname-loopback", [f"env.{name}", "certify.nodes"],
                  f"{name}={value} selects only the loopback interface; ranks on {r.certify.nodes} nodes cannot reach each other over it (remove it, or name the interface the nodes share, e.g. eth0)",
                  "NCCL-ENV, multinode.md (M)")


_LOOPBACK = re.compile(r"\Alo[0-9]*(?::[0-9A-Za-z_.-]*)?\Z")


def loopback_only(variable: str, value: str) -> bool:
    """True when ``variable`` (``NCCL_SOCKET_IFNAME`` or ``GLOO_SOCKET_IFNAME``) set to
    ``value`` can select nothing but loopback interfaces.

    NCCL reads a comma-separated list of interface-name *prefixes*; a leading ``^`` makes it
    a list to exclude (never loopback-only), a leading ``=`` makes the names exact. Gloo
    reads comma-separated exact names. Loopback names are ``lo``, ``lo0``, ``lo:1``; a prefix
    selects only those when it is one of them (``lo``, ``lo0``). Empty entries are ignored;
    an empty list (the library's default choice) is not loopback-only. Source: NCCL-ENV.
    """
    text = value.strip()
    if variable == "NCCL_SOCKET_IFNAME":
        if text.startswith("^"):
            return False
        text = text[1:] if text.startswith("=") else text
    names = [n.strip() for n in text.split(",") if n.strip()]
    return bool(names) and all(_LOOPBACK.fullmatch(n) for n in names)


_STACK_REASONS = {
    "nccl": "a second NCCL: {torch_text} loads the NCCL of its own wheel{nccl_text}",
    "cuda": "a second CUDA: {torch_text} brings its CUDA runtime as the nvidia-* wheels it pins",
    "cudnn": "a second cuDNN: {torch_text} brings {cudnn_text} as a wheel",
    "driver": "an NVIDIA driver package: the driver comes from the host (the container runtime mounts the host's driver libraries); one in the image shadows or mismatches it",
    "torch": "a second PyTorch beside the torch section's torch {local}",
}


def _stack_reason(c: _Ctx, stack: str) -> str:
    cpu = c.variant == "cpu"
    values = {
        "local": c.local,
        "torch_text": f"torch {c.local}",
        "nccl_text": f" ({c.nccl_pkg} {c.nccl})" if c.nccl_pkg and c.nccl else "",
        "cudnn_text": f"cuDNN {c.cudnn}" if c.cudnn else "its cuDNN",
    }
    text = _STACK_REASONS[stack].format_map(values)
    if cpu and stack in ("nccl", "cuda", "cudnn"):
        text = f"a CUDA library in a CPU image: a CPU build of torch ({c.local}) uses no {dict(nccl='NCCL', cuda='CUDA', cudnn='cuDNN')[stack]}"
    return text


def _rule_second_stack(c: _Ctx) -> None:
    """No second torch, CUDA, cuDNN, NCCL or driver beside the one torch brings
    [compat.md §5.3-5.4, §5.8; S1; NV-CTK; base images that ship torch]."""
    r = c.r
    rules = c.data["second_stack"]
    major = c.vcuda.split(".")[0] if c.vcuda else None
    for i, item in enumerate(r.apt):
        name = item.split("=", 1)[0]
        for row in rules["apt"]:
            if re.fullmatch(row["pattern"], name):
                c.add(_severity(row["tag"]), "second-stack", [f"packages.apt[{i}]"],
                      f"{item} is {_stack_reason(c, row['stack'])}; remove it", f"{row['source']} ({row['tag']})")
                break
    for i, req in enumerate(r.pip):
        name = canonicalize_name(Requirement(req).name)
        m = re.fullmatch(r"(nvidia-[a-z0-9-]+?)-cu([0-9]+)", name)
        if m and major and m.group(2) != major:  # never mix -cu12 and -cu13 [compat.md §5.8]
            c.add(ERROR, "cuda-package-mix", [f"packages.pip[{i}]"], f"{req} is a CUDA {m.group(2)} package in a CUDA {major} image (torch {c.variant}); use the -cu{major} package", "S1 (V)")
            continue
        for row in rules["pip"]:
            if re.fullmatch(row["pattern"], name):
                c.add(_severity(row["tag"]), "second-stack", [f"packages.pip[{i}]"],
                      f"{req} is {_stack_reason(c, row['stack'])}; remove it", f"{row['source']} ({row['tag']})")
                break
    if r.base_image:
        repo, _tag = _base_tag(r.base_image)
        for row in rules["base"]:
            if re.fullmatch(row["pattern"], repo):
                c.add(_severity(row["tag"]), "second-stack", ["base.image"],
                      f"base image {r.base_image} already ships PyTorch: installing torch {c.local} makes a second one; start from its CUDA/OS base (e.g. nvidia/cuda:X.Y.Z-base-ubuntuVER or debian)",
                      f"{row['source']} ({row['tag']})")


def _rule_companions(c: _Ctx) -> None:
    """torchvision/torchaudio requirements must admit a release that pairs with the torch
    release, by those wheels' own Requires-Dist [S1-COMP]."""
    r = c.r
    if not r.torch_version:
        return
    table = c.data["companions"]
    torch_v = Version(r.torch_version)
    for i, req_text in enumerate(r.pip):
        req = Requirement(req_text)
        rows = table.get(canonicalize_name(req.name))
        if rows is None:
            continue
        pairs = {v: row for v, row in rows.items() if _spec_contains(row["torch"], torch_v)}
        field_ = [f"packages.pip[{i}]", "torch.version"]
        if not pairs:
            c.add(WARNING, "companion-unknown", field_, f"envbuild knows no {req.name} release whose wheel pairs with torch {r.torch_version}; {req_text} is unchecked (pip may find none)", "S1-COMP (U)")
            continue
        if any(req.specifier.contains(v, prereleases=True) for v in pairs):
            continue
        worst = "V" if any(row["tag"] in ("V", "M") for row in pairs.values()) else "U"
        best = max(pairs, key=Version)
        row = pairs[best]
        c.add(_severity(worst), "companion-pair", field_,
              f"{req_text} does not pair with torch {r.torch_version}: {req.name} {best} is the release for it (its wheel requires torch{row['torch']}); use {req.name}=={best}",
              f"S1-COMP {row['wheel']} ({row['tag']})")


def _spec_contains(spec: str, version: Version) -> bool:
    try:
        return SpecifierSet(spec).contains(version, prereleases=True)
    except InvalidSpecifier:  # pragma: no cover - compat.yaml is ours
        return False


#: The rules, in the order their findings are listed.
RULES: tuple[Callable[[_Ctx], None], ...] = (
    _rule_release_variant, _rule_cuda, _rule_python_os, _rule_nccl_cudnn, _rule_driver,
    _rule_base_image, _rule_backend, _rule_torch_index, _rule_socket_ifname, _rule_second_stack,
    _rule_companions,
)


def check(recipe: Recipe, schema_errors: list[EnvbuildError] | tuple[EnvbuildError, ...] = ()) -> Spec:
    """Apply every rule to ``recipe`` and resolve its pins.

    ``recipe`` may be partial (:func:`builder.recipe.schema.parse`; its schema errors given as
    ``schema_errors``): rules run on the fields that validated and skip what concerns the
    others. Returns a :class:`Spec` whose ``findings`` hold all errors, warnings and notes
    (the caller decides: :func:`require_ok` raises on errors). Never raises.
    """
    r = recipe
    data = facts()
    variant = _derive_variant(r)
    rel = data["torch"].get(r.torch_version) if r.torch_version else None
    c = _Ctx(r=r, data=data, variant=variant, rel=rel, vcuda=_variant_cuda(variant) if variant else None)
    for rule in RULES:
        rule(c)
    return Spec(
        recipe=r,
        variant=variant or "",
        torch_local=c.local,
        cuda=c.vcuda,
        nccl_package=c.nccl_pkg,
        nccl=c.nccl,
        cudnn=c.cudnn,
        glibc=c.glibc or "",
        driver_min=c.dmin,
        driver_minor_compat_min=c.dcompat,
        findings=tuple(c.findings),
        torch_index_url=c.torch_index_url,
        schema_errors=tuple(schema_errors),
    )


def require_ok(spec: Spec) -> Spec:
    """Raise :class:`ManyErrors` (exit 2) listing every schema error and every error finding
    of ``spec``; else return it."""
    if spec.failed:
        file = spec.recipe.path
        raise ManyErrors([*spec.schema_errors,
                          *(EnvbuildError(f"{e.message} [{e.source}]", file=file, field=", ".join(e.fields)) for e in spec.errors)])
    return spec


# --------------------------------------------------------------------------- lock documents
#: Largest lock document read from an image label or a file, in bytes.
MAX_LOCK_BYTES = 1 << 20

_LOCK_SCHEMA: dict[str, Any] = {
    "schema": "lockschema!",
    "recipe": "recipename!",
    "base_image": "image!",
    "os": {"id": "osid!", "version_id": "release!", "glibc": "release!"},
    "python": "pyver!",
    "cuda": "release",
    "torch": {"version": "release!", "variant": "variant!", "local": "torchlocal!"},
    "nccl": "release",
    "nccl_package": "pipname",
    "cudnn": "release",
    "driver": {"min": "release", "minor_compat_min": "release"},
    "apt": "aptlist",
    "pip": "lockpip",
    "index": {"url": "url!", "torch_url": "url"},
    "env": "env",
    "certify": None,  # the recipe's certify schema, all keys present (below)
    "resolved": "resolved",
}


def validate_lock(doc: Any, source: str) -> dict[str, Any]:
    """Check a lock document with the recipe's schema and bounds; returns ``doc``.

    ``doc`` is parsed JSON: ``images/<recipe>/envbuild.lock.json`` or the image label
    ``envbuild.lock``; ``source`` names it in errors (``label envbuild.lock``). Every key
    :meth:`Spec.lock` writes must be there with its exact type (no bool for an int, no
    string for a number) and within the recipe's bounds (``certify.nodes`` 1..1024, sizes
    at most :data:`builder.recipe.schema.MAX_SIZE`, ports 1..65535, finite thresholds...); no
    string may hold a control character; ``resolved`` is optional.

    Raises:
        ManyErrors: (exit 2) one line per invalid field, e.g.
            ``label envbuild.lock: certify.nodes: 'abc' must be an integer in 1..1024``.
    """
    from . import schema as recipe_mod

    if not isinstance(doc, dict):
        raise EnvbuildError("is not a JSON object", file=source, value=type(doc).__name__)
    loader = recipe_mod._Loader(source, dict(inputs.control_char_paths(doc)), kinds=_LOCK_KINDS)
    schema = dict(_LOCK_SCHEMA, certify=_required(recipe_mod._SCHEMA["certify"]))
    required = tuple(k for k in schema if k != "resolved")  # present; cuda, nccl... may be null
    loader.mapping(doc, schema, "", required)
    if loader.errors:
        raise ManyErrors(loader.errors)
    return doc


def _required(schema: dict[str, Any]) -> dict[str, Any]:
    """``schema`` with every key required except the nullable thresholds."""
    out: dict[str, Any] = {}
    for k, v in schema.items():
        if isinstance(v, dict):
            out[k] = _required(v)
        else:
            out[k] = v if v.endswith("!") or k in ("min_busbw_gbps", "busbw_size") else v + "!"
    return out


def _k_lockschema(ld, value, kind, path):
    if value != LOCK_SCHEMA:
        ld.err(path, value, f"is not {LOCK_SCHEMA!r}")
        return None
    return value


def _k_recipename(ld, value, kind, path):
    from .schema import MAX_RECIPE_NAME, RECIPE_NAME

    if not (isinstance(value, str) and len(value) <= MAX_RECIPE_NAME and RECIPE_NAME.fullmatch(value)):
        ld.err(path, value, "is not a recipe name")
        return None
    return value


_TORCH_LOCAL = re.compile(r"\A[0-9]{1,6}(?:\.[0-9]{1,6}){0,3}\+(?:cpu|cu[0-9]{2,3})\Z")


def _k_torchlocal(ld, value, kind, path):
    if not (isinstance(value, str) and _TORCH_LOCAL.fullmatch(value)):
        ld.err(path, value, "is not a torch wheel version such as 2.8.0+cu128")
        return None
    return value


def _k_pipname(ld, value, kind, path):
    from .schema import PIP_NAME

    if not (isinstance(value, str) and PIP_NAME.fullmatch(value)):
        ld.err(path, value, "is not a package name")
        return None
    return value


def _k_lockpip(ld, value, kind, path):
    from .schema import pip_requirement

    return ld.items(value, path, lambda item: pip_requirement(item, allow_torch=True))


def _k_resolved(ld, value, kind, path):
    """The ``resolved`` section of a lock (``builder.render.rendered.full_lock``)."""
    from .schema import APT_NAME, APT_VERSION, PIP_NAME, PIP_VERSION, SHA256, _fits

    if not isinstance(value, dict) or set(value) - {"base", "pip", "apt"}:
        ld.err(path, value, "must be a mapping of base, pip and apt")
        return None
    base = value.get("base") or {}
    if not isinstance(base, dict) or (base.get("digest") is not None and not _fits(SHA256, base.get("digest"), 80)):
        ld.err(f"{path}.base", base, "must hold a digest sha256:<64 hex> or null")
    pip = value.get("pip") or []
    if not isinstance(pip, list) or len(pip) > 10000:
        ld.err(f"{path}.pip", pip, "must be a list")
        pip = []
    for i, p in enumerate(pip):
        ok = (isinstance(p, dict) and _fits(PIP_NAME, p.get("name"), 128) and _fits(PIP_VERSION, p.get("version"), 64)
              and isinstance(p.get("hashes"), list) and 0 < len(p["hashes"]) <= 16
              and all(_fits(SHA256, h, 80) for h in p["hashes"]))
        if not ok:
            ld.err(f"{path}.pip[{i}]", p, "must be {name, version, hashes: [sha256:<64 hex>]}")
    apt = value.get("apt") or {}
    if not isinstance(apt, dict):
        ld.err(f"{path}.apt", apt, "must be a mapping of package: version")
        apt = {}
    for name, version in apt.items():
        if not (_fits(APT_NAME, name, 128) and _fits(APT_VERSION, version, 128)):
            ld.err(f"{path}.apt.{name}", version, "is not a Debian package name and version")
    return value


#: Kinds of the lock schema beyond the recipe's (builder.recipe.schema._SCALARS).
_LOCK_KINDS = {"lockschema": _k_lockschema, "recipename": _k_recipename, "torchlocal": _k_torchlocal,
               "pipname": _k_pipname, "lockpip": _k_lockpip, "resolved": _k_resolved}


def read_lock_text(text: Any, source: str) -> dict[str, Any]:
    """Parse and check a lock document given as JSON text (an image label): at most
    :data:`MAX_LOCK_BYTES`, bounded JSON (:func:`builder.core.inputs.load_json`), then
    :func:`validate_lock`. Raises :class:`EnvbuildError` (exit 2) naming ``source``."""
    if not isinstance(text, str):
        raise EnvbuildError("is not text", file=source, value=type(text).__name__)
    if len(text) > MAX_LOCK_BYTES:
        raise EnvbuildError(f"is {len(text)} characters, over the {MAX_LOCK_BYTES}-byte limit of a lock", file=source)
    return validate_lock(inputs.load_json(text, source), source)
