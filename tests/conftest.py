"""Shared fixtures. Engine fixtures live in fixtures_engine.py (and other fixtures_*.py
modules); this file wires them together and enforces "no skipped test" in CI."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from fixtures_browser import chromium  # noqa: F401 - pytest fixture
from fixtures_engine import (  # noqa: F401 - pytest fixtures
    bootstrap_image,
    docker_client,
    python_image,
    session_labels,
    test_session_id,
)
from fixtures_registry import namespace, registry, registry_server  # noqa: F401 - pytest fixtures

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="session")
def test_labels(session_labels) -> dict[str, str]:
    """Labels to put on everything a test creates (removed by label at session end)."""
    return dict(session_labels)


@pytest.fixture(scope="session")
def torch_image(docker_client, bootstrap_image, session_labels) -> str:
    """The cpu-torch2 image built through envbuild once per test session; yields its tag.

    Built from the committed rendered files with the site options of this machine (pip's
    CA bundle and wheel folder). An image with the same tag made earlier by a user is reused
    as is (and kept); one built here carries the session label and is removed at the end.
    """
    from builder.image import build, site

    result = build.build(build.BuildOptions(recipe="cpu-torch2", images_dir=ROOT / "images",
                                            site=site.SiteOptions.detect(), base_mode="auto", labels=session_labels),
                         docker_client)
    return result.tag


def pytest_sessionfinish(session, exitstatus):
    """With ENVBUILD_NO_SKIPS=1 (set by .ci/run), a skipped test fails the run."""
    if os.environ.get("ENVBUILD_NO_SKIPS") != "1":
        return
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    skipped = reporter.stats.get("skipped", []) if reporter else []
    if skipped and session.exitstatus == 0:
        reporter.write_line(f"ENVBUILD_NO_SKIPS: {len(skipped)} test(s) skipped; the default suite must not skip", red=True)
        session.exitstatus = 1
