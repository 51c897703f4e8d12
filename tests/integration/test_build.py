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
import re
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import pytest
from test_build_units import CA_TEXT, LOCK, TINY, TORCH_LOCK, WHEEL, WHEEL_TEXT, site_files, whole, write_rendered  # noqa: F401

from builder.agent import payload
from builder.core.errors import EnvbuildError, Unreachable
from builder.image import bootstrap, build, engine, probecache, reuse
from builder.image.engine import BuildFailed
from builder.image.site import SiteOptions

from factories import CPU_REPORT, node_report
from fixtures_engine import TEST_SESSION_LABEL

ROOT = Path(__file__).resolve().parents[2]

OFFICIAL = "debian:bookworm-slim"
# a Debian tag that exists in no registry: pulling it fails with or without network
UNPULLABLE = "debian:bookworm-envbuild-test-no-such-tag"
BOOTSTRAP = "envbuild/bootstrap-debian:bookworm"
CA_SHA256 = "ce030684f2982fc9c117c4697626122b14d89373f1ee4a7bcc69037eb71a3312"


def expected_tag(folder, name, base_id):
    data = (folder / "envbuild.lock.json").read_bytes() + (folder / "Dockerfile").read_bytes() + base_id.encode()
    return f"envbuild/{name}:{hashlib.sha256(data).hexdigest()[:12]}"


def sh(client, image, command, labels):
    """Run ``sh -c command`` in a throwaway container; (exit code, stdout)."""
    c = client.sdk.containers.create(image, ["sh", "-c", command], labels=labels, network_mode="none")
    try:
        c.start()
        code = c.wait(timeout=120)["StatusCode"]
        return code, c.logs(stdout=True, stderr=False).decode()
    finally:
        c.remove(force=True)


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
    base_id = docker_client.sdk.images.get(BOOTSTRAP).id
    assert result.tag == expected_tag(folder, f"tiny-{test_session_id}", base_id)
    assert (result.base_used, result.base_image_id, result.base_how) == (BOOTSTRAP, base_id, "bootstrapped")
    assert result.mismatches == [] and result.reused is False
    assert result.lock_hash.startswith(result.tag.rsplit(":", 1)[1]) and len(result.lock_hash) == 64
    assert docker_client.sdk.images.get(result.tag).id == result.image_id
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
    return list(client.sdk.events(since=since, until=int(time.time()) + 1, decode=True,
                              filters={"type": "container", "label": f"envbuild.run={run_id}"}))


def test_existing_tag_is_reused_and_checked_again(docker_client, tiny_build, session_labels, tmp_path):
    result, folder, _, _ = tiny_build
    options = build.BuildOptions(recipe=folder.name, images_dir=folder.parent, base_mode="bootstrap",
                                 labels=session_labels, probe_cache=tmp_path / "cache", run_id=uuid.uuid4().hex[:12])
    since = int(time.time()) - 1
    again = build.build(options, docker_client)
    assert (again.reused, again.probe_cached) == (True, False)  # a new cache: probed in a container
    assert again.tag == result.tag
    assert again.image_id == docker_client.sdk.images.get(result.tag).id
    assert again.mismatches == [] and again.probe["torch"]["version"] == "2.13.0+cpu"
    assert [e["status"] for e in probe_containers(docker_client, options.run_id, since)][:2] == ["create", "start"]


def test_no_change_build_decides_from_the_image_id(docker_client, tiny_build, session_labels, tmp_path):
    result, folder, _, _ = tiny_build
    cache = tmp_path / "cache"
    first = build.BuildOptions(recipe=folder.name, images_dir=folder.parent, base_mode="bootstrap",
                               labels=session_labels, probe_cache=cache)
    probed = build.build(first, docker_client)
    image_id = docker_client.sdk.images.get(result.tag).id  # (an earlier test may have rebuilt the tag)
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
    box = docker_client.sdk.containers.create(good.tag, ["true"], labels=session_labels)
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
    docker_client.sdk.api.tag(impostor, repo, tag, force=True)
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
    image = docker_client.sdk.images.get(tag)
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
    assert docker_client.sdk.images.list(name=f"envbuild/{name}") == []

