"""Hostile recipes through ``envbuild check`` and ``envbuild render`` (issue 8).

A seeded, deterministic generator (:func:`hostile_recipes`, seed :data:`SEED`) makes at
least 160 hostile recipe files: control characters (newline, CR, ESC, DEL, NEL, bidi
overrides, line separators) at random places of random fields, trailing newlines, huge
strings, lists and integers, wrong types, alias bombs, deep nesting, complex keys, YAML
tags, duplicate keys, NaN/inf, non-UTF-8 bytes, several documents, FIFOs, devices,
folders, dangling links and over-size files. Each runs through both commands in the
bounded worker of :mod:`hostile.harness`: the exit code is the expected one (2 invalid,
3 unreadable), stderr holds exactly one ``error:`` line, escaped and short, with no
traceback, no hang and no memory blow-up.

:func:`test_trailing_newline_in_every_field` does the same for one field at a time, over
the field list of the recipe model itself (:func:`builder.recipe.load.schema_fields`): a field
added to the model without an example here fails.
"""

from __future__ import annotations

import copy
import random

import pytest
import yaml

from builder.recipe import load as recipe

from hostile.harness import Case, assert_held, run_cases

SEED = 20261108
#: How many generated recipes (each run through check and render).
COUNT = 180

BASE = {
    "description": "hostile-input base recipe",
    "base": {"image": "debian:bookworm-slim"},
    "os": {"id": "debian", "version": "12"},
    "python": "3.11",
    "cuda": None,
    "torch": {"version": "2.13.0", "variant": "cpu"},
    "packages": {"apt": ["curl"], "pip": ["numpy==2.2.6"]},
    "index": {"url": "https://pypi.org/simple", "torch_url": "https://download.pytorch.org/whl/cpu"},
    "env": {"OMP_NUM_THREADS": "1"},
    "certify": {"backend": "gloo", "nodes": 2, "gpus_per_node": 0, "port": 29500, "shm_size": "256m",
                "timeout_s": 300, "allreduce": {"sizes": [8, 1024], "iters": 10, "warmup": 2},
                "ddp": {"steps": 3, "batch_size": 8, "image_size": 64},
                "thresholds": {"min_busbw_gbps": 1.5, "busbw_size": 1024}},
}

#: A valid value of every schema field (lists and mappings: their one item carries the fault).
EXAMPLES = {
    "description": "a recipe", "base.image": "debian:bookworm-slim", "os.id": "debian", "os.version": "12",
    "python": "3.11", "cuda.version": "12.8", "cuda.driver": "570.26", "torch.version": "2.13.0",
    "torch.variant": "cpu", "nccl": "2.27.3", "cudnn": "9.10.2.21", "packages.apt": ["curl"],
    "packages.pip": ["numpy==2.2.6"], "index.url": "https://pypi.org/simple",
    "index.torch_url": "https://download.pytorch.org/whl/cpu", "env": {"FOO": "bar"}, "certify.backend": "gloo",
    "certify.nodes": 2, "certify.gpus_per_node": 0, "certify.port": 29500, "certify.shm_size": "256m",
    "certify.timeout_s": 300, "certify.allreduce.sizes": [8], "certify.allreduce.iters": 10,
    "certify.allreduce.warmup": 2, "certify.ddp.steps": 3, "certify.ddp.batch_size": 8,
    "certify.ddp.image_size": 64, "certify.thresholds.min_busbw_gbps": 1.5, "certify.thresholds.busbw_size": 1024,
    "packages.keep_pip": False,
}
#: Fields whose recipe must be a CUDA one for the field alone to be valid.
CUDA_FIELDS = ("cuda.driver", "nccl", "cudnn")
CUDA_BASE = dict(copy.deepcopy(BASE), base={"image": "nvidia/cuda:12.8.1-base-ubuntu24.04"},
                 os={"id": "ubuntu", "version": "24.04"}, python="3.12", cuda={"version": "12.8"},
                 torch={"version": "2.8.0", "variant": "cu128"},
                 index={"url": "https://pypi.org/simple", "torch_url": "https://download.pytorch.org/whl/cu128"},
                 certify=dict(BASE["certify"], backend="nccl", gpus_per_node=1))
