"""Recipe loading and strict schema validation (builder/recipe.py)."""

import pytest

from builder import recipe
from builder.errors import EnvbuildError, ManyErrors
from helpers import CPU, CUDA, merge, write_recipe


def load(tmp_path, data):
    return recipe.load(write_recipe(tmp_path, data))


def messages(tmp_path, data):
    with pytest.raises(EnvbuildError) as info:
        load(tmp_path, data)
    assert info.value.exit_code == 2
    return str(info.value).replace(str(tmp_path) + "/", "")


def test_valid_cpu_recipe_loads(tmp_path):
    r = load(tmp_path, CPU)
    assert (r.name, r.base_image, r.python, r.cuda, r.torch_version, r.torch_variant) == (
        "t", "debian:bookworm-slim", "3.11", None, "2.13.0", "cpu")
    assert r.certify.backend == "gloo" and r.certify.nodes == 2 and r.certify.port == 29500


def test_valid_cuda_recipe_defaults_to_nccl(tmp_path):
    r = load(tmp_path, CUDA)
    assert (r.cuda, r.nccl, r.certify.backend, r.certify.gpus_per_node) == ("12.8", "2.27.3", "nccl", 1)


def test_injection_in_version_is_rejected(tmp_path):
    msg = messages(tmp_path, merge(CPU, {"torch": {"version": "2.8;rm -rf /"}}))
    assert msg == "t.yaml: torch.version: '2.8;rm -rf /' is not a version"


def test_typo_key_suggests_the_right_one(tmp_path):
    msg = messages(tmp_path, merge(CPU, {"torch": {"varient": "cpu"}}))
    assert msg == "t.yaml: torch.varient: unknown key; did you mean 'variant'?"


def test_unknown_top_level_key_lists_allowed(tmp_path):
    msg = messages(tmp_path, merge(CPU, {"zzz": 1}))
    assert msg.startswith("t.yaml: zzz: unknown key; allowed keys: description, base, os, python, cuda")


def test_every_error_is_listed(tmp_path):
    data = merge(CPU, {"python": "three", "certfy": {}, "packages": {"apt": ["ok", "bad pkg"]}})
    with pytest.raises(ManyErrors) as info:
        load(tmp_path, data)
    lines = str(info.value).replace(str(tmp_path) + "/", "").splitlines()
    assert lines == [
        "t.yaml: python: 'three' is not a version",
        "t.yaml: certfy: unknown key; did you mean 'certify'?",
        "t.yaml: packages.apt[1]: 'bad pkg' is not a Debian package name (name or name=version)",
    ]


@pytest.mark.parametrize("item, expected", [
    ("numpy==1.26.4; sys_platform == 'linux'", "must not carry a URL or an environment marker"),
    ("numpy @ https://evil/x.whl", "must not carry a URL or an environment marker"),
    ("--index-url=http://evil", "is not a PEP 508 requirement (name[extras] and version specifiers only)"),
    ("numpy==1.0 && curl evil", "is not a PEP 508 requirement (name[extras] and version specifiers only)"),
    ("torch==2.1.0", "torch is pinned by the torch section, not packages.pip"),
])
def test_pip_items_are_closed(tmp_path, item, expected):
    msg = messages(tmp_path, merge(CPU, {"packages": {"pip": [item]}}))
    assert msg == f"t.yaml: packages.pip[0]: {item!r} {expected}"


def test_pip_items_valid_twin(tmp_path):
    r = load(tmp_path, merge(CPU, {"packages": {"pip": ["numpy==1.26.4", "requests[socks]>=2.31,<3"], "apt": ["curl", "libgomp1=12.2.0-14"]}}))
    assert r.pip == ("numpy==1.26.4", "requests[socks]<3,>=2.31")
    assert r.apt == ("curl", "libgomp1=12.2.0-14")


