"""Shared fixtures. Engine fixtures live in fixtures_engine.py (and other fixtures_*.py
modules); this file wires them together and enforces "no skipped test" in CI."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import uuid
from pathlib import Path

import pytest

from fixtures_browser import chromium  # noqa: F401 - pytest fixture
from fixtures_engine import (  # noqa: F401 - pytest fixtures
    bootstrap_image,
    docker_client,
    python_image,
    remove_session,
    run_labels,
    run_lock,
    session_labels,
    test_session_id,
    worker,
)
from fixtures_registry import namespace, registry, registry_server  # noqa: F401 - pytest fixtures

ROOT = Path(__file__).resolve().parent.parent
_RUN_GIVEN = pytest.StashKey[bool]()


@pytest.fixture(scope="session")
def test_labels(session_labels) -> dict[str, str]:
    """Labels to put on everything a test creates (removed by label at session end)."""
    return dict(session_labels)


@pytest.fixture(scope="session")
def torch_image(docker_client, bootstrap_image, run_labels) -> str:
    """The cpu-torch2 image built through envbuild once per test run (the first xdist worker
    builds, the others find its content-hashed tag); yields its tag.

    Built from the committed rendered files with the site options of this machine (pip's
    CA bundle and wheel folder). An image with the same tag made earlier by a user is reused
    as is (and kept); one built here carries the run's label and is removed at the end.
    """
    from builder.image import build, site

    with run_lock("torch-image"):
        result = build.build(build.BuildOptions(recipe="cpu-torch2", images_dir=ROOT / "images",
                                                site=site.SiteOptions.detect(), base_mode="auto", labels=run_labels),
                             docker_client)
    return result.tag


def pytest_configure(config):
    """The run's id (``ENVBUILD_TEST_RUN``: the Makefile gives its two passes one) and shared
    folder (locks), inherited by every xdist worker."""
    if not worker():
        config.stash[_RUN_GIVEN] = "ENVBUILD_TEST_RUN" in os.environ
        os.environ.setdefault("ENVBUILD_TEST_RUN", uuid.uuid4().hex[:12])
        os.environ["ENVBUILD_TEST_SHARED"] = tempfile.mkdtemp(prefix="envbuild-test-run-")


_GROUPS_FILE = "xdist-groups.json"


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    """Each test module is one xdist work unit (its module fixtures run once), except the tests
    of the one-node Slurm of scripts/setup-slurm.sh (its daemons listen on fixed ports): they
    are one unit of their own, "slurm", run one at a time on one worker beside the others.
    A worker writes ``{nodeid: unit}`` for the controller's scheduler (below)."""
    units = {}
    for item in items:
        if "slurm_node" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.xdist_group("slurm"))
        mark = item.get_closest_marker("xdist_group")
        units[item.nodeid] = mark.args[0] if mark and mark.args else item.nodeid.split("::", 1)[0]
    if worker():
        shared = Path(os.environ["ENVBUILD_TEST_SHARED"])
        tmp = shared / f"{_GROUPS_FILE}.{os.environ['PYTEST_XDIST_WORKER']}"
        tmp.write_text(json.dumps(units))
        os.replace(tmp, shared / _GROUPS_FILE)


@pytest.hookimpl(optionalhook=True)  # an xdist hook: pytest -p no:xdist still runs
def pytest_xdist_make_scheduler(config, log):
    """``--dist loadgroup`` by the units above. xdist 3.8 marks a group by appending it to
    ``item._nodeid``, which pytest 9 no longer reads: its own loadgroup sends every test
    apart, so module fixtures ran once per worker and Slurm tests could meet."""
    if config.getvalue("dist") != "loadgroup":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class UnitScheduling(LoadScopeScheduling):
        units: dict[str, str] | None = None

        def _split_scope(self, nodeid: str) -> str:
            if self.units is None:  # read once every worker has collected (schedule() runs then)
                self.units = json.loads((Path(os.environ["ENVBUILD_TEST_SHARED"]) / _GROUPS_FILE).read_text())
            return self.units[nodeid]

    return UnitScheduling(config, log)


def pytest_sessionfinish(session, exitstatus):
    """The xdist controller removes what the workers shared. With ENVBUILD_NO_SKIPS=1 (set by
    .ci/run), a skipped test fails the run."""
    if not worker():  # ENVBUILD_TEST_KEEP=1: a later pass of this run (Makefile) removes it
        shared = Path(os.environ["ENVBUILD_TEST_SHARED"])
        given = session.config.stash.get(_RUN_GIVEN, False)
        if os.environ.get("ENVBUILD_TEST_KEEP") != "1" and ((shared / "engine-used").exists() or given):
            from builder.core.errors import Unreachable
            from builder.image import engine

            try:
                client = engine.connect()
            except Unreachable:  # nothing of this run can be on an engine that does not answer
                client = None
            if client is not None:
                try:
                    remove_session(client, os.environ["ENVBUILD_TEST_RUN"])
                finally:
                    client.close()
        shutil.rmtree(shared, ignore_errors=True)
    if os.environ.get("ENVBUILD_NO_SKIPS") != "1":
        return
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    skipped = reporter.stats.get("skipped", []) if reporter else []
    if skipped and session.exitstatus == 0:
        reporter.write_line(f"ENVBUILD_NO_SKIPS: {len(skipped)} test(s) skipped; the default suite must not skip", red=True)
        session.exitstatus = 1
