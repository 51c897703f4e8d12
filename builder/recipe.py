"""Stage 1: load a recipe YAML file into a validated :class:`Recipe`.

A recipe pins the base image, OS, Python, CUDA, PyTorch, NCCL and cuDNN of an image,
the extra apt/pip packages, the package indexes and the certification settings. The
schema is strict: unknown keys are errors (with a "did you mean"), versions parse with
``packaging``, package names follow PEP 508 / Debian policy, and every value that
reaches a ``RUN`` line matches a closed pattern, so nothing free-form is rendered.

All problems of one file are reported together as :class:`~builder.errors.ManyErrors`,
one line each: ``recipes/x.yaml: torch.version: '2.8;rm -rf /' is not a version``.
The schema is documented in README.md ("Recipe schema").
"""

from __future__ import annotations

import difflib
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import yaml
from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name
from packaging.version import InvalidVersion, Version

from .errors import EnvbuildError, ManyErrors

#: Release-style versions only (no local labels, no epochs): "2.8.0", "12.8", "570.124.06".
_RELEASE = re.compile(r"^[0-9]+(\.[0-9]+){0,3}$")
#: Docker image reference: [registry[:port]/]path[:tag][@sha256:64hex] (distribution/reference grammar, lower-case path).
IMAGE_REF = re.compile(
    # a first component is a registry only with a '.' or ':' or as 'localhost' (as docker reads it)
    r"^(?:(?P<registry>(?:[a-zA-Z0-9-]+\.)+[a-zA-Z0-9-]+(?::[0-9]+)?|[a-zA-Z0-9-]+:[0-9]+|localhost)/)?"
    r"(?P<path>[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*(?:/[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*)*)"
    r"(?::(?P<tag>[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}))?"
    r"(?:@(?P<digest>sha256:[0-9a-f]{64}))?$"
)
#: Debian package name (Debian policy 5.6.1) with an optional ``=version``.
_APT = re.compile(r"^[a-z0-9][a-z0-9+.-]+(=[A-Za-z0-9.+~:-]+)?$")
_URL = re.compile(r"^https?://[A-Za-z0-9.-]+(:[0-9]{1,5})?(/[A-Za-z0-9._~/%-]*)?$")
_ENV_NAME = re.compile(r"^[A-Z_][A-Z0-9_]*$")
_ENV_VALUE = re.compile(r"^[A-Za-z0-9_.,:/@%+=-]*$")
SHM_SIZE = re.compile(r"^[0-9]+[kmgKMG]?$")
_VARIANT = re.compile(r"^(cpu|cu[0-9]{3})$")
_NAME = re.compile(r"^[a-z0-9][a-z0-9._-]*$")

BACKENDS = ("gloo", "nccl")
#: Largest all-reduce message accepted (64 GiB), in bytes.
MAX_SIZE = 2**36
#: Environment variables a recipe cannot set: the image's venv and loader depend on them.
RESERVED_ENV = frozenset({"PATH", "VIRTUAL_ENV", "PYTHONPATH", "PYTHONHOME", "PYTHONDONTWRITEBYTECODE",
                          "PYTHONUNBUFFERED", "LD_PRELOAD", "LD_LIBRARY_PATH", "HOME", "DEBIAN_FRONTEND"})


@dataclass(frozen=True)
class AllreduceSettings:
    """All-reduce sweep: message ``sizes`` in bytes, ``iters`` timed and ``warmup`` untimed iterations."""

    sizes: tuple[int, ...] = (8, 1024, 65536, 1048576, 4194304)
    iters: int = 20
    warmup: int = 5


@dataclass(frozen=True)
class DdpSettings:
    """DDP training check: ``steps`` of ResNet-18 on ``batch_size`` synthetic images of ``image_size``² pixels."""

    steps: int = 3
    batch_size: int = 8
    image_size: int = 64


@dataclass(frozen=True)
class Thresholds:
    """Pass/fail gates. ``min_busbw_gbps`` (GB/s = 1e9 B/s) applies at ``busbw_size`` bytes (the largest size when null)."""

    min_busbw_gbps: float | None = None
    busbw_size: int | None = None


@dataclass(frozen=True)
class CertifySettings:
    """How ``envbuild certify`` runs: simulated ``nodes``, ``gpus_per_node``, backend, rendezvous ``port``,
    ``shm_size`` (docker syntax, e.g. ``1g``), ``timeout_s`` (seconds) for the whole run."""

    backend: str = "gloo"
    nodes: int = 2
    gpus_per_node: int = 0
    port: int = 29500
    shm_size: str = "1g"
    timeout_s: int = 600
    allreduce: AllreduceSettings = field(default_factory=AllreduceSettings)
    ddp: DdpSettings = field(default_factory=DdpSettings)
    thresholds: Thresholds = field(default_factory=Thresholds)


