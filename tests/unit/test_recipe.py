"""Recipe loading and strict schema validation (builder/recipe/load.py, model.py, fields.py)."""

import os
import time
from pathlib import Path

import pytest

from builder.core.errors import EnvbuildError, ManyErrors
from builder.oci import reference
from builder.recipe import fields
from builder.recipe import load as recipe

from helpers import CPU, CUDA, merge, write_recipe


def load(tmp_path, data):
    return recipe.load(write_recipe(tmp_path, data)).recipe


def messages(tmp_path, data):
    with pytest.raises(EnvbuildError) as info:
        load(tmp_path, data)
    assert info.value.exit_code == 2
    return str(info.value).replace(str(tmp_path) + "/", "")


def test_valid_cpu_recipe_loads(tmp_path):
    loaded = recipe.load(write_recipe(tmp_path, CPU))
    r = loaded.recipe
    assert (loaded.name, r.base.image, r.python, r.cuda, r.torch.version, r.torch.variant) == (
        "t", "debian:bookworm-slim", "3.11", None, "2.13.0", "cpu")
    assert r.certify.backend == "gloo" and r.certify.nodes == 2 and r.certify.port == 29500


def test_valid_cuda_recipe_defaults_to_nccl(tmp_path):
    r = load(tmp_path, CUDA)
    assert (r.cuda.version, r.nccl, r.certify.backend, r.certify.gpus_per_node) == ("12.8", "2.27.3", "nccl", 1)


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
    assert r.packages.pip == ("numpy==1.26.4", "requests[socks]<3,>=2.31")
    assert r.packages.apt == ("curl", "libgomp1=12.2.0-14")


@pytest.mark.parametrize("field, value, expected", [
    ("base", {"image": "debian:bookworm;rm"}, "base.image: 'debian:bookworm;rm' is not an image reference (name[:tag][@sha256:digest])"),
    ("os", {"id": "arch", "version": "1"}, "os.id: 'arch' is not a supported OS; use debian or ubuntu"),
    ("torch", {"version": "2.8.0", "variant": "rocm6"}, "torch.variant: 'rocm6' is not a torch variant; use cpu or cu and the CUDA digits, such as cu128"),
    ("env", {"A B": "x"}, "env.A B: 'A B' is not an environment variable name"),
    ("env", {"X": "a b"}, "env.X: 'a b' must match [A-Za-z0-9_.,:/@%+=^-]{0,1024} (no spaces or quotes)"),
    ("index", {"url": "ftp://x"}, "index.url: 'ftp://x' is not an http(s) URL"),
    ("index", {"url": "https://pypi.org:99999/simple"}, "index.url: 'https://pypi.org:99999/simple' is not an http(s) "
     "URL: its host is not HOST[:PORT] (a port in 1..65535)"),
    ("index", {"url": "https://pypi.org/simple", "torch_url": "http://h:0/x"}, "index.torch_url: 'http://h:0/x' is not an "
     "http(s) URL: its host is not HOST[:PORT] (a port in 1..65535)"),
    ("base", {"image": "reg.example:99999/debian:12"}, "base.image: 'reg.example:99999/debian:12' is not an image "
     "reference: registry is not HOST[:PORT] (a port in 1..65535)"),
    ("base", {"image": "a" * 256 + ":x"}, "base.image: '" + "a" * 196 + "... is not an image reference: name is longer "
     "than 255 characters"),
    ("base", {"image": "a" * 300}, "base.image: '" + "a" * 196 + "... is not an image reference: name is longer than 255 "
     "characters"),
    ("base", {"image": "a" * 255 + ":" + "t" * 201}, "base.image: '" + "a" * 196 + "... is not an image reference "
     "(name[:tag][@sha256:digest])"),
    ("certify", {"backend": "mpi"}, "certify.backend: 'mpi' is not a backend; use gloo or nccl"),
    ("certify", {"port": 70000}, "certify.port: 70000 must be an integer in 1..65535"),
    ("certify", {"nodes": 0}, "certify.nodes: 0 must be an integer in 1..1024"),
    ("certify", {"nodes": 100000}, "certify.nodes: 100000 must be an integer in 1..1024"),
    ("certify", {"timeout_s": 10**21}, "certify.timeout_s: 1000000000000000000000 must be an integer in 1..604800"),
    ("certify", {"allreduce": {"sizes": [8, 6]}}, "certify.allreduce.sizes[1]: 6 must be a size in bytes, a multiple of 4 (float32), at most 68719476736"),
    ("certify", {"allreduce": {"sizes": [100000000000000]}}, "certify.allreduce.sizes[0]: 100000000000000 must be a size in bytes, a multiple of 4 (float32), at most 68719476736"),
    ("env", {"PATH": "/evil"}, "env.PATH: 'PATH' is set by envbuild or the runtime; it cannot be overridden"),
    ("env", {"LD_PRELOAD": "x.so"}, "env.LD_PRELOAD: 'LD_PRELOAD' is set by envbuild or the runtime; it cannot be overridden"),
    ("description", "two\nlines", "description: 'two\\nlines' holds a control character (\\x0a); recipe values are printable text on one line (no newline, tab, escape or bidi control)"),
    ("description", "x" * 201, "description: '" + "x" * 196 + "... must be one line of at most 200 printable characters"),
])
def test_field_values(tmp_path, field, value, expected):
    assert messages(tmp_path, merge(CPU, {field: value})) == f"t.yaml: {expected}"


