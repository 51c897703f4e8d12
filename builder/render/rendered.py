"""Stage 3: render a resolved :class:`~builder.recipe.compat.Spec` into image definitions.

One recipe gives, under ``images/<recipe>/``:

- ``Dockerfile`` (template ``templates/Dockerfile.j2``),
- ``Singularity.def`` (template ``templates/Singularity.def.j2``, Apptainer/SingularityCE),
- ``envbuild.lock.json`` (the resolved pins, :meth:`Spec.lock`).

When ``images/<recipe>/envbuild.resolved.json`` exists (written by ``envbuild lock``,
``builder/resolve/lock.py``) and was resolved for this very lock, its pins are carried over: the
lock gains the key ``resolved`` (base digest, pip packages with hashes, apt versions),
the base becomes ``image@sha256:...``, apt packages are installed as ``name=version`` and
pip installs ``--require-hashes`` from the resolved list (:func:`load_resolved`,
:func:`render_for`). A resolved file made for another lock is an error, never ignored.

Like spack's container writers, a format-neutral context (packages, environment, labels)
is built once and each format adds only its own details, so both files describe the same
environment. Rendering is byte-deterministic: it depends only on the spec (no time, host,
user or site paths: the header names the recipe by its file name, ``cpu-torch2.yaml``, not
by the path it was given as); site options enter at build time (see ``builder/image/build.py``).

A second line of defence behind the recipe's closed patterns: every value substituted into
a template passes :func:`_finalize`, which refuses (:class:`~builder.core.errors.EnvbuildError`,
naming the template and the value) any value holding a newline or another control
character, so no value can start a new Dockerfile instruction or shell line. The three
files are written as one set (:func:`write`): all of them or, on any error, none.
"""

from __future__ import annotations

import json
import os
import shlex
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jinja2

from builder.core import inputs
from builder.recipe.compat import Spec, lock_bytes, lock_hash
from builder.core.errors import EnvbuildError, ExitCode
from builder.core.files import template_environment
from builder.recipe.schema import APT_NAME, APT_VERSION, PIP_NAME, PIP_VERSION, SHA256

VENV = "/opt/venv"
WHEELS_DIR = "/run/envbuild/wheels"
SINGULARITY_CA = "/run/envbuild/pip_ca.crt"
FILES = ("Dockerfile", "Singularity.def", "envbuild.lock.json")
#: Input written by ``envbuild lock`` next to the rendered files (not rendered itself).
RESOLVED_FILE = "envbuild.resolved.json"
RESOLVED_SCHEMA = "envbuild.resolved/1"
#: Where the build writes the hash-pinned requirements (removed in the same RUN).
REQUIREMENTS_TMP = "/tmp/envbuild-requirements.txt"

#: Largest ``envbuild.resolved.json`` read, in bytes.
MAX_RESOLVED_BYTES = 4 << 20


@dataclass(frozen=True)
class Rendered:
    """The rendered files of one recipe: ``files`` maps file name -> bytes."""

    recipe: str
    files: dict[str, bytes]


def dockerquote(value: str) -> str:
    """Quote ``value`` as a Dockerfile double-quoted string (``"`` and ``\\`` escaped, ``$`` not expanded)."""
    return json.dumps(value, ensure_ascii=False).replace("$", "\\$")


class _UnsafeValue(Exception):
    """A substituted value holds a control character (raised by :func:`_finalize`)."""

    def __init__(self, value: str) -> None:
        super().__init__(value)
        self.value = value


def _finalize(value: Any) -> Any:
    """jinja2 ``finalize``: every ``{{ ... }}`` output passes here. A value with a newline or
    another control character (:func:`builder.core.inputs.has_control`) is refused: it could end
    a Dockerfile instruction or a ``%post`` line and start one of its own."""
    text = value if isinstance(value, str) else str(value)
    if inputs.has_control(text):
        raise _UnsafeValue(text)
    return value


def _environment() -> jinja2.Environment:
    return template_environment({"dockerquote": dockerquote}, finalize=_finalize)


def _render_template(env: jinja2.Environment, name: str, ctx: dict[str, Any]) -> str:
    """Render template ``name``; raises :class:`EnvbuildError` (exit 2) naming the template
    and the value when :func:`_finalize` refuses one."""
    try:
        return env.get_template(name).render(ctx)
    except _UnsafeValue as e:
        raise EnvbuildError("refusing to write a value with a newline or control character into the template",
                            file=f"builder/render/templates/{name}", value=e.value) from None


