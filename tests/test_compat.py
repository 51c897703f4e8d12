"""Compatibility rules (builder/compat.py): one failing case per rule with its literal
message, and a passing twin that differs only in the offending value."""

import pytest

from builder import compat, recipe
from builder.errors import ManyErrors
from helpers import CPU, CUDA, merge, write_recipe


def spec_of(tmp_path, data):
    return compat.check(recipe.load(write_recipe(tmp_path, data)))


def findings(tmp_path, data, rule):
    return [(f.level, f.message, f.source) for f in spec_of(tmp_path, data).findings if f.rule == rule]


# (rule, base, failing change, passing change, level, message, source)
CASES = [
    ("torch-release", CPU, {"torch": {"version": "2.16.0"}}, {"torch": {"version": "2.13.0"}}, "error",
     "torch 2.16.0 is not in envbuild's compatibility data; known releases: 2.0.0, 2.0.1, 2.1.0, 2.1.1, 2.1.2, 2.2.0, 2.2.1, 2.2.2, 2.3.0, 2.3.1, 2.4.0, 2.4.1, 2.5.0, 2.5.1, 2.6.0, 2.7.0, 2.7.1, 2.8.0, 2.9.0, 2.9.1, 2.10.0, 2.11.0, 2.12.0, 2.12.1, 2.13.0, 2.14.0, 2.14.1, 2.15.0", "S2 (V)"),
    ("torch-variant",
     merge(CUDA, {"base": {"image": "nvidia/cuda:12.6.3-base-ubuntu24.04"}, "cuda": {"version": "12.6"}, "torch": {"variant": ...}, "nccl": ...}),
     {"torch": {"version": "2.5.1"}}, {"torch": {"version": "2.6.0"}}, "error",
     "torch 2.5.1 has no cu126 build; builds exist for cu118, cu121, cu124", "S2 (V)"),
    ("torch-variant", merge(CUDA, {"torch": {"version": "2.15.0", "variant": "cu132"}, "cuda": {"version": "13.2"}, "nccl": ..., "python": "3.12", "base": {"image": "nvidia/cuda:13.2.0-base-ubuntu24.04"}}),
     {"torch": {"variant": "cu130"}, "cuda": {"version": "13.0"}, "base": {"image": "nvidia/cuda:13.0.2-base-ubuntu24.04"}}, {}, "warning",
     "torch 2.15.0 has no cu130 build; builds exist for cu132", "S2 (U)"),
    ("cpu-with-cuda", CPU, {"cuda": {"version": "12.8"}}, {}, "error",
     "torch variant cpu does not use CUDA 12.8; set cuda to null or use a cuXYZ variant", "S2 (V)"),
    ("cuda-major", CUDA, {"cuda": {"version": "13.0"}}, {}, "error",
     "torch variant cu128 is CUDA 12.8 but the recipe's CUDA is 13.0; the major versions must match (use cu130 or cuda 12.8)", "compat.md §5.5 (V)"),
    ("cuda-minor", CUDA, {"torch": {"variant": "cu126"}}, {}, "warning",
     "torch variant cu126 brings its own CUDA 12.6 runtime; the recipe's CUDA is 12.8 (minor versions differ)", "compat.md §5.5 (U)"),
    ("cuda-missing", CPU, {"torch": {"variant": "cu130"}}, {}, "error",
     "torch variant cu130 needs a cuda section (cuda.version: 13.0)", "S2 (V)"),
    ("python-wheel", CUDA, {"python": "3.14", "os": {"version": "24.04"}}, {}, "error",
     "torch 2.8.0 has wheels for Python 3.9 to 3.13, not 3.14", "S1 (V)"),
    ("os-release", CPU, {"os": {"version": "10"}}, {}, "error",
     "debian 10 is not a known OS release; known: debian 11, debian 12, debian 13, ubuntu 18.04, ubuntu 20.04, ubuntu 22.04, ubuntu 24.04", "DISTRO (V)"),
    ("os-python", CPU, {"python": "3.12"}, {}, "error",
     "Python 3.12 is not the system Python of debian 12 (3.11); use python: \"3.11\" or another OS release", "DISTRO (V)"),
    ("glibc", merge(CUDA, {"base": {"image": "nvidia/cuda:12.8.1-base-ubuntu18.04"}}), {"os": {"version": "18.04"}}, {"os": {"version": "24.04"}, "base": {"image": "nvidia/cuda:12.8.1-base-ubuntu24.04"}}, "error",
     "torch 2.8.0+cu128 wheels are manylinux_2_28 and need glibc >= 2.28; ubuntu 18.04 has glibc 2.27", "S1, pytorch#141565 (V)"),
    ("nccl-pin", CUDA, {"nccl": "2.26.2"}, {}, "error",
     "torch 2.8.0+cu128 pins nvidia-nccl-cu12==2.27.3; the recipe's NCCL 2.26.2 would be a second NCCL or a resolver conflict (use nccl: 2.27.3)", "S1 (V)"),
    ("nccl-pin", merge(CUDA, {"torch": {"variant": "cu126"}}), {"nccl": "2.26.2"}, {"nccl": "2.27.3"}, "warning",
     "torch 2.8.0+cu126 pins nvidia-nccl-cu12==2.27.3; the recipe's NCCL 2.26.2 would be a second NCCL or a resolver conflict (use nccl: 2.27.3)", "S1 (U)"),
    ("nccl-bundled", merge(CUDA, {"torch": {"version": "2.1.2", "variant": "cu118"}, "cuda": {"version": "11.8"}, "python": "3.10", "os": {"version": "22.04"}, "base": {"image": "nvidia/cuda:11.8.0-base-ubuntu22.04"}}),
     {"nccl": "2.18.3"}, {"nccl": ...}, "warning",
     "torch 2.1.2+cu118 bundles its NCCL (version unverified); the recipe's 2.18.3 cannot be checked", "compat.md §1 (U)"),
    ("nccl-unknown", merge(CUDA, {"torch": {"version": "2.7.1", "variant": "cu118"}, "cuda": {"version": "11.8"}, "base": {"image": "nvidia/cuda:11.8.0-base-ubuntu24.04"}}),
     {"nccl": "2.21.5"}, {"nccl": ...}, "warning",
     "envbuild has no fact on the NCCL that torch 2.7.1+cu118 pins; keeping the recipe's 2.21.5 unchecked", "compat.md §1 (U)"),
    ("nccl-cpu", CPU, {"nccl": "2.27.3"}, {}, "error",
     "a CPU build of torch has no NCCL; remove nccl (2.27.3) or use a CUDA variant", "S1 (V)"),
    ("cudnn-pin", CUDA, {"cudnn": "9.1.0.70"}, {"cudnn": "9.10.2.21"}, "error",
     "torch 2.8.0+cu128 brings cuDNN 9.10.2.21, not 9.1.0.70", "S1 (V)"),
    ("cudnn-cpu", CPU, {"cudnn": "9.1.0.70"}, {}, "error",
     "a CPU build of torch has no cuDNN; remove cudnn (9.1.0.70)", "S1 (V)"),
    ("cuda-package-mix", CUDA, {"packages": {"pip": ["nvidia-cublas-cu13==13.0.0.19"]}}, {"packages": {"pip": ["nvidia-cublas-cu12==12.8.4.1"]}}, "error",
     "nvidia-cublas-cu13==13.0.0.19 is a CUDA 13 package in a CUDA 12 image (torch cu128); use the -cu12 package", "S1 (V)"),
    ("driver-too-old", CUDA, {"cuda": {"driver": "520.61.05"}}, {"cuda": {"driver": "570.124.06"}}, "error",
     "driver 520.61.05 is below 525.60.13, the oldest that runs CUDA 12.8 (cu128) even with minor-version compatibility; full support needs >= 570.26", "NV-MVC (V)"),
    ("driver-minor-compat", CUDA, {"cuda": {"driver": "535.104.05"}}, {"cuda": {"driver": "570.26"}}, "warning",
     "driver 535.104.05 is below 570.26 (CUDA 12.8 GA): runs only under minor-version compatibility (no PTX JIT, some APIs fail)", "NV-MVC (V)"),
    ("base-tag", CUDA, {"base": {"image": "nvidia/cuda:latest"}}, {}, "warning",
     "cannot read CUDA and OS from the tag 'latest' (expected X.Y.Z-flavour-osVER)", "NV-IMG (U)"),
    ("base-cuda-unused", merge(CPU, {"os": {"id": "ubuntu", "version": "24.04"}, "python": "3.12"}), {"base": {"image": "nvidia/cuda:12.8.1-base-ubuntu24.04"}}, {"base": {"image": "ubuntu:24.04"}}, "warning",
     "base image nvidia/cuda:12.8.1-base-ubuntu24.04 carries CUDA 12.8.1 but the recipe has no cuda section", "NV-IMG (V)"),
    ("base-cuda-major", CUDA, {"base": {"image": "nvidia/cuda:13.0.2-base-ubuntu24.04"}}, {}, "error",
     "base image CUDA 13.0.2 and the recipe's CUDA 12.8 differ in major version; use an nvidia/cuda:12.8.x tag", "NV-IMG (V)"),
    ("base-cuda-minor", CUDA, {"base": {"image": "nvidia/cuda:12.6.3-base-ubuntu24.04"}}, {}, "warning",
     "base image CUDA 12.6.3 and the recipe's CUDA 12.8 differ in minor version", "NV-IMG (V)"),
    ("base-os", CUDA, {"base": {"image": "nvidia/cuda:12.8.1-base-ubuntu22.04"}}, {}, "error",
     "base image 12.8.1-base-ubuntu22.04 is ubuntu 22.04 but the recipe says ubuntu 24.04", "NV-IMG (V)"),
    ("base-os", CPU, {"base": {"image": "debian:bullseye-slim"}}, {}, "error",
     "base image debian:bullseye-slim is debian 11 but the recipe says debian 12", "DISTRO (V)"),
    ("base-second-nccl", CUDA, {"base": {"image": "nvidia/cuda:12.8.1-runtime-ubuntu24.04"}}, {}, "warning",
     "the runtime flavour ships a system libnccl2 2.25.1 beside torch's NCCL 2.27.3: two NCCLs in one image; prefer the base flavour", "compat.md §4 (S)"),
    ("backend-nccl-cpu", CPU, {"certify": {"backend": "nccl"}}, {}, "error",
     "backend nccl needs a CUDA build of torch; use gloo for a CPU image", "multinode.md (V)"),
]