def test_bounded_values_valid_twin(tmp_path):
    r = load(tmp_path, merge(CPU, {"description": "ünïcode ok", "env": {"OMP_NUM_THREADS": "2"},
                                   "certify": {"nodes": 1024, "timeout_s": 604800, "allreduce": {"sizes": [68719476736]}}}))
    assert (r.description, r.env, r.certify.nodes, r.certify.timeout_s, r.certify.allreduce.sizes) == (
        "ünïcode ok", {"OMP_NUM_THREADS": "2"}, 1024, 604800, (68719476736,))


def test_duplicate_key_is_an_error(tmp_path):
    text = "base: {image: debian:bookworm-slim}\nos: {id: debian, version: '12'}\npython: '3.11'\npython: '3.12'\ntorch: {version: 2.13.0}\n"
    assert messages(tmp_path, text) == "t.yaml: malformed YAML: line 4, column 1: duplicate key 'python'"


def test_binary_file_and_directory(tmp_path):
    (tmp_path / "t.yaml").write_bytes(b"\xff\xfe\x00garbage")
    with pytest.raises(EnvbuildError) as info:
        recipe.load(tmp_path / "t.yaml")
    assert (str(info.value), info.value.exit_code) == (f"{tmp_path}/t.yaml: is not UTF-8 text (byte 0)", 2)
    (tmp_path / "d.yaml").mkdir()
    with pytest.raises(EnvbuildError) as info:
        recipe.load(tmp_path / "d.yaml")
    assert (str(info.value), info.value.exit_code) == (f"{tmp_path}/d.yaml: is a directory, not a recipe file", 3)


def test_reference_and_url_at_their_limits_twin(tmp_path):
    ref = "reg.example:65535/" + "a" * (255 - 18) + ":" + "t" * 128 + "@sha256:" + "a" * 64
    r = load(tmp_path, merge(CPU, {"base": {"image": ref}, "index": {"url": "https://pypi.org:65535/simple"}}))
    assert (len(r.base.image), r.index.url) == (456, "https://pypi.org:65535/simple")


def test_image_with_digest_is_valid(tmp_path):
    ref = "debian:bookworm-slim@sha256:" + "a" * 64
    assert load(tmp_path, merge(CPU, {"base": {"image": ref}})).base.image == ref


def test_missing_required_field(tmp_path):
    assert messages(tmp_path, merge(CPU, {"torch": ...})) == "t.yaml: torch: is required"


def test_missing_file(tmp_path):
    with pytest.raises(EnvbuildError) as info:
        recipe.load(tmp_path / "nope.yaml")
    assert (str(info.value), info.value.exit_code) == (f"{tmp_path}/nope.yaml: no such recipe file", 3)


def test_malformed_yaml(tmp_path):
    msg = messages(tmp_path, "base: [\n")
    assert msg == "t.yaml: malformed YAML: line 2, column 1: expected the node content, but found '<stream end>'"


def test_find_lists_known_recipes(tmp_path):
    (tmp_path / "a.yaml").write_text("x: 1")
    with pytest.raises(EnvbuildError) as info:
        recipe.find("zzz", tmp_path)
    assert (str(info.value), info.value.exit_code) == (f"{tmp_path}/zzz.yaml: no such recipe; known recipes: a", 3)


