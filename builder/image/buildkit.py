"""The BuildKit half of :class:`builder.image.engine.Engine`: a docker CLI that builds with
BuildKit, its command line, its ``--progress=plain`` output and the one-line build error."""

from __future__ import annotations

import collections
import os
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from builder.core import process
from builder.core.errors import EnvbuildError, Unreachable

#: Docker CLI releases from 23.0 on need the buildx plugin for BuildKit builds; older
#: ones have BuildKit built in, enabled by ``DOCKER_BUILDKIT=1``
#: (https://docs.docker.com/engine/release-notes/23.0/: "docker build" uses buildx).
LEGACY_BUILDKIT_MAX_MAJOR = 22

# --------------------------------------------------------------------------- the client


@dataclass(frozen=True)
class BuildkitCLI:
    """A docker client able to run BuildKit builds: ``argv`` is the build command prefix, ``env`` the
    extra environment (``DOCKER_BUILDKIT=1`` for a pre-23 client without buildx)."""

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
        out = process.run([path, "--version"], 20)
    except Unreachable:
        return None
    m = re.search(r"version\s+v?(\d+\.\d+[^\s,]*)", out.stdout, re.IGNORECASE)
    return m.group(1) if out.returncode == 0 and m else None


def _has_buildx(path: str) -> bool:
    try:
        out = process.run([path, "buildx", "version"], 20)
    except Unreachable:
        return False
    return out.returncode == 0


def buildkit_cli(search_path: str | None = None, extra: Iterable[str] = ("/usr/bin/docker",)) -> BuildkitCLI:
    """The first ``docker`` on ``search_path`` (default ``$PATH``), then ``extra``, whose buildx works; else one older
    than 23.0 (BuildKit built in). Raises EnvbuildError (exit 2): none qualifies; the message lists those tried."""
    cands = _candidates(search_path, extra)
    for path in cands:
        if _has_buildx(path):
            return BuildkitCLI(path, _client_version(path) or "unknown", (path, "buildx", "build", "--load"))
    tried = []
    for path in cands:
        version = _client_version(path)
        tried.append(f"{path} ({version or 'no version'})")
        if version is None:
            continue
        major = int(version.split(".")[0])
        if major <= LEGACY_BUILDKIT_MAX_MAJOR:
            return BuildkitCLI(path, version, (path, "build"), {"DOCKER_BUILDKIT": "1"})
    raise EnvbuildError("no docker client can build with BuildKit: tried "
                        f"{', '.join(tried) or 'no docker executable found'}; install the buildx plugin (apt-get "
                        "install docker-buildx) or a docker client older than 23 (Debian's docker.io 20.10)",
                        field="docker")


# --------------------------------------------------------------------------- output


#: Output lines of the failing step kept in a build error's one line.
BUILD_ERROR_LINES = 3


class BuildFailed(EnvbuildError):
    """``docker build`` failed (exit 2): one line with the failing step (``step``, e.g. ``[2/3] RUN
    make``), the reason and its last :data:`BUILD_ERROR_LINES` lines; ``lines`` keeps more."""

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
    """``(exit status, read output, whether it timed out)`` of the build command (:func:`process.stream`)."""
    log = ProgressLog(keep_lines)

    def each(line: str) -> None:
        log.add(line)
        if on_line:
            on_line(line)

    rc, timed_out = process.stream(argv, timeout_s, each, env=env)
    return rc, log, timed_out
