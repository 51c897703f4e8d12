"""BuildKit through the docker CLI: finding a client that can build with BuildKit, the
build command line, reading ``--progress=plain`` output, and the one-line build error.

The docker SDK only speaks the classic builder, and the rendered Dockerfiles need BuildKit
(``RUN --mount=type=secret|bind``, ``--secret``), so builds run a docker CLI found by
:func:`buildkit_cli` (:func:`builder.image.engine.build_image` drives it).
"""

from __future__ import annotations

import collections
import os
import re
import subprocess
import threading
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from builder.core.errors import EnvbuildError

#: Docker CLI releases from 23.0 on need the buildx plugin for BuildKit builds; older
#: ones have BuildKit built in, enabled by ``DOCKER_BUILDKIT=1``
#: (https://docs.docker.com/engine/release-notes/23.0/: "docker build" uses buildx).
LEGACY_BUILDKIT_MAX_MAJOR = 22

# --------------------------------------------------------------------------- the client


@dataclass(frozen=True)
class BuildkitCLI:
    """A docker client able to run BuildKit builds.

    Attributes:
        path: the client executable, e.g. ``"/usr/bin/docker"``.
        version: its version, e.g. ``"20.10.24+dfsg1"``.
        argv: the build command prefix: ``(path, "buildx", "build", "--load")`` when the
            buildx plugin works, else ``(path, "build")``.
        env: extra environment for the command: ``{"DOCKER_BUILDKIT": "1"}`` for a
            pre-23 client without buildx, else ``{}``.
    """

    path: str
    version: str
    argv: tuple[str, ...]
    env: Mapping[str, str] = field(default_factory=dict)


def _candidates(search_path: str | None, extra: Iterable[str]) -> list[str]:
    if search_path is None:
        search_path = os.environ.get("PATH", "")
    found: list[str] = []
    seen: set[str] = set()
    entries = [os.path.join(d, "docker") for d in search_path.split(os.pathsep) if d]
    for cand in [*entries, *extra]:
        if not (os.path.isfile(cand) and os.access(cand, os.X_OK)):
            continue
        real = os.path.realpath(cand)
        if real in seen:
            continue
        seen.add(real)
        found.append(cand)
    return found


def _client_version(path: str) -> str | None:
    try:
        out = subprocess.run(
            [path, "--version"], capture_output=True, text=True, timeout=20
        )
    except (OSError, subprocess.SubprocessError):
        return None
    m = re.search(r"version\s+v?(\d+\.\d+[^\s,]*)", out.stdout, re.IGNORECASE)
    return m.group(1) if out.returncode == 0 and m else None


def _has_buildx(path: str) -> bool:
    try:
        out = subprocess.run(
            [path, "buildx", "version"], capture_output=True, text=True, timeout=20
        )
    except (OSError, subprocess.SubprocessError):
        return False
    return out.returncode == 0


def buildkit_cli(
    search_path: str | None = None, extra: Iterable[str] = ("/usr/bin/docker",)
) -> BuildkitCLI:
    """Find a docker client that can build with BuildKit.

    Candidates are ``docker`` in each ``search_path`` entry (default ``$PATH``) in order,
    then ``extra``; duplicates (same real path) are tried once. First choice: a client
    whose ``docker buildx version`` works (``docker buildx build --load``); else a client
    older than 23.0 (``docker --version``), used as ``DOCKER_BUILDKIT=1 docker build``.

    Raises:
        EnvbuildError: (exit 2) no candidate qualifies; the message lists those tried.
    """
    cands = _candidates(search_path, extra)
    for path in cands:
        if _has_buildx(path):
            return BuildkitCLI(
                path=path,
                version=_client_version(path) or "unknown",
                argv=(path, "buildx", "build", "--load"),
                env={},
            )
    tried = []
    for path in cands:
        version = _client_version(path)
        tried.append(f"{path} ({version or 'no version'})")
        if version is None:
            continue
        major = int(version.split(".")[0])
        if major <= LEGACY_BUILDKIT_MAX_MAJOR:
            return BuildkitCLI(
                path=path, version=version, argv=(path, "build"), env={"DOCKER_BUILDKIT": "1"}
            )
    raise EnvbuildError(
        "no docker client can build with BuildKit: tried "
        + (", ".join(tried) or "no docker executable found")
        + "; install the buildx plugin (apt-get install docker-buildx) or a docker client"
        " older than 23 (Debian's docker.io 20.10)",
        field="docker",
    )



# --------------------------------------------------------------------------- output


#: Output lines of the failing step kept in a build error's one line.
BUILD_ERROR_LINES = 3


class BuildFailed(EnvbuildError):
    """``docker build`` failed (exit 2). The message is one line: the failing step, the
    reason, then its last :data:`BUILD_ERROR_LINES` output lines after ``" | output: "``.

    Attributes:
        tag: the tag asked for (it does not exist afterwards).
        step: the failing step as BuildKit names it, e.g. ``"[2/3] RUN make"``, or None.
        lines: the failing step's last output lines (at most ``keep_lines``), raw
            ``--progress=plain`` lines, followed by BuildKit's closing error lines.
    """

    def __init__(self, message: str, *, tag: str, step: str | None, lines: list[str], **kw: Any) -> None:
        self.tag = tag
        self.step = step
        self.lines = lines
        super().__init__(message, **kw)


