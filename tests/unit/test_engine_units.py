"""The engine-free tests of tests/integration/test_engine.py: builder/image/engine.py, buildkit.py and probecheck.py against the real Docker engine:
connecting, finding a BuildKit client, building (failure keeps no tag), probing in
throwaway containers (the agent folder bind-mounted), cleanup by label."""

from __future__ import annotations

import pytest

from builder.core.errors import EnvbuildError, ExitCode, Unreachable
from builder.image import buildkit, engine

# --------------------------------------------------------------------------- connect


def test_connect_to_dead_socket_is_one_line_unreachable(tmp_path, monkeypatch):
    dead = tmp_path / "dead.sock"
    monkeypatch.setenv("DOCKER_HOST", f"unix://{dead}")
    with pytest.raises(Unreachable) as info:
        engine.connect()
    msg = str(info.value)
    assert info.value.exit_code == ExitCode.UNREACHABLE == 3
    assert "\n" not in msg
    assert msg.startswith(f"no Docker engine answers at unix://{dead} (")
    assert "`dockerd &`" in msg and "`systemctl start docker`" in msg and "scripts/setup.sh" in msg


# --------------------------------------------------------------------------- BuildKit CLI


def fake_docker(folder, version, buildx):
    """A `docker` script answering `--version` and `buildx version` like a real client."""
    folder.mkdir()
    path = folder / "docker"
    if buildx:
        answer = "echo 'github.com/docker/buildx v0.12.1 0000'"
    else:
        answer = "echo 'docker: unknown command: docker buildx' >&2; exit 1"
    path.write_text(
        "#!/bin/sh\n"
        'case "$1" in\n'
        f'  --version) echo "Docker version {version}, build 0000000" ;;\n'
        f"  buildx) {answer} ;;\n"
        "  *) exit 2 ;;\n"
        "esac\n"
    )
    path.chmod(0o755)
    return str(path)


def test_buildkit_cli_prefers_buildx(tmp_path):
    old = fake_docker(tmp_path / "old", "20.10.24+dfsg1", buildx=False)
    new = fake_docker(tmp_path / "new", "28.2.2", buildx=True)
    cli = engine.buildkit_cli(f"{tmp_path / 'old'}:{tmp_path / 'new'}", extra=())
    assert cli == engine.BuildkitCLI(
        path=new, version="28.2.2", argv=(new, "buildx", "build", "--load"), env={}
    )
    assert old != new


def test_buildkit_cli_falls_back_to_pre23_client_with_env(tmp_path):
    new = fake_docker(tmp_path / "new", "28.2.2", buildx=False)
    old = fake_docker(tmp_path / "old", "20.10.24+dfsg1", buildx=False)
    cli = engine.buildkit_cli(f"{tmp_path / 'new'}:{tmp_path / 'old'}", extra=())
    assert cli == engine.BuildkitCLI(
        path=old, version="20.10.24+dfsg1", argv=(old, "build"), env={"DOCKER_BUILDKIT": "1"}
    )
    assert new != old


def test_buildkit_cli_none_qualifies(tmp_path):
    new = fake_docker(tmp_path / "new", "28.2.2", buildx=False)
    with pytest.raises(EnvbuildError) as info:
        engine.buildkit_cli(str(tmp_path / "new"), extra=())
    msg = str(info.value)
    assert info.value.exit_code == 2
    assert f"tried {new} (28.2.2)" in msg
    assert "apt-get install docker-buildx" in msg


def test_buildkit_cli_searches_extra_after_path(tmp_path):
    new = fake_docker(tmp_path / "new", "28.2.2", buildx=False)
    old = fake_docker(tmp_path / "old", "19.03.15", buildx=False)
    cli = engine.buildkit_cli(str(tmp_path / "new"), extra=(old,))
    assert cli.path == old and cli.env == {"DOCKER_BUILDKIT": "1"} and new != old


def test_run_labels():
    assert engine.run_labels("0123456789ab") == {"envbuild": "1", "envbuild.run": "0123456789ab"}
    run_id = engine.new_run_id()
    assert len(run_id) == 12 and int(run_id, 16) >= 0 and run_id != engine.new_run_id()


BUILDX_FAILURE = """\
#5 [build 2/3] RUN make
#5 0.215 compiling
#5 0.300 make: *** [all] Error 2
#5 ERROR: process "/bin/sh -c make" did not complete successfully: exit code: 2
#6 [stage-1 2/2] RUN sleep 5
#6 CANCELED
#6 ERROR: context canceled
------
 > [build 2/3] RUN make:
0.215 compiling
0.300 make: *** [all] Error 2
------
Dockerfile:5
--------------------
   5 | >>> RUN make
--------------------
ERROR: failed to solve: process "/bin/sh -c make" did not complete successfully: exit code: 2
"""


def test_progress_log_picks_the_failing_step_not_the_cancelled_one():
    """buildx's output format (the engine here has the older one): parsed from literal lines."""
    log = buildkit.ProgressLog(keep=30)
    for line in BUILDX_FAILURE.splitlines():
        log.add(line)
    assert log.failure() == (
        "[build 2/3] RUN make",
        'process "/bin/sh -c make" did not complete successfully: exit code: 2',
        [
            "#5 [build 2/3] RUN make",
            "#5 0.215 compiling",
            "#5 0.300 make: *** [all] Error 2",
            "Dockerfile:5",
            "   5 | >>> RUN make",
            'ERROR: failed to solve: process "/bin/sh -c make" did not complete successfully: exit code: 2',
        ],
    )
    short = buildkit.ProgressLog(keep=2)
    for line in BUILDX_FAILURE.splitlines():
        short.add(line)
    assert short.failure()[2] == [
        "   5 | >>> RUN make",
        'ERROR: failed to solve: process "/bin/sh -c make" did not complete successfully: exit code: 2',
    ]


def test_deadline_label_round_trips():
    assert engine.deadline_label(1_800_000_000.2) == "2027-01-15T08:00:01Z"
    assert engine._parse_deadline("2027-01-15T08:00:01Z") == 1_800_000_001.0
    for bad in ("2027-01-15T08:00:01Z\n", "soon", "2027-13-45T99:00:01Z", None, 5):
        assert engine._parse_deadline(bad) is None

