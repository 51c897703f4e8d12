"""Stage 1: load a recipe YAML file into a validated :class:`Recipe`.

A recipe pins the base image, OS, Python, CUDA, PyTorch, NCCL and cuDNN of an image,
the extra apt/pip packages, the package indexes and the certification settings. The
schema is strict: unknown keys are errors (with a "did you mean"), versions parse with
``packaging``, package names follow PEP 508 / Debian policy, and every value that
reaches a ``RUN`` line matches a closed pattern over the *whole* value (``\\A...\\Z``:
Python's ``$`` also matches before a final newline), so nothing free-form is rendered.

Reading is bounded (:mod:`builder.core.inputs`): a recipe is a regular file of at most
:data:`~builder.core.inputs.MAX_RECIPE_BYTES` (else exit 3), parsed by the bounded YAML loader
(aliases, depth, complex keys, duplicate keys, huge integers: exit 2). No string anywhere
in a recipe may hold a control character (newline, tab, ESC, bidi overrides...): each one
is an error naming its field (``packages.apt[0]``, ``env.FOO``, ``description``).

All problems of one file are reported together, one line each:
``recipes/x.yaml: torch.version: '2.8;rm -rf /' is not a version``. :func:`parse` returns
the recipe with the fields that failed left out (listed in :attr:`Recipe.invalid`) and the
errors, so that the compatibility rules can still run on the fields that validated;
:func:`load` raises them. The schema is documented in README.md ("Recipe schema").
"""

from __future__ import annotations

import difflib
import math
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable

from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name
from packaging.version import InvalidVersion, Version

from builder.core import inputs
from builder.core.errors import EnvbuildError, ExitCode, ManyErrors
from builder.oci import reference

# Closed patterns, each matching a whole value (\A...\Z; use .fullmatch or .match alike).
#: Release-style versions only (no local labels, no epochs): "2.8.0", "12.8", "570.124.06".
_RELEASE = re.compile(r"\A[0-9]{1,6}(?:\.[0-9]{1,6}){0,3}\Z")
#: Debian package name (Debian policy 5.6.1) and version (5.6.12), ``name[=version]``.
APT_NAME = re.compile(r"\A[a-z0-9][a-z0-9+.-]{1,127}\Z")
APT_VERSION = re.compile(r"\A[A-Za-z0-9.+~:-]{1,128}\Z")
_APT = re.compile(r"\A[a-z0-9][a-z0-9+.-]{1,127}(?:=[A-Za-z0-9.+~:-]{1,128})?\Z")
#: PEP 508 distribution name and a plain PEP 440 version of a specifier.
PIP_NAME = re.compile(r"\A[A-Za-z0-9](?:[A-Za-z0-9._-]{0,126}[A-Za-z0-9])?\Z")
PIP_VERSION = re.compile(r"\A[A-Za-z0-9][A-Za-z0-9.+!_-]{0,63}\Z")
_SPEC_VERSION = re.compile(r"\A[0-9][0-9A-Za-z.*+!]{0,63}\Z")
SHA256 = re.compile(r"\Asha256:[0-9a-f]{64}\Z")
_URL = re.compile(r"\Ahttps?://[A-Za-z0-9.-]{1,253}(?::[0-9]{1,5})?(?:/[A-Za-z0-9._~/%-]{0,1024})?\Z")
_ENV_NAME = re.compile(r"\A[A-Z_][A-Z0-9_]{0,127}\Z")
_ENV_VALUE = re.compile(r"\A[A-Za-z0-9_.,:/@%+=^-]{0,1024}\Z")
#: ``/dev/shm`` size in docker syntax: a number and an optional unit k, m or g (1024-based).
SHM_SIZE = re.compile(r"\A[0-9]{1,13}[kmgKMG]?\Z")
#: torch wheel variants: ``cpu`` or ``cu`` and the CUDA version's digits (``cu90``, ``cu128``).
VARIANT = re.compile(r"\A(?:cpu|cu[0-9]{2,3})\Z")
#: A recipe name (its file name without .yaml): one docker repository path component.
RECIPE_NAME = re.compile(r"\A[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*\Z")
MAX_RECIPE_NAME = 64

