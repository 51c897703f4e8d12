"""The engine-free tests of tests/integration/test_gate.py: envbuild gate (issue 11) on this host against a real certificate of the cpu-torch2 image: the
host probe, the image probed on the node, doctor's fast local checks, the history folder, and
the Slurm Prolog (scripts/slurm/prolog-gate.sh) on the real one-node Slurm: a passing node runs
the job, a failing one is drained with the gate's reason and the job does not run there."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from builder.nodes.gate import history_dir

from fixtures_nodes import ROOT, run_envbuild

pytest_plugins = ["fixtures_gate", "fixtures_nodes"]  # the certificate, nodes_factory, slurm_node


def gate(*args: str, session: str, timeout: float = 300, env: dict | None = None) -> subprocess.CompletedProcess:
    """``envbuild gate ARGS``, stale containers looked for among this test session's only;
    ``env`` added to the environment."""
    argv = ["gate", *args, "--stale-label", f"envbuild.test-session={session}"]
    if env is None:
        return run_envbuild(*argv, timeout=timeout)
    exe = ROOT / ".venv" / "bin" / "envbuild"
    return subprocess.run([str(exe), *argv], capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, **env})


def test_gate_usage_errors_exit_64(tmp_path):
    for args, text in [(["--node", "a b"], "is not a Slurm node name"), (["--checks", "shm,nope"], "choose from"),
                       (["--history", str(tmp_path), "--no-history"], "--history and --no-history do not go together"),
                       (["--epilog", "--resume"], "--epilog and --resume do not go together")]:
        proc = run_envbuild("gate", "--against", str(tmp_path / "c.json"), *args)
        assert proc.returncode == 64, (args, proc.stderr)
        assert text in proc.stderr


def test_gate_without_a_certificate_exits_3(tmp_path):
    proc = run_envbuild("gate", "--against", str(tmp_path / "none.json"), "--no-history")
    assert proc.returncode == 3
    assert proc.stderr.strip() == f"error: {tmp_path / 'none.json'}: no such certificate or node report"


def test_history_folder_default():
    assert history_dir({"XDG_STATE_HOME": "/s"}, uid=1000) == Path("/s/envbuild/gate")
    assert history_dir({"HOME": "/home/u"}, uid=1000) == Path("/home/u/.local/state/envbuild/gate")
    assert history_dir({"XDG_STATE_HOME": "/s"}, uid=0) == Path("/var/lib/envbuild/gate")


def test_history_refuses_a_symlinked_node_folder(tmp_path):
    """The node's history folder planted as a symlink elsewhere: refused (exit 3, naming it), nothing
    written there; the retention tests are its twins (a real folder)."""
    from builder.core.errors import EnvbuildError
    from builder.nodes.gate import write_history

    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "hist").mkdir()
    os.symlink(tmp_path / "elsewhere", tmp_path / "hist" / "n1")
    try:
        write_history(tmp_path / "hist", "n1", {"probed_at": "2026-12-01T00:00:00Z"})
    except EnvbuildError as e:
        assert (e.exit_code, str(e)) == (3, f"{tmp_path}/hist/n1: is a symlink, not a folder: envbuild writes only "
                                            "regular files, never through a symlink (remove it or give another path)")
    else:
        raise AssertionError("the history was written through a symlink")
    assert list((tmp_path / "elsewhere").iterdir()) == []
