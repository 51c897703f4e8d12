"""Render stamps: "the rendered files are current" by hashing, as rendering to find out costs
~0.2 s of a no-change ~0.3 s build. Any difference or a bad stamp: None, and the caller renders."""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Literal

import msgspec

from builder import __version__
from builder.core.errors import EnvbuildError
from builder.core.files import write_atomic
from builder.core.paths import RENDERED_FILES, RESOLVED_FILE

#: Recipe file suffixes (:data:`builder.recipe.load.SUFFIXES`; a test keeps them equal).
SUFFIXES = (".yaml", ".yml")
#: Version of the stamp's format and of :func:`inputs_digest`.
FORMAT = "envbuild-render-stamp/1"
#: Most bytes of a stamp file (a real one is ~500 bytes).
MAX_STAMP_BYTES = 16 << 10
#: Most bytes of one hashed input (a recipe is bounded far below by ``MAX_RECIPE_BYTES``).
MAX_INPUT_BYTES = 8 << 20
_BUILDER = Path(__file__).resolve().parent.parent
#: Folders whose files decide the rendering (code, templates, facts).
CODE_DIRS = ("core", "oci", "recipe", "render")


def default_dir(env: Mapping[str, str] | None = None) -> Path:
    """``$ENVBUILD_CACHE_DIR``, ``$XDG_CACHE_HOME/envbuild`` or ``~/.cache/envbuild``, then ``render-stamps``."""
    env = os.environ if env is None else env
    root = env.get("ENVBUILD_CACHE_DIR") or (
        os.path.join(env["XDG_CACHE_HOME"], "envbuild") if env.get("XDG_CACHE_HOME") else None)
    return Path(root or Path.home() / ".cache" / "envbuild") / "render-stamps"


def recipe_candidates(name_or_path: str, recipes_dir: str | os.PathLike[str]) -> list[Path]:
    """The paths :func:`builder.recipe.load.find` may read for ``name_or_path``."""
    p = Path(name_or_path)
    if p.suffix in SUFFIXES:
        return [p]
    return [p, *(Path(recipes_dir) / f"{name_or_path}{s}" for s in SUFFIXES)]


def _code_files() -> list[Path]:
    files: list[Path] = []
    for d in CODE_DIRS:
        files.extend(q for q in (_BUILDER / d).rglob("*") if q.is_file() and "__pycache__" not in q.parts)
    return sorted(files)


def _feed(h: hashlib._Hash, label: str, path: Path) -> None:
    try:
        with open(path, "rb") as f:
            data = f.read(MAX_INPUT_BYTES + 1)
    except IsADirectoryError:
        data, label = b"", label + ":dir"
    except OSError:
        data, label = b"", label + ":absent"
    h.update(f"{label}\0{len(data)}\0".encode("utf-8", "surrogateescape"))
    h.update(data)


def inputs_digest(name_or_path: str, recipes_dir: str | os.PathLike[str],
                  images_dir: str | os.PathLike[str], recipe: str) -> str:
    """sha256 (64 hex) of the inputs that decide the rendering of ``recipe``."""
    h = hashlib.sha256(f"{FORMAT}\0{__version__}\0{name_or_path}\0{os.fspath(recipes_dir)}\0{recipe}\0".encode(
        "utf-8", "surrogateescape"))
    for i, p in enumerate(recipe_candidates(name_or_path, recipes_dir)):
        _feed(h, f"recipe{i}", p)
    for q in _code_files():
        _feed(h, q.relative_to(_BUILDER).as_posix(), q)
    _feed(h, "resolved", Path(images_dir) / recipe / RESOLVED_FILE)
    return h.hexdigest()


def _stamp_path(name_or_path: str, recipes_dir: str | os.PathLike[str], images_dir: str | os.PathLike[str],
                cache: Path | None) -> Path:
    key = "\0".join((os.path.abspath(images_dir), name_or_path, os.path.abspath(recipes_dir)))
    return (cache or default_dir()) / f"{hashlib.sha256(key.encode('utf-8', 'surrogateescape')).hexdigest()}.json"


def _file_digests(folder: Path) -> dict[str, str] | None:
    out: dict[str, str] = {}
    for name in RENDERED_FILES:
        try:
            out[name] = hashlib.sha256((folder / name).read_bytes()).hexdigest()
        except OSError:
            return None
    return out


def record(name_or_path: str, recipes_dir: str | os.PathLike[str], images_dir: str | os.PathLike[str],
           recipe: str, files: Mapping[str, bytes], cache: Path | None = None) -> Path | None:
    """Write the stamp of ``files`` just compared with or written to disk; None when it cannot be written."""
    doc = {"format": FORMAT, "recipe": recipe, "inputs": inputs_digest(name_or_path, recipes_dir, images_dir, recipe),
           "files": {n: hashlib.sha256(files[n]).hexdigest() for n in RENDERED_FILES}}
    path = _stamp_path(name_or_path, recipes_dir, images_dir, cache)
    try:
        return write_atomic(path, json.dumps(doc, sort_keys=True).encode("utf-8"))
    except EnvbuildError:
        return None


_Hex64 = Annotated[str, msgspec.Meta(pattern=r"\A[0-9a-f]{64}\Z")]


class _Stamp(msgspec.Struct, forbid_unknown_fields=True):
    format: Literal["envbuild-render-stamp/1"]
    recipe: Annotated[str, msgspec.Meta(pattern=r"\A[a-z0-9][a-z0-9._-]{0,63}\Z")]
    inputs: _Hex64
    files: dict[str, _Hex64]


def _load(path: Path) -> _Stamp | None:
    try:
        with open(path, "rb") as f:
            raw = f.read(MAX_STAMP_BYTES + 1)
        doc = msgspec.json.decode(raw, type=_Stamp) if len(raw) <= MAX_STAMP_BYTES else None
    except (OSError, msgspec.DecodeError):  # ValidationError is a DecodeError
        return None
    return doc if doc is not None and set(doc.files) == set(RENDERED_FILES) else None


def current(name_or_path: str, recipes_dir: str | os.PathLike[str], images_dir: str | os.PathLike[str],
            cache: Path | None = None) -> str | None:
    """The recipe's name when a stamp shows its rendered files current; None: render and compare."""
    doc = _load(_stamp_path(name_or_path, recipes_dir, images_dir, cache))
    if doc is None:
        return None
    if inputs_digest(name_or_path, recipes_dir, images_dir, doc.recipe) != doc.inputs:
        return None
    if _file_digests(Path(images_dir) / doc.recipe) != doc.files:
        return None
    return doc.recipe
