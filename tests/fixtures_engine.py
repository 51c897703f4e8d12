"""Fixtures for tests that use the real Docker engine (import them in conftest.py).

Everything a test creates on the engine carries ``envbuild.test-session=<id>``
(:data:`TEST_SESSION_LABEL`, value from ``test_session_id``); a session finalizer removes
all of it (containers, networks, images). The bootstrapped Debian base
``envbuild/bootstrap-debian:<suite>`` is a product cache and is kept.

Under pytest-xdist every worker is a session of its own id; the images all workers share
(:func:`shared_image`) are built once, under a file lock, with the run's label
(``ENVBUILD_TEST_RUN``, set by tests/conftest.py), and removed by the controller at the end.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import textwrap
import uuid
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from builder.core.errors import EnvbuildError, Unreachable
from builder.image import bootstrap, engine

TEST_SESSION_LABEL = "envbuild.test-session"


def worker() -> bool:
    """True in a pytest-xdist worker (its controller, or a run without xdist: False)."""
    return "PYTEST_XDIST_WORKER" in os.environ


@contextlib.contextmanager
def run_lock(name: str) -> Iterator[None]:
    """Held by one process of this test run at a time (an exclusive ``flock`` on a file of
    the run's shared folder): what all xdist workers share is made once."""
    with open(Path(os.environ["ENVBUILD_TEST_SHARED"]) / f"{name}.lock", "w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        yield


def shared_image(client, tag: str, make: Callable[[], object]) -> str:
    """``tag``, made by ``make()`` unless another worker of this run made it already."""
    import docker.errors

    with run_lock(tag.replace("/", "_").replace(":", "_")):
        try:
            client.sdk.images.get(tag)
        except docker.errors.ImageNotFound:
            make()
    return tag


@pytest.fixture(scope="session")
def test_session_id() -> str:
    """12 hex digits naming this test session (value of ``envbuild.test-session``): this
    process's own under xdist, else the run's."""
    return uuid.uuid4().hex[:12] if worker() else os.environ["ENVBUILD_TEST_RUN"]


@pytest.fixture(scope="session")
def run_labels() -> dict[str, str]:
    """The labels of what all workers of this run share (the controller removes it)."""
    return {TEST_SESSION_LABEL: os.environ["ENVBUILD_TEST_RUN"]}


@pytest.fixture(scope="session")
def session_labels(test_session_id) -> dict[str, str]:
    """Labels for every engine object a test creates: ``{"envbuild.test-session": id}``."""
    return {TEST_SESSION_LABEL: test_session_id}


@pytest.fixture(scope="session")
def docker_client(test_session_id):
    """A connected ``Engine``; at the end of the session, everything labelled
    ``envbuild.test-session=<id>`` is removed. Fails (not skips) without an engine."""
    try:
        client = engine.connect()
    except Unreachable as e:
        pytest.fail(f"these tests need a Docker engine: {e}", pytrace=False)
    if worker():  # the controller removes what the run shares (tests/conftest.py)
        (Path(os.environ["ENVBUILD_TEST_SHARED"]) / "engine-used").touch()
    yield client
    keep = os.environ.get("ENVBUILD_TEST_KEEP") == "1" and test_session_id == os.environ["ENVBUILD_TEST_RUN"]
    try:
        if not keep:  # the run's last pass removes it (Makefile)
            remove_session(client, test_session_id)
    finally:
        client.close()


def remove_session(client, session_id: str) -> None:
    """Remove everything labelled ``envbuild.test-session=<session_id>`` (a warning when
    something is left, e.g. another session's container uses an image of ours)."""
    try:
        client.remove_by_label(f"{TEST_SESSION_LABEL}={session_id}")
    except EnvbuildError as e:
        warnings.warn(f"test session cleanup: {e}", stacklevel=1)


@pytest.fixture(scope="session")
def bootstrap_image(docker_client) -> str:
    """``envbuild/bootstrap-debian:bookworm``, made once with debootstrap (about 30 s) and
    kept across sessions (not labelled with the session)."""
    with run_lock("bootstrap-debian"):
        return bootstrap.bootstrap_debian(docker_client, "bookworm")


@pytest.fixture(scope="session")
def python_image(docker_client, bootstrap_image, run_labels, tmp_path_factory) -> str:
    """``envbuild-test/python:<run>``: the bootstrapped base plus Debian's python3
    (3.11.2 in bookworm), built with BuildKit once per run; removed at its end."""
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
    tag = f"envbuild-test/python:{run_labels[TEST_SESSION_LABEL]}"
    return shared_image(docker_client, tag, lambda: docker_client.build(ctx, tag, labels=run_labels))


def write_script(path: Path, text: str) -> Path:
    """Write a Python script (dedented) to ``path`` and return it."""
    path.write_text(textwrap.dedent(text))
    return path