@dataclass(frozen=True)
class Recipe:
    """A validated recipe. Versions are strings in release form ("2.8.0"); ``cuda`` is None for CPU images.

    ``pip`` holds canonical PEP 508 requirement strings; ``apt`` Debian package names
    (optionally ``name=version``); ``env`` extra environment variables of the image.
    """

    name: str
    path: str
    description: str
    base_image: str
    os_id: str
    os_version: str
    python: str
    cuda: str | None
    driver: str | None
    torch_version: str
    torch_variant: str | None
    nccl: str | None
    cudnn: str | None
    apt: tuple[str, ...]
    pip: tuple[str, ...]
    index_url: str
    torch_index_url: str | None
    env: tuple[tuple[str, str], ...]
    certify: CertifySettings

    def as_dict(self) -> dict[str, Any]:
        """Plain-data view (lists instead of tuples), for the lock and labels."""
        d = asdict(self)
        d["env"] = dict(self.env)
        return d


# ---------------------------------------------------------------------------- schema
# Each schema node: dict of key -> (kind, required). Kinds are checked by _Loader.
_SCHEMA: dict[str, Any] = {
    "description": "str",
    "base": {"image": "image!"},
    "os": {"id": "osid!", "version": "release!"},
    "python": "pyver!",
    "cuda": {"version": "release!", "driver": "release"},
    "torch": {"version": "release!", "variant": "variant"},
    "nccl": "release",
    "cudnn": "release",
    "packages": {"apt": "aptlist", "pip": "piplist"},
    "index": {"url": "url", "torch_url": "url"},
    "env": "env",
    "certify": {
        "backend": "backend",
        "nodes": "int:1:1024",
        "gpus_per_node": "int:0:64",
        "port": "int:1:65535",
        "shm_size": "shm",
        "timeout_s": "int:1:604800",
        "allreduce": {"sizes": "sizes", "iters": "int:1:100000", "warmup": "int:0:10000"},
        "ddp": {"steps": "int:1:100000", "batch_size": "int:2:65536", "image_size": "int:32:4096"},
        "thresholds": {"min_busbw_gbps": "posfloat", "busbw_size": f"int:4:{MAX_SIZE}"},
    },
}
_REQUIRED_TOP = ("base", "os", "python", "torch")


def _kind(spec: Any) -> tuple[str, bool]:
    return (spec[:-1], True) if spec.endswith("!") else (spec, False)


