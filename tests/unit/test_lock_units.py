"""The engine-free tests of tests/integration/test_lock.py: builder/resolve/, the resolved pins in rendering, and reproducible builds (builder/image/fshash.py)."""

from __future__ import annotations

import io
import json
import os
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from builder.core.errors import EnvbuildError
from builder.image import fshash
from builder.image.site import SiteOptions
from builder.oci import reference
from builder.recipe import load, rules
from builder.recipe.lock import lock_hash
from builder.recipe.model import ResolvedWheel
from builder.recipe.spec import Spec
from builder.render import rendered as render
from builder.resolve import apt, pip

ROOT = Path(__file__).resolve().parents[2]


def spec_of(path) -> Spec:
    return rules.require_ok(rules.check(load.load(path)))


GOLDEN_SPEC = ROOT / "tests/recipes/golden-locked.yaml"
GOLDEN_DIR = ROOT / "tests/golden"


# --------------------------------------------------------------------------- rendering


def test_golden_locked_files():
    """Regenerate with `make golden` and review the diff."""
    out = render.render_for(spec_of(GOLDEN_SPEC), GOLDEN_DIR)
    for name, data in out.files.items():
        assert data.decode() == (GOLDEN_DIR / "golden-locked" / name).read_text(), name


def test_resolved_pins_reach_both_formats_and_the_lock():
    folder = GOLDEN_DIR / "golden-locked"
    resolved = json.loads((folder / "envbuild.resolved.json").read_text())
    docker = (folder / "Dockerfile").read_text()
    sing = (folder / "Singularity.def").read_text()
    lockdoc = json.loads((folder / "envbuild.lock.json").read_text())
    digest = resolved["base"]["digest"]
    assert f"ARG BASE_IMAGE=debian:bookworm-slim@{digest}\n" in docker
    assert f"From: debian:bookworm-slim@{digest}\n" in sing
    for text in (docker, sing):
        assert "--only-binary=:all: --require-hashes -r /tmp/envbuild-requirements.txt" in text
        for p in resolved["pip"]:
            line = f"{p['name']}=={p['version']} " + " ".join(f"--hash={h}" for h in p["hashes"])
            assert f"'{line}'" in text
        for name, version in resolved["apt"].items():
            assert f"{name}={version}" in text
        assert "curl=7.88.1-10+deb12u5" in text  # the recipe's own pin is kept
    # the lock keeps every existing key and gains `resolved`; the labels carry it
    base_lock = spec_of(GOLDEN_SPEC).lock()
    assert {k: v for k, v in lockdoc.items() if k != "resolved"} == base_lock.to_dict()
    assert lockdoc["resolved"]["base"]["digest"] == digest
    assert [p["name"] for p in lockdoc["resolved"]["pip"]] == [p["name"] for p in resolved["pip"]]
    assert f'org.opencontainers.image.base.digest="{digest}"' in docker
    assert f'envbuild.lock-hash="{lock_hash(lockdoc)}"' in docker


def test_hadolint_clean_with_resolved_pins():
    hadolint = shutil.which("hadolint", path=os.path.dirname(sys.executable)) or shutil.which("hadolint")
    res = subprocess.run([hadolint, "--config", str(ROOT / ".hadolint.yaml"), "--no-color",
                          str(GOLDEN_DIR / "golden-locked/Dockerfile")], capture_output=True, text=True)
    assert res.returncode == 0, res.stdout + res.stderr


def copy_recipe(tmp_path, name="golden-locked"):
    recipes = tmp_path / "recipes"
    recipes.mkdir()
    shutil.copy(GOLDEN_SPEC, recipes / f"{name}.yaml")
    images = tmp_path / "images"
    (images / name).mkdir(parents=True)
    shutil.copy(GOLDEN_DIR / "golden-locked/envbuild.resolved.json", images / name / "envbuild.resolved.json")
    return recipes, images


