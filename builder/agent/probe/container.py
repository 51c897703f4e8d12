"""The container this probe runs in (if any), the runtimes installed here, and the image (named by
whoever starts the probe, through the ``ENVBUILD_IMAGE*`` variables)."""

from __future__ import annotations

import os
import shutil
from typing import Any

from .common import run_text

# Container runtimes asked for their version when on PATH (the host side of a node).
RUNTIME_COMMANDS = (("docker", ("docker", "--version")), ("podman", ("podman", "--version")),
                    ("apptainer", ("apptainer", "--version")), ("singularity", ("singularity", "--version")),
                    ("enroot", ("enroot", "version")))


def parse_version_output(text: str | None) -> str | None:
    """The first dotted version token in ``NAME --version`` output (``20.10.24+dfsg1``), or None."""
    for tok in (text or "").replace(",", " ").split():
        tok = tok[1:] if tok[:1] in "vV" and tok[1:2].isdigit() else tok
        if tok[:1].isdigit() and "." in tok:
            return tok
    return None


def _runtime() -> str | None:
    env = os.environ
    if os.path.exists("/.dockerenv"):
        return "docker"
    if os.path.exists("/run/.containerenv"):
        return "podman"
    if env.get("APPTAINER_CONTAINER") or env.get("APPTAINER_NAME"):
        return "apptainer"
    if env.get("SINGULARITY_CONTAINER") or env.get("SINGULARITY_NAME"):
        return "singularity"
    if env.get("container"):
        return env["container"]  # systemd's convention: lxc, podman, oci, ...
    if env.get("KUBERNETES_SERVICE_HOST"):
        return "kubernetes"
    return None


def container_info(errors: list[str]) -> dict[str, Any]:
    installed = {}
    for name, argv in RUNTIME_COMMANDS:
        if shutil.which(argv[0]) is None:
            continue
        version = parse_version_output(run_text(list(argv)))
        if version is None:
            errors.append("container: `{}` printed no version".format(" ".join(argv)))
        else:
            installed[name] = version
    return {"runtime": _runtime(), "version": os.environ.get("ENVBUILD_RUNTIME_VERSION") or None,
            "installed": installed}


def image_info() -> dict[str, str | None]:
    """From the ``ENVBUILD_IMAGE*`` variables; ``ref`` falls back to ``$APPTAINER_CONTAINER``."""
    env = os.environ
    ref = (env.get("ENVBUILD_IMAGE") or env.get("APPTAINER_CONTAINER") or env.get("SINGULARITY_CONTAINER") or None)
    return {"ref": ref, "digest": env.get("ENVBUILD_IMAGE_DIGEST") or None, "id": env.get("ENVBUILD_IMAGE_ID") or None}
