"""Fixtures for tests that use the real Docker engine (import them in conftest.py).

Everything a test creates on the engine carries ``envbuild.test-session=<id>``
(:data:`TEST_SESSION_LABEL`, value from ``test_session_id``); a session finalizer removes
all of it (containers, networks, images). The bootstrapped Debian base
``envbuild/bootstrap-debian:<suite>`` is a product cache and is kept.
"""

from __future__ import annotations

import textwrap
import uuid
import warnings
from pathlib import Path

import pytest

from builder.core.errors import EnvbuildError, Unreachable
from builder.image import bootstrap, engine

TEST_SESSION_LABEL = "envbuild.test-session"


@pytest.fixture(scope="session")
def test_session_id() -> str:
    """12 hex digits naming this test session (value of ``envbuild.test-session``)."""
    return uuid.uuid4().hex[:12]


@pytest.fixture(scope="session")
def session_labels(test_session_id) -> dict[str, str]:
    """Labels for every engine object a test creates: ``{"envbuild.test-session": id}``."""
    return {TEST_SESSION_LABEL: test_session_id}


@pytest.fixture(scope="session")
def docker_client(test_session_id):
    """A connected ``docker.DockerClient``; at the end of the session, everything labelled
    ``envbuild.test-session=<id>`` is removed. Fails (not skips) without an engine."""
    try:
        client = engine.connect()
    except Unreachable as e:
        pytest.fail(f"these tests need a Docker engine: {e}", pytrace=False)
    yield client
    try:
        engine.remove_by_label(client, f"{TEST_SESSION_LABEL}={test_session_id}")
    except EnvbuildError as e:  # e.g. another session's container uses an image of ours
        warnings.warn(f"test session cleanup: {e}", stacklevel=1)
    finally:
        client.close()


@pytest.fixture(scope="session")
def bootstrap_image(docker_client) -> str:
    """``envbuild/bootstrap-debian:bookworm``, made once with debootstrap (about 30 s) and
    kept across sessions (not labelled with the session)."""
    return bootstrap.bootstrap_debian(docker_client, "bookworm")


@pytest.fixture(scope="session")
def python_image(docker_client, bootstrap_image, session_labels, test_session_id, tmp_path_factory) -> str:
    """``envbuild-test/python:<session>``: the bootstrapped base plus Debian's python3
    (3.11.2 in bookworm), built with BuildKit; removed at the end of the session."""
    ctx = tmp_path_factory.mktemp("python-image")
    (ctx / "Dockerfile").write_text(
        textwrap.dedent(
            f"""\
            FROM {bootstrap_image}
            RUN apt-get update && apt-get install -y --no-install-recommends python3 \\
             && rm -rf /var/lib/apt/lists/*
            """
        )
    )
    tag = f"envbuild-test/python:{test_session_id}"
    engine.build_image(ctx, tag, labels=session_labels, client=docker_client)
    return tag


def write_script(path: Path, text: str) -> Path:
    """Write a Python script (dedented) to ``path`` and return it."""
    path.write_text(textwrap.dedent(text))
    return path