@pytest.mark.parametrize("field, value, expected", [
    ("base", {"image": "debian:bookworm;rm"}, "base.image: 'debian:bookworm;rm' is not an image reference (name[:tag][@sha256:digest])"),
    ("os", {"id": "arch", "version": "1"}, "os.id: 'arch' is not a supported OS; use debian or ubuntu"),
    ("torch", {"version": "2.8.0", "variant": "rocm6"}, "torch.variant: 'rocm6' is not a torch variant; use cpu or cuXYZ such as cu128"),
    ("env", {"A B": "x"}, "env.A B: 'A B' is not an environment variable name"),
    ("env", {"X": "a b"}, "env.X: 'a b' must match [A-Za-z0-9_.,:/@%+=-]* (no spaces or quotes)"),
    ("index", {"url": "ftp://x"}, "index.url: 'ftp://x' is not an http(s) URL"),
    ("certify", {"backend": "mpi"}, "certify.backend: 'mpi' is not a backend; use gloo or nccl"),
    ("certify", {"port": 70000}, "certify.port: 70000 must be an integer in 1..65535"),
    ("certify", {"nodes": 0}, "certify.nodes: 0 must be an integer in 1..1024"),
    ("certify", {"nodes": 100000}, "certify.nodes: 100000 must be an integer in 1..1024"),
    ("certify", {"timeout_s": 10**21}, "certify.timeout_s: 1000000000000000000000 must be an integer in 1..604800"),
    ("certify", {"allreduce": {"sizes": [8, 6]}}, "certify.allreduce.sizes[1]: 6 must be a size in bytes, a multiple of 4 (float32), at most 68719476736"),
    ("certify", {"allreduce": {"sizes": [100000000000000]}}, "certify.allreduce.sizes[0]: 100000000000000 must be a size in bytes, a multiple of 4 (float32), at most 68719476736"),
    ("env", {"PATH": "/evil"}, "env.PATH: 'PATH' is set by envbuild or the runtime; it cannot be overridden"),
    ("env", {"LD_PRELOAD": "x.so"}, "env.LD_PRELOAD: 'LD_PRELOAD' is set by envbuild or the runtime; it cannot be overridden"),
    ("description", "two\nlines", "description: 'two\\nlines' must be one line of at most 200 printable characters"),
])
def test_field_values(tmp_path, field, value, expected):
    assert messages(tmp_path, merge(CPU, {field: value})) == f"t.yaml: {expected}"


def test_bounded_values_valid_twin(tmp_path):
    r = load(tmp_path, merge(CPU, {"description": "ünïcode ok", "env": {"OMP_NUM_THREADS": "2"},
                                   "certify": {"nodes": 1024, "timeout_s": 604800, "allreduce": {"sizes": [68719476736]}}}))
    assert (r.description, r.env, r.certify.nodes, r.certify.timeout_s, r.certify.allreduce.sizes) == (
        "ünïcode ok", (("OMP_NUM_THREADS", "2"),), 1024, 604800, (68719476736,))


def test_duplicate_key_is_an_error(tmp_path):
    text = "base: {image: debian:bookworm-slim}\nos: {id: debian, version: '12'}\npython: '3.11'\npython: '3.12'\ntorch: {version: 2.13.0}\n"
    assert messages(tmp_path, text) == "t.yaml: malformed YAML: line 4, column 1: duplicate key 'python'"


def test_binary_file_and_directory(tmp_path):
    (tmp_path / "t.yaml").write_bytes(b"\xff\xfe\x00garbage")
    with pytest.raises(EnvbuildError) as info:
        recipe.load(tmp_path / "t.yaml")
    assert str(info.value) == f"{tmp_path}/t.yaml: is not UTF-8 text"
    (tmp_path / "d.yaml").mkdir()
    with pytest.raises(EnvbuildError) as info:
        recipe.load(tmp_path / "d.yaml")
    assert str(info.value) == f"{tmp_path}/d.yaml: is a directory, not a recipe file"


def test_image_with_digest_is_valid(tmp_path):
    ref = "debian:bookworm-slim@sha256:" + "a" * 64
    assert load(tmp_path, merge(CPU, {"base": {"image": ref}})).base_image == ref


def test_missing_required_field(tmp_path):
    assert messages(tmp_path, merge(CPU, {"torch": ...})) == "t.yaml: torch: is required"


def test_missing_file(tmp_path):
    with pytest.raises(EnvbuildError) as info:
        recipe.load(tmp_path / "nope.yaml")
    assert str(info.value) == f"{tmp_path}/nope.yaml: no such recipe file"


def test_malformed_yaml(tmp_path):
    msg = messages(tmp_path, "base: [\n")
    assert msg == "t.yaml: malformed YAML: line 2, column 1: expected the node content, but found '<stream end>'"


def test_find_lists_known_recipes(tmp_path):
    (tmp_path / "a.yaml").write_text("x: 1")
    with pytest.raises(EnvbuildError) as info:
        recipe.find("zzz", tmp_path)
    assert str(info.value) == f"{tmp_path}/zzz.yaml: no such recipe; known recipes: a"