# --------------------------------------------------------------------------- issue 8: whole values, bounds
INJECTION = ("t.yaml: packages.apt[0]: 'python3\\n' holds a control character (\\x0a); recipe values are "
             "printable text on one line (no newline, tab, escape or bidi control)")


def test_trailing_newline_in_apt_cannot_inject_a_run_line(tmp_path):
    msg = messages(tmp_path, merge(CPU, {"packages": {"apt": ["python3\n", "run", "touch", "pwned"]}}))
    assert msg == INJECTION


def test_apt_list_without_the_newline_is_valid_twin(tmp_path):
    assert load(tmp_path, merge(CPU, {"packages": {"apt": ["python3", "run", "touch"]}})).packages.apt == (
        "python3", "run", "touch")


@pytest.mark.parametrize("changes, field, shown", [
    ({"base": {"image": "debian:bookworm-slim\n"}}, "base.image", "'debian:bookworm-slim\\n'"),
    ({"index": {"url": "https://pypi.org/simple\n"}}, "index.url", "'https://pypi.org/simple\\n'"),
    ({"index": {"torch_url": "https://download.pytorch.org/whl/cpu\n"}}, "index.torch_url", "'https://download.pytorch.org/whl/cpu\\n'"),
    ({"env": {"FOO": "bar\n"}}, "env.FOO", "'bar\\n'"),
    ({"env": {"FOO\n": "bar"}}, "env.FOO\\x0a", "'FOO\\n'"),
    ({"certify": {"shm_size": "1g\n"}}, "certify.shm_size", "'1g\\n'"),
    ({"cuda": {"version": "12.8\n"}}, "cuda.version", "'12.8\\n'"),
    ({"description": "ok\x1b[31m"}, "description", "'ok\\x1b[31m'"),
    ({"description": "right\u202eleft"}, "description", "'right\\u202eleft'"),
])
def test_control_characters_are_refused_in_every_field(tmp_path, changes, field, shown):
    ch = shown.split("\\", 1)[1]
    code = {"n": "\\x0a"}.get(ch[0], "\\" + ch[:3] if ch.startswith("x") else "\\" + ch[:5])
    assert messages(tmp_path, merge(CPU, changes)) == (
        f"t.yaml: {field}: {shown} holds a control character ({code}); recipe values are printable text "
        "on one line (no newline, tab, escape or bidi control)")


@pytest.mark.parametrize("pattern, good", [
    (reference.REFERENCE, "debian:bookworm-slim"), (fields.APT_NAME, "python3"), (fields.SHM_SIZE, "1g"),
    (fields.VARIANT, "cu128"), (fields.RECIPE_NAME, "cpu-torch2"), (fields.PIP_NAME, "numpy"),
    (fields.SHA256, "sha256:" + "a" * 64), (fields.URL, "https://pypi.org/simple"), (fields.RELEASE, "2.8.0"),
    (fields.ENV_VALUE, "x"), (fields.ENV_NAME, "X"), (fields.APT, "curl=7.88.1-10+deb12u5"),
    (fields.TORCH_LOCAL, "2.8.0+cu128"), (fields.APT_VERSION, "7.88.1-10"), (fields.PIP_VERSION, "2.2.6"),
    (fields.SPEC_VERSION, "2.2.6"), (fields.PYTHON_MINOR, "3.11"), (fields.WHEEL_FILE, "numpy-2.2.6-py3-none-any.whl"),
    (fields.PLATFORM_TAG, "manylinux_2_36_x86_64"),
])
def test_every_pattern_matches_the_whole_value(pattern, good):
    """Python's `$` matches before a final newline: each pattern must refuse `good + "\\n"`
    even through re.match (the CLI's argument types use .match)."""
    assert pattern.match(good) and pattern.fullmatch(good)
    assert pattern.match(good + "\n") is None and pattern.match(good + "\nRUN x") is None