def image_env(spec: Spec) -> list[tuple[str, str]]:
    """Environment variables of the image, in order: the venv first, then the recipe's ``env``."""
    env = [
        ("VIRTUAL_ENV", VENV),
        ("PATH", f"{VENV}/bin:$PATH"),
        ("PYTHONDONTWRITEBYTECODE", "1"),
        ("PYTHONUNBUFFERED", "1"),
    ]
    env.extend(spec.recipe.env)
    return env


def labels(spec: Spec, lock: dict[str, Any] | None = None) -> list[tuple[str, str]]:
    """Image labels (OCI ``org.opencontainers.image.*`` and ``envbuild.*`` pins), sorted by name.

    ``envbuild.lock`` holds the whole lock (``lock``, default :meth:`Spec.lock`; with the
    ``resolved`` section when there is one) as compact JSON so that ``certify`` and node
    checks can read the recipe's pins and settings from the image alone.
    """
    r = spec.recipe
    lock = spec.lock() if lock is None else lock
    out = {
        "org.opencontainers.image.title": f"envbuild/{r.name}",
        "org.opencontainers.image.description": r.description or f"envbuild recipe {r.name}",
        "org.opencontainers.image.base.name": r.base_image,
        "org.opencontainers.image.version": lock_hash(lock).split(":", 1)[1][:12],
        "envbuild.recipe": r.name,
        "envbuild.lock-hash": lock_hash(lock),
        "envbuild.lock": json.dumps(lock, sort_keys=True, separators=(",", ":")),
        "envbuild.os": f"{r.os_id} {r.os_version}",
        "envbuild.python": r.python,
        "envbuild.torch": spec.torch_local,
        "envbuild.cuda": spec.cuda or "none",
        "envbuild.nccl": spec.nccl or "none",
        "envbuild.cudnn": spec.cudnn or "none",
        "envbuild.backend": r.certify.backend,
        "envbuild.driver.min": spec.driver_min or "none",
    }
    base_digest = ((lock.get("resolved") or {}).get("base") or {}).get("digest")
    if base_digest:
        out["org.opencontainers.image.base.digest"] = base_digest
    return sorted(out.items())


def pip_options(spec: Spec) -> list[str]:
    """pip options shared by both formats: no cache, the recipe's indexes, the wheel folder."""
    r = spec.recipe
    opts = ["--no-cache-dir", "--disable-pip-version-check", "--index-url", r.index_url]
    if spec.torch_index_url:
        opts += ["--extra-index-url", spec.torch_index_url]
    opts += ["--find-links", WHEELS_DIR]
    return opts


def _apt_pinned(names: list[str], pins: dict[str, str]) -> list[str]:
    """``name`` -> ``name=version`` where ``pins`` has a version (``name=version`` kept)."""
    return [n if "=" in n or n not in pins else f"{n}={pins[n]}" for n in names]


def full_lock(spec: Spec, resolved: dict[str, Any] | None = None) -> dict[str, Any]:
    """:meth:`Spec.lock` plus, when ``resolved`` is given, the key ``resolved``:
    ``{"base": {"ref", "digest"}, "pip": [{"name", "version", "hashes"}], "apt": {name: version}}``."""
    lock = spec.lock()
    if resolved:
        lock["resolved"] = {
            "base": {"ref": resolved["base"].get("ref"), "digest": resolved["base"].get("digest")},
            "pip": [{"name": p["name"], "version": p["version"], "hashes": list(p["hashes"])}
                    for p in resolved.get("pip") or []],
            "apt": dict(sorted((resolved.get("apt") or {}).items())),
        }
    return lock


def context(spec: Spec, resolved: dict[str, Any] | None = None) -> dict[str, Any]:
    """The format-neutral rendering context (plain data); ``resolved`` from :func:`load_resolved`."""
    r = spec.recipe
    lock = full_lock(spec, resolved)
    pins = dict((resolved or {}).get("apt") or {})
    base = r.base_image
    base_digest = ((resolved or {}).get("base") or {}).get("digest")
    if base_digest and "@" not in base:
        base = f"{base}@{base_digest}"
    pip_locked = [
        shlex.quote(f"{p['name']}=={p['version']} " + " ".join(f"--hash={h}" for h in p["hashes"]))
        for p in (resolved or {}).get("pip") or []
    ]
    return {
        "recipe": r.name,
        "recipe_file": Path(r.path).name,
        "base_image": base,
        "env": image_env(spec),
        "build_apt": _apt_pinned(["python3", "python3-venv", *r.apt], pins),
        "runtime_apt": _apt_pinned(["python3", *r.apt], pins),
        "venv": VENV,
        "wheels_dir": WHEELS_DIR,
        "ca_path": SINGULARITY_CA,
        "pip_options": pip_options(spec),
        "pip_requirements": [shlex.quote(req) for req in spec.pip_requirements()],
        "pip_locked": pip_locked,
        "requirements_tmp": REQUIREMENTS_TMP,
        "torch_local": spec.torch_local,
        "labels": labels(spec, lock),
    }


