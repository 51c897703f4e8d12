"""builder/image/build.py, builder/image/bootstrap.py and builder/image/probecheck.py against the real engine.

The build tests use tiny Dockerfiles that follow the rendered-Dockerfile contract (ARG
BASE_IMAGE, the pip_ca secret, the wheels bind mount) on the bootstrapped Debian base,
with a stand-in ``torch`` package (a few lines of Python) instead of real torch, so they
run in seconds. The real probe (builder/agent/probe/) reads the environment in the images.
The test with real torch uses the ``torch_image`` fixture (conftest)."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import re
import shutil
import tempfile
import time
import uuid
from pathlib import Path

import pytest

from builder.agent import payload
from builder.core.errors import EnvbuildError, Unreachable
from builder.image import bootstrap, build, engine, engineapi, probecache, reuse
from builder.image.buildkit import BuildFailed
from builder.image.probecheck import compare_probe_to_lock
from builder.image.site import SiteOptions

from factories import CPU_REPORT, node_report
from fixtures_engine import TEST_SESSION_LABEL

ROOT = Path(__file__).resolve().parents[2]

OFFICIAL = "debian:bookworm-slim"
# a Debian tag that exists in no registry: pulling it fails with or without network
UNPULLABLE = "debian:bookworm-envbuild-test-no-such-tag"
BOOTSTRAP = "envbuild/bootstrap-debian:bookworm"
CA_TEXT = "envbuild-test-ca-MARKER\n"
CA_SHA256 = "ce030684f2982fc9c117c4697626122b14d89373f1ee4a7bcc69037eb71a3312"
WHEEL = "fake_pkg-1.0-py3-none-any.whl"
WHEEL_TEXT = "envbuild-test-wheel-MARKER\n"

LOCK = {
    "recipe": "tiny",
    "python": "3.11",
    "torch": {"version": "2.13.0", "variant": "cpu", "local": "2.13.0+cpu"},
    "cuda": None,
    "nccl": None,
    "os": {"id": "debian", "version_id": "12"},
}

# The contract: ARG BASE_IMAGE first, the pip_ca secret and the wheels bind mount.
TINY = """\
# a test Dockerfile following the rendered-Dockerfile contract
ARG BASE_IMAGE=debian:bookworm-slim
FROM ${{BASE_IMAGE}}
RUN apt-get update && apt-get install -y --no-install-recommends python3 && rm -rf /var/lib/apt/lists/*
LABEL envbuild.torch="2.13.0+cpu"
RUN --mount=type=secret,id=pip_ca --mount=type=bind,source=wheels,target=/run/envbuild/wheels \\
    ls -A /run/envbuild/wheels > /saw-wheels.txt \\
 && if [ -s /run/secrets/pip_ca ]; then sha256sum < /run/secrets/pip_ca > /saw-ca.txt; else echo none > /saw-ca.txt; fi
RUN mkdir /usr/lib/python3/dist-packages/torch \\
 && printf '__version__ = "{torch}"\\nfrom . import version\\n' > /usr/lib/python3/dist-packages/torch/__init__.py \\
 && printf 'cuda = None\\n' > /usr/lib/python3/dist-packages/torch/version.py
"""


def write_rendered(images_dir, name, dockerfile, lock):
    folder = images_dir / name
    folder.mkdir(parents=True)
    (folder / "Dockerfile").write_text(dockerfile)
    (folder / "envbuild.lock.json").write_text(json.dumps({**lock, "recipe": name}, indent=2) + "\n")
    return folder


def expected_tag(folder, name, base_id):
    data = (folder / "envbuild.lock.json").read_bytes() + (folder / "Dockerfile").read_bytes() + base_id.encode()
    return f"envbuild/{name}:{hashlib.sha256(data).hexdigest()[:12]}"


def sh(client, image, command, labels):
    """Run ``sh -c command`` in a throwaway container; (exit code, stdout)."""
    c = client.containers.create(image, ["sh", "-c", command], labels=labels, network_mode="none")
    try:
        c.start()
        code = c.wait(timeout=120)["StatusCode"]
        return code, c.logs(stdout=True, stderr=False).decode()
    finally:
        c.remove(force=True)


@pytest.fixture(scope="module")
def site_files(tmp_path_factory):
    d = tmp_path_factory.mktemp("site")
    (d / "ca.pem").write_text(CA_TEXT)
    (d / "wheels").mkdir()
    (d / "wheels" / WHEEL).write_text(WHEEL_TEXT)
    (d / "wheels" / "notes.txt").write_text("not a wheel\n")
    return d


@pytest.fixture(scope="module")
def tiny_build(docker_client, bootstrap_image, session_labels, test_session_id, site_files, tmp_path_factory):
    """build() of the tiny recipe on the bootstrapped base with a CA bundle and a wheel folder."""
    images = tmp_path_factory.mktemp("images")
    name = f"tiny-{test_session_id}"  # content-addressed tags: keep concurrent sessions apart
    folder = write_rendered(images, name, TINY.format(torch="2.13.0+cpu"), LOCK)
    warnings = []
    lines = []
    site = SiteOptions(ca_bundle=site_files / "ca.pem", wheel_dir=site_files / "wheels")
    options = build.BuildOptions(recipe=name, images_dir=images, site=site, base_mode="bootstrap", labels=session_labels,
                                 probe_cache=tmp_path_factory.mktemp("probe-cache"))
    result = build.build(options, docker_client, warn=warnings.append, on_line=lines.append)
    return result, folder, warnings, lines


# --------------------------------------------------------------------------- build


def test_build_tags_labels_and_checks(docker_client, tiny_build, test_session_id):
    result, folder, warnings, lines = tiny_build
    base_id = docker_client.images.get(BOOTSTRAP).id
    assert result.tag == expected_tag(folder, f"tiny-{test_session_id}", base_id)
    assert (result.base_used, result.base_image_id, result.base_how) == (BOOTSTRAP, base_id, "bootstrapped")
    assert result.mismatches == [] and result.reused is False
    assert result.lock_hash.startswith(result.tag.rsplit(":", 1)[1]) and len(result.lock_hash) == 64
    assert docker_client.images.get(result.tag).id == result.image_id
    assert result.probe["schema"] == "envbuild.probe/1"
    assert (result.probe["torch"]["version"], result.probe["os"]["id"], result.probe["os"]["version_id"]) == ("2.13.0+cpu", "debian", "12")
    labels = result.labels
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", labels["org.opencontainers.image.created"])
    # containers inherit image labels: images must not carry the cleanup labels
    assert "envbuild" not in labels and "envbuild.run" not in labels
    assert labels["envbuild.recipe"] == f"tiny-{test_session_id}"
    assert labels["envbuild.base.used"] == BOOTSTRAP
    assert labels["envbuild.base.image-id"] == base_id
    assert labels["envbuild.bootstrap.stands-for"] == "debian:bookworm-slim"
    assert labels["envbuild.lock.sha256"] == hashlib.sha256((folder / "envbuild.lock.json").read_bytes()).hexdigest()
    assert labels[TEST_SESSION_LABEL] == test_session_id
    assert "org.opencontainers.image.revision" not in labels  # tmp folder: not in a git work tree
    assert warnings == []  # asked for: no warning (auto mode warns, see test_resolve_auto_...)
    assert any(ln.startswith("#") for ln in lines)


def test_wheels_and_ca_are_seen_in_the_build_only(docker_client, tiny_build, session_labels):
    tag = tiny_build[0].tag
    assert sh(docker_client, tag, "cat /saw-wheels.txt", session_labels) == (0, f"{WHEEL}\n")
    assert sh(docker_client, tag, "cat /saw-ca.txt", session_labels) == (0, f"{CA_SHA256}  -\n")
    # BuildKit leaves the mount points as empty folders, nothing in them
    assert sh(docker_client, tag, "find /run/envbuild /run/secrets | sort", session_labels) == (
        0,
        "/run/envbuild\n/run/envbuild/wheels\n/run/secrets\n",
    )
    # neither the CA's nor the wheel's content is anywhere in the image
    grep = "grep -rlsF -e envbuild-test-ca-MARKER -e envbuild-test-wheel-MARKER / --exclude-dir=proc --exclude-dir=sys --exclude-dir=dev"
    assert sh(docker_client, tag, grep, session_labels) == (1, "")


def test_build_without_ca_and_wheels_sees_neither(docker_client, tiny_build, session_labels):
    result, folder, _, _ = tiny_build
    again = build.build(build.BuildOptions(recipe=folder.name, images_dir=folder.parent, base_mode="bootstrap",
                                           labels=session_labels, rebuild=True), docker_client)
    assert again.tag == result.tag and again.image_id != result.image_id
    assert sh(docker_client, again.tag, "cat /saw-wheels.txt", session_labels) == (0, "")
    assert sh(docker_client, again.tag, "cat /saw-ca.txt", session_labels) == (0, "none\n")


def probe_containers(client, run_id, since):
    """The container events of probes labelled ``envbuild.run=<run_id>`` since ``since``."""
    return list(client.events(since=since, until=int(time.time()) + 1, decode=True,
                              filters={"type": "container", "label": f"envbuild.run={run_id}"}))


def test_existing_tag_is_reused_and_checked_again(docker_client, tiny_build, session_labels, tmp_path):
    result, folder, _, _ = tiny_build
    options = build.BuildOptions(recipe=folder.name, images_dir=folder.parent, base_mode="bootstrap",
                                 labels=session_labels, probe_cache=tmp_path / "cache", run_id=uuid.uuid4().hex[:12])
    since = int(time.time()) - 1
    again = build.build(options, docker_client)
    assert (again.reused, again.probe_cached) == (True, False)  # a new cache: probed in a container
    assert again.tag == result.tag
    assert again.image_id == docker_client.images.get(result.tag).id
    assert again.mismatches == [] and again.probe["torch"]["version"] == "2.13.0+cpu"
    assert [e["status"] for e in probe_containers(docker_client, options.run_id, since)][:2] == ["create", "start"]


def test_no_change_build_decides_from_the_image_id(docker_client, tiny_build, session_labels, tmp_path):
    result, folder, _, _ = tiny_build
    cache = tmp_path / "cache"
    first = build.BuildOptions(recipe=folder.name, images_dir=folder.parent, base_mode="bootstrap",
                               labels=session_labels, probe_cache=cache)
    probed = build.build(first, docker_client)
    image_id = docker_client.images.get(result.tag).id  # (an earlier test may have rebuilt the tag)
    assert (probed.probe_cached, probed.image_id) == (False, image_id)
    assert [p.name for p in cache.iterdir()] == [image_id.split(":")[1] + ".json"]
    # pip's configuration is pending and would fail if read (a missing folder); no client given
    site = SiteOptions(wheel_dir=tmp_path / "no-such-folder", pending=True)
    options = dataclasses.replace(first, site=site, run_id=uuid.uuid4().hex[:12])
    since = int(time.time()) - 1
    again = build.build(options)
    assert (again.reused, again.probe_cached, again.tag, again.image_id) == (True, True, result.tag, image_id)
    assert again.probe == probed.probe and again.mismatches == []
    assert again.labels["envbuild.inputs.sha256"] == again.lock_hash
    assert (again.base_used, again.base_how) == (BOOTSTRAP, "bootstrapped")
    assert probe_containers(docker_client, options.run_id, since) == []  # no container started
    # --rebuild never takes the recorded match: it builds (and reads pip's configuration)
    with pytest.raises(EnvbuildError) as info:
        build.build(dataclasses.replace(options, rebuild=True), docker_client)
    assert str(info.value) == f"--wheels: '{tmp_path}/no-such-folder' no such folder"


def test_retagged_or_edited_image_is_probed_again(docker_client, bootstrap_image, session_labels, test_session_id,
                                                  tmp_path):
    name = f"tiny-retag-{test_session_id}"
    write_rendered(tmp_path, name, TINY.format(torch="2.13.0+cpu"), LOCK)
    options = build.BuildOptions(recipe=name, images_dir=tmp_path, base_mode="bootstrap", labels=session_labels,
                                 probe_cache=tmp_path / "cache")
    good = build.build(options, docker_client)
    assert build.build(options, docker_client).probe_cached is True
    repo, tag = good.tag.split(":")
    # edited: a committed copy (same files, one more label) under the same tag: another image ID
    box = docker_client.containers.create(good.tag, ["true"], labels=session_labels)
    try:
        edited = box.commit(repo, tag, changes=["LABEL envbuild.test-edited=1"])
    finally:
        box.remove(force=True)
    again = build.build(options, docker_client)
    assert (again.image_id, again.probe_cached, again.mismatches) == (edited.id, False, [])
    assert build.build(options, docker_client).probe_cached is True
    # retagged: another image (another torch inside) under the tag whose probe matched before
    write_rendered(tmp_path, f"{name}-impostor", TINY.format(torch="2.99.0+cpu"), LOCK)
    with pytest.raises(build.LockMismatch) as info:
        build.build(dataclasses.replace(options, recipe=f"{name}-impostor"), docker_client)
    impostor = info.value.result.image_id
    docker_client.api.tag(impostor, repo, tag, force=True)
    with pytest.raises(build.LockMismatch) as info:
        build.build(options, docker_client)
    assert info.value.result.image_id == impostor and info.value.result.probe_cached is False
    assert info.value.mismatches == ["torch.version: lock '2.13.0+cpu', image '2.99.0+cpu'"]


# The torch index as the rendered Dockerfile hands it to pip: a build argument.
INDEXED = """\
ARG BASE_IMAGE=debian:bookworm-slim
FROM ${{BASE_IMAGE}}
RUN apt-get update && apt-get install -y --no-install-recommends python3 && rm -rf /var/lib/apt/lists/*
ARG PIP_EXTRA_INDEX_URL=https://download.pytorch.org/whl/cpu
RUN --mount=type=bind,source=wheels,target=/run/envbuild/wheels \\
    echo "index=[$PIP_EXTRA_INDEX_URL]" > /saw-index.txt && {fail}true
RUN mkdir /usr/lib/python3/dist-packages/torch \\
 && printf '__version__ = "2.13.0+cpu"\\nfrom . import version\\n' > /usr/lib/python3/dist-packages/torch/__init__.py \\
 && printf 'cuda = None\\n' > /usr/lib/python3/dist-packages/torch/version.py
"""
FULL_LOCK = json.loads((ROOT / "images/cpu-torch2/envbuild.lock.json").read_text())
TORCH_WHEEL = "torch-2.13.0+cpu-cp311-cp311-manylinux_2_28_x86_64.whl"


def test_the_torch_index_is_not_asked_when_the_wheel_folder_holds_torch(docker_client, bootstrap_image,
                                                                         session_labels, test_session_id, tmp_path):
    name = f"tiny-index-{test_session_id}"
    write_rendered(tmp_path, name, INDEXED.format(fail=""), FULL_LOCK)
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    (wheels / TORCH_WHEEL).write_bytes(b"PK")
    options = build.BuildOptions(recipe=name, images_dir=tmp_path, base_mode="bootstrap", labels=session_labels,
                                 site=SiteOptions(wheel_dir=wheels), probe_cache=tmp_path / "cache")
    result = build.build(options, docker_client)
    assert result.notes == [f"torch==2.13.0+cpu from the wheel folder ({TORCH_WHEEL}): pip does not ask the torch "
                            "index https://download.pytorch.org/whl/cpu"]
    assert sh(docker_client, result.tag, "cat /saw-index.txt", session_labels) == (0, "index=[]\n")
    # the twin: a wheel for another Python: the torch index stays
    (wheels / TORCH_WHEEL).rename(wheels / TORCH_WHEEL.replace("cp311", "cp312"))
    result = build.build(dataclasses.replace(options, rebuild=True), docker_client)
    assert result.notes == [f"pip asks the torch index https://download.pytorch.org/whl/cpu: the wheel folder {wheels} "
                            "holds no torch==2.13.0+cpu wheel for cp311 x86_64"]
    assert sh(docker_client, result.tag, "cat /saw-index.txt", session_labels) == (
        0, "index=[https://download.pytorch.org/whl/cpu]\n")


def test_a_failed_build_that_asked_the_torch_index_names_it(docker_client, bootstrap_image, session_labels,
                                                            test_session_id, tmp_path):
    name = f"tiny-index-broken-{test_session_id}"
    write_rendered(tmp_path, name, INDEXED.format(fail="exit 3 && "), FULL_LOCK)
    with pytest.raises(BuildFailed) as info:
        build.build(build.BuildOptions(recipe=name, images_dir=tmp_path, base_mode="bootstrap", labels=session_labels,
                                       probe_cache=tmp_path / "cache"), docker_client)
    assert str(info.value).startswith(
        f"{tmp_path}/{name}/Dockerfile: docker build of {info.value.tag} failed (pip asked the torch index "
        "https://download.pytorch.org/whl/cpu; where it cannot be reached, put the pinned torch wheel into the wheel "
        "folder: --wheels DIR) at step [3/4] RUN --mount=type=bind,source=wheels,target=/run/envbuild/wheels ")
    assert "exit code: 3" in info.value.message and "\n" not in str(info.value)


def test_probe_mismatch_fails_and_keeps_the_image(docker_client, bootstrap_image, session_labels, test_session_id, tmp_path):
    # labels still say 2.13.0+cpu; the environment has another torch
    name = f"tiny-bad-{test_session_id}"
    write_rendered(tmp_path, name, TINY.format(torch="2.99.0+cpu"), LOCK)
    with pytest.raises(build.LockMismatch) as info:
        build.build(build.BuildOptions(recipe=name, images_dir=tmp_path, base_mode="bootstrap", labels=session_labels),
                    docker_client)
    err = info.value
    tag = err.result.tag
    assert err.exit_code == 2
    assert err.mismatches == ["torch.version: lock '2.13.0+cpu', image '2.99.0+cpu'"]
    assert str(err) == (
        f"{tmp_path}/{name}/envbuild.lock.json: image {tag} does not match the lock (1 difference): "
        f"torch.version: lock '2.13.0+cpu', image '2.99.0+cpu'; the image is kept for inspection "
        f"(docker run --rm -it {tag} bash)"
    )
    assert tag.startswith(f"envbuild/{name}:")
    image = docker_client.images.get(tag)
    assert image.labels["envbuild.torch"] == "2.13.0+cpu"


def test_failed_build_leaves_no_tag(docker_client, bootstrap_image, session_labels, test_session_id, tmp_path):
    dockerfile = "ARG BASE_IMAGE=debian:bookworm-slim\nFROM ${BASE_IMAGE}\nRUN echo half-done && exit 3\n"
    name = f"tiny-broken-{test_session_id}"
    write_rendered(tmp_path, name, dockerfile, LOCK)
    with pytest.raises(BuildFailed) as info:
        build.build(build.BuildOptions(recipe=name, images_dir=tmp_path, base_mode="bootstrap", labels=session_labels),
                    docker_client)
    assert info.value.tag.startswith(f"envbuild/{name}:")
    summary, _, output = str(info.value).partition(" | output: ")
    assert summary == (
        f"{tmp_path}/{name}/Dockerfile: docker build of {info.value.tag} failed at step "
        "[2/2] RUN echo half-done && exit 3: executor failed running [/bin/sh -c echo half-done && exit 3]: exit code: 3"
    )
    assert "half-done" in output and "\n" not in str(info.value)
    assert docker_client.images.list(name=f"envbuild/{name}") == []


def test_missing_rendered_files_say_render(tmp_path):
    client = None  # never reached
    with pytest.raises(EnvbuildError) as info:
        build.build(build.BuildOptions(recipe="tiny", images_dir=tmp_path), client)
    assert str(info.value) == f"{tmp_path}/tiny/Dockerfile: missing; run `envbuild render tiny` first"
    (tmp_path / "tiny").mkdir()
    (tmp_path / "tiny" / "Dockerfile").write_text(TINY.format(torch="2.13.0+cpu"))
    with pytest.raises(EnvbuildError) as info:
        build.build(build.BuildOptions(recipe="tiny", images_dir=tmp_path), client)
    assert str(info.value) == f"{tmp_path}/tiny/envbuild.lock.json: missing; run `envbuild render tiny` first"


def test_rendered_files_are_validated(tmp_path):
    folder = write_rendered(tmp_path, "tiny", "FROM debian:bookworm-slim\n", LOCK)
    with pytest.raises(EnvbuildError) as info:
        build.read_rendered("tiny", tmp_path)
    assert str(info.value) == f"{folder}/Dockerfile: ARG BASE_IMAGE: the first instruction must be ARG BASE_IMAGE=<image>"
    (folder / "Dockerfile").write_text("# syntax=docker/dockerfile:1\n\nARG BASE_IMAGE=debian:bookworm-slim\nFROM ${BASE_IMAGE}\n")
    assert build.read_rendered("tiny", tmp_path)[3] == "debian:bookworm-slim"
    (folder / "envbuild.lock.json").write_text(json.dumps({**LOCK, "recipe": "other"}))
    with pytest.raises(EnvbuildError) as info:
        build.read_rendered("tiny", tmp_path)
    assert str(info.value) == (
        f"{folder}/envbuild.lock.json: recipe: 'other' lock is for another recipe than 'tiny'; "
        "run `envbuild render tiny` again"
    )
    (folder / "envbuild.lock.json").write_text(json.dumps({k: v for k, v in LOCK.items() if k != "os"} | {"recipe": "tiny"}))
    with pytest.raises(EnvbuildError) as info:
        build.read_rendered("tiny", tmp_path)
    assert str(info.value) == f"{folder}/envbuild.lock.json: os: missing"


def test_recipe_name_must_suit_an_image_name():
    assert build.image_tag("cpu-torch2", b"L", b"D", "sha256:0")[0] == "envbuild/cpu-torch2:" + hashlib.sha256(b"LDsha256:0").hexdigest()[:12]
    with pytest.raises(EnvbuildError) as info:
        build.image_tag("CPU torch", b"L", b"D", "sha256:0")
    assert str(info.value) == "recipe: 'CPU torch' not usable in an image name (lowercase letters, digits, '.', '_', '-')"


def test_stage_context_links_only_wheels(site_files, tmp_path):
    ctx = tmp_path / "ctx"
    ctx.mkdir()
    (site_files / "wheels" / "link.whl").symlink_to(site_files / "wheels" / WHEEL)
    try:
        staged = build.stage_context(b"ARG BASE_IMAGE=x\n", site_files / "wheels", ctx)
    finally:
        (site_files / "wheels" / "link.whl").unlink()
    assert staged == [WHEEL, "link.whl"]
    assert sorted(p.name for p in (ctx / "wheels").iterdir()) == [WHEEL, "link.whl"]
    assert (ctx / "Dockerfile").read_bytes() == b"ARG BASE_IMAGE=x\n"
    src = os.stat(site_files / "wheels" / WHEEL)
    for name in (WHEEL, "link.whl"):  # hard links to the wheel (same filesystem), no symlinks
        st = os.lstat(ctx / "wheels" / name)
        assert (st.st_ino, st.st_dev) == (src.st_ino, src.st_dev)
    empty = tmp_path / "ctx2"
    empty.mkdir()
    assert build.stage_context(b"", None, empty) == [] and list((empty / "wheels").iterdir()) == []


# --------------------------------------------------------------------------- real torch


TORCH_LOCK = {
    "python": "3.11",
    "torch": {"version": "2.13.0", "variant": "cpu", "local": "2.13.0+cpu"},
    "cuda": None,
    "nccl": None,
    "os": {"id": "debian", "version_id": "12"},
}

SHADOW = """\
FROM {image}
RUN d="$(python3 -c 'import importlib.util as u; print(u.find_spec("torch").submodule_search_locations[0])')" \\
 && sed -i "s/^__version__\\b.*$/__version__ = '2.99.0+cpu'/" "$d/version.py" \\
 && grep -qx "__version__ = '2.99.0+cpu'" "$d/version.py"
"""


def test_check_reads_the_environment_not_the_labels(docker_client, torch_image, session_labels, test_session_id, tmp_path):
    probe, mismatches = build.check_image(docker_client, torch_image, TORCH_LOCK, labels=session_labels)
    assert mismatches == []
    assert probe["torch"]["version"] == "2.13.0+cpu"

    (tmp_path / "Dockerfile").write_text(SHADOW.format(image=torch_image))
    shadow = f"envbuild-test/shadow-torch:{test_session_id}"
    engine.build_image(tmp_path, shadow, labels=session_labels, client=docker_client)
    good_labels = {k: v for k, v in docker_client.images.get(torch_image).labels.items() if k != TEST_SESSION_LABEL}
    shadow_labels = {k: v for k, v in docker_client.images.get(shadow).labels.items() if k != TEST_SESSION_LABEL}
    assert shadow_labels == good_labels  # the labels still describe the good image

    probe, mismatches = build.check_image(docker_client, shadow, TORCH_LOCK, labels=session_labels)
    assert mismatches == ["torch.version: lock '2.13.0+cpu', image '2.99.0+cpu'"]


# --------------------------------------------------------------------------- lockcheck


def probe_doc(**changes):
    """The cpu-torch2 node report of tests/factories.py with top-level ``changes``."""
    return node_report(CPU_REPORT, **changes)


CUDA_LOCK = {
    "python": "3.12",
    "torch": {"version": "2.8.0", "variant": "cu128", "local": "2.8.0+cu128"},
    "cuda": "12.8",
    "nccl": "2.27.3",
    "os": {"id": "ubuntu", "version_id": "24.04"},
}


def cuda_probe(nccl_loaded):
    return probe_doc(
        python={"version": "3.12.3", "executable": "/opt/venv/bin/python3"},
        torch={"version": "2.8.0+cu128", "cuda": "12.8", "cuda_available": True, "cudnn": "91002", "nccl_compiled": "2.27.3"},
        os={"id": "ubuntu", "version_id": "24.04", "pretty_name": "Ubuntu 24.04.2 LTS"},
        nccl={"loaded": nccl_loaded, "found": [], "pip_packages": {}},
    )


def test_lockcheck_matching_probe():
    assert compare_probe_to_lock(probe_doc(), TORCH_LOCK) == []
    nccl = {"version": "2.27.3", "code": 22703, "path": "/x/libnccl.so.2"}
    assert compare_probe_to_lock(cuda_probe(nccl), CUDA_LOCK) == []


def test_lockcheck_names_every_difference():
    probe = probe_doc(
        python={"version": "3.12.1", "executable": "/usr/bin/python3"},
        torch={"version": "2.12.0+cpu", "cuda": "12.6"},
        os={"id": "ubuntu", "version_id": "22.04", "pretty_name": "Ubuntu"},
    )
    assert compare_probe_to_lock(probe, TORCH_LOCK) == [
        "torch.version: lock '2.13.0+cpu', image '2.12.0+cpu'",
        "python.version: lock '3.11', image '3.12.1'",
        "torch.cuda: lock None, image '12.6'",
        "os.id: lock 'debian', image 'ubuntu'",
        "os.version_id: lock '12', image '22.04'",
    ]


def test_lockcheck_torch_missing():
    assert compare_probe_to_lock(probe_doc(torch=None), TORCH_LOCK) == ["torch.version: lock '2.13.0+cpu', image None"]


def test_lockcheck_nccl_only_where_cuda():
    other = {"version": "2.21.5", "code": 22105, "path": "/usr/lib/x86_64-linux-gnu/libnccl.so.2"}
    assert compare_probe_to_lock(cuda_probe(other), CUDA_LOCK) == ["nccl.loaded.version: lock '2.27.3', image '2.21.5'"]
    assert compare_probe_to_lock(cuda_probe(None), CUDA_LOCK) == ["nccl.loaded.version: lock '2.27.3', image None"]
    # a CPU lock ignores whatever NCCL the image has
    assert compare_probe_to_lock(probe_doc(nccl={"loaded": other}), TORCH_LOCK) == []


def test_lockcheck_cuda_compares_major_minor():
    probe = cuda_probe({"version": "2.27.3"})
    probe["torch"]["cuda"] = "12.8.1"
    assert compare_probe_to_lock(probe, CUDA_LOCK) == []
    probe["torch"]["cuda"] = "12.9"
    assert compare_probe_to_lock(probe, CUDA_LOCK) == ["torch.cuda: lock '12.8', image '12.9'"]


# --------------------------------------------------------------------------- bootstrap


def test_bootstrap_image_is_own_named_and_labelled(docker_client, bootstrap_image, session_labels):
    assert bootstrap_image == BOOTSTRAP
    image = docker_client.images.get(BOOTSTRAP)
    assert image.labels == {
        "envbuild.bootstrap.mirror": "http://deb.debian.org/debian",
        "envbuild.bootstrap.stands-for": "debian:bookworm-slim",
        "envbuild.bootstrap.suite": "bookworm",
    }
    assert [t for t in image.tags if t.startswith("debian:")] == []
    assert image.attrs["Config"]["Cmd"] == ["/bin/bash"]
    assert image.attrs["Config"]["Env"] == ["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"]
    out = sh(
        docker_client,
        BOOTSTRAP,
        '. /etc/os-release; echo "$ID $VERSION_ID"; ls -A /var/lib/apt/lists | wc -l; ls /var/cache/apt/archives | grep -c "\\.deb$"',
        session_labels,
    )
    assert out == (1, "debian 12\n0\n0\n")  # grep -c finds nothing: exit 1


def test_bootstrap_reuses_the_existing_image(docker_client, bootstrap_image, tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))  # no debootstrap: reuse must not need it
    assert bootstrap.bootstrap_debian(docker_client, "bookworm") == BOOTSTRAP


def test_bootstrap_without_debootstrap_says_apt_get(docker_client, tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(EnvbuildError) as info:
        bootstrap.bootstrap_debian(docker_client, "envbuild-test-nosuite")
    assert info.value.exit_code == 2
    assert str(info.value) == (
        "base: 'debian:envbuild-test-nosuite-slim' debootstrap is not installed, needed to bootstrap "
        "envbuild/bootstrap-debian:envbuild-test-nosuite standing in for debian:envbuild-test-nosuite-slim; "
        "run `apt-get install debootstrap` (or scripts/setup.sh)"
    )


def test_bootstrap_unreachable_mirror_cleans_up(docker_client, bootstrap_image, tmp_path, monkeypatch):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # where the rootfs goes
    before = docker_client.images.get(BOOTSTRAP).id
    with pytest.raises(Unreachable) as info:
        bootstrap.bootstrap_debian(docker_client, "bookworm", mirror="http://127.0.0.1:9/debian", rebuild=True)
    assert info.value.exit_code == 3
    assert str(info.value) == (
        "base: 'debian:bookworm-slim' debootstrap could not reach the Debian mirror http://127.0.0.1:9/debian (exit 1)"
        " | output: I: Retrieving InRelease | I: Retrieving Release | E: Failed getting release file "
        "http://127.0.0.1:9/debian/dists/bookworm/Release"
    )
    assert list(tmp_path.iterdir()) == []  # the temporary rootfs is gone
    assert docker_client.images.get(BOOTSTRAP).id == before  # the existing image is untouched
    assert sorted(t for i in docker_client.images.list(name="envbuild/bootstrap-debian") for t in i.tags if "importing" in t) == []


def test_resolve_auto_bootstraps_a_debian_base_with_a_warning(docker_client, bootstrap_image):
    warnings = []
    ref, image_id, how = bootstrap.resolve_base(docker_client, UNPULLABLE, "auto", warn=warnings.append, pull_timeout_s=20)
    assert (ref, image_id, how) == (BOOTSTRAP, docker_client.images.get(BOOTSTRAP).id, "bootstrapped")
    assert len(warnings) == 1
    assert warnings[0].startswith(f"{UNPULLABLE} is not available locally and cannot be pulled (")
    assert warnings[0].endswith(
        "a bootstrapped base envbuild/bootstrap-debian:bookworm (debootstrap minbase of bookworm) "
        "stands in for it: not byte-identical to the official image"
    )


def test_resolve_auto_uses_a_local_image(docker_client, bootstrap_image):
    warnings = []
    got = bootstrap.resolve_base(docker_client, BOOTSTRAP, "auto", warn=warnings.append)
    assert got == (BOOTSTRAP, docker_client.images.get(BOOTSTRAP).id, "local") and warnings == []


def test_resolve_non_debian_unpullable_is_unreachable(docker_client):
    with pytest.raises(Unreachable) as info:
        bootstrap.resolve_base(docker_client, "envbuild-test/not-debian:1", "auto", pull_timeout_s=20)
    assert info.value.exit_code == 3
    assert str(info.value).startswith(
        "base: 'envbuild-test/not-debian:1' base image is not available locally and cannot be pulled ("
    )


def test_resolve_local_mode_does_not_pull_or_bootstrap(docker_client):
    with pytest.raises(Unreachable) as info:
        bootstrap.resolve_base(docker_client, UNPULLABLE, "local")
    assert str(info.value) == f"base: {UNPULLABLE!r} base image is not available locally (--base-mode local)"


def test_resolve_override_is_taken_as_is(docker_client, python_image):
    got = bootstrap.resolve_base(docker_client, OFFICIAL, "auto", override=python_image)
    assert got == (python_image, docker_client.images.get(python_image).id, "explicit")
    with pytest.raises(Unreachable) as info:
        bootstrap.resolve_base(docker_client, OFFICIAL, "local", override="envbuild-test/no-such-image:0")
    assert str(info.value) == "base: 'envbuild-test/no-such-image:0' is not available locally"


def test_resolve_bootstrap_mode_needs_a_debian_base(docker_client):
    with pytest.raises(EnvbuildError) as info:
        bootstrap.resolve_base(docker_client, "ubuntu:24.04", "bootstrap")
    assert info.value.exit_code == 2
    assert str(info.value) == "base: 'ubuntu:24.04' only a debian:<suite> base can be bootstrapped"


@pytest.mark.parametrize(
    "ref, suite",
    [
        ("debian:bookworm-slim", "bookworm"),
        ("debian:bookworm", "bookworm"),
        ("docker.io/library/debian:12-slim", "bookworm"),
        ("debian:12.8", "bookworm"),
        ("debian:trixie-20250101-slim", "trixie"),
        ("debian:bookworm-slim@sha256:" + "0" * 64, "bookworm"),
        ("debian:latest", None),
        ("debian", None),
        ("ubuntu:24.04", None),
        ("nvidia/cuda:12.8.1-base-ubuntu24.04", None),
        ("myregistry.example/debian:bookworm", None),
    ],
)
def test_debian_suite(ref, suite):
    assert bootstrap.debian_suite(ref) == suite


# --------------------------------------------------------------------------- no-change build: parts


def test_probe_cache_misses_on_any_other_key(tmp_path):
    agent = tmp_path / "agent"
    shutil.copytree(payload.AGENT_DIR / "probe", agent / "probe", ignore=shutil.ignore_patterns("__pycache__"))
    image_id = "sha256:" + "a" * 64
    doc = {"schema": "envbuild.probe/1", "torch": {"version": "2.13.0+cpu"}}
    cache = tmp_path / "cache"
    assert probecache.load(cache, image_id, b"lock", agent) is None  # nothing recorded
    assert probecache.store(cache, image_id, b"lock", agent, doc) == cache / f"{'a' * 64}.json"
    assert probecache.load(cache, image_id, b"lock", agent) == doc
    assert probecache.load(cache, "sha256:" + "b" * 64, b"lock", agent) is None  # another image
    assert probecache.load(cache, image_id, b"lock2", agent) is None  # another lock
    (agent / "probe" / "__main__.py").write_text((agent / "probe" / "__main__.py").read_text() + "\n# changed\n")
    assert probecache.load(cache, image_id, b"lock", agent) is None  # another probe
    assert probecache.load(cache, "envbuild/x:latest", b"lock", agent) is None  # not an image ID
    (cache / f"{'a' * 64}.json").write_text("{not json")
    assert probecache.load(cache, image_id, b"lock", agent) is None  # malformed: a miss, not an error
    blocked = tmp_path / "file"
    blocked.write_text("")
    assert probecache.store(blocked / "cache", image_id, b"lock", agent, doc) is None  # cannot write: no error


def test_probe_cache_folder_follows_xdg(tmp_path):
    assert probecache.default_dir({"ENVBUILD_CACHE_DIR": "/c", "XDG_CACHE_HOME": "/x"}) == Path("/c/probe-matches")
    assert probecache.default_dir({"XDG_CACHE_HOME": "/x"}) == Path("/x/envbuild/probe-matches")
    assert probecache.default_dir({}) == Path.home() / ".cache/envbuild/probe-matches"


def test_engine_api_speaks_only_to_a_local_socket(docker_client, bootstrap_image, tmp_path):
    assert engineapi.connect({"DOCKER_HOST": "tcp://127.0.0.1:2375"}) is None
    assert engineapi.connect({"DOCKER_HOST": f"unix://{tmp_path}/no.sock"}) is None
    api = engineapi.connect({})
    assert api.inspect_image(bootstrap_image)["Id"] == docker_client.images.get(bootstrap_image).id
    assert api.inspect_image("envbuild-test/no-such-image:none") is None
    assert engineapi.image_labels(api.inspect_image(bootstrap_image))["envbuild.bootstrap.suite"] == "bookworm"
    with pytest.raises(engineapi.EngineAPIError):
        engineapi.EngineAPI(str(tmp_path / "no.sock")).inspect_image(bootstrap_image)


def test_reuse_decides_only_from_local_images(docker_client, tiny_build, session_labels):
    result, folder, _, _ = tiny_build
    df, lock = (folder / "Dockerfile").read_bytes(), (folder / "envbuild.lock.json").read_bytes()
    options = build.BuildOptions(recipe=folder.name, images_dir=folder.parent, base_mode="bootstrap")
    found = reuse.find(options, df, lock, OFFICIAL)
    assert (found.tag, found.base, found.warning) == (
        result.tag, (BOOTSTRAP, docker_client.images.get(BOOTSTRAP).id, "bootstrapped"), None)
    # auto mode without the official base: the stand-in an earlier build used, with a warning
    auto = reuse.find(dataclasses.replace(options, base_mode="auto"), df, lock, OFFICIAL)
    if docker_client.images.list(name=OFFICIAL):  # a machine with the official image: it is the base
        assert auto is None or auto.base[2] == "local"
    else:
        assert auto.tag == result.tag and auto.warning.startswith(f"{OFFICIAL} is not available locally: {result.tag}")
    # a refresh, a base that is not local, another engine: not decided here
    assert reuse.find(dataclasses.replace(options, base_mode="pull"), df, lock, OFFICIAL) is None
    site = SiteOptions(base_override="envbuild-test/no-such-base:none")
    assert reuse.find(dataclasses.replace(options, base_mode="auto", site=site), df, lock, OFFICIAL) is None
    assert reuse.find(dataclasses.replace(options, base_mode="local"), df, lock, UNPULLABLE) is None
    assert reuse.find(dataclasses.replace(options, base_mode="auto"), df, lock, "ubuntu:no-such-tag") is None
    assert reuse.find(options, df + b"# changed\n", lock, OFFICIAL) is None