CONTROLS = ["\n", "\r", "\t", "\x00", "\x1b", "\x07", "\x7f", "\x85", "\u2028", "\u2029", "\u202e", "\u2066",
            "\u200f", "\ufeff", "\x9b"]
SECTIONS = ("base", "os", "torch", "cuda", "packages", "index", "certify", "certify.allreduce", "certify.ddp",
            "certify.thresholds")
FIELDS = [p for p, _kind in recipe.schema_fields() if p not in CUDA_FIELDS]
NUMERIC = [p for p, kind in recipe.schema_fields() if kind in (int, float)]


def _set(data: dict, path: str, value) -> dict:
    node = data
    keys = path.split(".")
    for key in keys[:-1]:
        if not isinstance(node.get(key), dict):
            node[key] = {}
        node = node[key]
    node[keys[-1]] = value
    return data


def _carrier(path: str, bad):
    """``bad`` placed as the field's value, its list item or its env value."""
    example = EXAMPLES[path]
    if isinstance(example, list):
        return [bad]
    if isinstance(example, dict):
        return {"FOO": bad}
    return bad


def _text(data: dict) -> str:
    return yaml.safe_dump(data, sort_keys=False, allow_unicode=True)


def _with(path: str, bad) -> str:
    return _text(_set(copy.deepcopy(BASE), path, _carrier(path, bad)))


def _control(rng: random.Random) -> tuple[str, object]:
    path = rng.choice(FIELDS)
    example = EXAMPLES[path]
    text = str(example[0] if isinstance(example, list) else example["FOO"] if isinstance(example, dict) else example)
    pos = rng.randrange(len(text) + 1)
    ch = rng.choice(CONTROLS)
    return f"control-{path}-U+{ord(ch):04X}", _with(path, text[:pos] + ch + text[pos:])


def _trailing(rng: random.Random) -> tuple[str, object]:
    path = rng.choice(FIELDS)
    example = EXAMPLES[path]
    text = str(example[0] if isinstance(example, list) else example["FOO"] if isinstance(example, dict) else example)
    return f"trailing-{path}", _with(path, text + rng.choice(["\n", "\r\n", "\nRUN touch /pwned", "\n\n"]))


def _huge_string(rng: random.Random) -> tuple[str, object]:
    path = rng.choice(FIELDS)
    return f"huge-string-{path}", _with(path, rng.choice("ab9.-") * rng.choice([5000, 200_000]))


def _wrong_type(rng: random.Random) -> tuple[str, object]:
    path = rng.choice(FIELDS + list(SECTIONS))
    bad = rng.choice([["x", 1], {"k": "v"}, True, [[[]]], {"nested": {"deep": [1]}}])
    data = _set(copy.deepcopy(BASE), path, bad)
    return f"wrong-type-{path}-{type(bad).__name__}", _text(data)


def _huge_list(rng: random.Random) -> tuple[str, object]:
    path = rng.choice(["packages.apt", "packages.pip", "certify.allreduce.sizes"])
    item = {"packages.apt": "curl", "packages.pip": "numpy", "certify.allreduce.sizes": 8}[path]
    return f"huge-list-{path}", _text(_set(copy.deepcopy(BASE), path, [item] * rng.choice([1001, 20000])))


def _nan(rng: random.Random) -> tuple[str, object]:
    path = rng.choice(NUMERIC)
    return f"nan-{path}", _text(_set(copy.deepcopy(BASE), path, rng.choice([float("nan"), float("inf"), float("-inf"), -1e308])))


def _huge_int(rng: random.Random) -> tuple[str, object]:
    path = rng.choice(NUMERIC + ["torch.version", "python", "os.version"])
    digits = "9" * rng.choice([31, 400, 5000, 100_000])
    return f"huge-int-{path}", _text(_set(copy.deepcopy(BASE), path, "HUGEINT")).replace("HUGEINT", digits)


def _alias_bomb(rng: random.Random) -> tuple[str, object]:
    width = rng.choice([9, 10, 16])
    levels = "".join(f"{chr(98 + i)}: &{chr(98 + i)} [{', '.join(['*' + chr(97 + i)] * width)}]\n" for i in range(8))
    path = rng.choice(FIELDS)
    body = _text(_set(copy.deepcopy(BASE), path, "BOMB")).replace("BOMB", "*i")
    return f"alias-bomb-{width}-{path}", f"a: &a [{', '.join(['x'] * width)}]\n" + levels + body


