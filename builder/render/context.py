"""The one rendering context, as spack's container writers (``PathContext``): format-neutral parts
once, each format (:data:`FORMATS`) adds its template, so both files describe the same environment.
Byte-deterministic: only the spec and the resolved pins enter (no time, host or site paths)."""

from __future__ import annotations

import json
import shlex
from functools import cached_property
from pathlib import Path
from typing import Any

from builder.core import inputs
from builder.core.errors import EnvbuildError
from builder.core.files import template_environment
from builder.core.paths import DOCKERFILE, SINGULARITY_DEF
from builder.recipe.lock import lock_hash, lock_label
from builder.recipe.model import Lock, LockResolved, Resolved
from builder.recipe.spec import Spec

VENV = "/opt/venv"
WHEELS_DIR = "/run/envbuild/wheels"
SINGULARITY_CA = "/run/envbuild/pip_ca.crt"
#: Where the build writes the hash-pinned requirements (removed in the same RUN).
REQUIREMENTS_TMP = "/tmp/envbuild-requirements.txt"
#: ``SOURCE_DATE_EPOCH`` of every build: 1980-01-01T00:00:00Z, the earliest time a zip (a wheel) can hold. The lock
#: has no date of its own, and a constant keeps the rendered files (and the image tag) a function of the lock alone.
SOURCE_DATE_EPOCH = 315532800


class _UnsafeValue(Exception):
    def __init__(self, value: str) -> None:
        super().__init__(value)
        self.value = value


def _finalize(value: Any) -> Any:
    """jinja2 ``finalize``: refuse a value with a control character, which could start a new instruction or line."""
    text = value if isinstance(value, str) else str(value)
    if inputs.has_control(text):
        raise _UnsafeValue(text)
    return value


def image_env(spec: Spec) -> list[tuple[str, str]]:
    """The image's environment, in order: the venv first, then the recipe's ``env`` by name."""
    env = [("VIRTUAL_ENV", VENV), ("PATH", f"{VENV}/bin:$PATH"), ("PYTHONDONTWRITEBYTECODE", "1"),
           ("PYTHONUNBUFFERED", "1")]
    env.extend(sorted(spec.recipe.env.items()))
    return env


def labels(spec: Spec, lock: Lock) -> list[tuple[str, str]]:
    """Image labels, sorted; ``envbuild.lock`` holds the whole lock so checks can read it from the image alone."""
    r = spec.recipe
    digest = lock_hash(lock)
    out = {"org.opencontainers.image.title": f"envbuild/{spec.name}",
           "org.opencontainers.image.description": r.description or f"envbuild recipe {spec.name}",
           "org.opencontainers.image.base.name": r.base.image,
           "org.opencontainers.image.version": digest.split(":", 1)[1][:12], "envbuild.recipe": spec.name,
           "envbuild.lock-hash": digest, "envbuild.lock": lock_label(lock), "envbuild.os": f"{r.os.id} {r.os.version}",
           "envbuild.python": r.python, "envbuild.torch": spec.torch_local, "envbuild.cuda": spec.cuda or "none",
           "envbuild.nccl": spec.nccl or "none", "envbuild.cudnn": spec.cudnn or "none",
           "envbuild.backend": r.certify.backend, "envbuild.driver.min": spec.driver_min or "none"}
    if isinstance(lock.resolved, LockResolved) and lock.resolved.base.digest:
        out["org.opencontainers.image.base.digest"] = lock.resolved.base.digest
    return sorted(out.items())


def pip_options(spec: Spec, *, torch_index: bool = True) -> list[str]:
    """pip options; without ``torch_index`` the Dockerfile passes the torch index as ``PIP_EXTRA_INDEX_URL``."""
    opts = ["--no-cache-dir", "--disable-pip-version-check", "--index-url", spec.recipe.index.url]
    if torch_index and spec.torch_index_url:
        opts += ["--extra-index-url", spec.torch_index_url]
    opts += ["--find-links", WHEELS_DIR]
    return opts


def site_packages(spec: Spec) -> str:
    return f"{VENV}/lib/python{spec.recipe.python}/site-packages"


#: Uninstalls pip, setuptools and wheel unless another distribution requires them (torch 2.13
#: requires setuptools); a fixed program: no recipe value enters it.
DROP_TOOLS = (
    "import importlib.metadata as m, subprocess, sys; "
    "from pip._vendor.packaging.requirements import Requirement as R; "
    "from pip._vendor.packaging.utils import canonicalize_name as n; "
    "tools = {'pip', 'setuptools', 'wheel'}; "
    "dists = {n(d.metadata['Name']): d for d in m.distributions()}; "
    "need = {n(r.name) for k, d in dists.items() if k not in tools for r in map(R, d.requires or ()) "
    "if not r.marker or r.marker.evaluate({'extra': ''})}; "
    "drop = sorted(tools & set(dists) - need); "
    "print('envbuild: removing', *drop or ['nothing'], flush=True); "
    "drop and subprocess.run([sys.executable, '-m', 'pip', 'uninstall', '-y', '-q', *drop], check=True)"
)