def singularity_context(spec: Spec, resolved: dict[str, Any] | None = None) -> dict[str, Any]:
    """Singularity context: label values are written raw (one line each), not JSON-quoted."""
    return context(spec, resolved)


def render(spec: Spec, resolved: dict[str, Any] | None = None) -> Rendered:
    """Render every file of ``spec``. Returns :class:`Rendered`; raises :class:`EnvbuildError`
    (exit 2) for a value :func:`_finalize` refuses, jinja2 errors only on template bugs.

    ``resolved``: the checked content of ``envbuild.resolved.json`` (:func:`load_resolved`)
    or None (the recipe's pins only).
    """
    env = _environment()
    docker = _render_template(env, "Dockerfile.j2", context(spec, resolved))
    sing = _render_template(env, "Singularity.def.j2", singularity_context(spec, resolved))
    return Rendered(
        recipe=spec.recipe.name,
        files={
            "Dockerfile": docker.encode(),
            "Singularity.def": sing.encode(),
            "envbuild.lock.json": lock_bytes(full_lock(spec, resolved)),
        },
    )


def render_for(spec: Spec, images_dir: str | Path = "images") -> Rendered:
    """:func:`render` with the resolved pins of ``images_dir/<recipe>/envbuild.resolved.json``
    when that file exists. Raises what :func:`load_resolved` raises."""
    return render(spec, load_resolved(spec, images_dir))


def _bad(path: Path, field: str, value: object, message: str) -> EnvbuildError:
    return EnvbuildError(message, file=str(path), field=field, value=value)


def _fits(regex, value: Any, limit: int = 128) -> bool:
    return isinstance(value, str) and len(value) <= limit and regex.fullmatch(value) is not None


def check_resolved(doc: Any, spec: Spec, path: str | Path) -> dict[str, Any]:
    """Check a parsed ``envbuild.resolved.json`` against ``spec``; returns it.

    Every value that reaches a RUN line must match a closed pattern over the whole value:
    pip names and versions (PEP 508/440 characters only), ``sha256:<64 hex>`` hashes,
    Debian package names and versions, the base digest; strings only (no number standing
    in for a version).

    Raises:
        EnvbuildError: (exit 2) one line naming the file, the field and the value: wrong
            schema or recipe; ``lock_hash`` differs from the recipe's lock (the recipe
            changed since ``envbuild lock``); a malformed entry.
    """
    path = Path(path)
    if not isinstance(doc, dict):
        raise _bad(path, "schema", type(doc).__name__, "is not a JSON object")
    if doc.get("schema") != RESOLVED_SCHEMA:
        raise _bad(path, "schema", doc.get("schema"), f"is not {RESOLVED_SCHEMA!r}")
    if doc.get("recipe") != spec.recipe.name:
        raise _bad(path, "recipe", doc.get("recipe"), f"is not this recipe ({spec.recipe.name!r})")
    want = lock_hash(spec.lock())
    if doc.get("lock_hash") != want:
        raise _bad(path, "lock_hash", doc.get("lock_hash"),
                   f"was resolved for another lock (now {want}): the recipe changed; run "
                   f"`envbuild lock {spec.recipe.name}` again or delete the file")
    base = doc.get("base")
    if not isinstance(base, dict):
        raise _bad(path, "base", base, "is not an object")
    if base.get("digest") is not None and not _fits(SHA256, base["digest"], 80):
        raise _bad(path, "base.digest", base["digest"], "is not sha256:<64 hex>")
    _check_resolved_pip(doc.get("pip") or [], path)
    apt = doc.get("apt") or {}
    if not isinstance(apt, dict):
        raise _bad(path, "apt", apt, "is not an object")
    for name, version in apt.items():
        if not _fits(APT_NAME, name):
            raise _bad(path, "apt", name, "is not a Debian package name")
        if not _fits(APT_VERSION, version):
            raise _bad(path, f"apt.{name}", version, "is not a Debian version")
    return doc