#: A step line of ``--progress=plain`` output: ``#<step> <text>``.
_STEP_RE = re.compile(r"#(\d+) (.*)", re.S)
#: A timed output line of a step: ``<seconds> <text>``.
_TIMED_RE = re.compile(r"\A\d+\.\d+ ")


class ProgressLog:
    """Splits BuildKit ``--progress=plain`` output into steps (``#N ...`` lines)."""

    def __init__(self, keep: int) -> None:
        self.keep = keep
        self.names: dict[str, str] = {}
        self.lines: dict[str, collections.deque[str]] = {}
        self.tail: collections.deque[str] = collections.deque(maxlen=keep)
        self.errors: list[tuple[str, str]] = []  # (step, "ERROR: ..." text)
        self.after_error: list[str] = []

    def add(self, line: str) -> None:
        self.tail.append(line)
        m = _STEP_RE.fullmatch(line)
        if not m:
            if self.errors and line.strip() and not line.startswith("------"):
                self.after_error.append(line)
                del self.after_error[: -self.keep]
            return
        step, rest = m.groups()
        if step not in self.names and rest.startswith("["):
            self.names[step] = rest
        if rest.startswith("sha256:"):
            return
        self.lines.setdefault(step, collections.deque(maxlen=self.keep)).append(line)
        if rest.startswith("ERROR"):
            self.errors.append((step, rest))

    def failure(self) -> tuple[str | None, str, list[str]]:
        """(step name, reason, lines) describing the failure."""
        if not self.errors:
            lines = list(self.tail)
            reason = lines[-1].strip() if lines else "no output"
            return None, reason, lines
        # parallel stages that BuildKit cancelled after the real failure also say ERROR
        real = [e for e in self.errors if "canceled" not in e[1] and "cancelled" not in e[1]]
        step, text = (real or self.errors)[0]
        reason = text.partition(":")[2].strip() or text
        lines = [ln for ln in self.lines.get(step, []) if not _step_text(ln).startswith("ERROR")]
        # the closing block repeats the step's output as "<seconds> <text>": keep the rest
        closing = [ln for ln in self.after_error if not ln.startswith(" > ") and not _TIMED_RE.match(ln)]
        return self.names.get(step), reason, (lines + closing)[-self.keep :]


def _step_text(line: str) -> str:
    m = _STEP_RE.fullmatch(line)
    return m.group(2) if m else ""


def build_failed(tag: str, log: ProgressLog, origin: str) -> BuildFailed:
    """The one-line :class:`BuildFailed` of a build whose output ``log`` read: the failing
    step, the reason, its last :data:`BUILD_ERROR_LINES` output lines after ``" | "``."""
    step, reason, lines = log.failure()
    where = f" at step {step}" if step else ""
    output = [ln.split(" ", 2)[2] if _TIMED_RE.match(ln.partition(" ")[2]) else ln for ln in lines]
    body = " | ".join(o for o in output[-BUILD_ERROR_LINES:] if o.strip())
    return BuildFailed(f"docker build of {tag} failed{where}: {reason}" + (f" | output: {body}" if body else ""),
                       tag=tag, step=step, lines=lines, file=origin)


def build_argv(cli: BuildkitCLI, dockerfile: Path, tag: str, iidfile: Path, context: Path,
               build_args: Mapping[str, str] | None = None, labels: Mapping[str, str] | None = None,
               secrets: Mapping[str, str | os.PathLike] | None = None) -> list[str]:
    """The build command: ``cli.argv --progress=plain -f DOCKERFILE -t TAG --iidfile FILE``,
    ``--build-arg K=V``, ``--label K=V``, ``--secret id=ID,src=PATH`` each, then the context."""
    argv = [*cli.argv, "--progress=plain", "-f", str(dockerfile), "-t", tag, "--iidfile", str(iidfile)]
    for k, v in (build_args or {}).items():
        argv += ["--build-arg", f"{k}={v}"]
    for k, v in (labels or {}).items():
        argv += ["--label", f"{k}={v}"]
    for sid, src in (secrets or {}).items():
        argv += ["--secret", f"id={sid},src={Path(src).resolve()}"]
    return [*argv, str(context)]


def run_build(argv: list[str], env: Mapping[str, str], on_line: Callable[[str], None] | None,
              timeout_s: float | None, keep_lines: int) -> tuple[int, ProgressLog, bool]:
    """Run the build command, each output line (without its newline) to ``on_line`` as it
    arrives; killed after ``timeout_s``. Returns ``(exit status, the read output, whether
    it timed out)``; the process never outlives the call."""
    log = ProgressLog(keep_lines)
    timed_out = threading.Event()
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                            env=dict(env), text=True, errors="replace", bufsize=1)

    def _kill() -> None:
        timed_out.set()
        proc.kill()

    timer = threading.Timer(timeout_s, _kill) if timeout_s else None
    try:
        if timer:
            timer.start()
        assert proc.stdout is not None
        for raw in proc.stdout:
            line = raw.rstrip("\n")
            log.add(line)
            if on_line:
                on_line(line)
        return proc.wait(), log, timed_out.is_set()
    finally:
        if timer:
            timer.cancel()
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        if proc.stdout:
            proc.stdout.close()