@pytest.mark.parametrize("changes, expected", [
    ({"certify": {"port": 65536}}, "certify.port: 65536 must be an integer in 1..65535"),
    ({"certify": {"shm_size": "1025g"}}, "certify.shm_size: '1025g' is not a size from 1m to 1024g such as 1g or 512m"),
    ({"certify": {"shm_size": "0"}}, "certify.shm_size: '0' is not a size from 1m to 1024g such as 1g or 512m"),
    ({"certify": {"shm_size": "9" * 40}}, "certify.shm_size: '" + "9" * 40 + "' is not a size from 1m to 1024g such as 1g or 512m"),
    ({"certify": {"thresholds": {"min_busbw_gbps": float("nan")}}}, "certify.thresholds.min_busbw_gbps: nan must be a finite number > 0 and at most 1e+06"),
    ({"certify": {"thresholds": {"min_busbw_gbps": float("inf")}}}, "certify.thresholds.min_busbw_gbps: inf must be a finite number > 0 and at most 1e+06"),
    ({"certify": {"thresholds": {"min_busbw_gbps": -1.5}}}, "certify.thresholds.min_busbw_gbps: -1.5 must be a finite number > 0 and at most 1e+06"),
    ({"certify": {"allreduce": {"sizes": [8] * 65}}}, "certify.allreduce.sizes: [8, 8, 8, 8, 8, 8, ...] must be a non-empty list of at most 64 sizes in bytes"),
])
def test_numbers_are_bounded_and_finite(tmp_path, changes, expected):
    assert messages(tmp_path, merge(CPU, changes)) == f"t.yaml: {expected}"


def test_bounds_valid_twin(tmp_path):
    r = load(tmp_path, merge(CPU, {"certify": {"port": 65535, "shm_size": "1024g", "thresholds": {"min_busbw_gbps": 1e6}}}))
    assert (r.certify.port, r.certify.shm_size, r.certify.thresholds.min_busbw_gbps) == (65535, "1024g", 1e6)
    assert fields.shm_bytes("1024g") == 1 << 40 and fields.shm_bytes("256m") == 256 << 20 and fields.shm_bytes("4096") == 4096


def test_huge_integer_is_named_not_a_traceback(tmp_path):
    text = write_recipe(tmp_path, merge(CPU, {"certify": {"nodes": 2}})).read_text().replace("nodes: 2", "nodes: " + "7" * 5000)
    (tmp_path / "t.yaml").write_text(text)
    msg = messages(tmp_path, text)
    assert msg.startswith("t.yaml: certify.nodes: '777") and msg.endswith("... must be an integer in 1..1024")
    assert len(msg) < 300


@pytest.mark.parametrize("text, expected", [
    ("a: &a [x, x, x, x, x, x, x, x, x]\n" + "".join(f"{c}: &{c} [{', '.join(['*' + p] * 9)}]\n" for p, c in zip("abcdefgh", "bcdefghi", strict=True)) + "description: *i\n",
     "t.yaml: malformed YAML: line 6, column 4: expands to more than 100000 values (aliases counted at each use)"),
    ("? [a, b]\n: 1\n", "t.yaml: malformed YAML: line 1, column 3: a mapping key must be a plain value (no '? [a, b]' complex keys)"),
    ("description: " + "[" * 10000 + "]" * 10000 + "\n", "t.yaml: malformed YAML: line 1, column 77: nesting deeper than 64 levels"),
    ("python: '3.11'\ndescription: a\x00b\n", "t.yaml: malformed YAML: line 2, column 15: unacceptable character U+0000"),
    ("description: \x1b[2Jx\n", "t.yaml: malformed YAML: line 1, column 14: unacceptable character U+001B"),
])
def test_unbounded_yaml_is_refused_with_exit_2(tmp_path, text, expected):
    assert messages(tmp_path, text) == expected


def test_unreadable_inputs_exit_3(tmp_path):
    os.mkfifo(tmp_path / "fifo.yaml")
    (tmp_path / "zero.yaml").symlink_to("/dev/zero")
    (tmp_path / "big.yaml").write_bytes(b"#" * (1 << 20) + b"\n")
    got = {}
    for name in ("fifo", "zero", "big", "missing"):
        with pytest.raises(EnvbuildError) as info:
            recipe.load(tmp_path / f"{name}.yaml")
        got[name] = (str(info.value).replace(str(tmp_path) + "/", ""), info.value.exit_code)
    assert got == {
        "fifo": ("fifo.yaml: is not a regular file (a FIFO); give a recipe file", 3),
        "zero": ("zero.yaml: is not a regular file (a character device); give a recipe file", 3),
        "big": ("big.yaml: is 1048577 bytes, over the 1048576-byte limit of a recipe file", 3),
        "missing": ("missing.yaml: no such recipe file", 3),
    }


