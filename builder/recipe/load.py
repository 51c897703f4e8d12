"""Load a recipe YAML file into a Recipe: all problems of a file together, and the rules still
run on the fields that passed."""

from __future__ import annotations

import dataclasses
import types
import typing
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec

from builder.core import inputs
from builder.core import model as docmodel
from builder.core.errors import EnvbuildError, ManyErrors, Unreachable

from .fields import MAX_RECIPE_NAME, RECIPE_NAME, control_message, pip_requirement
from .model import DEFAULT_CERTIFY, DEFAULT_SIZES, Recipe

#: File name suffixes of a recipe.
SUFFIXES = (".yaml", ".yml")
#: The fields whose value is a version: a YAML number there is read as its text.
VERSION_FIELDS = frozenset({"os.version", "python", "cuda.version", "cuda.driver", "torch.version", "nccl", "cudnn"})


@dataclass(frozen=True)
class Loaded:
    """A recipe file read, with the ``errors`` of the fields named in ``invalid`` (left at defaults)."""

    name: str
    path: str
    recipe: Recipe
    invalid: frozenset[str] = frozenset()
    errors: tuple[EnvbuildError, ...] = ()

    def valid(self, *fields: str) -> bool:
        """True when none of ``fields``, a part of one, or a section holding one failed."""
        for f in fields:
            for bad in self.invalid:
                if bad == f or bad.startswith((f + ".", f + "[")) or f.startswith((bad + ".", bad + "[")):
                    return False
        return True


def parse(path: str | Path) -> Loaded:
    """``errors``: one EnvbuildError (exit 2) per invalid field. Raises Unreachable (exit 3):
    unreadable; EnvbuildError (exit 2): not UTF-8, malformed YAML, not a mapping."""
    p = Path(path)
    file = str(path)
    text = inputs.read_text(p, inputs.MAX_RECIPE_BYTES, "recipe file")
    data = inputs.load_yaml(text, file)
    if not isinstance(data, dict):
        raise EnvbuildError("a recipe must be a YAML mapping", file=file)
    loaded = validate(data, file, p.stem)
    if not (len(loaded.name) <= MAX_RECIPE_NAME and RECIPE_NAME.fullmatch(loaded.name)):
        named = EnvbuildError(
            f"is not named as a recipe: <name>.yaml with a <name> of at most {MAX_RECIPE_NAME} characters "
            "[a-z0-9] joined by '.', '_', '__' or '-' (a docker repository name)", file=file)
        loaded = dataclasses.replace(loaded, errors=(named, *loaded.errors))
    return loaded


def validate(data: dict[Any, Any], file: str, name: str) -> Loaded:
    """:func:`parse` for a mapping built in memory (``envbuild audit``); never raises for bad data."""
    data = normalise(data, Recipe)
    found = list(docmodel.violations(data, Recipe, control=control_message))
    invalid = frozenset(field for field, _value, _message in found)
    recipe = docmodel.partial(data, Recipe, invalid) if found else msgspec.convert(data, Recipe, strict=True)
    return Loaded(name=name, path=file, recipe=_canonical(recipe, data, invalid), invalid=invalid,
                  errors=tuple(docmodel.errors(found, file=file)))


def load(path: str | Path) -> Loaded:
    """:func:`parse`, raising ManyErrors (exit 2) listing every invalid field."""
    loaded = parse(path)
    if loaded.errors:
        raise ManyErrors(list(loaded.errors))
    return loaded


def normalise(data: dict[Any, Any], model: Any, prefix: str = "") -> dict[Any, Any]:
    """``data`` with YAML's readings undone: a null section is empty, another null is left out, a number in a version
    field or an ``env`` value is its text."""
    hints = {f.encode_name: hint for f, hint in docmodel.struct_fields(model)}
    out: dict[Any, Any] = {}
    for key, value in data.items():
        hint = hints.get(key) if isinstance(key, str) else None
        if hint is None:
            out[key] = value
            continue
        path = f"{prefix}.{key}" if prefix else key
        section, nullable = _section(hint)
        if value is None:
            if section is not None and not nullable:
                out[key] = {}
        elif section is not None and isinstance(value, dict):
            out[key] = normalise(value, section, path)
        elif path in VERSION_FIELDS and _is_number(value):
            out[key] = str(value)
        elif path == "env" and isinstance(value, dict):
            out[key] = {k: str(v) if _is_number(v) else v for k, v in value.items()}
        else:
            out[key] = value
    return out


