"""Stage 2: compatibility rules over a :class:`~builder.recipe.Recipe`, giving a resolved :class:`Spec`.

The facts live in ``builder/data/compat.yaml`` (copied from ``shared/reference/compat.md``
with their sources and confidence tags). Each rule below names its fact source. Facts
tagged V (verified from the artifact) or M (maintainer's statement) give **errors**; facts
tagged S (secondary copy) or U (unverified) give **warnings** naming their source.

``check`` is offline and deterministic: it reads only the bundled facts. Every violation
is listed, each naming the recipe fields, the values and what would be valid.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources
from typing import Any

import yaml
from packaging.version import Version

from .errors import EnvbuildError, ManyErrors
from .recipe import Recipe

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
        """``recipes/x.yaml: torch.variant: <message> [source]``."""
        return f"{file}: {', '.join(self.fields)}: {self.message} [{self.source}]"


@dataclass(frozen=True)
class Spec:
    """The resolved pins of a recipe: what render and build consume.

    ``torch_local`` is the exact wheel version (``2.8.0+cu128``); ``nccl_package``/``nccl``
    the ``nvidia-nccl-cu1X`` wheel and its version pinned by that torch build (None for CPU
    or when torch bundles NCCL); ``driver_min`` the full-support driver of the variant's CUDA
    GA release and ``driver_minor_compat_min`` its minor-version-compatibility floor
    (NVIDIA CUDA release notes Table 3; minor-version-compatibility docs).
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

    @property
    def errors(self) -> list[Finding]:
        return [f for f in self.findings if f.level == ERROR]

    @property
    def warnings(self) -> list[Finding]:
        return [f for f in self.findings if f.level == WARNING]

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
            "index": {"url": r.index_url, "torch_url": r.torch_index_url},
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
    """The bundled facts (``builder/data/compat.yaml``), parsed once."""
    text = resources.files("builder").joinpath("data/compat.yaml").read_text(encoding="utf-8")
    return yaml.safe_load(text)


def _v(text: Any) -> Version:
    return Version(str(text))


def _mm(version: str) -> str:
    """Major.minor of a version string: ``12.8.1`` -> ``12.8``."""
    return ".".join(str(version).split(".")[:2])


def _variant_cuda(variant: str) -> str | None:
    """``cu128`` -> ``12.8``, ``cu118`` -> ``11.8``, ``cpu`` -> None (PyTorch's variant naming)."""
    if variant == "cpu":
        return None
    digits = variant[2:]
    return f"{digits[:-1]}.{digits[-1]}"


def _severity(tag: str) -> str:
    return ERROR if tag in ("V", "M") else WARNING


_CUDA_TAG = re.compile(r"^(?P<cuda>[0-9]+\.[0-9]+\.[0-9]+)-(?P<flavour>[a-z0-9-]+?)-(?P<os>ubuntu|rockylinux|ubi)(?P<osver>[0-9.]+)$")


def _base_tag(image: str) -> tuple[str, str | None]:
    """Split ``nvidia/cuda:12.8.1-base-ubuntu24.04@sha256:..`` into (repository, tag)."""
    ref = image.split("@", 1)[0]
    last = ref.rsplit("/", 1)[-1]
    if ":" in last:
        repo, tag = ref.rsplit(":", 1)
        return repo, tag
    return ref, None