def _deep(rng: random.Random) -> tuple[str, object]:
    depth = rng.choice([65, 500, 10_000, 50_000])
    style = rng.choice(["flow-list", "flow-map", "block"])
    if style == "flow-list":
        value = "[" * depth + "]" * depth
    elif style == "flow-map":
        value = "{a: " * depth + "1" + "}" * depth
    else:
        value = "".join(f"\n{'  ' * (i + 1)}k:" for i in range(min(depth, 300))) + " 1"
    path = rng.choice(FIELDS)
    return f"deep-{style}-{depth}-{path}", _text(_set(copy.deepcopy(BASE), path, "DEEP")).replace("DEEP", value)


def _yaml_structure(rng: random.Random) -> tuple[str, object]:
    kind = rng.choice(["complex-key", "nested-complex-key", "tag", "duplicate", "documents", "scalar", "empty",
                       "recursive", "merge-bomb"])
    body = _text(copy.deepcopy(BASE))
    text = {
        "complex-key": "? [a, b]\n: 1\n" + body,
        "nested-complex-key": body + "extra:\n  ? {x: 1}\n  : 2\n",
        "tag": body.replace("description: hostile-input base recipe", "description: !!python/object/apply:os.system ['id']"),
        "duplicate": body + "python: '3.12'\n",
        "documents": body + "---\n" + body,
        "scalar": rng.choice(["just a string\n", "42\n", "[1, 2, 3]\n", "null\n"]),
        "empty": rng.choice(["", "\n", "# only a comment\n", "---\n"]),
        "recursive": "a: &a [*a]\n" + body,
        "merge-bomb": "x: &x {a: 1}\n" + "".join(f"y{i}: &y{i} {{<<: *{'x' if i == 0 else f'y{i - 1}'}, b{i}: 1}}\n" for i in range(60)) + body,
    }[kind]
    return f"yaml-{kind}", text


def _bad_key(rng: random.Random) -> tuple[str, object]:
    section = rng.choice(["", "torch", "certify", "env", "packages"])
    key = rng.choice(["desc\u202eription", "py\nthon", "\x1b[31mred", "tab\tkey", "ok\u2028"])
    data = copy.deepcopy(BASE)
    target = data if not section else data[section]
    target[key] = "x"
    return f"bad-key-{section or 'top'}-{ord(key[4]) if len(key) > 4 else 0}", _text(data)


def _bytes(rng: random.Random) -> tuple[str, object]:
    raw = _text(copy.deepcopy(BASE)).encode()
    pos = rng.randrange(len(raw))
    junk = rng.choice([b"\xff", b"\xc3\x28", b"\xed\xa0\x80", b"\xf8\x88\x80\x80\x80", b"\x80"])
    return f"not-utf8-{junk.hex()}", raw[:pos] + junk + raw[pos:]


GENERATORS = (_control, _trailing, _huge_string, _wrong_type, _huge_list, _nan, _huge_int, _alias_bomb, _deep,
              _yaml_structure, _bad_key, _bytes)

#: Files that cannot be read as a recipe (exit 3): name -> the case's files.
UNREADABLE = {
    "fifo": {"r.yaml": {"fifo": True}},
    "dev-zero": {"r.yaml": {"symlink": "/dev/zero"}},
    "dev-null": {"r.yaml": {"symlink": "/dev/null"}},
    "dev-urandom": {"r.yaml": {"symlink": "/dev/urandom"}},
    "directory": {"r.yaml/inner": "x"},
    "dir-symlink": {"d/x": "y", "r.yaml": {"symlink": "d"}},
    "dangling-symlink": {"r.yaml": {"symlink": "nowhere.yaml"}},
    "over-size": {"r.yaml": "description: " + "x" * (2 << 20) + "\n"},
    "over-size-by-one": {"r.yaml": "#" * (1 << 20) + "\n"},
    "missing": {},
}