def _section(annotation: Any) -> tuple[Any, bool]:
    while typing.get_origin(annotation) is typing.Annotated:
        annotation = typing.get_args(annotation)[0]
    args = typing.get_args(annotation)
    nullable = type(None) in args
    for t in (annotation, *args):
        if isinstance(t, type) and issubclass(t, msgspec.Struct):
            return t, nullable
    return None, nullable


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _canonical(recipe: Recipe, data: dict[Any, Any], invalid: frozenset[str]) -> Recipe:
    """Canonical form; a CUDA recipe naming no valid backend or GPU count gets nccl and 1 GPU."""
    replace = msgspec.structs.replace
    c = recipe.certify
    section = data.get("certify")
    given: dict[Any, Any] = section if isinstance(section, dict) else {}

    def chosen(key: str) -> bool:
        return key in given and f"certify.{key}" not in invalid

    cuda = recipe.cuda is not None
    certify = replace(
        c,
        backend=c.backend if chosen("backend") else ("nccl" if cuda else DEFAULT_CERTIFY.backend),
        gpus_per_node=c.gpus_per_node if chosen("gpus_per_node") else (1 if cuda else DEFAULT_CERTIFY.gpus_per_node),
        shm_size=c.shm_size.lower(),
        allreduce=replace(c.allreduce, sizes=tuple(sorted(set(c.allreduce.sizes))) or DEFAULT_SIZES),
    )
    packages = replace(recipe.packages, pip=tuple(pip_requirement(p)[1] for p in recipe.packages.pip))
    return replace(recipe, description=recipe.description.strip(), packages=packages,
                   env=dict(sorted(recipe.env.items())), certify=certify)


def names(recipes_dir: str | Path) -> list[str]:
    """The recipe names under ``recipes_dir`` (``*.yaml``, ``*.yml``), sorted."""
    return sorted({q.stem for s in SUFFIXES for q in Path(recipes_dir).glob(f"*{s}")})


def find(name_or_path: str, recipes_dir: str | Path = "recipes") -> Path:
    """``cpu-torch2`` -> ``recipes/cpu-torch2.yaml``. EnvbuildError (exit 2): not a recipe;
    Unreachable (exit 3): no such recipe."""
    p = Path(name_or_path)
    if p.suffix in SUFFIXES:
        return p
    candidates = [Path(recipes_dir) / f"{name_or_path}{suffix}" for suffix in SUFFIXES]
    is_name = "/" not in name_or_path and RECIPE_NAME.fullmatch(name_or_path) is not None
    if not is_name or (p.is_file() and not any(c.exists() for c in candidates)):
        lower = p.name.lower()
        what = (f"audit a Dockerfile or Singularity definition with `envbuild audit {inputs.escape(name_or_path, 200)}`"
                if lower.endswith(("dockerfile", "containerfile", ".def")) or lower.startswith("dockerfile") else
                "give a recipe name such as cpu-torch2 or a path ending in .yaml")
        raise EnvbuildError(f"is not a recipe: a recipe is a .yaml or .yml file; {what}", file=name_or_path)
    for candidate in candidates:
        if candidate.exists():
            return candidate
    known = names(recipes_dir)
    hint = f"; known recipes: {', '.join(known)}" if known else ""
    raise Unreachable(f"no such recipe{hint}", file=str(Path(recipes_dir) / f"{name_or_path}.yaml"))


def schema_fields(model: Any = Recipe, prefix: str = "") -> list[tuple[str, Any]]:
    """Every leaf field of ``model`` as ``(dotted path, type of its values)``, in schema order."""
    out: list[tuple[str, Any]] = []
    for f, hint in docmodel.struct_fields(model):
        path = f"{prefix}.{f.encode_name}" if prefix else f.encode_name
        section, _nullable = _section(hint)
        out.extend(schema_fields(section, path) if section is not None else [(path, _leaf_type(hint))])
    return out


def _leaf_type(annotation: Any) -> Any:
    while True:
        while typing.get_origin(annotation) is typing.Annotated:
            annotation = typing.get_args(annotation)[0]
        real = [a for a in typing.get_args(annotation) if a is not type(None)]
        if typing.get_origin(annotation) in (typing.Union, types.UnionType) and len(real) == 1:
            annotation = real[0]
            continue
        return typing.get_origin(annotation) or annotation