SHADOW = """\
FROM {image}
RUN d="$(python3 -c 'import importlib.util as u; print(u.find_spec("torch").submodule_search_locations[0])')" \\
 && sed -i "s/^__version__\\b.*$/__version__ = '2.99.0+cpu'/" "$d/version.py" \\
 && grep -qx "__version__ = '2.99.0+cpu'" "$d/version.py"
"""


def test_check_reads_the_environment_not_the_labels(docker_client, torch_image, session_labels, test_session_id, tmp_path):
    probe, mismatches = build.check_image(docker_client, torch_image, whole(TORCH_LOCK), labels=session_labels)
    assert mismatches == []
    assert probe["torch"]["version"] == "2.13.0+cpu"

    (tmp_path / "Dockerfile").write_text(SHADOW.format(image=torch_image))
    shadow = f"envbuild-test/shadow-torch:{test_session_id}"
    docker_client.build(tmp_path, shadow, labels=session_labels)
    good_labels = {k: v for k, v in docker_client.sdk.images.get(torch_image).labels.items() if k != TEST_SESSION_LABEL}
    shadow_labels = {k: v for k, v in docker_client.sdk.images.get(shadow).labels.items() if k != TEST_SESSION_LABEL}
    assert shadow_labels == good_labels  # the labels still describe the good image

    probe, mismatches = build.check_image(docker_client, shadow, whole(TORCH_LOCK), labels=session_labels)
    assert mismatches == ["torch.version: lock '2.13.0+cpu', image '2.99.0+cpu'"]


# --------------------------------------------------------------------------- bootstrap


def test_bootstrap_image_is_own_named_and_labelled(docker_client, bootstrap_image, session_labels):
    assert bootstrap_image == BOOTSTRAP
    image = docker_client.sdk.images.get(BOOTSTRAP)
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
    before = docker_client.sdk.images.get(BOOTSTRAP).id
    with pytest.raises(Unreachable) as info:
        bootstrap.bootstrap_debian(docker_client, "bookworm", mirror="http://127.0.0.1:9/debian", rebuild=True)
    assert info.value.exit_code == 3
    assert str(info.value) == (
        "base: 'debian:bookworm-slim' debootstrap could not reach the Debian mirror http://127.0.0.1:9/debian (exit 1)"
        " | output: I: Retrieving InRelease | I: Retrieving Release | E: Failed getting release file "
        "http://127.0.0.1:9/debian/dists/bookworm/Release"
    )
    assert list(tmp_path.iterdir()) == []  # the temporary rootfs is gone
    assert docker_client.sdk.images.get(BOOTSTRAP).id == before  # the existing image is untouched
    assert sorted(t for i in docker_client.sdk.images.list(name="envbuild/bootstrap-debian") for t in i.tags if "importing" in t) == []


def test_resolve_auto_bootstraps_a_debian_base_with_a_warning(docker_client, bootstrap_image):
    warnings = []
    ref, image_id, how = bootstrap.resolve_base(docker_client, UNPULLABLE, "auto", warn=warnings.append, pull_timeout_s=20)
    assert (ref, image_id, how) == (BOOTSTRAP, docker_client.sdk.images.get(BOOTSTRAP).id, "bootstrapped")
    assert len(warnings) == 1
    assert warnings[0].startswith(f"{UNPULLABLE} is not available locally and cannot be pulled (")
    assert warnings[0].endswith(
        "a bootstrapped base envbuild/bootstrap-debian:bookworm (debootstrap minbase of bookworm) "
        "stands in for it: not byte-identical to the official image"
    )