class _Loader:
    """Walks raw YAML data against the schema, collecting every error."""

    def __init__(self, file: str) -> None:
        self.file = file
        self.errors: list[EnvbuildError] = []

    def err(self, field: str, value: Any, message: str) -> None:
        self.errors.append(EnvbuildError(message, file=self.file, field=field, value=value))

    def err_novalue(self, field: str, message: str) -> None:
        self.errors.append(EnvbuildError(message, file=self.file, field=field))

    def mapping(self, data: Any, schema: dict, prefix: str, required: tuple[str, ...] = ()) -> dict:
        if data is None:
            data = {}
        if not isinstance(data, dict):
            self.err(prefix or "(top level)", data, "must be a mapping")
            return {}
        out: dict[str, Any] = {}
        for key, value in data.items():
            path = f"{prefix}.{key}" if prefix else str(key)
            if key not in schema:
                close = difflib.get_close_matches(str(key), list(schema), n=1, cutoff=0.6)
                hint = f"; did you mean '{close[0]}'?" if close else f"; allowed keys: {', '.join(schema)}"
                self.err_novalue(path, f"unknown key{hint}")
                continue
            sub = schema[key]
            if isinstance(sub, dict):
                if value is None and key in ("cuda",):
                    out[key] = None
                    continue
                req = tuple(k for k, v in sub.items() if isinstance(v, str) and v.endswith("!"))
                out[key] = self.mapping(value, sub, path, req)
            else:
                out[key] = self.scalar(value, sub, path)
        for key in required:
            if key not in data:
                self.err_novalue(f"{prefix}.{key}" if prefix else key, "is required")
        return out

    def scalar(self, value: Any, spec: str, path: str) -> Any:  # noqa: C901 - one branch per kind
        kind, required = _kind(spec)
        if value is None:
            if required:
                self.err_novalue(path, "is required")
            return None
        if kind == "str":
            if not isinstance(value, str) or not value.isprintable() or len(value) > 200:
                self.err(path, value if not isinstance(value, str) or len(value) <= 200 else value[:40] + "...",
                         "must be one line of at most 200 printable characters")
                return None
            return value.strip()
        if kind in ("release", "pyver"):
            text = str(value) if isinstance(value, (str, int, float)) and not isinstance(value, bool) else None
            if text is None or not _RELEASE.match(text):
                self.err(path, value if text is None else text, "is not a version")
                return None
            try:
                Version(text)
            except InvalidVersion:
                self.err(path, text, "is not a version")
                return None
            if kind == "pyver" and not re.match(r"^3\.[0-9]+$", text):
                self.err(path, text, "must be a Python minor version such as '3.11'")
                return None
            return text
        if kind == "image":
            if not isinstance(value, str) or not IMAGE_REF.match(value):
                self.err(path, value, "is not an image reference (name[:tag][@sha256:digest])")
                return None
            return value
        if kind == "osid":
            if value not in ("debian", "ubuntu"):
                self.err(path, value, "is not a supported OS; use debian or ubuntu")
                return None
            return value
        if kind == "variant":
            if not isinstance(value, str) or not _VARIANT.match(value):
                self.err(path, value, "is not a torch variant; use cpu or cuXYZ such as cu128")
                return None
            return value
        if kind == "backend":
            if value not in BACKENDS:
                self.err(path, value, f"is not a backend; use {' or '.join(BACKENDS)}")
                return None
            return value
        if kind.startswith("int:"):
            low, high = (int(x) for x in kind.split(":")[1:])
            if not isinstance(value, int) or isinstance(value, bool) or not low <= value <= high:
                self.err(path, value, f"must be an integer in {low}..{high}")
                return None
            return value
        if kind == "posfloat":
            if not isinstance(value, (int, float)) or isinstance(value, bool) or value <= 0:
                self.err(path, value, "must be a number > 0")
                return None
            return float(value)
        if kind == "shm":
            if not isinstance(value, str) or not SHM_SIZE.match(value):
                self.err(path, value, "is not a size such as 1g or 512m")
                return None
            return value.lower()
        if kind == "url":
            if not isinstance(value, str) or not _URL.match(value):
                self.err(path, value, "is not an http(s) URL")
                return None
            return value
        if kind == "sizes":
            if not isinstance(value, list) or not value:
                self.err(path, value, "must be a non-empty list of sizes in bytes")
                return None
            good = []
            for i, v in enumerate(value):
                if not isinstance(v, int) or isinstance(v, bool) or v < 4 or v % 4 or v > MAX_SIZE:
                    self.err(f"{path}[{i}]", v, f"must be a size in bytes, a multiple of 4 (float32), at most {MAX_SIZE}")
                else:
                    good.append(v)
            return tuple(sorted(set(good)))
        if kind == "aptlist":
            return tuple(self._list(value, path, _apt_item))
        if kind == "piplist":
            return tuple(self._list(value, path, _pip_item))
        if kind == "env":
            if not isinstance(value, dict):
                self.err(path, value, "must be a mapping of NAME: value")
                return None
            env = []
            for k, v in value.items():
                sv = str(v) if isinstance(v, (str, int, float)) and not isinstance(v, bool) else None
                if not isinstance(k, str) or not _ENV_NAME.match(k):
                    self.err(f"{path}.{k}", k, "is not an environment variable name")
                elif k in RESERVED_ENV:
                    self.err(f"{path}.{k}", k, "is set by envbuild or the runtime; it cannot be overridden")
                elif sv is None or not _ENV_VALUE.match(sv):
                    self.err(f"{path}.{k}", v, "must match [A-Za-z0-9_.,:/@%+=-]* (no spaces or quotes)")
                else:
                    env.append((k, sv))
            return tuple(sorted(env))
        raise AssertionError(f"unknown schema kind {kind}")  # pragma: no cover - schema bug

    def _list(self, value: Any, path: str, check) -> list[str]:
        if not isinstance(value, list):
            self.err(path, value, "must be a list")
            return []
        out = []
        for i, item in enumerate(value):
            ok, result = check(item)
            if ok:
                out.append(result)
            else:
                self.err(f"{path}[{i}]", item, result)
        return out


def _apt_item(item: Any) -> tuple[bool, str]:
    if isinstance(item, str) and _APT.match(item):
        return True, item
    return False, "is not a Debian package name (name or name=version)"


def _pip_item(item: Any) -> tuple[bool, str]:
    """Accepts ``name[extras] <specifiers>`` only; no URLs, markers or options."""
    if not isinstance(item, str) or item.strip().startswith("-"):
        return False, "is not a PEP 508 requirement (name[extras] and version specifiers only)"
    try:
        req = Requirement(item)
    except InvalidRequirement:
        return False, "is not a PEP 508 requirement (name[extras] and version specifiers only)"
    if req.url or req.marker:
        return False, "must not carry a URL or an environment marker"
    for spec in req.specifier:
        if not re.match(r"^[0-9][0-9A-Za-z.*+!]*$", spec.version):
            return False, "has a version that is not a plain version"
    if canonicalize_name(req.name) == "torch":
        return False, "torch is pinned by the torch section, not packages.pip"
    return True, str(req)