def test_stale_resolved_file_is_an_error_naming_file_and_field(tmp_path):
    recipes, images = copy_recipe(tmp_path)
    path = recipes / "golden-locked.yaml"
    path.write_text(path.read_text().replace("numpy==2.2.6", "numpy==2.2.5"))
    with pytest.raises(EnvbuildError) as e:
        render.render_for(spec_of(path), images)
    assert e.value.file == str(images / "golden-locked/envbuild.resolved.json") and e.value.field == "lock_hash"
    assert "run `envbuild lock golden-locked` again" in str(e.value)
    res = subprocess.run([sys.executable, "-m", "builder.cli", "--recipes-dir", str(recipes), "--images-dir",
                          str(images), "render", "golden-locked"], cwd=ROOT, capture_output=True, text=True)
    assert res.returncode == 2 and res.stderr.count("\n") == 1 and "lock_hash" in res.stderr


@pytest.mark.parametrize("path, value, field", [
    (("pip", 0, "name"), "filelock; rm -rf /", "pip[0].name"),
    (("pip", 0, "version"), "4.3.1 --index-url http://evil", "pip[0].version"),
    (("pip", 0, "hashes"), ["sha256:xyz"], "pip[0].hashes[0]"),
    (("pip", 0, "hashes"), [], "pip[0].hashes"),
    (("apt", "python3"), "3.11 && curl evil", "apt.python3"),
    (("base", "digest"), "sha256:abc", "base.digest"),
    (("schema",), "envbuild.resolved/0", "schema"),
])
def test_resolved_values_must_match_closed_patterns(tmp_path, path, value, field):
    recipes, images = copy_recipe(tmp_path)
    file = images / "golden-locked/envbuild.resolved.json"
    doc = json.loads(file.read_text())
    target = doc
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = value
    file.write_text(json.dumps(doc))
    with pytest.raises(EnvbuildError) as e:
        render.render_for(spec_of(recipes / "golden-locked.yaml"), images)
    assert e.value.field == field and e.value.file == str(file)


def test_render_check_sees_resolved_pins(tmp_path):
    recipes, images = copy_recipe(tmp_path)
    cmd = [sys.executable, "-m", "builder.cli", "--recipes-dir", str(recipes), "--images-dir", str(images)]
    assert subprocess.run([*cmd, "render", "golden-locked"], cwd=ROOT, capture_output=True).returncode == 0
    assert (images / "golden-locked/Dockerfile").read_bytes() == (GOLDEN_DIR / "golden-locked/Dockerfile").read_bytes()
    assert subprocess.run([*cmd, "render", "--check", "golden-locked"], cwd=ROOT, capture_output=True).returncode == 0
    (images / "golden-locked/envbuild.resolved.json").unlink()
    res = subprocess.run([*cmd, "render", "--check", "golden-locked"], cwd=ROOT, capture_output=True, text=True)
    assert res.returncode == 2 and "Dockerfile: stale" in res.stderr


# --------------------------------------------------------------------------- parsing


def test_parse_report_takes_pips_hashes():
    report = {"install": [
        {"metadata": {"name": "torch", "version": "2.13.0+cpu"}, "requested": True,
         "download_info": {"url": "file:///w/torch-2.13.0%2Bcpu-cp311-cp311-manylinux_2_28_x86_64.whl",
                           "archive_info": {"hashes": {"sha256": "a" * 64}}}},
        {"metadata": {"name": "Jinja2", "version": "3.1.6"},
         "download_info": {"url": "https://files/jinja2-3.1.6-py3-none-any.whl",
                           "archive_info": {"hash": "sha256=" + "b" * 64}}},
    ]}
    assert pip.parse_report(report) == [
        ResolvedWheel(name="Jinja2", version="3.1.6", hashes=("sha256:" + "b" * 64,),
                      file="jinja2-3.1.6-py3-none-any.whl", requested=False),
        ResolvedWheel(name="torch", version="2.13.0+cpu", hashes=("sha256:" + "a" * 64,),
                      file="torch-2.13.0+cpu-cp311-cp311-manylinux_2_28_x86_64.whl", requested=True),
    ]
    with pytest.raises(EnvbuildError, match="no sha256"):
        pip.parse_report({"install": [{"metadata": {"name": "x", "version": "1"}, "download_info": {"url": "u"}}]})


