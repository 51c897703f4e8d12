"""builder/render/stamp.py: a no-change build checks the rendered files by hashing, not rendering.

Each input that decides the rendering, changed, must leave the fast path (``current`` is None)
and its unchanged twin keeps it; ``envbuild build`` still refuses stale rendered files."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from builder.cli.commands.recipe import load_spec
from builder.recipe import load
from builder.render import rendered as render
from builder.render import stamp
from builder.render import write as render_write

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def site(tmp_path):
    """A recipes folder and its rendered images folder (cpu-torch2), and an empty stamp cache."""
    recipes, images = tmp_path / "recipes", tmp_path / "images"
    cache = stamp.default_dir({"ENVBUILD_CACHE_DIR": str(tmp_path / "cache")})
    recipes.mkdir()
    shutil.copy(ROOT / "recipes" / "cpu-torch2.yaml", recipes / "cpu-torch2.yaml")
    spec = load_spec("cpu-torch2", str(recipes))
    rendered = render.render_for(spec, images)
    render_write.write(rendered, images)
    assert stamp.record("cpu-torch2", recipes, images, spec.name, rendered.files, cache=cache) is not None
    return recipes, images, cache


def test_suffixes_are_the_loaders():
    assert stamp.SUFFIXES == load.SUFFIXES


def test_unchanged_inputs_take_the_fast_path(site):
    recipes, images, cache = site
    assert stamp.current("cpu-torch2", recipes, images, cache=cache) == "cpu-torch2"


def test_no_stamp_is_not_the_fast_path(site, tmp_path):
    recipes, images, _cache = site
    assert stamp.current("cpu-torch2", recipes, images, cache=tmp_path / "other-cache") is None


def test_changed_recipe_is_not_the_fast_path(site):
    recipes, images, cache = site
    path = recipes / "cpu-torch2.yaml"
    path.write_bytes(path.read_bytes() + b"# a comment changes the bytes\n")
    assert stamp.current("cpu-torch2", recipes, images, cache=cache) is None


def test_a_yml_twin_appearing_is_not_the_fast_path(site):
    recipes, images, cache = site
    (recipes / "cpu-torch2.yml").write_bytes((recipes / "cpu-torch2.yaml").read_bytes())
    assert stamp.current("cpu-torch2", recipes, images, cache=cache) is None


@pytest.mark.parametrize("name", ["Dockerfile", "Singularity.def", "envbuild.lock.json"])
def test_edited_rendered_file_is_not_the_fast_path(site, name):
    recipes, images, cache = site
    f = images / "cpu-torch2" / name
    f.write_bytes(f.read_bytes() + b"\n")
    assert stamp.current("cpu-torch2", recipes, images, cache=cache) is None


def test_missing_rendered_file_is_not_the_fast_path(site):
    recipes, images, cache = site
    (images / "cpu-torch2" / "Singularity.def").unlink()
    assert stamp.current("cpu-torch2", recipes, images, cache=cache) is None


def test_a_resolved_file_appearing_is_not_the_fast_path(site):
    recipes, images, cache = site
    (images / "cpu-torch2" / "envbuild.resolved.json").write_text("{}")
    assert stamp.current("cpu-torch2", recipes, images, cache=cache) is None


@pytest.mark.parametrize("changed", ["render/templates/Dockerfile.j2", "recipe/data/compat.yaml", "core/inputs.py",
                                     "render/context.py", "recipe/rules/stacks.py",
                                     "oci/reference.py"])
def test_changed_code_templates_or_facts_are_not_the_fast_path(site, tmp_path, monkeypatch, changed):
    recipes, images, cache = site
    copy = tmp_path / "builder"
    for d in stamp.CODE_DIRS:
        shutil.copytree(stamp._BUILDER / d, copy / d)
    monkeypatch.setattr(stamp, "_BUILDER", copy)
    files = {n: (images / "cpu-torch2" / n).read_bytes() for n in ("Dockerfile", "Singularity.def",
                                                                   "envbuild.lock.json")}
    stamp.record("cpu-torch2", recipes, images, "cpu-torch2", files, cache=cache)
    assert stamp.current("cpu-torch2", recipes, images, cache=cache) == "cpu-torch2"  # the twin
    f = copy / changed
    f.write_bytes(f.read_bytes() + b"\n")
    assert stamp.current("cpu-torch2", recipes, images, cache=cache) is None


def test_another_version_is_not_the_fast_path(site, monkeypatch):
    recipes, images, cache = site
    monkeypatch.setattr(stamp, "__version__", "99.0.0")
    assert stamp.current("cpu-torch2", recipes, images, cache=cache) is None


@pytest.mark.parametrize("text", ["", "not json", "[]", '{"format": "envbuild-render-stamp/1"}', "{" * 20000])
def test_malformed_stamp_is_not_the_fast_path(site, text):
    recipes, images, cache = site
    for f in cache.glob("*.json"):
        f.write_text(text)
    assert stamp.current("cpu-torch2", recipes, images, cache=cache) is None




def test_warning_is_plain_off_a_terminal_and_coloured_where_forced(capsys, monkeypatch):
    from builder.cli import output

    monkeypatch.delenv("FORCE_COLOR", raising=False)
    monkeypatch.delenv("TTY_COMPATIBLE", raising=False)
    output.console.cache_clear()
    output.warn("base stands in")
    assert capsys.readouterr().err == "warning: base stands in\n"
    monkeypatch.setenv("FORCE_COLOR", "1")
    output.console.cache_clear()
    try:
        output.warn("base stands in")
        assert capsys.readouterr().err == "\x1b[33mwarning: base stands in\x1b[0m\n"
    finally:
        output.console.cache_clear()