def check(recipe: Recipe) -> Spec:
    """Apply every rule to ``recipe`` and resolve its pins.

    Returns a :class:`Spec` whose ``findings`` hold all errors, warnings and notes (the
    caller decides: :func:`require_ok` raises on errors). Never raises for a valid recipe
    file: every problem becomes a finding.
    """
    f: list[Finding] = []
    data = facts()
    r = recipe
    add = lambda level, rule, fields, msg, src: f.append(Finding(level, rule, tuple(fields), msg, src))  # noqa: E731

    # --- the torch release and variant [S2] -------------------------------------------------
    releases = data["torch"]
    rel = releases.get(r.torch_version)
    variant = r.torch_variant or (f"cu{r.cuda.replace('.', '')}" if r.cuda else "cpu")
    if rel is None:
        known = ", ".join(sorted(releases, key=Version))
        add(ERROR, "torch-release", ["torch.version"], f"torch {r.torch_version} is not in envbuild's compatibility data; known releases: {known}", "S2 (V)")
    variant_known = True
    if rel and variant != "cpu":
        vlist = rel["variants"]["list"]
        variant_known = variant in vlist
        if variant not in vlist:
            add(_severity(rel["variants"]["tag"]), "torch-variant", ["torch.version", "torch.variant" if r.torch_variant else "cuda.version"],
                f"torch {r.torch_version} has no {variant} build; builds exist for {', '.join(vlist)}", f"S2 ({rel['variants']['tag']})")
    if variant == "cpu" and r.cuda:
        add(ERROR, "cpu-with-cuda", ["torch.variant", "cuda.version"], f"torch variant cpu does not use CUDA {r.cuda}; set cuda to null or use a cuXYZ variant", "S2 (V)")

    # --- CUDA of the variant vs the recipe's CUDA --------------------------------------------
    vcuda = _variant_cuda(variant)
    if vcuda and r.cuda:
        if vcuda.split(".")[0] != r.cuda.split(".")[0]:
            add(ERROR, "cuda-major", ["torch.variant", "cuda.version"], f"torch variant {variant} is CUDA {vcuda} but the recipe's CUDA is {r.cuda}; the major versions must match (use cu{r.cuda.replace('.', '')} or cuda {vcuda})", "compat.md §5.5 (V)")
        elif vcuda != _mm(r.cuda):
            add(WARNING, "cuda-minor", ["torch.variant", "cuda.version"], f"torch variant {variant} brings its own CUDA {vcuda} runtime; the recipe's CUDA is {r.cuda} (minor versions differ)", "compat.md §5.5 (U)")
    if variant != "cpu" and not r.cuda:
        add(ERROR, "cuda-missing", ["torch.variant", "cuda"], f"torch variant {variant} needs a cuda section (cuda.version: {vcuda})", "S2 (V)")

    # --- Python: Requires-Python and wheels [S1] ---------------------------------------------
    if rel:
        lo, hi = (str(x) for x in rel["python"])
        if not (_v(lo) <= _v(r.python) <= _v(hi)):
            add(ERROR, "python-wheel", ["python", "torch.version"], f"torch {r.torch_version} has wheels for Python {lo} to {hi}, not {r.python}", "S1 (V)")

    # --- OS: system Python and glibc [DISTRO], manylinux_2_28 needs glibc >= 2.28 [S1, PT141565]
    osrel = data["os"].get(r.os_id, {}).get(r.os_version)
    glibc = None
    if osrel is None:
        known = ", ".join(f"{i} {v}" for i, vs in data["os"].items() for v in vs)
        add(ERROR, "os-release", ["os.id", "os.version"], f"{r.os_id} {r.os_version} is not a known OS release; known: {known}", "DISTRO (V)")
    else:
        glibc = str(osrel["glibc"])
        if str(osrel["python"]) != r.python:
            add(ERROR, "os-python", ["python", "os.version"], f"Python {r.python} is not the system Python of {r.os_id} {r.os_version} ({osrel['python']}); use python: \"{osrel['python']}\" or another OS release", "DISTRO (V)")
        if rel:
            tag = (rel.get("manylinux_by_variant") or {}).get(variant, rel["manylinux"])
            if tag == "manylinux_2_28" and _v(glibc) < _v("2.28"):
                add(ERROR, "glibc", ["os.version", "torch.version"], f"torch {r.torch_version}+{variant} wheels are manylinux_2_28 and need glibc >= 2.28; {r.os_id} {r.os_version} has glibc {glibc}", "S1, pytorch#141565 (V)")

    # --- NCCL pinned by the torch build [S1] -------------------------------------------------
    nccl_pkg = nccl = None
    if rel and variant != "cpu" and not variant_known:
        nccl = r.nccl
    elif rel and variant != "cpu":
        pin = (rel.get("nccl") or {}).get(variant)
        if pin is None:
            if r.nccl:
                add(WARNING, "nccl-unknown", ["nccl", "torch.variant"], f"envbuild has no fact on the NCCL that torch {r.torch_version}+{variant} pins; keeping the recipe's {r.nccl} unchecked", "compat.md §1 (U)")
            nccl = r.nccl
        else:
            nccl_pkg = pin["package"]
            pinned = str(pin["version"]) if pin["version"] else None
            nccl = pinned if pinned else r.nccl
            if r.nccl and pinned and r.nccl != pinned:
                add(_severity(pin["tag"]), "nccl-pin", ["nccl", "torch.version", "torch.variant"],
                    f"torch {r.torch_version}+{variant} pins {nccl_pkg}=={pinned}; the recipe's NCCL {r.nccl} would be a second NCCL or a resolver conflict (use nccl: {pinned})",
                    f"S1 ({pin['tag']})")
                if _severity(pin["tag"]) == WARNING:
                    nccl = r.nccl
            elif pinned is None and r.nccl:
                add(WARNING, "nccl-bundled", ["nccl"], f"torch {r.torch_version}+{variant} bundles its NCCL (version unverified); the recipe's {r.nccl} cannot be checked", "compat.md §1 (U)")
    elif variant == "cpu" and r.nccl:
        add(ERROR, "nccl-cpu", ["nccl", "torch.variant"], f"a CPU build of torch has no NCCL; remove nccl ({r.nccl}) or use a CUDA variant", "S1 (V)")

    # --- cuDNN brought by the torch build [S1] -----------------------------------------------
    cudnn = None
    if rel and variant != "cpu":
        pin = (rel.get("cudnn") or {}).get(variant)
        cudnn = str(pin["version"]) if pin else r.cudnn
        if pin and r.cudnn and r.cudnn != str(pin["version"]):
            add(_severity(pin["tag"]), "cudnn-pin", ["cudnn", "torch.variant"], f"torch {r.torch_version}+{variant} brings cuDNN {pin['version']}, not {r.cudnn}", f"S1 ({pin['tag']})")
            if _severity(pin["tag"]) == WARNING:
                cudnn = r.cudnn
    elif r.cudnn:
        add(ERROR, "cudnn-cpu", ["cudnn"], f"a CPU build of torch has no cuDNN; remove cudnn ({r.cudnn})", "S1 (V)")

    # --- never mix -cu12 and -cu13 NVIDIA packages [compat.md §5.8, §1 CUDA 13 packaging] ----
    if vcuda:
        major = vcuda.split(".")[0]
        for req in r.pip:
            m = re.match(r"^(nvidia-[a-z0-9-]+?)-cu([0-9]+)\b", req.lower())
            if m and m.group(2) != major:
                add(ERROR, "cuda-package-mix", ["packages.pip"], f"{req} is a CUDA {m.group(2)} package in a CUDA {major} image (torch {variant}); use the -cu{major} package", "S1 (V)")

    # --- driver floors [NV-RN Table 3, NV-MVC] -----------------------------------------------
    dmin = dcompat = None
    if vcuda:
        drv = data["cuda_driver"].get(vcuda)
        if drv is None:
            add(WARNING, "driver-unknown", ["torch.variant"], f"envbuild has no driver floor for CUDA {vcuda}", "NV-RN (U)")
        else:
            dmin, dcompat = str(drv["ga"]), str(drv["minor_compat"])
            add(NOTE, "driver-floor", ["torch.variant"], f"{variant} needs driver >= {dmin} (CUDA {vcuda} GA); >= {dcompat} runs under minor-version compatibility (no PTX JIT)", "NV-RN, NV-MVC (V)")
            if r.driver:
                if _v(r.driver) < _v(dcompat):
                    add(ERROR, "driver-too-old", ["cuda.driver"], f"driver {r.driver} is below {dcompat}, the oldest that runs CUDA {vcuda} ({variant}) even with minor-version compatibility; full support needs >= {dmin}", "NV-MVC (V)")
                elif _v(r.driver) < _v(dmin):
                    add(WARNING, "driver-minor-compat", ["cuda.driver"], f"driver {r.driver} is below {dmin} (CUDA {vcuda} GA): runs only under minor-version compatibility (no PTX JIT, some APIs fail)", "NV-MVC (V)")

    # --- the base image: its CUDA and OS from the tag [NV-IMG] --------------------------------
    repo, tag = _base_tag(r.base_image)
    if repo.endswith("nvidia/cuda") and tag:
        m = _CUDA_TAG.match(tag)
        if not m:
            add(WARNING, "base-tag", ["base.image"], f"cannot read CUDA and OS from the tag {tag!r} (expected X.Y.Z-flavour-osVER)", "NV-IMG (U)")
        else:
            bcuda, flavour = m.group("cuda"), m.group("flavour")
            if not r.cuda:
                add(WARNING, "base-cuda-unused", ["base.image", "cuda"], f"base image {r.base_image} carries CUDA {bcuda} but the recipe has no cuda section", "NV-IMG (V)")
            elif bcuda.split(".")[0] != r.cuda.split(".")[0]:
                add(ERROR, "base-cuda-major", ["base.image", "cuda.version"], f"base image CUDA {bcuda} and the recipe's CUDA {r.cuda} differ in major version; use an nvidia/cuda:{r.cuda}.x tag", "NV-IMG (V)")
            elif _mm(bcuda) != _mm(r.cuda):
                add(WARNING, "base-cuda-minor", ["base.image", "cuda.version"], f"base image CUDA {bcuda} and the recipe's CUDA {r.cuda} differ in minor version", "NV-IMG (V)")
            base_os = (m.group("os"), m.group("osver"))
            if base_os != (r.os_id, r.os_version):
                add(ERROR, "base-os", ["base.image", "os.id", "os.version"], f"base image {tag} is {base_os[0]} {base_os[1]} but the recipe says {r.os_id} {r.os_version}", "NV-IMG (V)")
            sys_nccl = data["cuda_image_nccl"].get(bcuda)
            if flavour != "base" and sys_nccl and nccl and str(sys_nccl) != nccl:
                add(WARNING, "base-second-nccl", ["base.image", "nccl"], f"the {flavour} flavour ships a system libnccl2 {sys_nccl} beside torch's NCCL {nccl}: two NCCLs in one image; prefer the base flavour", "compat.md §4 (S)")
    elif repo in ("debian", "library/debian", "docker.io/library/debian", "ubuntu", "library/ubuntu", "docker.io/library/ubuntu") and tag:
        distro = repo.rsplit("/", 1)[-1]
        word = tag.split("-")[0]
        versions = data["os"].get(distro, {})
        tag_version = next((v for v, rel_ in versions.items() if word == v or word in rel_.get("codenames", [])), None)
        if distro != r.os_id or (tag_version and tag_version != r.os_version):
            add(ERROR, "base-os", ["base.image", "os.id", "os.version"], f"base image {r.base_image} is {distro} {tag_version or word} but the recipe says {r.os_id} {r.os_version}", "DISTRO (V)")

    # --- the backend --------------------------------------------------------------------------
    if r.certify.backend == "nccl" and variant == "cpu":
        add(ERROR, "backend-nccl-cpu", ["certify.backend", "torch.variant"], "backend nccl needs a CUDA build of torch; use gloo for a CPU image", "multinode.md (V)")

    return Spec(
        recipe=r,
        variant=variant,
        torch_local=f"{r.torch_version}+{variant}",
        cuda=vcuda,
        nccl_package=nccl_pkg,
        nccl=nccl,
        cudnn=cudnn,
        glibc=glibc or "",
        driver_min=dmin,
        driver_minor_compat_min=dcompat,
        findings=tuple(f),
    )


def require_ok(spec: Spec) -> Spec:
    """Raise :class:`ManyErrors` (exit 2) listing every error finding of ``spec``; else return it."""
    errors = spec.errors
    if errors:
        file = spec.recipe.path
        raise ManyErrors([EnvbuildError(f"{e.message} [{e.source}]", file=file, field=", ".join(e.fields)) for e in errors])
    return spec
