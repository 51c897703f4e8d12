"""The value types of recipe, lock and resolved-pins fields: closed patterns, bounds, messages. Every value that may
reach a ``RUN`` line matches a closed pattern over the *whole* value (``\\A...\\Z``: Python's ``$`` also matches
before a final newline). Package names follow PEP 508 / Debian policy 5.6.1; sizes are docker's 1024-based
``units.RAMInBytes``."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Annotated, Any, Final, Literal

from msgspec import Meta

from builder.core import inputs
from builder.oci import reference

# Closed patterns, each matching a whole value (\A...\Z; use .fullmatch or .match alike).
#: Release-style versions only (no local labels, no epochs): "2.8.0", "12.8", "570.124.06".
RELEASE = re.compile(r"\A[0-9]{1,6}(?:\.[0-9]{1,6}){0,3}\Z")
#: Docker image reference: [registry[:port]/]path[:tag][@sha256:64hex]
#: (distribution/reference grammar, lower-case path).
#: Debian package name (Debian policy 5.6.1) and version (5.6.12), ``name[=version]``.
APT_NAME = re.compile(r"\A[a-z0-9][a-z0-9+.-]{1,127}\Z")
APT_VERSION = re.compile(r"\A[A-Za-z0-9.+~:-]{1,128}\Z")
APT = re.compile(r"\A[a-z0-9][a-z0-9+.-]{1,127}(?:=[A-Za-z0-9.+~:-]{1,128})?\Z")
#: PEP 508 distribution name and a plain PEP 440 version of a specifier.
PIP_NAME = re.compile(r"\A[A-Za-z0-9](?:[A-Za-z0-9._-]{0,126}[A-Za-z0-9])?\Z")
PIP_VERSION = re.compile(r"\A[A-Za-z0-9][A-Za-z0-9.+!_-]{0,63}\Z")
SPEC_VERSION = re.compile(r"\A[0-9][0-9A-Za-z.*+!]{0,63}\Z")
SHA256 = re.compile(r"\Asha256:[0-9a-f]{64}\Z")
URL = re.compile(r"\Ahttps?://[A-Za-z0-9.-]{1,253}(?::[0-9]{1,5})?(?:/[A-Za-z0-9._~/%-]{0,1024})?\Z")
ENV_NAME = re.compile(r"\A[A-Z_][A-Z0-9_]{0,127}\Z")
ENV_VALUE = re.compile(r"\A[A-Za-z0-9_.,:/@%+=^-]{0,1024}\Z")
#: ``/dev/shm`` size in docker syntax: a number and an optional unit k, m or g (1024-based).
SHM_SIZE = re.compile(r"\A[0-9]{1,13}[kmgKMG]?\Z")
#: torch wheel variants: ``cpu`` or ``cu`` and the CUDA version's digits (``cu90``, ``cu128``).
VARIANT = re.compile(r"\A(?:cpu|cu[0-9]{2,3})\Z")
#: The torch wheel version of a lock: a release and the variant, ``2.8.0+cu128``.
TORCH_LOCAL = re.compile(r"\A[0-9]{1,6}(?:\.[0-9]{1,6}){0,3}\+(?:cpu|cu[0-9]{2,3})\Z")
#: A recipe name (its file name without .yaml): one docker repository path component.
RECIPE_NAME = re.compile(r"\A[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*\Z")
MAX_RECIPE_NAME = 64
#: A Python minor version, ``3.11``.
PYTHON_MINOR = re.compile(r"\A3\.[0-9]{1,3}\Z")
#: A wheel file name as pip's report gives it (URL-decoded), a manylinux platform tag.
WHEEL_FILE = re.compile(r"\A[A-Za-z0-9._+~!-]{0,255}\Z")
PLATFORM_TAG = re.compile(r"\A[a-z0-9_]{1,64}\Z")

BACKENDS = ("gloo", "nccl")
#: Largest all-reduce message accepted (64 GiB), in bytes.
MAX_SIZE = 2**36
#: Most all-reduce sizes, apt packages and pip requirements a recipe may list.
MAX_SIZES = 64
MAX_PACKAGES = 1000
#: Most pip lines of a lock: torch, its NCCL pin and the recipe's requirements.
MAX_LOCK_PIP = MAX_PACKAGES + 2
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
#: Schema names of the lock and the resolved-pins documents.
LOCK_SCHEMA: Final = "envbuild.lock/1"
RESOLVED_SCHEMA: Final = "envbuild.resolved/1"


def shm_bytes(text: str) -> int:
    """Bytes of a docker size (``256m`` -> 268435456; k/m/g are 1024-based, docker's
    ``units.RAMInBytes``). ``text`` must match :data:`SHM_SIZE`."""
    unit = text[-1].lower()
    factor = {"k": 1 << 10, "m": 1 << 20, "g": 1 << 30}.get(unit)
    return int(text[:-1]) * factor if factor else int(text)


def control_message(text: str) -> str:
    """The message of a recipe or lock string holding a control character (the first one named)."""
    ch = next((c for c in text if inputs.is_control(c)), "?")
    return (f"holds a control character ({inputs.escape(ch)}); recipe values are printable text on one line "
            "(no newline, tab, escape or bidi control)")


_PEP508 = "is not a PEP 508 requirement (name[extras] and version specifiers only)"

#: A name and one specifier of a plain release (``scipy >= 1.11``), decided without packaging,
#: whose parser imports ``packaging.tags`` (~40-70 ms, most of ``envbuild check``'s budget).
#: Anything else goes through packaging; both give the same canonical string.
SIMPLE_REQUIREMENT = re.compile(
    r"\A([A-Za-z0-9](?:[A-Za-z0-9._-]{0,126}[A-Za-z0-9])?)[ \t]*"
    r"(?:(==|!=|<=|>=|<|>)[ \t]*([0-9]{1,20}(?:\.[0-9]{1,20}){0,9})|(~=)[ \t]*([0-9]{1,20}(?:\.[0-9]{1,20}){1,9}))"
    r"[ \t]*\Z")
_NAME_RUNS = re.compile(r"[-_.]+")


def canonical_name(name: str) -> str:
    """A distribution name normalised as PEP 503 says (runs of ``-``, ``_``, ``.`` become one
    ``-``, lower case): ``packaging.utils.canonicalize_name`` without importing packaging."""
    return _NAME_RUNS.sub("-", name).lower()


def requirement_name(text: str) -> str:
    """The distribution name of a requirement that :func:`pip_requirement` accepted (as written, not canonical). Raises
    ``packaging.requirements.InvalidRequirement`` for text that is not one."""
    m = SIMPLE_REQUIREMENT.fullmatch(text)
    if m:
        return m.group(1)
    from packaging.requirements import Requirement

    return Requirement(text).name


def pip_requirement(item: Any, *, allow_torch: bool = False) -> tuple[bool, str]:
    """Check one pip requirement: ``name[extras] <specifiers>`` only; no URLs, markers or
    options, plain versions. Returns ``(True, canonical string)`` or ``(False, message)``.
    The common form (:data:`SIMPLE_REQUIREMENT`) is decided without importing packaging."""
    if not isinstance(item, str) or len(item) > 512 or inputs.has_control(item) or item.strip().startswith("-"):
        return False, _PEP508
    m = SIMPLE_REQUIREMENT.fullmatch(item)
    if m:
        name, op, version = m.group(1), m.group(2) or m.group(4), m.group(3) or m.group(5)
        if not allow_torch and canonical_name(name) == "torch":
            return False, "torch is pinned by the torch section, not packages.pip"
        return True, f"{name}{op}{version}"
    return _pip_requirement_parsed(item, allow_torch)


def _pip_requirement_parsed(item: str, allow_torch: bool) -> tuple[bool, str]:
    """:func:`pip_requirement` through packaging's PEP 508 parser."""
    from packaging.requirements import InvalidRequirement, Requirement

    try:
        req = Requirement(item)
    except InvalidRequirement:
        return False, _PEP508
    if req.url or req.marker:
        return False, "must not carry a URL or an environment marker"
    if not _fits(PIP_NAME, req.name, 128) or not all(_fits(PIP_NAME, e, 128) for e in req.extras):
        return False, _PEP508
    for spec in req.specifier:
        if not _fits(SPEC_VERSION, spec.version, 64):
            return False, "has a version that is not a plain version"
    if not allow_torch and canonical_name(req.name) == "torch":
        return False, "torch is pinned by the torch section, not packages.pip"
    return True, str(req)