@pytest.mark.parametrize("rule, base, bad, good, level, message, source", CASES, ids=[c[0] for c in CASES])
def test_rule_fails(tmp_path, rule, base, bad, good, level, message, source):
    assert (level, message, source) in findings(tmp_path, merge(base, bad), rule)


@pytest.mark.parametrize("rule, base, bad, good, level, message, source", CASES, ids=[c[0] for c in CASES])
def test_rule_passing_twin(tmp_path, rule, base, bad, good, level, message, source):
    assert findings(tmp_path, merge(base, good), rule) == []


def test_default_recipes_are_clean():
    for name in ("cpu-torch2", "cuda12-torch2"):
        spec = compat.check(recipe.load(f"recipes/{name}.yaml"))
        assert [f.level for f in spec.findings if f.level != "note"] == []


def test_driver_floor_note_for_cu128(tmp_path):
    assert findings(tmp_path, CUDA, "driver-floor") == [
        ("note", "cu128 needs driver >= 570.26 (CUDA 12.8 GA); >= 525.60.13 runs under minor-version compatibility (no PTX JIT)", "NV-RN, NV-MVC (V)")]


def test_resolved_pins(tmp_path):
    spec = spec_of(tmp_path, merge(CUDA, {"nccl": ...}))
    assert (spec.torch_local, spec.cuda, spec.nccl_package, spec.nccl, spec.cudnn, spec.driver_min, spec.driver_minor_compat_min, spec.glibc) == (
        "2.8.0+cu128", "12.8", "nvidia-nccl-cu12", "2.27.3", "9.10.2.21", "570.26", "525.60.13", "2.39")
    assert spec.pip_requirements() == ["torch==2.8.0+cu128", "nvidia-nccl-cu12==2.27.3"]


def test_variant_derived_from_cuda(tmp_path):
    assert spec_of(tmp_path, merge(CUDA, {"torch": {"variant": ...}})).variant == "cu128"


def test_require_ok_lists_every_error(tmp_path):
    spec = spec_of(tmp_path, merge(CPU, {"nccl": "2.27.3", "cudnn": "9.1.0.70"}))
    with pytest.raises(ManyErrors) as info:
        compat.require_ok(spec)
    assert info.value.exit_code == 2
    assert str(info.value).replace(str(tmp_path) + "/", "").splitlines() == [
        "t.yaml: nccl, torch.variant: a CPU build of torch has no NCCL; remove nccl (2.27.3) or use a CUDA variant [S1 (V)]",
        "t.yaml: cudnn: a CPU build of torch has no cuDNN; remove cudnn (9.1.0.70) [S1 (V)]",
    ]
