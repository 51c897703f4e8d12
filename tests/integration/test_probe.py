"""builder/agent/probe/: run as the agent payload on stdin (`python3 -c BOOTSTRAP probe`, as
docker exec, ssh and srun run it) in subprocesses,
against a real NCCL library from the nvidia-nccl-cu12 2.27.3 wheel (no GPU needed: its
ncclGetVersion answers 22703), plus the pure parsing helpers with literal inputs."""

from __future__ import annotations

import glob
import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from test_probe_units import base_env, nccl_entry, run_probe_stdin  # noqa: F401

from fixtures_engine import run_lock

REPO = Path(__file__).resolve().parents[2]
PROBE = REPO / "builder" / "agent" / "probe"
NCCL_PIN = "nvidia-nccl-cu12==2.27.3"
WHEEL_GLOB = "/tmp/nccl/nvidia_nccl_cu12-2.27.3-*.whl"


def run_collect(env, preload=None):
    """In a fresh interpreter: optionally ctypes-load `preload`, then probe.collect().

    Also reports whether any libnccl is mapped after collect() (it must not be, unless
    preloaded: the versions of libraries on disk are read in subprocesses)."""
    code = textwrap.dedent(f"""
        import ctypes, json, sys
        preload = {str(preload) if preload else None!r}
        if preload:
            ctypes.CDLL(preload)
        sys.path.insert(0, {str(PROBE.parent)!r})
        import probe
        doc = probe.collect()
        maps = open("/proc/self/maps").read()
        doc["_mapped_nccl"] = sorted({{l.split()[-1] for l in maps.splitlines()
                                       if "/libnccl" in l}})
        print(json.dumps(doc))
    """)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, env=env,
                          timeout=120, text=True)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


@pytest.fixture(scope="session")
def nccl_target(request, tmp_path_factory):
    """Directory with the nvidia-nccl-cu12 2.27.3 wheel installed by `pip --target`.

    Cached under pytest's cache dir (.pytest_cache) so reruns skip pip. The wheel comes
    from $ENVBUILD_NCCL_WHEEL, /tmp/nccl/, or `pip download`; skips if none works."""
    cache = getattr(request.config, "cache", None)
    target = Path(cache.mkdir("envbuild-nccl-cu12-2.27.3")) if cache else \
        tmp_path_factory.mktemp("nccl")
    with run_lock("nccl-target"):  # one pip install into the shared cache folder at a time
        return _install_nccl(target, tmp_path_factory)


def _install_nccl(target: Path, tmp_path_factory) -> Path:
    lib = target / "nvidia" / "nccl" / "lib" / "libnccl.so.2"
    if lib.is_file():
        return target
    wheels = [os.environ.get("ENVBUILD_NCCL_WHEEL")] + sorted(glob.glob(WHEEL_GLOB))
    wheel = next((w for w in wheels if w and os.path.isfile(w)), None)
    if wheel is None:
        dl = tmp_path_factory.mktemp("nccl-download")
        proc = subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps",
                               "--only-binary=:all:", "-d", str(dl), NCCL_PIN],
                              capture_output=True, text=True, timeout=600)
        found = sorted(dl.glob("*.whl"))
        if proc.returncode != 0 or not found:
            pytest.skip(f"no {NCCL_PIN} wheel available: {proc.stderr.strip()[-300:]}")
        wheel = str(found[0])
    proc = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps",
                           "--target", str(target), wheel],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr
    assert lib.is_file()
    return target


# --- NCCL: on disk, loaded, pip ----------------------------------------------------------

def test_found_via_ld_library_path(nccl_target):
    libdir = nccl_target / "nvidia" / "nccl" / "lib"
    doc = run_probe_stdin(base_env(LD_LIBRARY_PATH=f"/nonexistent:{libdir}"))
    entry = nccl_entry(doc["nccl"]["found"], libdir / "libnccl.so.2")
    assert entry == {"path": str(libdir / "libnccl.so.2"),
                     "realpath": str((libdir / "libnccl.so.2").resolve()),
                     "version": "2.27.3", "code": 22703, "error": None}
    assert doc["nccl"]["loaded"] is None  # found on disk is not loaded
    assert doc["nccl"]["pip_packages"] == {}  # the target dir is not on sys.path
    paths = [f["path"] for f in doc["nccl"]["found"]]
    assert paths == sorted(paths)


def test_found_via_site_dir_and_pip_metadata(nccl_target):
    doc = run_probe_stdin(base_env(PYTHONPATH=str(nccl_target)))
    entry = nccl_entry(doc["nccl"]["found"], nccl_target / "nvidia" / "nccl" / "lib" / "libnccl.so.2")
    assert (entry["version"], entry["code"]) == ("2.27.3", 22703)
    assert doc["nccl"]["pip_packages"] == {"nvidia-nccl-cu12": "2.27.3"}


def test_symlinks_to_one_file_are_listed_once(nccl_target, tmp_path):
    # The layout of a system libnccl2: libnccl.so -> libnccl.so.2 -> libnccl.so.2.27.3.
    real = tmp_path / "z" / "libnccl.so.2.27.3"
    real.parent.mkdir()
    shutil.copy(nccl_target / "nvidia" / "nccl" / "lib" / "libnccl.so.2", real)
    links = tmp_path / "a"
    links.mkdir()
    (links / "libnccl.so").symlink_to(real)
    (links / "libnccl.so.2").symlink_to(real)
    (links / "libnccl-net.so").symlink_to(real)  # a plugin's name: not NCCL core
    doc = run_probe_stdin(base_env(LD_LIBRARY_PATH=f"{links}:{real.parent}"))
    same = [f for f in doc["nccl"]["found"] if f["realpath"] == str(real)]
    assert [(f["path"], f["code"]) for f in same] == [(str(real), 22703)]  # the file itself
    doc = run_probe_stdin(base_env(LD_LIBRARY_PATH=str(links)))  # only the links
    same = [f for f in doc["nccl"]["found"] if f["realpath"] == str(real)]
    assert [(f["path"], f["code"]) for f in same] == [(str(links / "libnccl.so"), 22703)]


def test_loaded_ignores_plugins(nccl_target, tmp_path):
    plugin = tmp_path / "libnccl-net.so"  # any mapped libnccl-* is a plugin, not NCCL
    shutil.copy(nccl_target / "nvidia" / "nccl" / "lib" / "libnccl.so.2", plugin)
    doc = run_collect(base_env(), preload=plugin)
    assert doc["_mapped_nccl"] == [str(plugin)]
    assert doc["nccl"]["loaded"] is None


def test_loaded_after_ctypes_load(nccl_target):
    lib = nccl_target / "nvidia" / "nccl" / "lib" / "libnccl.so.2"
    doc = run_collect(base_env(), preload=lib)
    assert doc["nccl"]["loaded"] == {"version": "2.27.3", "code": 22703, "path": str(lib)}
    assert doc["errors"] == []


def test_loaded_null_when_nothing_mapped(nccl_target):
    libdir = nccl_target / "nvidia" / "nccl" / "lib"
    doc = run_collect(base_env(LD_LIBRARY_PATH=str(libdir)))
    assert doc["nccl"]["loaded"] is None
    assert nccl_entry(doc["nccl"]["found"], libdir / "libnccl.so.2")["code"] == 22703
    assert doc["_mapped_nccl"] == []  # versions on disk were read in subprocesses