def _fits(regex: re.Pattern[str], value: Any, limit: int) -> bool:
    return isinstance(value, str) and len(value) <= limit and regex.fullmatch(value) is not None


def _recipe_pip(item: Any) -> str | None:
    ok, text = pip_requirement(item)
    return None if ok else text


def _lock_pip(item: Any) -> str | None:
    ok, text = pip_requirement(item, allow_torch=True)
    return None if ok else text


def _python_minor(text: str) -> str | None:
    return None if PYTHON_MINOR.fullmatch(text) else "must be a Python minor version such as '3.11'"


def _shm_range(text: str) -> str | None:
    return None if MIN_SHM_BYTES <= shm_bytes(text) <= MAX_SHM_BYTES else SHM_MESSAGE


def _at_most(limit: int) -> Callable[[list[Any]], tuple[str, str] | None]:
    """A list check: at most ``limit`` items (the value shown as its count, not its items)."""
    def check(items: list[Any]) -> tuple[str, str] | None:
        return (f"lists more than {limit} items", f"<{len(items)} items>") if len(items) > limit else None
    return check


def _not_reserved(name: str) -> str | None:
    return "is set by envbuild or the runtime; it cannot be overridden" if name in RESERVED_ENV else None


def _int_in(low: int, high: int, **more: Any) -> Any:
    return Annotated[int, Meta(ge=low, le=high, extra={"message": f"must be an integer in {low}..{high}"}, **more)]


