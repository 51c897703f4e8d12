"""Certificates on disk (``images/<recipe>/certificates/*.json``) and the one to publish.
A file that cannot be read bounded or is not an ``envbuild.certificate/1`` or ``/2`` document is not a certificate."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from builder.core import inputs
from builder.core.certificate import CERT_SCHEMAS
from builder.core.errors import EnvbuildError, ExitCode
from builder.core.paths import image_dir
from builder.image.engine import Engine, Image

#: Labels an image must carry with the certificate's values (label, field): push and pull check them.
CERT_LABELS = (("envbuild.recipe", "recipe"), ("envbuild.lock-hash", "lock_hash"))


def certificates(images_dir: str | os.PathLike[str], recipe: str) -> list[tuple[Path, dict[str, Any]]]:
    """``(path, certificate)`` of every readable certificate of ``recipe``, newest first."""
    folder = image_dir(images_dir, recipe).certificates
    out = []
    for path in sorted(folder.glob("*.json")) if folder.is_dir() else []:
        try:
            doc = inputs.read_json(path, inputs.MAX_REPORT_BYTES, "certificate", ExitCode.CHECK_FAILED)
        except EnvbuildError:
            continue
        if isinstance(doc, dict) and doc.get("schema") in CERT_SCHEMAS:
            out.append((path, doc))
    return sorted(out, key=lambda pc: (str(pc[1].get("finished_at") or ""), pc[0].name), reverse=True)


def passed(cert: Mapping[str, Any]) -> bool:
    return bool((cert.get("verdict") or {}).get("passed"))


def failures(cert: Mapping[str, Any]) -> str:
    """The verdict's failures in one string."""
    return "; ".join((cert.get("verdict") or {}).get("failures") or []) or "verdict failed"


def _of_image(client: Engine, certs: list[tuple[Path, dict[str, Any]]], folder: Path, image: str
              ) -> tuple[Image, dict[str, Any], Path]:
    img = client.image(image)
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


def _newest_present(client: Engine, certs: list[tuple[Path, dict[str, Any]]], folder: Path, recipe: str
                    ) -> tuple[Image, dict[str, Any], Path]:
    """The newest passing certificate of ``recipe`` whose image is still in the engine."""
    good = [(p, c) for p, c in certs if passed(c)]
    if not good:
        raise EnvbuildError(f"refused: no passing certificate for recipe {recipe}; run `envbuild make "
                            f"{recipe}` or `envbuild certify IMAGE` first", file=str(folder))
    for path, cert in good:
        image_id = (cert.get("image") or {}).get("id")
        img = client.inspect_image(image_id) if isinstance(image_id, str) and image_id else None
        if img is not None:  # else removed or rebuilt since it was certified
            return img, cert, path
    path, cert = good[0]
    raise EnvbuildError(f"refused: the certified image {(cert.get('image') or {}).get('id')} is not in "
                        "the engine (removed or rebuilt); build and certify again", file=str(path))


def find_certified(client: Engine, images_dir: str | os.PathLike[str], recipe: str,
                   image: str | None = None) -> tuple[Image, dict[str, Any], Path]:
    """``(image, certificate, path)``: ``image`` (else ``recipe``'s newest) and its passing certificate.
    Raises EnvbuildError (exit 2) when there is none, the image is gone, or its recipe and
    lock-hash labels differ from the certificate's."""
    folder = image_dir(images_dir, recipe).certificates
    certs = certificates(images_dir, recipe)
    if image is not None:
        img, cert, path = _of_image(client, certs, folder, image)
    else:
        img, cert, path = _newest_present(client, certs, folder, recipe)
    labels = img.labels
    for key, name in CERT_LABELS:
        want = cert.get(name)
        if labels.get(key) != want:
            raise EnvbuildError(f"refused: image label {key} is {labels.get(key)!r}, the certificate says "
                                f"{want!r}", file=str(path))
    return img, cert, path