def test_recipe_at_the_size_limit_is_read_twin(tmp_path):
    text = yaml_text(CPU)
    (tmp_path / "t.yaml").write_text(text + "#" * ((1 << 20) - len(text) - 1) + "\n")
    assert recipe.load(tmp_path / "t.yaml").name == "t"


def yaml_text(data):
    import yaml

    return yaml.safe_dump(data, sort_keys=False)


def test_twenty_thousand_env_entries_load_in_linear_time(tmp_path):
    env = {f"V{i}": str(i) for i in range(20000)}
    t0 = time.monotonic()
    r = load(tmp_path, merge(CPU, {"env": env}))
    assert len(r.env) == 20000 and time.monotonic() - t0 < 20  # a quadratic path takes minutes


def test_bad_recipe_file_name_is_an_error(tmp_path):
    path = write_recipe(tmp_path, CPU, name="Bad_Name-")
    with pytest.raises(EnvbuildError) as info:
        recipe.load(path)
    assert str(info.value) == (f"{path}: is not named as a recipe: <name>.yaml with a <name> of at most 64 characters "
                               "[a-z0-9] joined by '.', '_', '__' or '-' (a docker repository name)")
    assert recipe.load(write_recipe(tmp_path, CPU, name="good.name_2")).name == "good.name_2"


def test_parse_keeps_valid_fields_and_names_invalid_ones(tmp_path):
    loaded = recipe.parse(write_recipe(tmp_path, merge(CPU, {"torch": {"variant": "rocm6"}, "python": "three"})))
    r = loaded.recipe
    assert [e.field for e in loaded.errors] == ["python", "torch.variant"]
    assert (r.python, r.torch.variant, r.torch.version, loaded.invalid) == (
        None, None, "2.13.0", frozenset({"python", "torch.variant"}))
    assert not loaded.valid("torch.variant") and not loaded.valid("torch") and loaded.valid("torch.version", "os.id")


@pytest.mark.parametrize("arg, expected", [
    ("images/x/Dockerfile", "images/x/Dockerfile: is not a recipe: a recipe is a .yaml or .yml file; audit a "
     "Dockerfile or Singularity definition with `envbuild audit images/x/Dockerfile`"),
    ("images/x/Singularity.def", "images/x/Singularity.def: is not a recipe: a recipe is a .yaml or .yml file; audit "
     "a Dockerfile or Singularity definition with `envbuild audit images/x/Singularity.def`"),
    ("notes.txt", "notes.txt: is not a recipe: a recipe is a .yaml or .yml file; give a recipe name such as "
     "cpu-torch2 or a path ending in .yaml"),
])
def test_find_explains_what_a_recipe_is(tmp_path, monkeypatch, arg, expected):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "notes.txt").write_text("x")
    with pytest.raises(EnvbuildError) as info:
        recipe.find(arg, tmp_path)
    assert (str(info.value), info.value.exit_code) == (expected, 2)


def test_find_takes_yml_and_names_twin(tmp_path):
    (tmp_path / "b.yml").write_text("x: 1")
    assert recipe.find("b", tmp_path) == tmp_path / "b.yml"
    assert recipe.find("any/where/x.yml", tmp_path) == Path("any/where/x.yml")


# --------------------------------------------------------------------------- published schemas (issue 9)
import json  # noqa: E402
import shutil  # noqa: E402

import jsonschema  # noqa: E402
import yaml  # noqa: E402

from builder.core.model import schema_files, stale_schemas  # noqa: E402
from builder.recipe.model import schemas  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]


def test_published_schemas_are_current():
    """Regenerate with `make golden` (scripts/schemas.py) and review the diff."""
    assert stale_schemas(schemas(), ROOT / "schemas") == []
    assert sorted(schema_files(schemas())) == [
        "certify-settings.schema.json", "lock.schema.json", "recipe.schema.json", "resolved.schema.json"]