class _StrictLoader(yaml.SafeLoader):
    """pyyaml's SafeLoader that refuses duplicate keys (YAML 1.2 says keys are unique;
    pyyaml would silently keep the last one)."""

    def construct_mapping(self, node, deep=False):
        seen = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            if key in seen:
                raise yaml.constructor.ConstructorError(None, None, f"duplicate key {key!r}", key_node.start_mark)
            seen.add(key)
        return super().construct_mapping(node, deep=deep)


def load(path: str | Path) -> Recipe:
    """Load and validate the recipe at ``path``.

    Returns: a :class:`Recipe`.
    Raises: :class:`EnvbuildError` (missing file, malformed YAML) or
        :class:`ManyErrors` (every schema violation), exit code 2.
    """
    p = Path(path)
    file = str(path)
    try:
        text = p.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise EnvbuildError("no such recipe file", file=file) from None
    except IsADirectoryError:
        raise EnvbuildError("is a directory, not a recipe file", file=file) from None
    except PermissionError:
        raise EnvbuildError("cannot read recipe: permission denied", file=file) from None
    except UnicodeDecodeError:
        raise EnvbuildError("is not UTF-8 text", file=file) from None
    try:
        data = yaml.load(text, Loader=_StrictLoader)  # noqa: S506 - a SafeLoader subclass
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark else ""
        problem = getattr(exc, "problem", None) or "invalid YAML"
        raise EnvbuildError(f"malformed YAML: {where}{problem}", file=file) from None
    loader = _Loader(file)
    if not isinstance(data, dict):
        raise EnvbuildError("a recipe must be a YAML mapping", file=file)
    raw = loader.mapping(data, _SCHEMA, "", _REQUIRED_TOP)
    if loader.errors:
        raise ManyErrors(loader.errors)
    return _build(p, file, raw)


def _build(p: Path, file: str, raw: dict) -> Recipe:
    name = p.stem
    if not _NAME.match(name):
        raise EnvbuildError("recipe file names use [a-z0-9._-] only", file=file)
    cert = raw.get("certify") or {}
    ar = cert.get("allreduce") or {}
    ddp = cert.get("ddp") or {}
    th = cert.get("thresholds") or {}
    defaults_ar = AllreduceSettings()
    defaults_c = CertifySettings()
    cuda = raw.get("cuda")
    certify = CertifySettings(
        backend=cert.get("backend") or ("nccl" if cuda else defaults_c.backend),
        nodes=cert.get("nodes") or defaults_c.nodes,
        gpus_per_node=cert.get("gpus_per_node") if cert.get("gpus_per_node") is not None else (1 if cuda else 0),
        port=cert.get("port") or defaults_c.port,
        shm_size=cert.get("shm_size") or defaults_c.shm_size,
        timeout_s=cert.get("timeout_s") or defaults_c.timeout_s,
        allreduce=AllreduceSettings(
            sizes=ar.get("sizes") or defaults_ar.sizes,
            iters=ar.get("iters") or defaults_ar.iters,
            warmup=ar.get("warmup") if ar.get("warmup") is not None else defaults_ar.warmup,
        ),
        ddp=DdpSettings(**{k: v for k, v in ddp.items() if v is not None}),
        thresholds=Thresholds(**{k: v for k, v in th.items() if v is not None}),
    )
    index = raw.get("index") or {}
    packages = raw.get("packages") or {}
    return Recipe(
        name=name,
        path=file,
        description=raw.get("description") or "",
        base_image=raw["base"]["image"],
        os_id=raw["os"]["id"],
        os_version=raw["os"]["version"],
        python=raw["python"],
        cuda=cuda["version"] if cuda else None,
        driver=cuda.get("driver") if cuda else None,
        torch_version=raw["torch"]["version"],
        torch_variant=raw["torch"].get("variant"),
        nccl=raw.get("nccl"),
        cudnn=raw.get("cudnn"),
        apt=tuple(packages.get("apt") or ()),
        pip=tuple(packages.get("pip") or ()),
        index_url=index.get("url") or "https://pypi.org/simple",
        torch_index_url=index.get("torch_url"),
        env=tuple(raw.get("env") or ()),
        certify=certify,
    )


def find(name_or_path: str, recipes_dir: str | Path = "recipes") -> Path:
    """Resolve ``cpu-torch2`` to ``recipes/cpu-torch2.yaml``; a path to a file is returned as is.

    Raises: :class:`EnvbuildError` (exit 2) when neither exists, listing the known recipes.
    """
    p = Path(name_or_path)
    if p.suffix in (".yaml", ".yml"):
        return p
    candidate = Path(recipes_dir) / f"{name_or_path}.yaml"
    if candidate.exists():
        return candidate
    known = sorted(q.stem for q in Path(recipes_dir).glob("*.yaml"))
    hint = f"; known recipes: {', '.join(known)}" if known else ""
    raise EnvbuildError(f"no such recipe{hint}", file=str(candidate))