def test_platform_tags_and_apt_policy():
    tags = pip.platform_tags("2.36")
    assert tags[0] == "manylinux_2_36_x86_64" and "manylinux_2_17_x86_64" in tags and tags[-1] == "linux_x86_64"
    policy = "python3:\n  Installed: (none)\n  Candidate: 3.11.2-1+b1\n  Version table:\n" \
             "nothere:\n  Installed: (none)\n  Candidate: (none)\n"
    assert apt.parse_policy(policy) == {"python3": "3.11.2-1+b1"}
    base = reference.parse("debian:bookworm-slim")
    assert (base.registry, base.repository, base.tag, base.digest) == ("registry-1.docker.io", "library/debian",
                                                                       "bookworm-slim", None)
    assert reference.parse("reg:5000/a/b@sha256:" + "0" * 64).digest == "sha256:" + "0" * 64


def test_fshash_exclusions():
    assert fshash.is_excluded("usr/lib/python3.11/__pycache__/os.cpython-311.pyc")
    assert fshash.is_excluded("opt/venv/lib/x/__pycache__")
    assert fshash.is_excluded("var/log/dpkg.log") and fshash.is_excluded("var/cache/ldconfig/aux-cache")
    assert fshash.is_excluded("var/lib/dpkg/status-old") and not fshash.is_excluded("var/lib/dpkg/status")
    assert fshash.is_excluded(".dockerenv") and not fshash.is_excluded("etc/passwd")

    def tar(entries):
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w") as t:
            for name, data, mtime in entries:
                info = tarfile.TarInfo(name)
                info.size, info.mtime, info.mode = len(data), mtime, 0o644
                t.addfile(info, io.BytesIO(data))
        buf.seek(0)
        return buf

    a = fshash.hash_tar(tar([("etc/x", b"1", 1), ("var/log/l", b"a", 1), ("m.pyc", b"p", 1)]))
    b = fshash.hash_tar(tar([("var/log/l", b"bb", 2), ("etc/x", b"1", 99), ("m.pyc", b"q", 5)]))
    c = fshash.hash_tar(tar([("etc/x", b"2", 1)]))
    assert a.sha256 == b.sha256 and a.entries == 1 and a.excluded == 2
    assert a.sha256 != c.sha256 and str(fshash.differences(a, c)[0]).startswith("etc/x: file 0644")


# --------------------------------------------------------------------------- issue 8: apt names as argv


def test_apt_names_reach_the_query_as_argv_words():
    assert apt.apt_query_argv(["python3", "libgomp1"]) == ["sh", "-c", apt.APT_QUERY, "sh", "python3", "libgomp1"]
    assert apt.APT_QUERY.endswith('exec apt-cache policy "$@"')


@pytest.mark.parametrize("name", ["python3;touch /pwned", "python3\n", "$(reboot)", "-o=Dir::Etc=/x"])
def test_apt_query_refuses_a_name_that_is_not_a_package_name(name):
    with pytest.raises(EnvbuildError) as info:
        apt.resolve_apt(None, "debian:bookworm-slim", ["python3", name])
    assert (str(info.value), info.value.exit_code) == (f"apt: {name!r} is not a Debian package name; not queried".replace("\n", "\\n"), 2)


def test_pip_resolution_uses_the_derived_torch_index(tmp_path):
    from helpers import CUDA, write_recipe

    spec = rules.require_ok(rules.check(load.load(write_recipe(tmp_path, CUDA))))
    argv = pip.pip_command(spec, SiteOptions(), tmp_path / "r.json", tmp_path / "t")
    i = argv.index("--extra-index-url")
    assert argv[i + 1] == "https://download.pytorch.org/whl/cu128"