def _image_ref(value: str) -> str | None:
    """What the pattern cannot say: the name's length, the port range, the IPv6 address."""
    try:
        reference.parse(value)
    except reference.ReferenceError as e:
        return f"is not an image reference: {e.message}"
    return None


def _url_host(value: str) -> str | None:
    """The URL's ``host[:port]`` as a registry's: DNS labels, a port in 1..65535."""
    if reference.is_host(value.split("://", 1)[-1].split("/", 1)[0]):
        return None
    return "is not an http(s) URL: its host is not HOST[:PORT] (a port in 1..65535)"


SHM_MESSAGE = "is not a size from 1m to 1024g such as 1g or 512m"

# ---------------------------------------------------------------------------- the types
Description = Annotated[str, Meta(max_length=MAX_DESCRIPTION, description="one line", extra={
    "message": f"must be one line of at most {MAX_DESCRIPTION} printable characters"})]
Release = Annotated[str, Meta(pattern=RELEASE.pattern, max_length=64, extra={"message": "is not a version"})]
PythonVersion = Annotated[str, Meta(pattern=RELEASE.pattern, max_length=64,
                                    extra={"message": "is not a version", "check": _python_minor})]
ImageRef = Annotated[str, Meta(pattern=reference.PATTERN, max_length=reference.MAX_CHARS, extra={
    "message": "is not an image reference (name[:tag][@sha256:digest])", "check": _image_ref})]
OsId = Annotated[Literal["debian", "ubuntu"], Meta(extra={"message": "is not a supported OS; use debian or ubuntu"})]
Backend = Annotated[Literal["gloo", "nccl"], Meta(extra={"message": f"is not a backend; use {' or '.join(BACKENDS)}"})]
Variant = Annotated[str, Meta(pattern=VARIANT.pattern, max_length=8, extra={
    "message": "is not a torch variant; use cpu or cu and the CUDA digits, such as cu128"})]
KeepPip = Annotated[bool, Meta(description="keep pip (and setuptools) in the image", extra={
    "message": "must be true or false"})]
Url = Annotated[str, Meta(pattern=URL.pattern, max_length=1300, extra={"message": "is not an http(s) URL",
                                                                       "check": _url_host})]
ShmSize = Annotated[str, Meta(pattern=SHM_SIZE.pattern, max_length=16,
                              description="docker size syntax, 1024-based: 1m to 1024g",
                              extra={"message": SHM_MESSAGE, "check": _shm_range})]
Nodes = _int_in(1, 1024)
GpusPerNode = _int_in(0, 64)
Port = _int_in(1, 65535)
TimeoutS = _int_in(1, 604800, description="seconds")
Iters = _int_in(1, 100000)
Warmup = _int_in(0, 10000)
Steps = _int_in(1, 100000)
BatchSize = _int_in(2, 65536)
ImageSize = _int_in(32, 4096, description="pixels per side")
BusbwSize = _int_in(4, MAX_SIZE, description="bytes")
BusbwGbps = Annotated[float, Meta(gt=0, le=MAX_BUSBW_GBPS, description="GB/s (1e9 bytes per second)", extra={
    "message": f"must be a finite number > 0 and at most {MAX_BUSBW_GBPS:g}"})]
