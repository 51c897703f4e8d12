"""Worker of harness.py: runs cases from a JSON list on stdin, one JSON line per event on
stdout. Argument: the address-space limit in bytes. Not a pytest module."""

from __future__ import annotations

import base64
import contextlib
import io
import json
import os
import resource
import signal
import sys
import tempfile
import time
import traceback


class CaseTimeout(BaseException):
    """Raised by SIGALRM: the case ran past its timeout (BaseException: not caught by main)."""


def _alarm(signum, frame):
    raise CaseTimeout()


def _make_files(root: str, files: dict) -> None:
    for rel, spec in files.items():
        path = os.path.join(root, rel)
        os.makedirs(os.path.dirname(path) or root, exist_ok=True)
        if "b64" in spec:
            with open(path, "wb") as fh:
                fh.write(base64.b64decode(spec["b64"]))
        elif spec.get("fifo"):
            os.mkfifo(path)
        elif "symlink" in spec:
            os.symlink(spec["symlink"], path)


def main() -> None:
    limit = int(sys.argv[1])
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    os.environ["DOCKER_HOST"] = "unix:///nonexistent/envbuild-hostile.sock"
    cases = json.loads(sys.stdin.read())
    proto = os.fdopen(os.dup(1), "w", buffering=1)
    signal.signal(signal.SIGALRM, _alarm)
    from builder.cli import app as cli

    base_env = dict(os.environ)
    home = os.getcwd()
    for case in cases:
        proto.write(json.dumps({"event": "start", "id": case["id"]}) + "\n")
        out, err = io.StringIO(), io.StringIO()
        code, tb, hung = None, None, False
        t0 = time.monotonic()
        with tempfile.TemporaryDirectory(prefix="envbuild-hostile-") as tmp:
            os.chdir(tmp)
            os.environ.clear()
            os.environ.update(base_env, **case["env"])
            try:
                _make_files(tmp, case["files"])
                sys.stdin = io.StringIO(case.get("stdin") or "")
                signal.setitimer(signal.ITIMER_REAL, case["timeout_s"])
                with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
                    code = cli.main(list(case["argv"]))
            except CaseTimeout:
                hung = True
            except SystemExit as e:  # main() returns when given argv; a stray exit is a bug
                tb = f"SystemExit({e.code!r}) escaped main()"
            except BaseException:  # noqa: BLE001 - recorded as the failure it is
                tb = traceback.format_exc()
            finally:
                signal.setitimer(signal.ITIMER_REAL, 0)
                os.chdir(home)
        proto.write(json.dumps({
            "event": "done", "id": case["id"], "code": code, "stdout": out.getvalue()[-20000:],
            "stderr": err.getvalue()[-20000:], "traceback": tb, "hung": hung,
            "seconds": round(time.monotonic() - t0, 3),
            "maxrss_kib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss}) + "\n")


if __name__ == "__main__":
    main()