def _check_resolved_pip(pip: Any, path: Path) -> None:
    if not isinstance(pip, list):
        raise _bad(path, "pip", pip, "is not a list")
    for i, p in enumerate(pip):
        if not isinstance(p, dict):
            raise _bad(path, f"pip[{i}]", p, "is not an object")
        if not _fits(PIP_NAME, p.get("name")):
            raise _bad(path, f"pip[{i}].name", p.get("name"), "is not a package name")
        if not _fits(PIP_VERSION, p.get("version"), 64):
            raise _bad(path, f"pip[{i}].version", p.get("version"), "is not a version")
        hashes = p.get("hashes")
        if not isinstance(hashes, list) or not 0 < len(hashes) <= 16:
            raise _bad(path, f"pip[{i}].hashes", hashes, "must list one to 16 sha256:<hex>")
        for h in hashes:
            if not _fits(SHA256, h, 80):
                raise _bad(path, f"pip[{i}].hashes", h, "is not sha256:<64 hex>")


def load_resolved(spec: Spec, images_dir: str | Path = "images") -> dict[str, Any] | None:
    """Read and check ``images_dir/<recipe>/envbuild.resolved.json``; None when absent.

    Raises:
        Unreachable: (exit 3) not a regular file, over :data:`MAX_RESOLVED_BYTES`, unreadable.
        EnvbuildError: (exit 2) not valid (bounded) JSON, or what :func:`check_resolved` raises.
    """
    path = Path(images_dir) / spec.recipe.name / RESOLVED_FILE
    if not os.path.lexists(path):
        return None
    doc = inputs.read_json(path, MAX_RESOLVED_BYTES, "resolved-pins file", ExitCode.CHECK_FAILED)
    return check_resolved(doc, spec, path)


def write(rendered: Rendered, images_dir: str | Path = "images") -> tuple[Path, list[str]]:
    """Write ``rendered`` to ``images_dir/<recipe>/`` as one set: every changed file is
    first written in full to a temporary file in that folder (fsync'd), and only when all
    of them are written are they renamed over the old ones (``os.replace``, atomic each;
    a rename in the same folder needs no space). On any error while writing (a full disk)
    the temporary files are removed and the old set is left as it was.

    Returns (the directory, names of the files written); files whose bytes are unchanged
    are not rewritten.

    Raises:
        Unreachable: (exit 3) the folder or a file cannot be written (a full disk, no
            permission), naming the file.
    """
    out = Path(images_dir) / rendered.recipe
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise EnvbuildError(f"cannot create the folder: {e.strerror or e}", file=str(out),
                            exit_code=ExitCode.UNREACHABLE) from None
    changed = [(name, data) for name, data in rendered.files.items() if _current(out / name) != data]
    temps: list[tuple[str, Path, Path]] = []
    try:
        for name, data in changed:
            target = out / name
            temps.append((name, _write_temp(target, data), target))
        for name, tmp, target in temps:
            try:
                os.replace(tmp, target)
            except OSError as e:
                raise _unwritable(target, e) from None
    finally:
        for _name, tmp, _target in temps:
            Path(tmp).unlink(missing_ok=True)
    return out, [name for name, _data in changed]


def _current(path: Path) -> bytes | None:
    try:
        return path.read_bytes() if path.is_file() else None
    except OSError:
        return None


def _unwritable(path: Path, e: OSError) -> EnvbuildError:
    return EnvbuildError(f"cannot write: {e.strerror or e}", file=str(path), exit_code=ExitCode.UNREACHABLE)


def _write_temp(target: Path, data: bytes, mode: int = 0o644) -> Path:
    """``data`` in a new temporary file next to ``target`` (fsync'd, ``mode``); its path.
    Raises :class:`EnvbuildError` (exit 3) naming ``target``; nothing is left behind."""
    try:
        fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp")
    except OSError as e:
        raise _unwritable(target, e) from None
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.chmod(tmp, mode)
    except BaseException as e:
        Path(tmp).unlink(missing_ok=True)
        if isinstance(e, OSError):
            raise _unwritable(target, e) from None
        raise
    return Path(tmp)


def stale(rendered: Rendered, images_dir: str | Path = "images") -> list[str]:
    """Names of the files under ``images_dir/<recipe>/`` that differ from ``rendered`` (or are missing)."""
    out = Path(images_dir) / rendered.recipe
    return [n for n, data in rendered.files.items() if _current(out / n) != data]
