"""Fixtures of verify --against and gate (issue 11): a real certificate of the cpu-torch2 image
and its parts, changed for injected faults."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

from certify_helpers import certify_image
from fixtures_nodes import set_path


@pytest.fixture(scope="session")
def certificate(docker_client, torch_image, test_labels, tmp_path_factory) -> tuple[dict, Path]:
    """``(certificate, path)``: a real certification of the cpu-torch2 image on one container
    node (gloo), passed."""
    cert, path = certify_image(docker_client, torch_image, images_dir=tmp_path_factory.mktemp("images"),
                               labels=test_labels, nodes=1)
    assert cert["verdict"]["passed"] is True, cert["verdict"]
    return cert, path


def rank_probe(cert: dict) -> dict:
    """The certified rank 0's probe, as a node report."""
    return copy.deepcopy(cert["probe"]["0"])


def write_cert(folder: Path, cert: dict, name: str = "cert.json", **changes) -> str:
    """``cert`` with ``changes`` (dotted paths, :func:`set_path`) written to ``folder/name``."""
    doc = copy.deepcopy(cert)
    for path, value in changes.items():
        set_path(doc, path, value)
    p = folder / name
    p.write_text(json.dumps(doc))
    return str(p)