def test_resolve_auto_uses_a_local_image(docker_client, bootstrap_image):
    warnings = []
    got = bootstrap.resolve_base(docker_client, BOOTSTRAP, "auto", warn=warnings.append)
    assert got == (BOOTSTRAP, docker_client.sdk.images.get(BOOTSTRAP).id, "local") and warnings == []


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
    assert got == (python_image, docker_client.sdk.images.get(python_image).id, "explicit")
    with pytest.raises(Unreachable) as info:
        bootstrap.resolve_base(docker_client, OFFICIAL, "local", override="envbuild-test/no-such-image:0")
    assert str(info.value) == "base: 'envbuild-test/no-such-image:0' is not available locally"


def test_resolve_bootstrap_mode_needs_a_debian_base(docker_client):
    with pytest.raises(EnvbuildError) as info:
        bootstrap.resolve_base(docker_client, "ubuntu:24.04", "bootstrap")
    assert info.value.exit_code == 2
    assert str(info.value) == "base: 'ubuntu:24.04' only a debian:<suite> base can be bootstrapped"


def test_engine_inspects_a_local_engine_without_the_sdk(docker_client, bootstrap_image):
    code = ("import sys; from builder.image.engine import Engine; e = Engine(); ref = sys.argv[1]; "
            "print(e.image_id(ref), e.image(ref).labels['envbuild.bootstrap.suite'], "
            "e.inspect_image('envbuild-test/no-such-image:none'), 'docker' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code, bootstrap_image], capture_output=True, text=True, check=True)
    assert out.stdout.split() == [docker_client.sdk.images.get(bootstrap_image).id, "bookworm", "None", "False"]


def test_engine_without_a_socket_is_unreachable(tmp_path):
    for host in ("tcp://127.0.0.1:9", f"unix://{tmp_path}/no.sock"):
        with pytest.raises(Unreachable) as info:
            engine.Engine(5, env={"DOCKER_HOST": host}).inspect_image("debian:bookworm-slim")
        assert (info.value.exit_code, str(info.value).split(" (")[0]) == (3, f"no Docker engine answers at {host}")


def test_build_gate_and_reference_share_the_probe_kept_by_image_id(docker_client, torch_image, monkeypatch, tmp_path):
    from builder.image.probecheck import probe_cached
    from builder.nodes import gate, reference
    from builder.nodes import report as nodereport

    monkeypatch.setenv("ENVBUILD_CACHE_DIR", str(tmp_path))
    doc, cached = probe_cached(docker_client, torch_image)
    assert (cached, probe_cached(docker_client, torch_image)) == (False, (doc, True))
    # a kept document with a mark: whoever reads it answers with the mark, no container runs
    probecache.store(probecache.default_dir(), docker_client.image_id(torch_image), payload.AGENT_DIR,
                     {**doc, "hostname": "kept-by-image-id"})
    assert reference.from_image(torch_image, docker_client).report.hostname == "kept-by-image-id"
    host = nodereport.validate(node_report(CPU_REPORT), "host")
    assert gate.probe_image(torch_image, host, docker_client)[0].hostname == "kept-by-image-id"
    assert probe_cached(docker_client, torch_image, cache_dir=tmp_path / "other")[0]["hostname"] != "kept-by-image-id"


def test_reuse_decides_only_from_local_images(docker_client, tiny_build, session_labels):
    result, folder, _, _ = tiny_build
    df, lock = (folder / "Dockerfile").read_bytes(), (folder / "envbuild.lock.json").read_bytes()
    options = build.BuildOptions(recipe=folder.name, images_dir=folder.parent, base_mode="bootstrap")
    found = reuse.find(options, df, lock, OFFICIAL)
    assert (found.tag, found.base, found.warning) == (
        result.tag, (BOOTSTRAP, docker_client.sdk.images.get(BOOTSTRAP).id, "bootstrapped"), None)
    # auto mode without the official base: the stand-in an earlier build used, with a warning
    auto = reuse.find(dataclasses.replace(options, base_mode="auto"), df, lock, OFFICIAL)
    if docker_client.sdk.images.list(name=OFFICIAL):  # a machine with the official image: it is the base
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
