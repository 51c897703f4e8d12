"""The engine-free tests of tests/integration/test_build.py: builder/image/build.py, builder/image/bootstrap.py and builder/image/probecheck.py against the real engine."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path

import pytest

from builder.agent import payload
from builder.core.documents import NodeReport
from builder.core.errors import EnvbuildError
from builder.core.model import convert
from builder.image import bootstrap, build, probecache, probecheck

from factories import CPU_REPORT, lock_of, node_report

CA_TEXT = "envbuild-test-ca-MARKER\n"
WHEEL = "fake_pkg-1.0-py3-none-any.whl"
WHEEL_TEXT = "envbuild-test-wheel-MARKER\n"

#: The tiny recipe's lock: images/cpu-torch2's (torch 2.13.0+cpu, Python 3.11, Debian 12), whole.
LOCK = {**json.loads((Path(__file__).resolve().parents[2] / "images/cpu-torch2/envbuild.lock.json").read_text()),
        "recipe": "tiny"}

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


@pytest.fixture(scope="module")
def site_files(tmp_path_factory):
    d = tmp_path_factory.mktemp("site")
    (d / "ca.pem").write_text(CA_TEXT)
    (d / "wheels").mkdir()
    (d / "wheels" / WHEEL).write_text(WHEEL_TEXT)
    (d / "wheels" / "notes.txt").write_text("not a wheel\n")
    return d


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
    assert build.read_rendered("tiny", tmp_path)[2].recipe == "tiny"
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
    assert str(info.value) == f"{folder}/envbuild.lock.json: os: is required"


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


def compare_probe_to_lock(probe, lock):
    return probecheck.compare_probe_to_lock(convert(probe, NodeReport), whole(lock))


def whole(partial):
    """The whole lock of ``partial``'s versions (the rest from images/cpu-torch2's)."""
    full = lock_of().to_dict()
    return lock_of(**{**partial, "os": {**full["os"], **partial["os"]}, "torch": {**full["torch"], **partial["torch"]}})


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
        torch={**CPU_REPORT["torch"], "version": "2.12.0+cpu", "cuda": "12.6"},
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
    assert compare_probe_to_lock(probe_doc(nccl={"loaded": other, "found": [], "pip_packages": {}}), TORCH_LOCK) == []


def test_lockcheck_cuda_compares_major_minor():
    probe = cuda_probe({"version": "2.27.3", "code": 22703, "path": "/x/libnccl.so.2"})
    probe["torch"]["cuda"] = "12.8.1"
    assert compare_probe_to_lock(probe, CUDA_LOCK) == []
    probe["torch"]["cuda"] = "12.9"
    assert compare_probe_to_lock(probe, CUDA_LOCK) == ["torch.cuda: lock '12.8', image '12.9'"]


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
    assert probecache.load(cache, image_id, agent) is None  # nothing recorded
    assert probecache.store(cache, image_id, agent, doc) == cache / f"{'a' * 64}.json"
    assert probecache.load(cache, image_id, agent) == doc
    assert probecache.load(cache, "sha256:" + "b" * 64, agent) is None  # another image
    (agent / "probe" / "__main__.py").write_text((agent / "probe" / "__main__.py").read_text() + "\n# changed\n")
    assert probecache.load(cache, image_id, agent) is None  # another probe
    assert probecache.load(cache, "envbuild/x:latest", agent) is None  # not an image ID
    (cache / f"{'a' * 64}.json").write_text("{not json")
    assert probecache.load(cache, image_id, agent) is None  # malformed: a miss, not an error
    blocked = tmp_path / "file"
    blocked.write_text("")
    assert probecache.store(blocked / "cache", image_id, agent, doc) is None  # cannot write: no error


def test_probe_cache_folder_follows_xdg(tmp_path):
    assert probecache.default_dir({"ENVBUILD_CACHE_DIR": "/c", "XDG_CACHE_HOME": "/x"}) == Path("/c/probes")
    assert probecache.default_dir({"XDG_CACHE_HOME": "/x"}) == Path("/x/envbuild/probes")
    assert probecache.default_dir({}) == Path.home() / ".cache/envbuild/probes"

