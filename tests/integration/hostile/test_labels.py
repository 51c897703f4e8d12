"""Hostile image labels: images derived from the session's cpu-torch2 image (its lock and
lock hash intact) with a label that would reach the terminal raw or file the certificate
under another recipe. ``certify`` and ``k8s render`` refuse each (exit 2) in one line naming
the label and its escaped value, before any container starts or any file is written; the
same image with its own labels is read (the twin)."""

from __future__ import annotations

import io
import json
import os
import re
import subprocess
import sys

import pytest

from builder.recipe.lock import lock_hash

from hostile.harness import ROOT

SPOOF = "cpu-torch2\nverdict: PASSED\x1b[2J"
LABELS = {
    "spoof": {"envbuild.recipe": SPOOF},
    "other-recipe": {"envbuild.recipe": "cuda12-torch2"},
    "oci-bidi": {"org.opencontainers.image.title": "\u202eenvbuild/cpu-torch2"},
}


@pytest.fixture(scope="module")
def derived(docker_client, torch_image, session_labels, test_session_id) -> dict[str, str]:
    """``case -> tag`` of images ``FROM torch_image`` with the labels of :data:`LABELS`
    (``twin``: only the session label), labelled with the session (removed at its end)."""
    tags = {}
    lock = json.loads(docker_client.image(torch_image).labels["envbuild.lock"])
    lock["certify"]["nodes"] = 1024  # a valid lock, its hash label made to match
    big = {"envbuild.lock": json.dumps(lock), "envbuild.lock-hash": lock_hash(lock)}
    for case, labels in {**LABELS, "twin": {}, "nodes-1024": big}.items():
        tag = f"envbuild-test/labels-{case}:{test_session_id}"
        docker_client.sdk.images.build(fileobj=io.BytesIO(f"FROM {torch_image}\n".encode()), tag=tag, rm=True,
                                   labels={**session_labels, **labels})
        tags[case] = tag
    return tags


def envbuild(tmp_path, session_labels, *args):
    env = {**os.environ, "ENVBUILD_EXTRA_LABELS": ",".join(f"{k}={v}" for k, v in session_labels.items())}
    return subprocess.run([sys.executable, "-m", "builder.cli", "--images-dir", str(tmp_path / "images"), *args],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)


@pytest.mark.parametrize("command", ["certify", "k8s"])
def test_a_hostile_label_is_refused_in_one_escaped_line(tmp_path, derived, session_labels, command):
    expect = {
        "spoof": r"label envbuild.recipe='cpu-torch2\nverdict: PASSED\x1b[2J' is not one line of at most 4096 "
                 "printable characters",
        "other-recipe": "label envbuild.recipe='cuda12-torch2' is not its lock's recipe 'cpu-torch2'; rebuild the "
                        "image with `envbuild build RECIPE`",
        "oci-bidi": r"label org.opencontainers.image.title='\u202eenvbuild/cpu-torch2' is not one line of at most "
                    "4096 printable characters",
    }
    got = {}
    for case in LABELS:
        argv = (["certify", derived[case]] if command == "certify" else
                ["k8s", "render", derived[case], "--allow-tag", "--out", str(tmp_path / "k8s")])
        r = envbuild(tmp_path, session_labels, *argv)
        got[case] = (r.returncode, r.stderr, "PASSED" in r.stdout, "\x1b" in r.stdout + r.stderr)
        expect[case] = (2, f"error: image: '{derived[case]}' {expect[case]}\n", False, False)
    assert got == expect
    assert not (tmp_path / "images").exists() and not (tmp_path / "k8s").exists()


def test_the_images_own_labels_are_read_twin(tmp_path, derived, session_labels):
    r = envbuild(tmp_path, session_labels, "k8s", "render", derived["twin"], "--allow-tag",
                 "--out", str(tmp_path / "k8s"))
    assert (r.returncode, r.stderr) == (0, "")
    assert (tmp_path / "k8s/job.yaml").is_file()


def test_a_lock_label_of_1024_nodes_starts_nothing(tmp_path, derived, session_labels, docker_client, test_session_id):
    r = envbuild(tmp_path, session_labels, "certify", derived["nodes-1024"])
    assert r.returncode == 3, r.stderr
    assert re.fullmatch(r"error: 1024 local node\(s\) of 1 rank\(s\) are more than this Docker engine runs: at most "
                        r"(\d+) \(4 ranks per CPU of its \d+, 1024 MiB of its \d+ MiB memory per rank\); give "
                        r"--nodes \1 or fewer, or run on a cluster \(--launcher slurm or k8s\)", r.stderr.splitlines()[-1]), r.stderr
    # nothing of this image was created (other tests of this worker's session may have containers)
    assert docker_client.sdk.containers.list(all=True, filters={"ancestor": derived["nodes-1024"]}) == []