def lean_commands(spec: Spec) -> list[str]:
    """torch's C++ tests go, and pip unless kept; ``.pyc`` files stay (ranks run on a read-only root)."""
    torch = f"{site_packages(spec)}/torch"
    cmds = [f"rm -rf {torch}/test",
            f"if [ -d {torch}/bin ]; then find {torch}/bin -maxdepth 1 -type f "
            r"\( -name 'test_*' -o -name '*Test' \) -delete; fi"]
    if not spec.recipe.packages.keep_pip:
        cmds.append(f'{VENV}/bin/python3 -c "{DROP_TOOLS}"')
    return cmds


def _apt_pinned(names: list[str], pins: dict[str, str]) -> list[str]:
    return [n if "=" in n or n not in pins else f"{n}={pins[n]}" for n in names]


def dockerquote(value: str) -> str:
    """A Dockerfile double-quoted string (``"`` and ``\\`` escaped, ``$`` not expanded)."""
    return json.dumps(value, ensure_ascii=False).replace("$", "\\$")


#: The image definitions, in the order they are written: file name -> template (Apptainer labels stay raw).
FORMATS = {DOCKERFILE: "Dockerfile.j2", SINGULARITY_DEF: "Singularity.def.j2"}


class Context:
    """The format-neutral context of ``spec``."""

    def __init__(self, spec: Spec, resolved: Resolved | None = None) -> None:
        self.spec = spec
        self.resolved = resolved

    @cached_property
    def lock(self) -> Lock:
        return self.spec.lock(self.resolved)

    @property
    def base_image(self) -> str:
        """The base image, pinned ``image@sha256:...`` when resolved."""
        base = self.spec.recipe.base.image
        digest = self.resolved.base.digest if self.resolved else None
        return f"{base}@{digest}" if digest and "@" not in base else base

    @property
    def apt_pins(self) -> dict[str, str]:
        return dict(self.resolved.apt) if self.resolved else {}

    @property
    def pip_locked(self) -> list[str]:
        """One shell word per resolved wheel: ``'name==version --hash=sha256:...'``."""
        wheels = self.resolved.pip if self.resolved else ()
        return [shlex.quote(f"{p.name}=={p.version} " + " ".join(f"--hash={h}" for h in p.hashes))
                for p in sorted(wheels, key=lambda w: w.name)]

    def values(self) -> dict[str, Any]:
        spec, apt = self.spec, self.spec.recipe.packages.apt
        return {
            "recipe": spec.name,
            "recipe_file": Path(spec.path).name,
            "base_image": self.base_image,
            "env": image_env(spec),
            "build_apt": _apt_pinned(sorted({"python3", "python3-venv", *apt}), self.apt_pins),
            "runtime_apt": _apt_pinned(sorted({"python3", *apt}), self.apt_pins),
            "venv": VENV,
            "wheels_dir": WHEELS_DIR,
            "ca_path": SINGULARITY_CA,
            "pip_options": pip_options(spec),
            "pip_options_no_torch_index": pip_options(spec, torch_index=False),
            "torch_index_url": spec.torch_index_url,
            "lean": lean_commands(spec),
            "index_args": [*(["PIP_EXTRA_INDEX_URL"] if spec.torch_index_url else []),
                           *(["PIP_NO_INDEX"] if self.pip_locked else [])],
            "pip_requirements": [shlex.quote(req) for req in sorted(spec.pip_requirements(), key=str.lower)],
            "source_date_epoch": SOURCE_DATE_EPOCH,
            "pip_locked": self.pip_locked,
            "requirements_tmp": REQUIREMENTS_TMP,
            "torch_local": spec.torch_local,
            "labels": labels(spec, self.lock),
        }

    def render(self, template: str) -> bytes:
        """The file's bytes; EnvbuildError (exit 2) naming the template and a value :func:`_finalize` refuses."""
        env = template_environment({"dockerquote": dockerquote}, finalize=_finalize)
        try:
            return env.get_template(template).render(self.values()).encode()
        except _UnsafeValue as e:
            raise EnvbuildError("refusing to write a value with a newline or control character into the template",
                                file=f"builder/render/templates/{template}", value=e.value) from None