def hostile_recipes(seed: int = SEED, count: int = COUNT) -> list[tuple[str, dict, int]]:
    """``count`` generated hostile recipes plus the unreadable kinds, as ``(id, files, exit
    code)``; the same list for the same seed."""
    rng = random.Random(seed)
    out: list[tuple[str, dict, int]] = []
    for i in range(count):
        name, content = GENERATORS[i % len(GENERATORS)](rng)
        out.append((f"{i:03d}-{name}", {"r.yaml": content}, 2))
    out.extend((f"unreadable-{name}", files, 3) for name, files in UNREADABLE.items())
    # a control character in the path given on the command line is a usage error (64)
    out.append(("bad-file-name", {"R\x1b[1m ecipe.yaml": _text(BASE)}, 64))
    out.append(("at-the-size-limit", {"r.yaml": "#" * (1 << 20)}, 2))  # read (1 MiB), then: not a mapping
    return out


def _cases(generated: list[tuple[str, dict, int]]) -> list[Case]:
    cases = []
    for cid, files, code in generated:
        path = next(iter(files), "r.yaml").split("/")[0] if "bad-file-name" in cid else "r.yaml"
        # check also prints the notes of the rules that still ran (e.g. a derived torch index)
        cases.append(Case(f"check:{cid}", ["check", path], (code,), files=files, max_stderr_lines=None))
        cases.append(Case(f"render:{cid}", ["--images-dir", "out", "render", path], (code,), files=files))
    return cases


GENERATED = hostile_recipes()
CASES = _cases(GENERATED)


@pytest.fixture(scope="module")
def outcomes():
    return run_cases(CASES)


def test_generator_is_seeded_and_large_enough():
    assert hostile_recipes() == GENERATED and len(GENERATED) >= 160
    assert hostile_recipes(SEED + 1) != GENERATED


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_hostile_recipe_gives_one_error_line(outcomes, case):
    outcome = outcomes[case.id]
    assert_held(case, outcome)
    lines = [line for line in outcome.stderr.splitlines() if not line.startswith("note: ")]
    prefix = f"envbuild {case.argv[-2]}: " if case.expect == (64,) else "error: "  # usage errors name the command
    assert len(lines) == 1 and lines[0].startswith(prefix), lines
    assert "Traceback" not in outcome.stderr and outcome.stdout == ""


# --------------------------------------------------------------------------- one field at a time
def _newline_case(path: str, command: str) -> Case:
    base = CUDA_BASE if path in CUDA_FIELDS else BASE
    example = EXAMPLES[path]
    text = str(example[0] if isinstance(example, list) else example["FOO"] if isinstance(example, dict) else example)
    data = _set(copy.deepcopy(base), path, _carrier(path, text + "\n"))
    argv = ["check", "r.yaml"] if command == "check" else ["--images-dir", "out", "render", "r.yaml"]
    return Case(f"{command}:newline:{path}", argv, (2,), files={"r.yaml": _text(data)}, max_stderr_lines=None)


def _named(path: str) -> str:
    example = EXAMPLES[path]
    return f"{path}[0]" if isinstance(example, list) else f"{path}.FOO" if isinstance(example, dict) else path


FIELD_PATHS = [p for p, _kind in recipe.schema_fields()]
FIELD_CASES = [_newline_case(p, cmd) for p in FIELD_PATHS for cmd in ("check", "render")]


@pytest.fixture(scope="module")
def field_outcomes():
    return run_cases(FIELD_CASES)


def test_every_schema_field_has_an_example():
    assert sorted(EXAMPLES) == sorted(FIELD_PATHS)


@pytest.mark.parametrize("path", FIELD_PATHS)
@pytest.mark.parametrize("command", ["check", "render"])
def test_trailing_newline_in_every_field(field_outcomes, path, command):
    case = next(c for c in FIELD_CASES if c.id == f"{command}:newline:{path}")
    outcome = field_outcomes[case.id]
    assert_held(case, outcome)
    example = EXAMPLES[path]
    text = str(example[0] if isinstance(example, list) else example["FOO"] if isinstance(example, dict) else example)
    errors = [line for line in outcome.stderr.splitlines() if not line.startswith("note: ")]
    assert errors == [f"error: r.yaml: {_named(path)}: {text + chr(10)!r} holds a control character (\\x0a); recipe "
                      "values are printable text on one line (no newline, tab, escape or bidi control)"]
