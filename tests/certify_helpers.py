"""Certify an image on an engine in one call, for tests: :func:`builder.certify.run.plan` of an
:class:`~builder.certify.source.EngineImage` with the overrides given as keywords, then
:func:`builder.certify.run.run`; the certificate comes back as plain JSON data (as written)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from builder.certify import run
from builder.certify.settings import Overrides
from builder.certify.source import EngineImage


def certify_image(client: Any, image: str, *, images_dir: Any = Path("images"), launcher: Any = None,
                  console: Any = None, run_id: str | None = None, labels: dict[str, str] | None = None,
                  extra_env: dict[str, str] | None = None, gpu_visible: bool | None = None,
                  **overrides: Any) -> tuple[dict[str, Any], Path]:
    """``(certificate as a dict, path)`` of certifying ``image`` on ``client``'s engine;
    ``overrides`` are :class:`~builder.certify.settings.Overrides` fields (``nodes=2``...)."""
    p = run.plan(EngineImage(client, image), Overrides(**overrides), gpu_visible=gpu_visible, run_id=run_id,
                 labels=labels, extra_env=extra_env)
    cert, path = run.run(p, images_dir=images_dir, launcher=launcher, console=console)
    return cert.to_dict(), path
