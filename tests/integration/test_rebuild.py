"""``envbuild rebuild RECIPE --compare`` (builder/image/rebuild.py) against the session's cpu-torch2 image.

The suite's one uncached build is the module fixture ``rebuilt``: the CLI rebuilds cpu-torch2 from a copy of
its committed rendered files and compares it with the current build of its lock (the session's ``torch_image``):
equal, exit 0. Its failing twin derives an image from the rebuilt one with one file altered and compares it
through ``--rebuilt`` (no second build): exit 2, the file named with its size and sha256 on both sides.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
#: /opt/venv/pyvenv.cfg of the cpu-torch2 image (Debian's Python 3.11.2 venv), and the altered one.
PYVENV = (148, "sha256:e2e1917c2c9734b56e6d3aa50ba1c808a403c4300fe40c37e5bde3175c42bbc2")
CHANGED = (8, "sha256:7f8b1dfc466b6249f06cbe55c9174df2578e7754da793fded244ef5cba2a38f1")


def envbuild(images: Path, *args: str) -> subprocess.CompletedProcess:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("ENVBUILD_")}
    return subprocess.run([sys.executable, "-m", "builder.cli", "--images-dir", str(images), "rebuild", "cpu-torch2",
                           "--compare", "--base-mode", "bootstrap", *args], cwd=ROOT, capture_output=True, text=True,
                          env=clean, timeout=1200)


@pytest.fixture(scope="module")
def images(tmp_path_factory) -> Path:
    """A copy of images/cpu-torch2's rendered files (no certificate: the current build is compared)."""
    folder = tmp_path_factory.mktemp("images")
    shutil.copytree(ROOT / "images/cpu-torch2", folder / "cpu-torch2", ignore=shutil.ignore_patterns("certificates"))
    return folder


@pytest.fixture(scope="module")
def rebuilt(docker_client, torch_image, images):
    """``(process, document)`` of the one uncached rebuild, kept for the twin and removed afterwards."""
    proc = envbuild(images, "--keep", "--json")
    doc = json.loads(proc.stdout) if proc.stdout.startswith("{") else {}
    try:
        yield proc, doc
    finally:
        if doc.get("tag"):
            docker_client.untag(doc["tag"], prune=True)


def test_an_uncached_rebuild_installs_the_same_files_as_the_session_image(docker_client, torch_image, rebuilt):
    proc, doc = rebuilt
    assert proc.returncode == 0, proc.stderr
    c = doc["comparison"]
    assert c["image"] == docker_client.image(torch_image).id and c["source"] == "current"
    assert doc["tag"].startswith("envbuild/cpu-torch2:rebuild-") and doc["image_id"] != c["image"]
    assert c["equal"] is True and c["differing"] == 0 and c["differences"] == []
    assert c["image_tree"]["sha256"] == c["rebuilt_tree"]["sha256"] and c["rebuilt_tree"]["entries"] > 20000
    assert c["method"] == "envbuild.fshash/1" and c["exclusions"][:2] == ["*.pyc", "*/__pycache__/"]
    assert c["rebuilt_tree"]["excluded"]["*.pyc"] > 5000 and c["rebuilt_tree"]["excluded"]["var/log/"] > 0
    assert c["layers"] == 3 and c["layers_equal"] == 1  # the base; the others carry build times
    assert docker_client.image(doc["tag"]).labels["envbuild.rebuild-of"] == c["image"]


def test_a_rebuild_with_one_file_altered_names_that_file(docker_client, torch_image, rebuilt, images, test_labels,
                                                         tmp_path):
    doc = rebuilt[1]
    (tmp_path / "Dockerfile").write_text(f"FROM {doc['tag']}\nRUN printf 'changed\\n' > /opt/venv/pyvenv.cfg\n")
    derived = f"envbuild-test/rebuild-altered:{test_labels['envbuild.test-session']}"
    docker_client.build(tmp_path, derived, labels=test_labels)

    proc = envbuild(images, "--rebuilt", derived, "--json")
    assert proc.returncode == 2, proc.stderr
    c = json.loads(proc.stdout)["comparison"]
    assert c["equal"] is False and c["differing"] == 1 and c["source"] == "current"
    assert c["differences"] == [{"path": "opt/venv/pyvenv.cfg",
                                 "image": {"entry": f"file 0644 0:0 {PYVENV[1]}", "size": PYVENV[0],
                                           "sha256": PYVENV[1]},
                                 "rebuilt": {"entry": f"file 0644 0:0 {CHANGED[1]}", "size": CHANGED[0],
                                             "sha256": CHANGED[1]}}]
    proc = envbuild(images, "--rebuilt", derived, "--against", torch_image)
    assert proc.returncode == 2, proc.stderr
    assert f"  opt/venv/pyvenv.cfg: 148 bytes {PYVENV[1]} -> 8 bytes {CHANGED[1]}" in proc.stdout.splitlines()
    assert "compared with the given image" in proc.stdout
    assert docker_client.image_id(derived)  # given, not ours: kept (the session removes it)
