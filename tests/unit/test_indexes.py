"""builder/image/indexes.py: which indexes a build asks, from the wheel folder's real files
(names and contents written by the test) and the committed cpu-torch2 lock."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import msgspec
import pytest

from builder.image import indexes
from builder.recipe.lock import validate_lock
from builder.recipe.model import LockResolved, PinnedWheel

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILE = (ROOT / "images/cpu-torch2/Dockerfile").read_bytes()
LOCKED_DOCKERFILE = (ROOT / "tests/golden/golden-locked/Dockerfile").read_bytes()
TORCH_WHEEL = "torch-2.13.0+cpu-cp311-cp311-manylinux_2_28_x86_64.whl"
TORCH_URL = "https://download.pytorch.org/whl/cpu"


@pytest.fixture(scope="module")
def lock():
    return validate_lock(json.loads((ROOT / "images/cpu-torch2/envbuild.lock.json").read_text()), "lock")


def wheel_folder(tmp_path: Path, *names: str, content: bytes = b"PK") -> Path:
    folder = tmp_path / "wheels"
    folder.mkdir(parents=True, exist_ok=True)
    for name in names:
        (folder / name).write_bytes(content)
    return folder


def test_the_pinned_torch_wheel_makes_the_torch_index_unneeded(lock, tmp_path):
    numpy = "numpy-2.3.5-cp311-cp311-manylinux_2_27_x86_64.manylinux_2_28_x86_64.whl"
    folder = wheel_folder(tmp_path, TORCH_WHEEL, numpy)
    plan = indexes.plan(lock, DOCKERFILE, folder, "amd64")
    assert plan == indexes.IndexPlan(build_args={"PIP_EXTRA_INDEX_URL": ""}, note=(
        f"torch==2.13.0+cpu from the wheel folder ({TORCH_WHEEL}): pip does not ask the torch index {TORCH_URL}"))


@pytest.mark.parametrize("names, arch, why", [
    ((), "amd64", "no wheel at all"),
    (("torch-2.13.0+cpu-cp312-cp312-manylinux_2_28_x86_64.whl",), "amd64", "another Python"),
    (("torch-2.13.0-cp311-cp311-manylinux_2_28_x86_64.whl",), "amd64", "PyPI's build, not +cpu"),
    (("torch-2.13.0+cu128-cp311-cp311-manylinux_2_28_x86_64.whl",), "amd64", "another variant"),
    (("torch-2.13.0+cpu-cp311-cp311-manylinux_2_39_x86_64.whl",), "amd64", "needs glibc 2.39, the image has 2.36"),
    ((TORCH_WHEEL,), "arm64", "another architecture"),
    (("torch-2.13.0+cpu-cp311-cp311-manylinux_2_28_x86_64.tar.gz", "torch-2.13.0+cpu.whl"), "amd64", "not wheels"),
])
def test_the_torch_index_is_asked_without_a_fitting_wheel(lock, tmp_path, names, arch, why):
    folder = wheel_folder(tmp_path, *names)
    plan = indexes.plan(lock, DOCKERFILE, folder, arch)
    machine = {"amd64": "x86_64", "arm64": "aarch64"}[arch]
    assert plan == indexes.IndexPlan(asks_torch_index=TORCH_URL, note=(
        f"pip asks the torch index {TORCH_URL}: the wheel folder {folder} holds no torch==2.13.0+cpu wheel "
        f"for cp311 {machine}")), why


def test_fitting_variants_of_the_torch_wheel(lock, tmp_path):
    for n, name in enumerate(["torch-2.13.0%2Bcpu-cp311-cp311-manylinux_2_28_x86_64.whl",  # a saved URL
                              "torch-2.13.0+cpu-cp311-cp311-manylinux2014_x86_64.whl",
                              "torch-2.13.0+cpu-cp311-cp311-linux_x86_64.whl"]):
        folder = wheel_folder(tmp_path / str(n), name)
        assert indexes.plan(lock, DOCKERFILE, folder, "amd64").build_args == {"PIP_EXTRA_INDEX_URL": ""}, name
    assert indexes.plan(lock, DOCKERFILE, wheel_folder(tmp_path / "a", TORCH_WHEEL.replace("x86_64", "aarch64")),
                        "arm64").build_args == {"PIP_EXTRA_INDEX_URL": ""}


def test_no_wheel_folder_asks_the_torch_index(lock):
    plan = indexes.plan(lock, DOCKERFILE, None, "amd64")
    assert plan.build_args == {} and plan.asks_torch_index == TORCH_URL
    assert plan.note == (f"pip asks the torch index {TORCH_URL} for torch==2.13.0+cpu "
                         "(no wheel folder: --wheels or pip's find-links)")


def test_a_dockerfile_without_the_build_argument_gets_no_plan(lock, tmp_path):
    folder = wheel_folder(tmp_path, TORCH_WHEEL)
    older = DOCKERFILE.replace(b"ARG PIP_EXTRA_INDEX_URL=", b"ARG OTHER=")
    assert indexes.plan(lock, older, folder, "amd64") == indexes.IndexPlan()
    assert indexes.declared_args(DOCKERFILE) == {"BASE_IMAGE", "PIP_EXTRA_INDEX_URL", "SOURCE_DATE_EPOCH"}
    assert indexes.declared_args(LOCKED_DOCKERFILE) == {"BASE_IMAGE", "PIP_EXTRA_INDEX_URL", "PIP_NO_INDEX", "SOURCE_DATE_EPOCH"}


def test_every_hash_pinned_wheel_in_the_folder_asks_no_index(lock, tmp_path):
    torch_sha = "sha256:" + hashlib.sha256(b"torch bytes").hexdigest()
    numpy_sha = "sha256:" + hashlib.sha256(b"numpy bytes").hexdigest()
    resolved = LockResolved(base=lock.resolved.base if lock.resolved else _base(), pip=(
        PinnedWheel(name="torch", version="2.13.0+cpu", hashes=(torch_sha,)),
        PinnedWheel(name="numpy", version="2.3.5", hashes=("sha256:" + "0" * 64, numpy_sha))))
    locked = msgspec.structs.replace(lock, resolved=resolved)
    folder = wheel_folder(tmp_path, TORCH_WHEEL, content=b"torch bytes")
    numpy = folder / "numpy-2.3.5-cp311-cp311-manylinux_2_27_x86_64.manylinux_2_28_x86_64.whl"
    numpy.write_bytes(b"numpy bytes")
    plan = indexes.plan(locked, LOCKED_DOCKERFILE, folder, "amd64")
    assert plan.build_args == {"PIP_EXTRA_INDEX_URL": "", "PIP_NO_INDEX": "1"}
    assert plan.note == f"the wheel folder {folder} holds all 2 hash-pinned wheels: pip asks no index (PIP_NO_INDEX=1)"
    numpy.write_bytes(b"other numpy bytes")  # a file whose hash the lock does not allow: the main index is asked
    plan = indexes.plan(locked, LOCKED_DOCKERFILE, folder, "amd64")
    assert plan.build_args == {"PIP_EXTRA_INDEX_URL": ""}
    (folder / TORCH_WHEEL).write_bytes(b"other torch bytes")  # and now torch too: the torch index is asked
    assert indexes.plan(locked, LOCKED_DOCKERFILE, folder, "amd64").asks_torch_index == TORCH_URL


def _base():
    from builder.recipe.model import LockBase

    return LockBase(ref="debian:bookworm-slim", digest=None)


def test_image_tags_follow_glibc_and_python():
    tags = {str(t) for t in indexes.image_tags("3.11", "2.36", "x86_64")}
    assert {"cp311-cp311-manylinux_2_36_x86_64", "cp311-cp311-manylinux_2_17_x86_64",
            "cp311-cp311-manylinux2014_x86_64", "cp311-abi3-manylinux1_x86_64", "cp311-cp311-linux_x86_64",
            "py3-none-any", "cp39-abi3-manylinux_2_28_x86_64", "py311-none-any"} <= tags
    assert not {"cp311-cp311-manylinux_2_37_x86_64", "cp312-cp312-manylinux_2_28_x86_64",
                "cp311-cp311-manylinux_2_28_aarch64"} & tags
    arm = {str(t) for t in indexes.image_tags("3.12", "2.39", "aarch64")}
    assert "cp312-cp312-manylinux2014_aarch64" in arm and "cp312-cp312-manylinux1_aarch64" not in arm