def test_a_stale_schema_is_detected(tmp_path):
    shutil.copytree(ROOT / "schemas", tmp_path / "schemas")
    path = tmp_path / "schemas/lock.schema.json"
    path.write_text(path.read_text().replace('"maxLength": 64', '"maxLength": 65', 1))
    (tmp_path / "schemas/resolved.schema.json").unlink()
    assert stale_schemas(schemas(), tmp_path / "schemas") == ["lock.schema.json", "resolved.schema.json"]


def _validator(stem):
    return jsonschema.Draft202012Validator(json.loads((ROOT / f"schemas/{stem}.schema.json").read_text()))


DOCUMENTS = [("lock", p) for p in ("images/cpu-torch2/envbuild.lock.json", "images/cuda12-torch2/envbuild.lock.json",
                                   "tests/golden/golden-locked/envbuild.lock.json")] + [
    ("resolved", "tests/golden/golden-locked/envbuild.resolved.json"),
    ("recipe", "recipes/cpu-torch2.yaml"), ("recipe", "recipes/cuda12-torch2.yaml"),
    ("recipe", "tests/recipes/golden-extras.yaml")]


@pytest.mark.parametrize("stem, path", DOCUMENTS)
def test_committed_documents_validate_against_the_published_schemas(stem, path):
    """The published schemas are valid JSON Schema 2020-12 and accept what envbuild writes."""
    jsonschema.Draft202012Validator.check_schema(json.loads((ROOT / f"schemas/{stem}.schema.json").read_text()))
    text = (ROOT / path).read_text()
    doc = yaml.safe_load(text) if path.endswith(".yaml") else json.loads(text)
    assert list(_validator(stem).iter_errors(doc)) == []


@pytest.mark.parametrize("stem, path, change, where", [
    ("lock", "images/cpu-torch2/envbuild.lock.json", lambda d: d["certify"].update(nodes="abc"), ["certify", "nodes"]),
    ("lock", "images/cpu-torch2/envbuild.lock.json", lambda d: d["torch"].update(local="2.13.0"), ["torch", "local"]),
    ("lock", "images/cpu-torch2/envbuild.lock.json", lambda d: d.update(extra=1), []),
    ("resolved", "tests/golden/golden-locked/envbuild.resolved.json",
     lambda d: d["base"].update(digest="sha256:abc"), ["base", "digest"]),
    ("recipe", "recipes/cpu-torch2.yaml", lambda d: d["base"].update(image="debian:bookworm;rm"), ["base", "image"]),
])
def test_the_published_schemas_refuse_a_forged_value(stem, path, change, where):
    text = (ROOT / path).read_text()
    doc = yaml.safe_load(text) if path.endswith(".yaml") else json.loads(text)
    change(doc)
    assert [list(e.absolute_path) for e in _validator(stem).iter_errors(doc)] == [where]


# --------------------------------------------------------------------------- the check path stays lean (issue 13)
import subprocess  # noqa: E402
import sys  # noqa: E402

HEAVY = ("rich", "docker", "jinja2", "requests", "pydantic")
CHECK_PATH = """
import sys
from builder.recipe import load, rules
spec = rules.check(load.load(sys.argv[1]))
if sys.argv[2] == "render":
    from builder.render import rendered
    rendered.render(spec)
print(sorted({m.split(".")[0] for m in sys.modules} & set(sys.argv[3].split(","))))
"""


def _heavy_modules(*args):
    res = subprocess.run([sys.executable, "-c", CHECK_PATH, str(ROOT / "recipes/cpu-torch2.yaml"), *args,
                          ",".join(HEAVY)], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    return res.stdout.strip()


def test_load_and_check_import_no_heavy_module():
    assert _heavy_modules("check") == "[]"


def test_rendering_imports_jinja2_twin():
    """The probe above sees a heavy module when one is imported (rendering needs jinja2)."""
    assert _heavy_modules("render") == "['jinja2']"


def test_facts_are_parsed_with_the_c_loader_and_read_the_same():
    from builder.recipe import facts

    assert yaml.__with_libyaml__ and facts.loader() is yaml.CSafeLoader
    text = (ROOT / "builder/recipe/data/compat.yaml").read_text()
    import msgspec

    assert facts.facts() == msgspec.convert(yaml.load(text, Loader=yaml.SafeLoader), facts.Facts, strict=True)
    assert facts.facts().torch["2.8.0"].nccl["cu128"] == facts.NcclPin(package="nvidia-nccl-cu12", version="2.27.3",
                                                                        tag="V")
