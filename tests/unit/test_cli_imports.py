"""The command line imports only what the command needs (issue 13, item 5): `envbuild check`
loads the recipe stage and nothing of docker, jinja2, requests, kubernetes, oras, rich or matplotlib; and
every command of the parser is dispatched to a function of builder.cli.commands."""

from __future__ import annotations

import argparse
import importlib
import json
import os
import subprocess
import sys
from pathlib import Path

from builder.cli import app
from builder.cli.parser import build_parser

ROOT = Path(__file__).resolve().parents[2]
#: Libraries the check path must not import (top-level package names).
HEAVY = ("docker", "jinja2", "requests", "kubernetes", "oras", "rich", "matplotlib")
#: Runs builder.cli.app.main on argv in a fresh interpreter; prints the exit code and the
#: HEAVY packages then in sys.modules.
PROBE = """
import json, sys
from builder.cli import app
heavy = set(sys.argv[1].split(","))
code = app.main(sys.argv[2:])
print(json.dumps([code, sorted({m.split(".")[0] for m in sys.modules} & heavy)]))
"""


def _imports(*argv: str) -> tuple[int, list[str], str]:
    """(exit code, HEAVY packages imported, stderr) of ``envbuild ARGV`` in a fresh interpreter."""
    env = {**os.environ, "DOCKER_HOST": "unix:///nonexistent/envbuild-imports.sock"}
    res = subprocess.run([sys.executable, "-c", PROBE, ",".join(HEAVY), *argv], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=120)
    code, heavy = json.loads(res.stdout.splitlines()[-1])
    return code, heavy, res.stderr


def test_check_imports_no_engine_template_http_cluster_or_rich_library():
    code, heavy, err = _imports("check", "cpu-torch2")
    assert (code, heavy, err) == (0, [], "")


def test_check_of_a_recipe_with_findings_imports_rich_only_to_print_them(tmp_path):
    """A finding is printed in its colour through rich; still nothing of the later stages."""
    recipe = tmp_path / "t.yaml"
    recipe.write_text((ROOT / "recipes/cpu-torch2.yaml").read_text().replace("version: 2.13.0", "version: 9.9.9"))
    code, heavy, err = _imports("check", str(recipe))
    assert (code, heavy) == (2, ["rich"]), err
    assert err.startswith(f"error: {recipe}: "), err


def test_the_probe_sees_what_a_command_imports_twin():
    """The twins: `render --check` imports the templates and rich; `build` (dead engine:
    exit 3) imports docker and requests. The probe above would see them."""
    code, heavy, err = _imports("render", "--check", "cpu-torch2")
    assert (code, heavy) == (0, ["jinja2", "rich"]), err
    code, heavy, err = _imports("build", "cpu-torch2")
    assert code == 3 and {"docker", "requests"} <= set(heavy), (code, heavy, err)


def test_matplotlib_is_imported_when_a_report_is_drawn_only(tmp_path):
    """`report` draws the plots: matplotlib is imported then; `certify` (dead engine: exit 3)
    imports the certify stage, report module included, and still no matplotlib."""
    from test_certify_units import _cert

    cert = tmp_path / "c.json"
    cert.write_text(json.dumps(_cert()))
    code, heavy, err = _imports("report", str(cert))
    assert (code, "matplotlib" in heavy) == (0, True), err
    code, heavy, err = _imports("certify", "envbuild/cpu-torch2:0123456789ab")
    assert code == 3 and "docker" in heavy and "matplotlib" not in heavy, (code, heavy, err)


def _command_keys(parser: argparse.ArgumentParser, prefix: str = "") -> set[str]:
    """Every runnable command path of ``parser`` (``check``, ``base bootstrap``, ...)."""
    keys: set[str] = set()
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                path = f"{prefix} {name}".strip()
                keys |= _command_keys(sub.filled(), path) or {path}
    return keys


def test_every_command_of_the_parser_runs_a_command_function():
    keys = _command_keys(build_parser())
    assert keys == set(app.COMMANDS)
    assert len(keys) == 20  # rebuild, gate, k8s gate, config and completion among them
    for key, (module, function) in app.COMMANDS.items():
        assert callable(getattr(importlib.import_module(f"builder.cli.commands.{module}"), function)), key
