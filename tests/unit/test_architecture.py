"""The architecture as the data flows (docs/architecture.md): stages import only earlier
stages, in-image code imports nothing of envbuild. The contracts are import-linter's
(pyproject.toml, [tool.importlinter]); these tests run the real `lint-imports` on this tree
and on a copy with one planted backward import, which must break the contract."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
LINT = Path(sys.executable).with_name("lint-imports")


def _lint(root: Path) -> subprocess.CompletedProcess:
    return subprocess.run([str(LINT), "--no-cache"], cwd=root, capture_output=True, text=True, timeout=300,
                          env={"PYTHONPATH": str(root), "PATH": "/usr/bin:/bin"})


def test_the_tree_keeps_every_import_contract():
    res = _lint(ROOT)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-2000:]
    assert "Contracts: 2 kept, 0 broken." in res.stdout


def _copy(tmp_path: Path) -> Path:
    dst = tmp_path / "repo"
    shutil.copytree(ROOT / "builder", dst / "builder", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "pyproject.toml", dst / "pyproject.toml")
    return dst


def test_a_planted_backward_import_breaks_the_layers(tmp_path):
    repo = _copy(tmp_path)
    target = repo / "builder" / "recipe" / "__init__.py"
    target.write_text(target.read_text() + "\nfrom builder.certify import certify  # planted\n")
    res = _lint(repo)
    assert res.returncode == 1
    assert "builder.recipe is not allowed to import builder.certify" in res.stdout


def test_an_envbuild_import_in_the_agent_breaks_its_contract(tmp_path):
    repo = _copy(tmp_path)
    target = repo / "builder" / "agent" / "probe" / "collect.py"
    target.write_text(target.read_text() + "\nfrom builder.core import errors  # planted\n")
    res = _lint(repo)
    assert res.returncode == 1
    assert "builder.agent.probe.collect -> builder.core.errors" in res.stdout


def _docker_importers(root: Path) -> list[str]:
    """The modules under ``root/builder`` that import the docker SDK (``docker`` or ``docker.*``)."""
    import ast

    found = []
    for path in sorted((root / "builder").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import) else
                     [node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level else [])
            if any(n == "docker" or n.startswith("docker.") for n in names):
                found.append(path.relative_to(root).as_posix())
                break
    return found


def test_only_the_engine_speaks_the_docker_sdk():
    assert _docker_importers(ROOT) == ["builder/image/engine.py"]


def test_a_planted_docker_import_outside_the_engine_is_found(tmp_path):
    repo = _copy(tmp_path)
    target = repo / "builder" / "launchers" / "local.py"
    target.write_text("import docker.errors  # planted\n" + target.read_text())
    assert _docker_importers(repo) == ["builder/image/engine.py", "builder/launchers/local.py"]
