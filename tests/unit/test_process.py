"""builder.core.process.run: a timeout always, the command shown escaped in its errors (exit 3)."""

import sys

import pytest

from builder.core import process
from builder.core.errors import ExitCode, Unreachable


def test_run_gives_the_output():
    proc = process.run([sys.executable, "-c", "print('ok')"], 30)
    assert (proc.returncode, proc.stdout) == (0, "ok\n")


def test_run_past_its_timeout_is_unreachable_with_the_command_escaped():
    with pytest.raises(Unreachable) as e:
        process.run([sys.executable, "-c", "import time; time.sleep(30)", "a\nb"], 0.5)
    assert e.value.exit_code == ExitCode.UNREACHABLE
    assert str(e.value) == f"{sys.executable} -c import time; time.sleep(30) a\\x0ab: no answer within 0.5 s"


def test_run_of_a_missing_program_is_unreachable():
    with pytest.raises(Unreachable) as e:
        process.run(["/nonexistent/envbuild-x\x1b[2J"], 5)
    assert str(e.value) == "cannot run /nonexistent/envbuild-x\\x1b[2J: No such file or directory"
