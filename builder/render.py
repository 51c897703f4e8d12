"""Stage 3: render a resolved :class:`~builder.compat.Spec` into image definitions.

One recipe gives, under ``images/<recipe>/``:

- ``Dockerfile`` (template ``templates/Dockerfile.j2``),
- ``Singularity.def`` (template ``templates/Singularity.def.j2``, Apptainer/SingularityCE),
- ``envbuild.lock.json`` (the resolved pins, :meth:`Spec.lock`).

When ``images/<recipe>/envbuild.resolved.json`` exists (written by ``envbuild lock``,
``builder/lock.py``) and was resolved for this very lock, its pins are carried over: the
lock gains the key ``resolved`` (base digest, pip packages with hashes, apt versions),
the base becomes ``image@sha256:...``, apt packages are installed as ``name=version`` and
pip installs ``--require-hashes`` from the resolved list (:func:`load_resolved`,
:func:`render_for`). A resolved file made for another lock is an error, never ignored.

Like spack's container writers, a format-neutral context (packages, environment, labels)
is built once and each format adds only its own details, so both files describe the same
environment. Rendering is byte-deterministic: it depends only on the spec (no time, host,
user or site paths); site options enter at build time (see ``builder/build.py``).
"""

from __future__ import annotations

import json
import re
import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jinja2

from .compat import Spec, lock_bytes, lock_hash
from .errors import EnvbuildError
from .files import template_environment, write_atomic

VENV = "/opt/venv"
WHEELS_DIR = "/run/envbuild/wheels"
SINGULARITY_CA = "/run/envbuild/pip_ca.crt"
FILES = ("Dockerfile", "Singularity.def", "envbuild.lock.json")
#: Input written by ``envbuild lock`` next to the rendered files (not rendered itself).
RESOLVED_FILE = "envbuild.resolved.json"
RESOLVED_SCHEMA = "envbuild.resolved/1"
#: Where the build writes the hash-pinned requirements (removed in the same RUN).
REQUIREMENTS_TMP = "/tmp/envbuild-requirements.txt"

# Closed patterns for every resolved value that reaches a RUN line.
_PIP_NAME = re.compile(r"^[A-Za-z0-9](?:[A-Za-z0-9._-]*[A-Za-z0-9])?$")
_PIP_VERSION = re.compile(r"^[A-Za-z0-9][A-Za-z0-9.+!_-]*$")
_SHA256 = re.compile(r"^sha256:[0-9a-f]{64}$")
_APT_NAME = re.compile(r"^[a-z0-9][a-z0-9+.-]+$")
_APT_VERSION = re.compile(r"^[A-Za-z0-9.+~:-]+$")


@dataclass(frozen=True)
class Rendered:
    """The rendered files of one recipe: ``files`` maps file name -> bytes."""

    recipe: str
    files: dict[str, bytes]


def dockerquote(value: str) -> str:
    """Quote ``value`` as a Dockerfile double-quoted string (``"`` and ``\\`` escaped, ``$`` not expanded)."""
    return json.dumps(value, ensure_ascii=False).replace("$", "\\$")


def _environment() -> jinja2.Environment:
    return template_environment({"dockerquote": dockerquote})


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
    if r.torch_index_url:
        opts += ["--extra-index-url", r.torch_index_url]
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
        "recipe_path": f"recipes/{r.name}.yaml",
        "base_image": base,
        "env": image_env(spec),
        "build_apt": _apt_pinned(["python3", "python3-venv"], pins),
        "runtime_apt": _apt_pinned(["python3", *r.apt], pins),
        "extra_apt": _apt_pinned(list(r.apt), pins),
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
    """Render every file of ``spec``. Returns :class:`Rendered`; raises jinja2 errors only on template bugs.

    ``resolved``: the checked content of ``envbuild.resolved.json`` (:func:`load_resolved`)
    or None (the recipe's pins only).
    """
    env = _environment()
    docker = env.get_template("Dockerfile.j2").render(context(spec, resolved))
    sing = env.get_template("Singularity.def.j2").render(singularity_context(spec, resolved))
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


def check_resolved(doc: Any, spec: Spec, path: str | Path) -> dict[str, Any]:
    """Check a parsed ``envbuild.resolved.json`` against ``spec``; returns it.

    Every value that reaches a RUN line must match a closed pattern: pip names and
    versions (PEP 508/440 characters only), ``sha256:<64 hex>`` hashes, Debian package
    names and versions, the base digest.

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
    if base.get("digest") is not None and not _SHA256.match(str(base["digest"])):
        raise _bad(path, "base.digest", base["digest"], "is not sha256:<64 hex>")
    pip = doc.get("pip") or []
    if not isinstance(pip, list):
        raise _bad(path, "pip", pip, "is not a list")
    for i, p in enumerate(pip):
        if not isinstance(p, dict):
            raise _bad(path, f"pip[{i}]", p, "is not an object")
        if not _PIP_NAME.match(str(p.get("name", ""))):
            raise _bad(path, f"pip[{i}].name", p.get("name"), "is not a package name")
        if not _PIP_VERSION.match(str(p.get("version", ""))):
            raise _bad(path, f"pip[{i}].version", p.get("version"), "is not a version")
        hashes = p.get("hashes")
        if not isinstance(hashes, list) or not hashes:
            raise _bad(path, f"pip[{i}].hashes", hashes, "must list at least one sha256:<hex>")
        for h in hashes:
            if not _SHA256.match(str(h)):
                raise _bad(path, f"pip[{i}].hashes", h, "is not sha256:<64 hex>")
    apt = doc.get("apt") or {}
    if not isinstance(apt, dict):
        raise _bad(path, "apt", apt, "is not an object")
    for name, version in apt.items():
        if not _APT_NAME.match(str(name)):
            raise _bad(path, "apt", name, "is not a Debian package name")
        if not _APT_VERSION.match(str(version)):
            raise _bad(path, f"apt.{name}", version, "is not a Debian version")
    return doc


def load_resolved(spec: Spec, images_dir: str | Path = "images") -> dict[str, Any] | None:
    """Read and check ``images_dir/<recipe>/envbuild.resolved.json``; None when absent.

    Raises:
        EnvbuildError: (exit 2) unreadable JSON, or what :func:`check_resolved` raises.
    """
    path = Path(images_dir) / spec.recipe.name / RESOLVED_FILE
    if not path.is_file():
        return None
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise EnvbuildError(f"not valid JSON: {e}", file=str(path)) from None
    return check_resolved(doc, spec, path)


def write(rendered: Rendered, images_dir: str | Path = "images") -> tuple[Path, list[str]]:
    """Write ``rendered`` to ``images_dir/<recipe>/`` atomically per file (temp file, then rename).

    Returns (the directory, names of the files written). Files whose bytes are unchanged
    are not rewritten.
    """
    out = Path(images_dir) / rendered.recipe
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for name, data in rendered.files.items():
        target = out / name
        if target.exists() and target.read_bytes() == data:
            continue
        written.append(name)
        write_atomic(target, data)
    return out, written


def stale(rendered: Rendered, images_dir: str | Path = "images") -> list[str]:
    """Names of the files under ``images_dir/<recipe>/`` that differ from ``rendered`` (or are missing)."""
    out = Path(images_dir) / rendered.recipe
    return [n for n, data in rendered.files.items() if not (out / n).exists() or (out / n).read_bytes() != data]
