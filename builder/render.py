"""Stage 3: render a resolved :class:`~builder.compat.Spec` into image definitions.

One recipe gives, under ``images/<recipe>/``:

- ``Dockerfile`` (template ``templates/Dockerfile.j2``),
- ``Singularity.def`` (template ``templates/Singularity.def.j2``, Apptainer/SingularityCE),
- ``envbuild.lock.json`` (the resolved pins, :meth:`Spec.lock`).

Like spack's container writers, a format-neutral context (packages, environment, labels)
is built once and each format adds only its own details, so both files describe the same
environment. Rendering is byte-deterministic: it depends only on the spec (no time, host,
user or site paths); site options enter at build time (see ``builder/build.py``).
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

from .compat import Spec, lock_bytes, lock_hash

VENV = "/opt/venv"
WHEELS_DIR = "/run/envbuild/wheels"
SINGULARITY_CA = "/run/envbuild/pip_ca.crt"
FILES = ("Dockerfile", "Singularity.def", "envbuild.lock.json")


@dataclass(frozen=True)
class Rendered:
    """The rendered files of one recipe: ``files`` maps file name -> bytes."""

    recipe: str
    files: dict[str, bytes]


def dockerquote(value: str) -> str:
    """Quote ``value`` as a Dockerfile double-quoted string (``"`` and ``\\`` escaped, ``$`` not expanded)."""
    return json.dumps(value, ensure_ascii=False).replace("$", "\\$")


def _environment() -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.PackageLoader("builder", "templates"),
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=True,
        autoescape=False,
    )
    env.filters["dockerquote"] = dockerquote
    return env


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


def labels(spec: Spec) -> list[tuple[str, str]]:
    """Image labels (OCI ``org.opencontainers.image.*`` and ``envbuild.*`` pins), sorted by name.

    ``envbuild.lock`` holds the whole lock as compact JSON so that ``certify`` and node
    checks can read the recipe's pins and settings from the image alone.
    """
    r = spec.recipe
    lock = spec.lock()
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
    return sorted(out.items())


def pip_options(spec: Spec) -> list[str]:
    """pip options shared by both formats: no cache, the recipe's indexes, the wheel folder."""
    r = spec.recipe
    opts = ["--no-cache-dir", "--disable-pip-version-check", "--index-url", r.index_url]
    if r.torch_index_url:
        opts += ["--extra-index-url", r.torch_index_url]
    opts += ["--find-links", WHEELS_DIR]
    return opts


def context(spec: Spec) -> dict[str, Any]:
    """The format-neutral rendering context (plain data)."""
    r = spec.recipe
    return {
        "recipe": r.name,
        "recipe_path": f"recipes/{r.name}.yaml",
        "base_image": r.base_image,
        "env": image_env(spec),
        "build_apt": ["python3", "python3-venv"],
        "runtime_apt": ["python3", *r.apt],
        "extra_apt": list(r.apt),
        "venv": VENV,
        "wheels_dir": WHEELS_DIR,
        "ca_path": SINGULARITY_CA,
        "pip_options": pip_options(spec),
        "pip_requirements": [shlex.quote(req) for req in spec.pip_requirements()],
        "torch_local": spec.torch_local,
        "labels": labels(spec),
    }


def singularity_context(spec: Spec) -> dict[str, Any]:
    """Singularity context: label values are written raw (one line each), not JSON-quoted."""
    return context(spec)


def render(spec: Spec) -> Rendered:
    """Render every file of ``spec``. Returns :class:`Rendered`; raises jinja2 errors only on template bugs."""
    env = _environment()
    docker = env.get_template("Dockerfile.j2").render(context(spec))
    sing = env.get_template("Singularity.def.j2").render(singularity_context(spec))
    return Rendered(
        recipe=spec.recipe.name,
        files={
            "Dockerfile": docker.encode(),
            "Singularity.def": sing.encode(),
            "envbuild.lock.json": lock_bytes(spec.lock()),
        },
    )


def write(rendered: Rendered, images_dir: str | Path = "images") -> Path:
    """Write ``rendered`` to ``images_dir/<recipe>/`` atomically per file (temp file, then rename).

    Returns the directory. Files whose bytes are unchanged are not rewritten.
    """
    out = Path(images_dir) / rendered.recipe
    out.mkdir(parents=True, exist_ok=True)
    for name, data in rendered.files.items():
        target = out / name
        if target.exists() and target.read_bytes() == data:
            continue
        fd, tmp = tempfile.mkstemp(dir=out, prefix=f".{name}.")
        try:
            with os.fdopen(fd, "wb") as fh:
                fh.write(data)
            os.chmod(tmp, 0o644)
            os.replace(tmp, target)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
    return out


def stale(rendered: Rendered, images_dir: str | Path = "images") -> list[str]:
    """Names of the files under ``images_dir/<recipe>/`` that differ from ``rendered`` (or are missing)."""
    out = Path(images_dir) / rendered.recipe
    return [n for n, data in rendered.files.items() if not (out / n).exists() or (out / n).read_bytes() != data]