Size = Annotated[int, Meta(ge=4, le=MAX_SIZE, multiple_of=4, description="bytes", extra={
    "message": f"must be a size in bytes, a multiple of 4 (float32), at most {MAX_SIZE}"})]
Sizes = Annotated[tuple[Size, ...], Meta(min_length=1, max_length=MAX_SIZES, extra={
    "message": f"must be a non-empty list of at most {MAX_SIZES} sizes in bytes"})]
AptItem = Annotated[str, Meta(pattern=APT.pattern, max_length=260,
                              extra={"message": "is not a Debian package name (name or name=version)"})]
AptList = Annotated[tuple[AptItem, ...], Meta(max_length=MAX_PACKAGES,
                                              extra={"message": "must be a list", "check": _at_most(MAX_PACKAGES)})]
PipItem = Annotated[str, Meta(max_length=512, description="PEP 508: name[extras] and version specifiers only",
                              extra={"message": _PEP508, "check": _recipe_pip})]
PipList = Annotated[tuple[PipItem, ...], Meta(max_length=MAX_PACKAGES,
                                              extra={"message": "must be a list", "check": _at_most(MAX_PACKAGES)})]
LockPipItem = Annotated[str, Meta(max_length=512, description="PEP 508: name[extras] and version specifiers only",
                                  extra={"message": _PEP508, "check": _lock_pip})]
LockPipList = Annotated[tuple[LockPipItem, ...], Meta(max_length=MAX_LOCK_PIP, extra={
    "message": "must be a list", "check": _at_most(MAX_LOCK_PIP)})]
EnvName = Annotated[str, Meta(pattern=ENV_NAME.pattern, max_length=128, extra={
    "message": "is not an environment variable name", "check": _not_reserved})]
EnvValue = Annotated[str, Meta(pattern=ENV_VALUE.pattern, max_length=1024, extra={
    "message": "must match [A-Za-z0-9_.,:/@%+=^-]{0,1024} (no spaces or quotes)"})]
Env = Annotated[dict[EnvName, EnvValue], Meta(extra={"message": "must be a mapping of NAME: value"})]
RecipeName = Annotated[str, Meta(pattern=RECIPE_NAME.pattern, max_length=MAX_RECIPE_NAME,
                                 extra={"message": "is not a recipe name"})]
TorchLocal = Annotated[str, Meta(pattern=TORCH_LOCAL.pattern, max_length=80,
                                 extra={"message": "is not a torch wheel version such as 2.8.0+cu128"})]
PipName = Annotated[str, Meta(pattern=PIP_NAME.pattern, max_length=128, extra={"message": "is not a package name"})]
PipVersion = Annotated[str, Meta(pattern=PIP_VERSION.pattern, max_length=64, extra={"message": "is not a version"})]
Sha256 = Annotated[str, Meta(pattern=SHA256.pattern, max_length=71, extra={"message": "is not sha256:<64 hex>"})]
Hashes = Annotated[tuple[Sha256, ...], Meta(min_length=1, max_length=16,
                                            extra={"message": "must list one to 16 sha256:<hex>"})]
AptName = Annotated[str, Meta(pattern=APT_NAME.pattern, max_length=128,
                              extra={"message": "is not a Debian package name"})]
AptVersion = Annotated[str, Meta(pattern=APT_VERSION.pattern, max_length=128,
                                 extra={"message": "is not a Debian version"})]
AptPins = Annotated[dict[AptName, AptVersion], Meta(max_length=10000, extra={"message": "is not an object"})]
WheelFile = Annotated[str, Meta(pattern=WHEEL_FILE.pattern, max_length=255,
                                extra={"message": "is not a wheel file name"})]
PlatformTag = Annotated[str, Meta(pattern=PLATFORM_TAG.pattern, max_length=64,
                                  extra={"message": "is not a platform tag"})]
#: A line of text envbuild wrote (a note); shown escaped, never rendered.
Note = Annotated[str, Meta(max_length=4000)]
LockSchema = Annotated[Literal["envbuild.lock/1"], Meta(extra={"message": f"is not {LOCK_SCHEMA!r}"})]
ResolvedSchema = Annotated[Literal["envbuild.resolved/1"], Meta(extra={"message": f"is not {RESOLVED_SCHEMA!r}"})]
