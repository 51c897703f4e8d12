"""The engine-free tests of tests/integration/test_compat.py: Compatibility rules (builder/recipe/rules/): one failing case per rule with its literal
message, and a passing twin that differs only in the offending value."""

import copy
import json
from pathlib import Path

import pytest

from builder.core.errors import EnvbuildError, ManyErrors
from builder.recipe import facts, load, rules
from builder.recipe import lock as lockdoc
from builder.recipe.rules.context import variant_cuda

from helpers import CPU, CUDA, merge, write_recipe

ROOT = Path(__file__).resolve().parents[2]


def spec_of(tmp_path, data):
    return rules.check(load.load(write_recipe(tmp_path, data)))


def findings(tmp_path, data, rule):
    return [(f.level, f.message, f.source) for f in spec_of(tmp_path, data).findings if f.rule == rule]


# (rule, base, failing change, passing change, level, message, source)
CASES = [
    ("torch-release", CPU, {"torch": {"version": "2.16.0"}}, {"torch": {"version": "2.13.0"}}, "error",
     "torch 2.16.0 is not in envbuild's compatibility data; known releases: 2.0.0, 2.0.1, 2.1.0, 2.1.1, 2.1.2, 2.2.0, 2.2.1, 2.2.2, 2.3.0, 2.3.1, 2.4.0, 2.4.1, 2.5.0, 2.5.1, 2.6.0, 2.7.0, 2.7.1, 2.8.0, 2.9.0, 2.9.1, 2.10.0, 2.11.0, 2.12.0, 2.12.1, 2.13.0, 2.14.0, 2.14.1, 2.15.0", "S2 (V)"),
    ("torch-floor", CPU, {"torch": {"version": "1.13.1"}}, {}, "error",
     "recipes start at torch 2.0.0: torch 1.13.1 is judged by envbuild audit only (its facts are kept for old files); use one of 2.0.0 to 2.15.0", "envbuild"),
    ("torch-variant",
     merge(CUDA, {"base": {"image": "nvidia/cuda:12.6.3-base-ubuntu24.04"}, "cuda": {"version": "12.6"}, "torch": {"variant": ...}, "nccl": ...}),
     {"torch": {"version": "2.5.1"}}, {"torch": {"version": "2.6.0"}}, "error",
     "torch 2.5.1 has no cu126 build; builds exist for cu118, cu121, cu124", "S2 (V)"),
    ("torch-variant", merge(CUDA, {"torch": {"version": "2.15.0", "variant": "cu132"}, "cuda": {"version": "13.2"}, "nccl": ..., "python": "3.12", "base": {"image": "nvidia/cuda:13.2.0-base-ubuntu24.04"}}),
     {"torch": {"variant": "cu130"}, "cuda": {"version": "13.0"}, "base": {"image": "nvidia/cuda:13.0.2-base-ubuntu24.04"}}, {}, "warning",
     "torch 2.15.0 has no cu130 build; builds exist for cu132", "S2 (U)"),
    ("cpu-with-cuda", CPU, {"cuda": {"version": "12.8"}}, {}, "error",
     "torch variant cpu does not use the image's CUDA 12.8: drop the CUDA or use cu126", "S2 (V)"),
    ("cuda-major", CUDA, {"cuda": {"version": "13.0"}}, {}, "error",
     "torch variant cu128 is CUDA 12.8 but the image's CUDA is 13.0; the major versions must match (torch 2.8.0 has no CUDA 13 build; use CUDA 12.8)", "compat.md §5.5 (V)"),
    ("cuda-minor", CUDA, {"torch": {"variant": "cu126"}}, {}, "warning",
     "torch variant cu126 brings its own CUDA 12.6 runtime; the image's CUDA is 12.8 (minor versions differ)", "compat.md §5.5 (U)"),
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
        spec = rules.check(load.load(f"recipes/{name}.yaml"))
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
        rules.require_ok(spec)
    assert info.value.exit_code == 2
    assert str(info.value).replace(str(tmp_path) + "/", "").splitlines() == [
        "t.yaml: nccl, torch.variant: a CPU build of torch has no NCCL; remove nccl (2.27.3) or use a CUDA variant [S1 (V)]",
        "t.yaml: cudnn: a CPU build of torch has no cuDNN; remove cudnn (9.1.0.70) [S1 (V)]",
    ]


# --------------------------------------------------------------------------- issue 8: the rules added
def rule_lines(tmp_path, data, *rules):
    return [(f.level, f.rule, f.fields, f.message, f.source) for f in spec_of(tmp_path, data).findings if f.rule in rules]


IFNAME_MSG = ("{var}={value} selects only the loopback interface; ranks on 2 nodes cannot reach each other over it "
              "(remove it, or name the interface the nodes share, e.g. eth0)")


@pytest.mark.parametrize("var, value", [
    ("NCCL_SOCKET_IFNAME", "lo"), ("NCCL_SOCKET_IFNAME", "lo0"), ("NCCL_SOCKET_IFNAME", "=lo"),
    ("NCCL_SOCKET_IFNAME", "lo,lo"), ("NCCL_SOCKET_IFNAME", "=lo,lo0"), ("GLOO_SOCKET_IFNAME", "lo"),
    ("GLOO_SOCKET_IFNAME", "lo,lo0"),
])
def test_loopback_socket_ifname_is_refused_on_several_nodes(tmp_path, var, value):
    assert rule_lines(tmp_path, merge(CPU, {"env": {var: value}}), "socket-ifname-loopback") == [
        ("error", "socket-ifname-loopback", (f"env.{var}", "certify.nodes"), IFNAME_MSG.format(var=var, value=value),
         "NCCL-ENV, multinode.md (M)")]


@pytest.mark.parametrize("var, value, nodes", [
    ("NCCL_SOCKET_IFNAME", "^lo", 2), ("NCCL_SOCKET_IFNAME", "^lo,docker", 2), ("NCCL_SOCKET_IFNAME", "eth0", 2),
    ("NCCL_SOCKET_IFNAME", "lo,eth0", 2), ("NCCL_SOCKET_IFNAME", "lowpan0", 2), ("GLOO_SOCKET_IFNAME", "eth0", 2),
    ("NCCL_SOCKET_IFNAME", "lo", 1), ("NCCL_SOCKET_IFNAME", "", 2),
])
def test_socket_ifname_passing_twins(tmp_path, var, value, nodes):
    assert rule_lines(tmp_path, merge(CPU, {"env": {var: value}, "certify": {"nodes": nodes}}), "socket-ifname-loopback") == []


def test_torch_index_is_derived_from_the_variant(tmp_path):
    spec = spec_of(tmp_path, merge(CUDA, {"index": {"url": "https://pypi.org/simple"}}))
    assert spec.torch_index_url == "https://download.pytorch.org/whl/cu128"
    assert spec.lock().to_dict()["index"] == {"url": "https://pypi.org/simple", "torch_url": "https://download.pytorch.org/whl/cu128"}
    assert rule_lines(tmp_path, CUDA, "torch-index") == [
        ("note", "torch-index", ("index.torch_url",), "torch 2.8.0+cu128 comes from https://download.pytorch.org/whl/cu128 (derived from the variant)", "PT-IDX (V)")]


def test_torch_index_given_is_kept_twin(tmp_path):
    spec = spec_of(tmp_path, merge(CUDA, {"index": {"torch_url": "https://mirror.example/torch/cu128"}}))
    assert spec.torch_index_url == "https://mirror.example/torch/cu128"
    assert rule_lines(tmp_path, merge(CUDA, {"index": {"torch_url": "https://mirror.example/torch/cu128"}}),
                      "torch-index", "torch-index-variant", "torch-index-pypi") == []


@pytest.mark.parametrize("url, rule, message", [
    ("https://download.pytorch.org/whl/cu126", "torch-index-variant",
     "index.torch_url https://download.pytorch.org/whl/cu126 is the cu126 index but the variant is cu128: pip finds no "
     "torch==2.8.0+cu128 there; use https://download.pytorch.org/whl/cu128 or leave index.torch_url out"),
    ("https://download.pytorch.org/whl/cpu/", "torch-index-variant",
     "index.torch_url https://download.pytorch.org/whl/cpu/ is the cpu index but the variant is cu128: pip finds no "
     "torch==2.8.0+cu128 there; use https://download.pytorch.org/whl/cu128 or leave index.torch_url out"),
    ("https://pypi.org/simple", "torch-index-pypi",
     "index.torch_url https://pypi.org/simple is PyPI, which has no torch==2.8.0+cu128 (local +cu128 builds live on the "
     "PyTorch index); use https://download.pytorch.org/whl/cu128 or leave index.torch_url out"),
])
def test_torch_index_of_another_variant_is_refused(tmp_path, url, rule, message):
    assert [(ln[0], ln[3]) for ln in rule_lines(tmp_path, merge(CUDA, {"index": {"torch_url": url}}), rule)] == [("error", message)]


@pytest.mark.parametrize("section, item, message, source", [
    ("apt", "libnccl2", "libnccl2 is a second NCCL: torch 2.8.0+cu128 loads the NCCL of its own wheel (nvidia-nccl-cu12 2.27.3); remove it", "compat.md §5.3 (V)"),
    ("apt", "libnccl-dev=2.27.3-1+cuda12.9", "libnccl-dev=2.27.3-1+cuda12.9 is a second NCCL: torch 2.8.0+cu128 loads the NCCL of its own wheel (nvidia-nccl-cu12 2.27.3); remove it", "compat.md §5.3 (V)"),
    ("apt", "cuda", "cuda is a second CUDA: torch 2.8.0+cu128 brings its CUDA runtime as the nvidia-* wheels it pins; remove it", "compat.md §5.3, S1 (V)"),
    ("apt", "cuda-toolkit-12-8", "cuda-toolkit-12-8 is a second CUDA: torch 2.8.0+cu128 brings its CUDA runtime as the nvidia-* wheels it pins; remove it", "compat.md §5.3, S1 (V)"),
    ("apt", "libcudnn9-cuda-12", "libcudnn9-cuda-12 is a second cuDNN: torch 2.8.0+cu128 brings cuDNN 9.10.2.21 as a wheel; remove it", "compat.md §5.4 (V)"),
    ("apt", "nvidia-driver-550", "nvidia-driver-550 is an NVIDIA driver package: the driver comes from the host (the container runtime mounts the host's driver libraries); one in the image shadows or mismatches it; remove it", "NV-CTK (M)"),
    ("pip", "nvidia-nccl-cu12==2.26.2", "nvidia-nccl-cu12==2.26.2 is a second NCCL: torch 2.8.0+cu128 loads the NCCL of its own wheel (nvidia-nccl-cu12 2.27.3); remove it", "S1 (V)"),
    ("pip", "nvidia-cublas-cu12==12.8.4.1", "nvidia-cublas-cu12==12.8.4.1 is a second CUDA: torch 2.8.0+cu128 brings its CUDA runtime as the nvidia-* wheels it pins; remove it", "S1 (V)"),
    ("pip", "cuda-toolkit", "cuda-toolkit is a second CUDA: torch 2.8.0+cu128 brings its CUDA runtime as the nvidia-* wheels it pins; remove it", "S1 (V)"),
    ("pip", "pytorch", "pytorch is a second PyTorch beside torch 2.8.0+cu128; remove it", "S1 (V)"),
])
def test_second_stack_packages_are_refused(tmp_path, section, item, message, source):
    field = f"packages.{section}[0]"
    assert rule_lines(tmp_path, merge(CUDA, {"packages": {section: [item]}}), "second-stack") == [
        ("error", "second-stack", (field,), message, source)]


def test_second_stack_in_a_cpu_image(tmp_path):
    assert [ln[3] for ln in rule_lines(tmp_path, merge(CPU, {"packages": {"apt": ["libnccl2"]}}), "second-stack")] == [
        "libnccl2 is a CUDA library in a CPU image: a CPU build of torch (2.13.0+cpu) uses no NCCL; remove it"]


def test_ordinary_packages_pass_twin(tmp_path):
    data = merge(CUDA, {"packages": {"apt": ["curl", "libgomp1", "cudf-tools-not-cuda"], "pip": ["nvidia-ml-py", "numpy==2.2.6"]}})
    assert rule_lines(tmp_path, data, "second-stack", "cuda-package-mix") == []


@pytest.mark.parametrize("image", ["nvcr.io/nvidia/pytorch:25.01-py3", "pytorch/pytorch:2.8.0-cuda12.8-cudnn9-runtime",
                                   "docker.io/pytorch/pytorch:latest"])
def test_base_images_that_ship_torch_are_refused(tmp_path, image):
    lines = rule_lines(tmp_path, merge(CUDA, {"base": {"image": image}}), "second-stack")
    assert [(ln[0], ln[2], ln[3]) for ln in lines] == [("error", ("base.image",),
        f"base image {image} already ships PyTorch: installing torch 2.8.0+cu128 makes a second one; start from its "
        "CUDA/OS base (e.g. nvidia/cuda:X.Y.Z-base-ubuntuVER or debian)")]


@pytest.mark.parametrize("req, level, message, source", [
    ("torchvision==0.2.2", "error", "torchvision==0.2.2 does not pair with torch 2.8.0: torchvision 0.23.0 is the release for it (its wheel requires torch==2.8.0); use torchvision==0.23.0",
     "S1-COMP torchvision-0.23.0-cp311-cp311-manylinux_2_28_x86_64.whl (V)"),
    ("torchvision<0.23", "error", "torchvision<0.23 does not pair with torch 2.8.0: torchvision 0.23.0 is the release for it (its wheel requires torch==2.8.0); use torchvision==0.23.0",
     "S1-COMP torchvision-0.23.0-cp311-cp311-manylinux_2_28_x86_64.whl (V)"),
    ("torchaudio==2.7.1", "error", "torchaudio==2.7.1 does not pair with torch 2.8.0: torchaudio 2.8.0 is the release for it (its wheel requires torch==2.8.0); use torchaudio==2.8.0",
     "S1-COMP torchaudio-2.8.0-cp311-cp311-manylinux_2_28_x86_64.whl (V)"),
])
def test_companions_must_pair_with_the_torch_release(tmp_path, req, level, message, source):
    assert [(ln[0], ln[3], ln[4]) for ln in rule_lines(tmp_path, merge(CUDA, {"packages": {"pip": [req]}}), "companion-pair")] == [
        (level, message, source)]


@pytest.mark.parametrize("req", ["torchvision==0.23.0", "torchvision", "torchvision>=0.20", "torchaudio==2.8.0", "TorchVision~=0.23.0"])
def test_companions_that_pair_pass_twin(tmp_path, req):
    assert rule_lines(tmp_path, merge(CUDA, {"packages": {"pip": [req]}}), "companion-pair", "companion-unknown") == []


def test_companion_without_a_known_release_is_a_warning(tmp_path):
    assert [(ln[0], ln[3]) for ln in rule_lines(tmp_path, merge(CPU, {"packages": {"pip": ["torchaudio"]}}), "companion-unknown")] == [
        ("warning", "envbuild knows no torchaudio release whose wheel pairs with torch 2.13.0; torchaudio is unchecked (pip may find none)")]


def test_every_variant_of_every_release_has_a_driver_floor():
    data = facts.facts()
    variants = {v for rel in data.torch.values() for v in rel.variants.list}
    missing = sorted(v for v in variants if variant_cuda(v) not in data.cuda_driver)
    assert missing == []
    assert {"cu80", "cu90", "cu92", "cu100", "cu101", "cu102", "cu110", "cu111", "cu113", "cu115", "cu116",
            "cu117", "cu118", "cu121", "cu124", "cu126", "cu128", "cu129", "cu130", "cu132"} == variants


def test_cu117_driver_floor_is_a_warning_from_an_unverified_row(tmp_path):
    data = merge(CUDA, {"torch": {"version": "2.0.1", "variant": "cu117"}, "cuda": {"version": "11.7", "driver": "450.0"},
                        "python": "3.10", "os": {"version": "22.04"}, "base": {"image": "nvidia/cuda:11.7.1-base-ubuntu22.04"}, "nccl": ...})
    assert [(ln[0], ln[3]) for ln in rule_lines(tmp_path, data, "driver-too-old")] == [
        ("warning", "driver 450.0 is below 450.80.02, the oldest that runs CUDA 11.7 (cu117) even with minor-version compatibility; full support needs >= 515.43.04")]


def test_variant_that_exists_nowhere_names_the_release_variants(tmp_path):
    assert [(ln[0], ln[3]) for ln in rule_lines(tmp_path, merge(CUDA, {"torch": {"variant": "cu90"}}), "torch-variant")] == [
        ("error", "torch 2.8.0 has no cu90 build; builds exist for cu126, cu128, cu129")]


def test_suggestions_name_only_variants_that_exist(tmp_path):
    data = merge(CUDA, {"torch": {"version": "2.1.0", "variant": "cu118"}, "cuda": {"version": "12.2"}, "python": "3.10",
                        "os": {"version": "22.04"}, "base": {"image": "nvidia/cuda:12.2.2-base-ubuntu22.04"}, "nccl": ...})
    assert [ln[3] for ln in rule_lines(tmp_path, data, "cuda-major")] == [
        "torch variant cu118 is CUDA 11.8 but the image's CUDA is 12.2; the major versions must match (use cu121 or CUDA 11.8)"]


def test_schema_errors_do_not_stop_the_rules(tmp_path):
    path = write_recipe(tmp_path, merge(CPU, {"python": "three", "nccl": "2.27.3", "packages": {"apt": ["libnccl2", "bad pkg"]}}))
    spec = rules.check(load.parse(path))
    with pytest.raises(ManyErrors) as info:
        rules.require_ok(spec)
    assert str(info.value).replace(str(tmp_path) + "/", "").splitlines() == [
        "t.yaml: python: 'three' is not a version",
        "t.yaml: packages.apt[1]: 'bad pkg' is not a Debian package name (name or name=version)",
        "t.yaml: nccl, torch.variant: a CPU build of torch has no NCCL; remove nccl (2.27.3) or use a CUDA variant [S1 (V)]",
        "t.yaml: packages.apt[0]: libnccl2 is a CUDA library in a CPU image: a CPU build of torch (2.13.0+cpu) uses no NCCL; remove it [compat.md §5.3 (V)]",
    ]


def test_rules_skip_invalid_fields(tmp_path):
    """An invalid cuda section must not be read as a CPU recipe (no cpu/cuda findings)."""
    loaded = load.parse(write_recipe(tmp_path, merge(CUDA, {"cuda": "12.8", "torch": {"variant": ...}})))
    spec = rules.check(loaded)
    assert [e.field for e in loaded.errors] == ["cuda"]
    assert [f.rule for f in spec.findings if f.level == "error"] == []


# --------------------------------------------------------------------------- lock documents
LOCK = json.loads((ROOT / "images/cpu-torch2/envbuild.lock.json").read_text())


def forged(path, value):
    doc = copy.deepcopy(LOCK)
    node = doc
    for key in path[:-1]:
        node = node[key]
    if value is ...:
        del node[path[-1]]
    else:
        node[path[-1]] = value
    return doc


@pytest.mark.parametrize("path, value, expected", [
    (("certify", "nodes"), "abc", "label envbuild.lock: certify.nodes: 'abc' must be an integer in 1..1024"),
    (("certify", "nodes"), 100000, "label envbuild.lock: certify.nodes: 100000 must be an integer in 1..1024"),
    (("certify", "nodes"), True, "label envbuild.lock: certify.nodes: True must be an integer in 1..1024"),
    (("certify", "allreduce", "sizes"), [2**40], "label envbuild.lock: certify.allreduce.sizes[0]: 1099511627776 must be a size in bytes, a multiple of 4 (float32), at most 68719476736"),
    (("certify", "port"), ..., "label envbuild.lock: certify.port: is required"),
    (("certify", "shm_size"), "1g\n", "label envbuild.lock: certify.shm_size: '1g\\n' holds a control character (\\x0a); recipe values are printable text on one line (no newline, tab, escape or bidi control)"),
    (("torch", "local"), "2.13.0", "label envbuild.lock: torch.local: '2.13.0' is not a torch wheel version such as 2.8.0+cu128"),
    (("pip",), ["torch==2.13.0+cpu", "x @ https://evil/x.whl"], "label envbuild.lock: pip[1]: 'x @ https://evil/x.whl' must not carry a URL or an environment marker"),
    (("schema",), "envbuild.lock/2", "label envbuild.lock: schema: 'envbuild.lock/2' is not 'envbuild.lock/1'"),
    (("extra",), 1, "label envbuild.lock: extra: unknown key; allowed keys: schema, recipe, base_image, os, python, cuda, torch, nccl, nccl_package, cudnn, driver, apt, pip, index, env, certify, resolved"),
])
def test_forged_lock_documents_are_refused(path, value, expected):
    with pytest.raises(EnvbuildError) as info:
        lockdoc.validate_lock(forged(path, value), "label envbuild.lock")
    assert (str(info.value), info.value.exit_code) == (expected, 2)


@pytest.mark.parametrize("lock_file", sorted(str(p.relative_to(ROOT)) for p in [*ROOT.glob("images/*/envbuild.lock.json"), *ROOT.glob("tests/golden/*/envbuild.lock.json")]))
def test_rendered_locks_validate_twin(lock_file):
    doc = json.loads((ROOT / lock_file).read_text())
    assert lockdoc.validate_lock(doc, lock_file).to_dict() == doc


@pytest.mark.parametrize("text, expected", [
    ('{"schema": NaN}', "label envbuild.lock: not valid JSON: NaN is not a number (NaN and Infinity are refused)"),
    ('{"n": ' + "1" * 5000 + "}", "label envbuild.lock: not valid JSON: an integer of 5000 digits (at most 30)"),
    ("[" * 10000 + "]" * 10000, "label envbuild.lock: not valid JSON: nesting deeper than 64 levels"),
    (" " * (1 << 20) + "{}", "label envbuild.lock: is 1048578 characters, over the 1048576-byte limit of a lock"),
])
def test_lock_label_text_is_read_with_bounds(text, expected):
    with pytest.raises(EnvbuildError) as info:
        lockdoc.read_lock_text(text, "label envbuild.lock")
    assert (str(info.value), info.value.exit_code) == (expected, 2)

