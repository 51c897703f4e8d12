"""scripts/split_tests.py: the static classification of test files (unit, integration, mixed),
the path fixes of a moved file, and the tree as it stands (nothing left to move)."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

from scripts import split_tests

ROOT = Path(__file__).resolve().parents[2]


def verdict(tmp_path: Path, text: str) -> split_tests.Verdict:
    path = tmp_path / "test_x.py"
    path.write_text(textwrap.dedent(text))
    return split_tests.classify(path, split_tests.shared_reasons())


def test_a_file_without_engine_fixtures_is_unit(tmp_path):
    v = verdict(tmp_path, """
        import pytest

        @pytest.mark.parametrize("registry", ["docker.io"])  # a parameter, not the fixture
        def test_a(registry, tmp_path):
            assert registry

        def test_b(monkeypatch):
            monkeypatch.setenv("DOCKER_HOST", "unix:///dead.sock")
            engine.connect()  # the socket the test chose
    """)
    assert (v.kind, v.unit, v.integration) == ("unit", ["test_a", "test_b"], {})


def test_engine_fixtures_helpers_and_commands_make_integration(tmp_path):
    v = verdict(tmp_path, """
        import pytest
        import subprocess

        @pytest.fixture
        def image(torch_image):
            return torch_image

        def helper():
            return engine.connect()

        def test_fixture(docker_client):
            pass

        def test_own_fixture(image):
            pass

        def test_helper():
            helper()

        def test_shared_fixture(nodes_factory):
            pass

        def test_command():
            run_json("doctor", "--image", "x")

        def test_cluster():
            subprocess.run(["sbatch", "job.sh"])

        @pytest.mark.gpu
        def test_gpu():
            pass

        def test_pure():
            run_json("verify", "a.json")
    """)
    assert v.kind == "mixed" and v.unit == ["test_pure"]
    assert v.integration == {
        "test_fixture": "uses docker_client", "test_own_fixture": "uses torch_image",
        "test_helper": "helper: calls connect()", "test_shared_fixture": "uses nodes_factory",
        "test_command": "runs `envbuild doctor`", "test_cluster": "runs sbatch",
        "test_gpu": "needs a GPU (marked gpu)"}


def test_a_fake_client_is_not_an_engine(tmp_path):
    assert verdict(tmp_path, """
        def test_a():
            certify_image(FakeClient({}), "img:1")
    """).kind == "unit"
    assert verdict(tmp_path, """
        def test_a(client):
            certify_image(client, "img:1")
    """).integration == {"test_a": "calls certify_image()"}


def test_paths_from_file_gain_one_level():
    text = ("ROOT = Path(__file__).resolve().parent.parent\nA = Path(__file__).resolve().parents[1]\n"
            "B = Path(__file__).parent / 'golden'\n"
            "C = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))\n"
            "code = \"import sys; sys.path.insert(0, 'tests'); import test_x\"\n")
    assert split_tests.fix_paths(text, "unit") == (
        "ROOT = Path(__file__).resolve().parents[2]\nA = Path(__file__).resolve().parents[2]\n"
        "B = Path(__file__).parents[1] / 'golden'\n"
        "C = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))\n"
        "code = \"import sys; sys.path[:0] = ['tests/unit', 'tests']; import test_x\"\n")


def test_the_tree_is_split():
    """Nothing is left in tests/ and every file of tests/unit holds unit tests only (after a
    merge brings a new tests/test_*.py: run scripts/split_tests.py)."""
    proc = subprocess.run([sys.executable, "scripts/split_tests.py", "--check"], cwd=ROOT, capture_output=True,
                          text=True, timeout=60)
    assert (proc.returncode, proc.stderr) == (0, "")
    assert sorted(p.name for p in (ROOT / "tests").glob("test_*.py")) == []
