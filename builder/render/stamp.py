"""Render stamps: decide "the rendered files are current" by hashing instead of rendering.

A no-change ``envbuild build`` must refuse stale rendered files; finding that out by rendering
costs the recipe check, the compatibility facts and jinja2 (~0.2 s of a ~0.3 s command). A
stamp records, after a render was compared with (or written to) ``images/<recipe>/``:

- ``inputs``: sha256 (64 hex) of every input that decides the rendering and the recipe check
  (:func:`inputs_digest`): the recipe file's bytes (each candidate path of the name, present or
  not), the compatibility facts (``builder/recipe/data/*``), the templates and the code of
  :mod:`builder.recipe`, :mod:`builder.render` and what they import (:mod:`builder.oci`,
  :mod:`builder.core`), envbuild's version and
  ``envbuild.resolved.json`` (or its absence);
- ``files``: the sha256 of each rendered file as it was rendered;
- ``recipe``: the recipe's name.

:func:`current` hashes the same inputs and the files on disk: any difference (a changed input,
an edited or missing rendered file, a stamp that is malformed, too big or of another version)
answers None and the caller renders as before. Site options (``--wheels``, ``--ca-cert``,
``--base``) do not enter the rendering; the build decides them (:mod:`builder.image.reuse`).

Stamps live in ``$ENVBUILD_CACHE_DIR`` (else ``$XDG_CACHE_HOME/envbuild``, else
``~/.cache/envbuild``) under ``render-stamps/<sha256 of the images folder, recipe argument and
recipes folder>.json``; a stamp that cannot be written is skipped (the next build renders).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from collections.abc import Mapping
from pathlib import Path

from builder import __version__
from builder.core.paths import RENDERED_FILES, RESOLVED_FILE

#: Recipe file suffixes (:data:`builder.recipe.load.SUFFIXES`; a test keeps them equal).
SUFFIXES = (".yaml", ".yml")
#: Version of the stamp's format and of :func:`inputs_digest`.
FORMAT = "envbuild-render-stamp/1"
#: Most bytes of a stamp file (a real one is ~500 bytes).
MAX_STAMP_BYTES = 16 << 10
#: Most bytes of one hashed input (a recipe is bounded far below by ``MAX_RECIPE_BYTES``).
MAX_INPUT_BYTES = 8 << 20
_HEX64 = re.compile(r"[0-9a-f]{64}")
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
    """Add ``label`` and the bytes of ``path`` (or "absent" / "not a file") to ``h``."""
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
    """sha256 (64 hex) of the inputs that decide the rendering of ``recipe`` (module docstring)."""
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
    """Write the stamp of ``files`` (the rendered files, name -> bytes, just compared with or
    written to ``images_dir/<recipe>/``). Returns its path, or None when it could not be written."""
    doc = {"format": FORMAT, "recipe": recipe,
           "inputs": inputs_digest(name_or_path, recipes_dir, images_dir, recipe),
           "files": {n: hashlib.sha256(files[n]).hexdigest() for n in RENDERED_FILES}}
    path = _stamp_path(name_or_path, recipes_dir, images_dir, cache)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp.write_text(json.dumps(doc, sort_keys=True), encoding="utf-8")
        os.replace(tmp, path)
    except OSError:
        tmp.unlink(missing_ok=True)
        return None
    return path


def _load(path: Path) -> dict[str, object] | None:
    """The stamp at ``path`` when it is well-formed, else None."""
    try:
        with open(path, "rb") as f:
            raw = f.read(MAX_STAMP_BYTES + 1)
    except OSError:
        return None
    if len(raw) > MAX_STAMP_BYTES:
        return None
    try:
        doc = json.loads(raw)
    except ValueError:
        return None
    if not isinstance(doc, dict) or set(doc) != {"format", "recipe", "inputs", "files"} or doc["format"] != FORMAT:
        return None
    files, recipe, inputs = doc["files"], doc["recipe"], doc["inputs"]
    if not (isinstance(recipe, str) and re.fullmatch(r"[a-z0-9][a-z0-9._-]{0,63}", recipe)
            and isinstance(inputs, str) and _HEX64.fullmatch(inputs) and isinstance(files, dict)
            and set(files) == set(RENDERED_FILES)
            and all(isinstance(v, str) and _HEX64.fullmatch(v) for v in files.values())):
        return None
    return doc


def current(name_or_path: str, recipes_dir: str | os.PathLike[str], images_dir: str | os.PathLike[str],
            cache: Path | None = None) -> str | None:
    """The recipe's name when a stamp shows the rendered files under ``images_dir/<recipe>/``
    current for unchanged inputs (module docstring); None when that cannot be shown this way
    (no stamp, any input or rendered file changed): the caller renders and compares."""
    doc = _load(_stamp_path(name_or_path, recipes_dir, images_dir, cache))
    if doc is None:
        return None
    recipe = str(doc["recipe"])
    if inputs_digest(name_or_path, recipes_dir, images_dir, recipe) != doc["inputs"]:
        return None
    if _file_digests(Path(images_dir) / recipe) != doc["files"]:
        return None
    return recipe
