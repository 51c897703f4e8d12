"""Certificates on disk: ``images/<recipe>/certificates/*.json``, and the one to publish.

``envbuild push`` publishes only an image that passed certification: :func:`find_certified`
finds a *passing* certificate for the exact local image (same image ID) and refuses
(exit 2) without one. Certificate files are read bounded (regular files only, at most
:data:`builder.core.inputs.MAX_REPORT_BYTES`, JSON with bounded nesting); a file that cannot
be read or is not an ``envbuild.certificate/1`` document is not a certificate.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import docker
import docker.errors

from builder.core import inputs
from builder.core.errors import EnvbuildError, ExitCode
from builder.core.paths import image_dir

CERTIFICATE_SCHEMA = "envbuild.certificate/1"
#: Labels an image must carry with the certificate's values to be published with it.
_LABELS = (("envbuild.recipe", "recipe"), ("envbuild.lock-hash", "lock_hash"))


def _newest_first(items: list[tuple[Path, dict[str, Any]]]) -> list[tuple[Path, dict[str, Any]]]:
    return sorted(items, key=lambda pc: (str(pc[1].get("finished_at") or ""), pc[0].name), reverse=True)


def certificates(images_dir: str | os.PathLike[str], recipe: str) -> list[tuple[Path, dict[str, Any]]]:
    """``(path, certificate)`` of every readable ``images_dir/<recipe>/certificates/*.json``
    with schema ``envbuild.certificate/1``, newest first (by ``finished_at``)."""
    folder = image_dir(images_dir, recipe).certificates
    out = []
    for path in sorted(folder.glob("*.json")) if folder.is_dir() else []:
        try:
            doc = inputs.read_json(path, inputs.MAX_REPORT_BYTES, "certificate", ExitCode.CHECK_FAILED)
        except EnvbuildError:
            continue
        if isinstance(doc, dict) and doc.get("schema") == CERTIFICATE_SCHEMA:
            out.append((path, doc))
    return _newest_first(out)


def passed(cert: Mapping[str, Any]) -> bool:
    """Whether the certificate's verdict passed."""
    return bool((cert.get("verdict") or {}).get("passed"))


def failures(cert: Mapping[str, Any]) -> str:
    """The verdict's failures in one string (``"verdict failed"`` when it lists none)."""
    return "; ".join((cert.get("verdict") or {}).get("failures") or []) or "verdict failed"


def _of_image(client: docker.DockerClient, certs: list[tuple[Path, dict[str, Any]]], folder: Path, image: str
              ) -> tuple[Any, dict[str, Any], Path]:
    """``image`` and its newest passing certificate (by image ID)."""
    try:
        img = client.images.get(image)
    except docker.errors.ImageNotFound:
        raise EnvbuildError("no such image in the engine", field="image", value=image) from None
    mine = [(p, c) for p, c in certs if (c.get("image") or {}).get("id") == img.id]
    good = [(p, c) for p, c in mine if passed(c)]
    if not good:
        if mine:
            p, c = mine[0]
            raise EnvbuildError(f"refused: image {image} ({img.id[:19]}) failed certification ({failures(c)}); "
                                "fix it and certify again", file=str(p))
        raise EnvbuildError(f"refused: image {image} ({img.id[:19]}) has no certificate; run "
                            f"`envbuild certify {image}` first", file=str(folder))
    path, cert = good[0]
    return img, cert, path


def _newest_present(client: docker.DockerClient, certs: list[tuple[Path, dict[str, Any]]], folder: Path, recipe: str
                    ) -> tuple[Any, dict[str, Any], Path]:
    """The newest passing certificate of ``recipe`` whose image is still in the engine."""
    good = [(p, c) for p, c in certs if passed(c)]
    if not good:
        raise EnvbuildError(f"refused: no passing certificate for recipe {recipe}; run `envbuild make "
                            f"{recipe}` or `envbuild certify IMAGE` first", file=str(folder))
    for path, cert in good:
        try:
            return client.images.get((cert.get("image") or {}).get("id") or ""), cert, path
        except (docker.errors.ImageNotFound, docker.errors.NullResource):
            continue  # removed or rebuilt since it was certified
    path, cert = good[0]
    raise EnvbuildError(f"refused: the certified image {(cert.get('image') or {}).get('id')} is not in "
                        "the engine (removed or rebuilt); build and certify again", file=str(path))


def find_certified(client: docker.DockerClient, images_dir: str | os.PathLike[str], recipe: str,
                   image: str | None = None) -> tuple[Any, dict[str, Any], Path]:
    """The local image to publish and its passing certificate.

    With ``image``: that image, which needs a passing certificate whose ``image.id`` is its
    ID. Without: the newest passing certificate of ``recipe`` whose image is in the engine.

    Returns:
        ``(docker Image, certificate dict, certificate path)``.

    Raises:
        EnvbuildError: (exit 2) refused: no certificate, only failing ones, the image not in
            the engine, or its labels (``envbuild.recipe``, ``envbuild.lock-hash``) differ
            from the certificate's.
    """
    folder = image_dir(images_dir, recipe).certificates
    certs = certificates(images_dir, recipe)
    if image is not None:
        img, cert, path = _of_image(client, certs, folder, image)
    else:
        img, cert, path = _newest_present(client, certs, folder, recipe)
    labels = img.labels or {}
    for key, name in _LABELS:
        want = cert.get(name)
        if labels.get(key) != want:
            raise EnvbuildError(f"refused: image label {key} is {labels.get(key)!r}, the certificate says "
                                f"{want!r}", file=str(path))
    return img, cert, path