BACKENDS = ("gloo", "nccl")
#: Largest all-reduce message accepted (64 GiB), in bytes.
MAX_SIZE = 2**36
#: Most all-reduce sizes, apt packages and pip requirements a recipe may list.
MAX_SIZES = 64
MAX_PACKAGES = 1000
#: Bounds of ``certify.shm_size`` in bytes: 1 MiB to 1 TiB.
MIN_SHM_BYTES = 1 << 20
MAX_SHM_BYTES = 1 << 40
#: Largest busbw floor accepted (GB/s): far above any interconnect (NVLink 5 is 1.8e3).
MAX_BUSBW_GBPS = 1e6
#: Longest one-line description.
MAX_DESCRIPTION = 200
#: Environment variables a recipe cannot set: the image's venv and loader depend on them.
RESERVED_ENV = frozenset({"PATH", "VIRTUAL_ENV", "PYTHONPATH", "PYTHONHOME", "PYTHONDONTWRITEBYTECODE",
                          "PYTHONUNBUFFERED", "LD_PRELOAD", "LD_LIBRARY_PATH", "HOME", "DEBIAN_FRONTEND"})


def shm_bytes(text: str) -> int:
    """Bytes of a docker size (``256m`` -> 268435456; k/m/g are 1024-based, docker's
    ``units.RAMInBytes``). ``text`` must match :data:`SHM_SIZE`."""
    unit = text[-1].lower()
    factor = {"k": 1 << 10, "m": 1 << 20, "g": 1 << 30}.get(unit)
    return int(text[:-1]) * factor if factor else int(text)


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
    (optionally ``name=version``); ``env`` extra environment variables of the image;
    ``torch_index_url`` None when the recipe leaves it to the variant
    (:attr:`builder.recipe.compat.Spec.torch_index_url`).

    From :func:`parse`, a recipe may be partial: ``invalid`` holds the field paths that
    failed validation (``torch.variant``, ``packages.apt[0]``); those fields hold None or
    their defaults and :meth:`valid` tells the compatibility rules to leave them alone.
    """

    name: str
    path: str
    description: str
    base_image: str | None
    os_id: str | None
    os_version: str | None
    python: str | None
    cuda: str | None
    driver: str | None
    torch_version: str | None
    torch_variant: str | None
    nccl: str | None
    cudnn: str | None
    apt: tuple[str, ...]
    pip: tuple[str, ...]
    index_url: str
    torch_index_url: str | None
    env: tuple[tuple[str, str], ...]
    certify: CertifySettings
    invalid: frozenset[str] = frozenset()

    def valid(self, *fields: str) -> bool:
        """True when none of ``fields`` (dotted paths such as ``torch.variant``) failed
        validation, nor a part of one (``packages.apt[2]`` for ``packages.apt``), nor a
        section holding one (``torch`` for ``torch.variant``)."""
        for f in fields:
            for bad in self.invalid:
                if bad == f or bad.startswith((f + ".", f + "[")) or f.startswith((bad + ".", bad + "[")):
                    return False
        return True

    def as_dict(self) -> dict[str, Any]:
        """Plain-data view (lists instead of tuples), for the lock and labels."""
        d = asdict(self)
        d["env"] = dict(self.env)
        d["invalid"] = sorted(self.invalid)
        return d


# ---------------------------------------------------------------------------- schema
# Each schema node: dict of key -> kind; a kind ending in "!" is required. Kinds are
# checked by _Loader.scalar; README.md "Recipe schema" documents them.
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
#: Sections that may be ``null`` as a whole (``cuda: null``: a CPU image).
_NULLABLE = ("cuda",)


def schema_fields(schema: dict[str, Any] | None = None, prefix: str = "") -> list[tuple[str, str]]:
    """Every leaf field of the recipe schema as ``(dotted path, kind)``, in schema order:
    ``[("description", "str"), ("base.image", "image!"), ...]``."""
    out: list[tuple[str, str]] = []
    for key, sub in (_SCHEMA if schema is None else schema).items():
        path = f"{prefix}.{key}" if prefix else key
        out.extend(schema_fields(sub, path) if isinstance(sub, dict) else [(path, sub)])
    return out


def _kind(spec: str) -> tuple[str, bool]:
    return (spec[:-1], True) if spec.endswith("!") else (spec, False)


def _control_message(text: str) -> str:
    ch = next((c for c in text if inputs.is_control(c)), "?")
    return (f"holds a control character ({inputs.escape(ch)}); recipe values are printable text on one line "
            "(no newline, tab, escape or bidi control)")


def _fits(regex: re.Pattern, value: Any, limit: int = 1024) -> bool:
    """True when ``value`` is a string of at most ``limit`` characters wholly matching ``regex``."""
    return isinstance(value, str) and len(value) <= limit and regex.fullmatch(value) is not None


class _Loader:
    """Walks loaded YAML data against a schema, collecting every error (one per field).

    ``kinds`` adds kind checkers to :data:`_SCALARS` (the lock's own kinds,
    :func:`builder.recipe.compat.validate_lock`). ``bad`` maps the field paths holding a control character (from
    :func:`builder.core.inputs.control_char_paths`) to their string: such a field gets that one
    error and no other check. ``invalid`` collects every field path that failed.
    """

    def __init__(self, file: str, bad: dict[str, str] | None = None,
                 kinds: dict[str, Callable[..., Any]] | None = None) -> None:
        self.file = file
        self.bad = bad or {}
        self.kinds = _SCALARS if kinds is None else {**_SCALARS, **kinds}
        self.errors: list[EnvbuildError] = []
        self.invalid: set[str] = set()

    def err(self, field: str, value: Any, message: str) -> None:
        self.invalid.add(field)
        self.errors.append(EnvbuildError(message, file=self.file, field=field, value=value))

    def err_novalue(self, field: str, message: str) -> None:
        self.invalid.add(field)
        self.errors.append(EnvbuildError(message, file=self.file, field=field))

    def control(self, path: str) -> bool:
        """Report the control character at ``path`` (True) or say there is none (False)."""
        if path not in self.bad:
            return False
        self.err(path, self.bad[path], _control_message(self.bad[path]))
        return True

    def mapping(self, data: Any, schema: dict, prefix: str, required: tuple[str, ...] = ()) -> dict:
        if data is None:
            data = {}
        if not isinstance(data, dict):
            self.err(prefix or "(top level)", data, "must be a mapping")
            return {}
        out: dict[str, Any] = {}
        for key, value in data.items():
            path = f"{prefix}.{key}" if prefix else str(key)
            if self.control(path):
                continue
            if key not in schema:
                close = difflib.get_close_matches(str(key)[:100], list(schema), n=1, cutoff=0.6)
                hint = f"; did you mean '{close[0]}'?" if close else f"; allowed keys: {', '.join(schema)}"
                self.err_novalue(path, f"unknown key{hint}")
                continue
            sub = schema[key]
            if isinstance(sub, dict):
                if value is None and key in _NULLABLE:
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

    def scalar(self, value: Any, spec: str, path: str) -> Any:
        kind, required = _kind(spec)
        if value is None:
            if required:
                self.err_novalue(path, "is required")
            return None
        check = self.kinds.get(kind.split(":")[0])
        if check is None:  # pragma: no cover - a schema bug
            raise AssertionError(f"unknown schema kind {kind}")
        return check(self, value, kind, path)

    def items(self, value: Any, path: str, check: Callable[[Any], tuple[bool, str]]) -> tuple[str, ...]:
        """A list of strings, each checked by ``check`` -> (ok, value or message)."""
        if not isinstance(value, list):
            self.err(path, value, "must be a list")
            return ()
        if len(value) > MAX_PACKAGES:
            self.err(path, f"<{len(value)} items>", f"lists more than {MAX_PACKAGES} items")
            return ()
        out = []
        for i, item in enumerate(value):
            sub = f"{path}[{i}]"
            if self.control(sub):
                continue
            ok, result = check(item)
            if ok:
                out.append(result)
            else:
                self.err(sub, item, result)
        return tuple(out)


# ---------------------------------------------------------------------------- kinds
# Each kind checker: (loader, value, kind, path) -> the clean value, or None after an error.


def _k_str(ld: _Loader, value: Any, kind: str, path: str) -> Any:
    if not isinstance(value, str) or len(value) > MAX_DESCRIPTION or inputs.has_control(value):
        ld.err(path, value, f"must be one line of at most {MAX_DESCRIPTION} printable characters")
        return None
    return value.strip()


def _k_release(ld: _Loader, value: Any, kind: str, path: str) -> Any:
    if isinstance(value, bool) or not isinstance(value, (str, int, float)):
        ld.err(path, value, "is not a version")
        return None
    text = value if isinstance(value, str) else str(value)
    if not _fits(_RELEASE, text, 64):
        ld.err(path, text, "is not a version")
        return None
    try:
        Version(text)
    except InvalidVersion:  # pragma: no cover - _RELEASE admits only valid versions
        ld.err(path, text, "is not a version")
        return None
    if kind == "pyver" and not re.fullmatch(r"3\.[0-9]{1,3}", text):
        ld.err(path, text, "must be a Python minor version such as '3.11'")
        return None
    return text


def _k_image(ld: _Loader, value: Any, kind: str, path: str) -> Any:
    if not reference.is_valid(value):
        ld.err(path, value, "is not an image reference (name[:tag][@sha256:digest])")
        return None
    return value


def _k_choice(ld: _Loader, value: Any, kind: str, path: str) -> Any:
    if kind == "osid" and value not in ("debian", "ubuntu"):
        ld.err(path, value, "is not a supported OS; use debian or ubuntu")
        return None
    if kind == "backend" and value not in BACKENDS:
        ld.err(path, value, f"is not a backend; use {' or '.join(BACKENDS)}")
        return None
    return value


def _k_variant(ld: _Loader, value: Any, kind: str, path: str) -> Any:
    if not _fits(VARIANT, value, 8):
        ld.err(path, value, "is not a torch variant; use cpu or cu and the CUDA digits, such as cu128")
        return None
    return value


def _k_int(ld: _Loader, value: Any, kind: str, path: str) -> Any:
    low, high = (int(x) for x in kind.split(":")[1:])
    if not isinstance(value, int) or isinstance(value, bool) or not low <= value <= high:
        ld.err(path, value, f"must be an integer in {low}..{high}")
        return None
    return value


def _k_posfloat(ld: _Loader, value: Any, kind: str, path: str) -> Any:
    ok = isinstance(value, (int, float)) and not isinstance(value, bool)
    if not ok or not math.isfinite(value) or not 0 < value <= MAX_BUSBW_GBPS:
        ld.err(path, value, f"must be a finite number > 0 and at most {MAX_BUSBW_GBPS:g}")
        return None
    return float(value)


def _k_shm(ld: _Loader, value: Any, kind: str, path: str) -> Any:
    if not _fits(SHM_SIZE, value, 16) or not MIN_SHM_BYTES <= shm_bytes(value) <= MAX_SHM_BYTES:
        ld.err(path, value, "is not a size from 1m to 1024g such as 1g or 512m")
        return None
    return value.lower()


def _k_url(ld: _Loader, value: Any, kind: str, path: str) -> Any:
    if not _fits(_URL, value, 1300):
        ld.err(path, value, "is not an http(s) URL")
        return None
    return value


def _k_sizes(ld: _Loader, value: Any, kind: str, path: str) -> Any:
    if not isinstance(value, list) or not value or len(value) > MAX_SIZES:
        ld.err(path, value, f"must be a non-empty list of at most {MAX_SIZES} sizes in bytes")
        return None
    good = []
    for i, v in enumerate(value):
        if ld.control(f"{path}[{i}]"):
            continue
        if not isinstance(v, int) or isinstance(v, bool) or v < 4 or v % 4 or v > MAX_SIZE:
            ld.err(f"{path}[{i}]", v, f"must be a size in bytes, a multiple of 4 (float32), at most {MAX_SIZE}")
        else:
            good.append(v)
    return tuple(sorted(set(good)))


def _k_aptlist(ld: _Loader, value: Any, kind: str, path: str) -> Any:
    return ld.items(value, path, _apt_item)


def _k_piplist(ld: _Loader, value: Any, kind: str, path: str) -> Any:
    return ld.items(value, path, _pip_item)


def _k_env(ld: _Loader, value: Any, kind: str, path: str) -> Any:
    if not isinstance(value, dict):
        ld.err(path, value, "must be a mapping of NAME: value")
        return None
    env = []
    for k, v in value.items():
        sub = f"{path}.{k}"
        if ld.control(sub):
            continue
        sv = v if isinstance(v, str) else str(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None
        if not _fits(_ENV_NAME, k, 128):
            ld.err(sub, k, "is not an environment variable name")
        elif k in RESERVED_ENV:
            ld.err(sub, k, "is set by envbuild or the runtime; it cannot be overridden")
        elif sv is None or not _fits(_ENV_VALUE, sv, 1024):
            ld.err(sub, v, "must match [A-Za-z0-9_.,:/@%+=^-]{0,1024} (no spaces or quotes)")
        else:
            env.append((k, sv))
    return tuple(sorted(env))


_SCALARS: dict[str, Callable[[_Loader, Any, str, str], Any]] = {
    "str": _k_str, "release": _k_release, "pyver": _k_release, "image": _k_image, "osid": _k_choice,
    "backend": _k_choice, "variant": _k_variant, "int": _k_int, "posfloat": _k_posfloat, "shm": _k_shm,
    "url": _k_url, "sizes": _k_sizes, "aptlist": _k_aptlist, "piplist": _k_piplist, "env": _k_env,
}


def _apt_item(item: Any) -> tuple[bool, str]:
    if _fits(_APT, item, 260):
        return True, item
    return False, "is not a Debian package name (name or name=version)"


def pip_requirement(item: Any, *, allow_torch: bool = False) -> tuple[bool, str]:
    """Check one pip requirement: ``name[extras] <specifiers>`` only; no URLs, markers or
    options, plain versions. Returns ``(True, canonical string)`` or ``(False, message)``."""
    if not isinstance(item, str) or len(item) > 512 or inputs.has_control(item) or item.strip().startswith("-"):
        return False, "is not a PEP 508 requirement (name[extras] and version specifiers only)"
    try:
        req = Requirement(item)
    except InvalidRequirement:
        return False, "is not a PEP 508 requirement (name[extras] and version specifiers only)"
    if req.url or req.marker:
        return False, "must not carry a URL or an environment marker"
    if not _fits(PIP_NAME, req.name, 128) or not all(_fits(PIP_NAME, e, 128) for e in req.extras):
        return False, "is not a PEP 508 requirement (name[extras] and version specifiers only)"
    for spec in req.specifier:
        if not _fits(_SPEC_VERSION, spec.version, 64):
            return False, "has a version that is not a plain version"
    if not allow_torch and canonicalize_name(req.name) == "torch":
        return False, "torch is pinned by the torch section, not packages.pip"
    return True, str(req)


def _pip_item(item: Any) -> tuple[bool, str]:
    return pip_requirement(item)


# ---------------------------------------------------------------------------- loading
def parse(path: str | Path) -> tuple[Recipe, list[EnvbuildError]]:
    """Load the recipe at ``path`` and validate every field.

    Returns:
        ``(recipe, errors)``: ``errors`` holds one :class:`EnvbuildError` per invalid field
        (exit 2), in document order; the recipe leaves those fields out and names them in
        :attr:`Recipe.invalid`.
    Raises:
        Unreachable: (exit 3) no such file, not a regular file (a FIFO, a device, a
            directory), over :data:`~builder.core.inputs.MAX_RECIPE_BYTES`, unreadable.
        EnvbuildError: (exit 2) not UTF-8, malformed or unbounded YAML (alias bomb,
            complex key, nesting, duplicate key), not a mapping.
    """
    p = Path(path)
    file = str(path)
    text = inputs.read_text(p, inputs.MAX_RECIPE_BYTES, "recipe file")
    data = inputs.load_yaml(text, file)
    if not isinstance(data, dict):
        raise EnvbuildError("a recipe must be a YAML mapping", file=file)
    loader = _Loader(file, dict(inputs.control_char_paths(data)))
    raw = loader.mapping(data, _SCHEMA, "", _REQUIRED_TOP)
    name = p.stem
    if not (len(name) <= MAX_RECIPE_NAME and RECIPE_NAME.fullmatch(name)):
        loader.errors.insert(0, EnvbuildError(
            f"is not named as a recipe: <name>.yaml with a <name> of at most {MAX_RECIPE_NAME} characters "
            "[a-z0-9] joined by '.', '_', '__' or '-' (a docker repository name)", file=file))
    return _build(name, file, raw, frozenset(loader.invalid)), loader.errors


def load(path: str | Path) -> Recipe:
    """Load and validate the recipe at ``path``.

    Returns: a :class:`Recipe`.
    Raises: what :func:`parse` raises; :class:`ManyErrors` (exit 2) listing every invalid field.
    """
    recipe, errors = parse(path)
    if errors:
        raise ManyErrors(errors)
    return recipe


def _certify_settings(cert: dict, cuda: Any) -> CertifySettings:
    ar = cert.get("allreduce") or {}
    ddp = cert.get("ddp") or {}
    th = cert.get("thresholds") or {}
    defaults_ar = AllreduceSettings()
    defaults_c = CertifySettings()
    return CertifySettings(
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


def _build(name: str, file: str, raw: dict, invalid: frozenset[str]) -> Recipe:
    cuda = raw.get("cuda")
    index = raw.get("index") or {}
    packages = raw.get("packages") or {}
    base, os_, torch = raw.get("base") or {}, raw.get("os") or {}, raw.get("torch") or {}
    return Recipe(
        name=name,
        path=file,
        description=raw.get("description") or "",
        base_image=base.get("image"),
        os_id=os_.get("id"),
        os_version=os_.get("version"),
        python=raw.get("python"),
        cuda=cuda.get("version") if cuda else None,
        driver=cuda.get("driver") if cuda else None,
        torch_version=torch.get("version"),
        torch_variant=torch.get("variant"),
        nccl=raw.get("nccl"),
        cudnn=raw.get("cudnn"),
        apt=tuple(packages.get("apt") or ()),
        pip=tuple(packages.get("pip") or ()),
        index_url=index.get("url") or "https://pypi.org/simple",
        torch_index_url=index.get("torch_url"),
        env=tuple(raw.get("env") or ()),
        certify=_certify_settings(raw.get("certify") or {}, cuda),
        invalid=invalid,
    )


#: File name suffixes of a recipe.
SUFFIXES = (".yaml", ".yml")


def find(name_or_path: str, recipes_dir: str | Path = "recipes") -> Path:
    """Resolve ``cpu-torch2`` to ``recipes/cpu-torch2.yaml`` (or ``.yml``); a path ending in
    ``.yaml``/``.yml`` is returned as is (:func:`parse` reads it).

    Raises:
        EnvbuildError: (exit 2) a path or name that is not a recipe (a Dockerfile, a
            Singularity definition, any other file): a recipe is a ``.yaml``/``.yml`` file.
        Unreachable: (exit 3) no recipe of that name under ``recipes_dir`` (the known
            recipes are listed).
    """
    p = Path(name_or_path)
    if p.suffix in SUFFIXES:
        return p
    candidates = [Path(recipes_dir) / f"{name_or_path}{suffix}" for suffix in SUFFIXES]
    is_name = "/" not in name_or_path and RECIPE_NAME.fullmatch(name_or_path) is not None
    if not is_name or (p.is_file() and not any(c.exists() for c in candidates)):
        lower = p.name.lower()
        what = (f"audit a Dockerfile or Singularity definition with `envbuild audit {inputs.escape(name_or_path, 200)}`"
                if lower.endswith(("dockerfile", "containerfile", ".def")) or lower.startswith("dockerfile") else
                "give a recipe name such as cpu-torch2 or a path ending in .yaml")
        raise EnvbuildError(f"is not a recipe: a recipe is a .yaml or .yml file; {what}", file=name_or_path)
    for candidate in candidates:
        if candidate.exists():
            return candidate
    known = sorted({q.stem for s in SUFFIXES for q in Path(recipes_dir).glob(f"*{s}")})
    hint = f"; known recipes: {', '.join(known)}" if known else ""
    raise EnvbuildError(f"no such recipe{hint}", file=str(Path(recipes_dir) / f"{name_or_path}.yaml"),
                        exit_code=ExitCode.UNREACHABLE)
