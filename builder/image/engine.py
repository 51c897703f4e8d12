"""The Docker engine: connect, build (BuildKit, through the docker CLI), probe, clean up.

Everything envbuild creates on the engine (images, containers, networks) carries the label
``envbuild=1`` (:data:`LABEL`) and, per invocation, ``envbuild.run=<id>`` (:data:`RUN_LABEL`,
see :func:`run_labels`), so that :func:`remove_by_label` can find and remove it.

Engine calls go through the docker SDK (``docker`` package) except image builds: the SDK
only speaks the classic builder, and the rendered Dockerfiles need BuildKit
(``RUN --mount=type=secret|bind``, ``--secret``), so :func:`build_image` runs a docker CLI
found by :func:`buildkit_cli`.
"""

from __future__ import annotations

import collections
import os
import re
import subprocess
import tempfile
import threading
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterable, Mapping

import docker
import docker.errors
import requests

from builder.core.errors import EnvbuildError, ExitCode, Unreachable
from builder.core.inputs import one_line, show

#: Label on everything envbuild creates (value ``"1"``).
LABEL = "envbuild"
#: Label naming the envbuild invocation that created an object (value: :func:`new_run_id`).
RUN_LABEL = "envbuild.run"
#: Label of a run's network: when the run must be over, UTC ``YYYY-mm-ddTHH:MM:SSZ``
#: (:func:`deadline_label`); after it, a network without containers is stale.
DEADLINE_LABEL = "envbuild.deadline"

#: Most ``Config.Env`` entries read from an image, and the longest one (bytes).
MAX_IMAGE_ENV = 4096
MAX_IMAGE_ENV_ENTRY = 65536
#: Most bytes of a container's output read by :func:`run_probe` (a probe document is a
#: few KiB; node reports are bounded to 16 MiB, :data:`builder.core.inputs.MAX_REPORT_BYTES`).
MAX_PROBE_OUTPUT = 16 << 20

#: Where :func:`run_probe` mounts the probe script (read-only) inside the container.
PROBE_MOUNT = "/opt/envbuild/probe.py"

#: Default ``DOCKER_HOST`` of the docker SDK and CLI when the variable is unset.
DEFAULT_DOCKER_HOST = "unix:///var/run/docker.sock"

#: Docker CLI releases from 23.0 on need the buildx plugin for BuildKit builds; older
#: ones have BuildKit built in, enabled by ``DOCKER_BUILDKIT=1``
#: (https://docs.docker.com/engine/release-notes/23.0/: "docker build" uses buildx).
LEGACY_BUILDKIT_MAX_MAJOR = 22

OnLine = Callable[[str], None]


# --------------------------------------------------------------------------- labels


def new_run_id() -> str:
    """A fresh id for one envbuild invocation: 12 lowercase hex digits (random)."""
    return uuid.uuid4().hex[:12]


def run_labels(run_id: str) -> dict[str, str]:
    """Labels for an object created by run ``run_id``: ``{"envbuild": "1", "envbuild.run": run_id}``."""
    return {LABEL: "1", RUN_LABEL: run_id}


# --------------------------------------------------------------------------- connect


def _docker_host() -> str:
    return os.environ.get("DOCKER_HOST") or DEFAULT_DOCKER_HOST


def _one_line(text: str, limit: int = 160) -> str:
    """``text`` as one escaped line of at most ``limit`` characters (:func:`builder.core.inputs.one_line`)."""
    return one_line(text, limit)


def connect(timeout_s: int = 60) -> docker.DockerClient:
    """Connect to the Docker engine named by the environment (``DOCKER_HOST`` etc.).

    Args:
        timeout_s: seconds allowed per API request of the returned client.

    Returns:
        A ``docker.DockerClient`` whose engine answered a ping.

    Raises:
        Unreachable: (exit 3) one line: no Docker engine answers at ``<url>``, with the
            reason and how to start one (``dockerd &``, ``systemctl start docker`` or
            ``scripts/setup.sh``).
    """
    url = _docker_host()
    try:
        client = docker.from_env(timeout=timeout_s)
        client.ping()
    except (docker.errors.DockerException, requests.exceptions.RequestException, OSError) as e:
        raise Unreachable(
            f"no Docker engine answers at {url} ({_one_line(e, 120)}); start one with "
            "`dockerd &` or `systemctl start docker`, or run scripts/setup.sh"
        ) from None
    return client


# --------------------------------------------------------------------------- BuildKit CLI


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


# --------------------------------------------------------------------------- build


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

    def __init__(self, message: str, *, tag: str, step: str | None, lines: list[str], **kw):
        self.tag = tag
        self.step = step
        self.lines = lines
        super().__init__(message, **kw)


_STEP_RE = re.compile(r"^#(\d+) (.*)$")
_TIMED_RE = re.compile(r"^\d+\.\d+ ")


class _ProgressLog:
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
        m = _STEP_RE.match(line)
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
        lines = [l for l in self.lines.get(step, []) if not _STEP_RE.match(l).group(2).startswith("ERROR")]
        # the closing block repeats the step's output as "<seconds> <text>": keep the rest
        closing = [l for l in self.after_error if not l.startswith(" > ") and not _TIMED_RE.match(l)]
        return self.names.get(step), reason, (lines + closing)[-self.keep :]


def _split_tag(tag: str) -> tuple[str, str]:
    """``(repository, tag)`` of an image name (:mod:`builder.oci.reference`; tag ``latest``
    when none).

    Raises:
        EnvbuildError: (exit 64) not an image reference.
    """
    from builder.oci import reference

    ref = reference.parse(tag, field="tag")
    return ref.name, ref.tag or "latest"


def build_image(
    context_dir: str | os.PathLike,
    tag: str,
    build_args: Mapping[str, str] | None = None,
    labels: Mapping[str, str] | None = None,
    secrets: Mapping[str, str | os.PathLike] | None = None,
    on_line: OnLine | None = None,
    *,
    dockerfile: str | os.PathLike | None = None,
    client: docker.DockerClient | None = None,
    cli: BuildkitCLI | None = None,
    origin: str | None = None,
    timeout_s: float | None = None,
    keep_lines: int = 30,
) -> str:
    """Build ``context_dir`` with BuildKit and tag the result ``tag``.

    Runs the client from :func:`buildkit_cli` with ``--progress=plain``; each output line
    (without its newline) goes to ``on_line`` as it arrives. The build is tagged with a
    temporary tag first and retagged ``tag`` only once it succeeded, so a failed or
    interrupted build leaves no ``tag`` behind (a ``tag`` that existed before is kept).

    Args:
        context_dir: the build context folder.
        tag: ``repo[:tag]``, e.g. ``"envbuild/x:0123456789ab"``.
        build_args: ``--build-arg NAME=VALUE`` pairs.
        labels: ``--label KEY=VALUE`` pairs.
        secrets: ``{id: path}``, passed as ``--secret id=ID,src=PATH``; the file must exist.
        on_line: called with every output line.
        dockerfile: the Dockerfile (default ``context_dir/Dockerfile``).
        client: SDK client used for tagging (default :func:`connect`).
        cli: the BuildKit client (default :func:`buildkit_cli`).
        origin: file name shown in error messages (default the Dockerfile's path).
        timeout_s: seconds before the build is killed (default: no limit).
        keep_lines: how many lines of the failing step the error keeps.

    Returns:
        The image ID, ``"sha256:<64 hex>"``.

    Raises:
        BuildFailed: (exit 2) the build failed; the one-line message names the failing
            step and ends with its last output lines (all kept lines in ``.lines``).
        EnvbuildError: (exit 2) a secret file does not exist; no BuildKit client.
        Unreachable: (exit 3) the build ran past ``timeout_s``; no engine.
    """
    context = Path(context_dir)
    dockerfile = Path(dockerfile) if dockerfile else context / "Dockerfile"
    origin = origin or str(dockerfile)
    for sid, src in (secrets or {}).items():
        if not Path(src).is_file():
            raise EnvbuildError("no such file", field=f"secret {sid}", value=str(src))
    cli = cli or buildkit_cli()
    client = client or connect()
    repo, name = _split_tag(tag)
    tmp_tag = f"{repo}:{name[:90]}-building-{uuid.uuid4().hex[:8]}"

    with tempfile.TemporaryDirectory(prefix="envbuild-iid-") as tmp:
        iidfile = Path(tmp) / "iid"
        argv = [*cli.argv, "--progress=plain", "-f", str(dockerfile), "-t", tmp_tag]
        argv += ["--iidfile", str(iidfile)]
        for k, v in (build_args or {}).items():
            argv += ["--build-arg", f"{k}={v}"]
        for k, v in (labels or {}).items():
            argv += ["--label", f"{k}={v}"]
        for sid, src in (secrets or {}).items():
            argv += ["--secret", f"id={sid},src={Path(src).resolve()}"]
        argv.append(str(context))
        env = {**os.environ, **cli.env}

        log = _ProgressLog(keep_lines)
        timed_out = threading.Event()
        proc = subprocess.Popen(
            argv,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=env,
            text=True,
            errors="replace",
            bufsize=1,
        )

        def _kill() -> None:
            timed_out.set()
            proc.kill()

        timer = threading.Timer(timeout_s, _kill) if timeout_s else None
        ok = False
        try:
            if timer:
                timer.start()
            assert proc.stdout is not None
            for raw in proc.stdout:
                line = raw.rstrip("\n")
                log.add(line)
                if on_line:
                    on_line(line)
            rc = proc.wait()
            if timed_out.is_set():
                raise Unreachable(
                    f"docker build of {tag} did not finish within {timeout_s:g} s", file=origin
                )
            if rc != 0:
                step, reason, lines = log.failure()
                where = f" at step {step}" if step else ""
                # one line (errors always are): the step's last output lines after " | "
                output = [l.split(" ", 2)[2] if _TIMED_RE.match(l.partition(" ")[2]) else l for l in lines]
                body = " | ".join(o for o in output[-BUILD_ERROR_LINES:] if o.strip())
                raise BuildFailed(
                    f"docker build of {tag} failed{where}: {reason}" + (f" | output: {body}" if body else ""),
                    tag=tag,
                    step=step,
                    lines=lines,
                    file=origin,
                )
            image_id = iidfile.read_text().strip() if iidfile.exists() else ""
            if not image_id:
                image_id = client.images.get(tmp_tag).id
            client.api.tag(image_id, repo, name, force=True)
            ok = True
            return image_id
        finally:
            if timer:
                timer.cancel()
            if proc.poll() is None:
                proc.kill()
                proc.wait()
            if proc.stdout:
                proc.stdout.close()
            try:
                # untag only: the image stays under `tag` on success
                client.api.remove_image(tmp_tag, noprune=ok)
            except docker.errors.APIError:
                pass  # NotFound: the build never tagged it; anything else must not mask the outcome


# --------------------------------------------------------------------------- cleanup


def remove_by_label(
    client: docker.DockerClient, label_filter: str | list[str]
) -> dict[str, int]:
    """Remove every container (forced), network and image matching a label filter.

    Args:
        label_filter: ``"key"`` or ``"key=value"``, or a list of them (all must match),
            as in ``docker ps --filter label=...``.

    Returns:
        Counts removed: ``{"containers": int, "networks": int, "images": int}``.

    Raises:
        EnvbuildError: (exit 2) an image could not be removed (e.g. used by a container
            without the label); the message names it.
    """
    filters = {"label": label_filter}
    counts = {"containers": 0, "networks": 0, "images": 0}
    for c in client.containers.list(all=True, filters=filters):
        try:
            c.remove(force=True)
            counts["containers"] += 1
        except docker.errors.NotFound:
            pass
    for n in client.networks.list(filters=filters):
        try:
            n.remove()
            counts["networks"] += 1
        except docker.errors.NotFound:
            pass
    # Images built FROM others (classic builder) must go before their parents: retry
    # what failed while each pass still removes something.
    pending = {img.id for img in client.images.list(filters=filters)}
    errors: dict[str, str] = {}
    while pending:
        progress = False
        for image_id in sorted(pending):
            try:
                client.images.remove(image_id, force=True)
                counts["images"] += 1
                pending.discard(image_id)
                progress = True
            except docker.errors.NotFound:
                pending.discard(image_id)
                progress = True
            except docker.errors.APIError as e:
                errors[image_id] = e.explanation or str(e)
        if not progress:
            detail = "; ".join(f"{i[7:19]}: {_one_line(errors[i], 200)}" for i in sorted(pending))
            raise EnvbuildError(
                f"could not remove {len(pending)} image(s) ({detail}); the rest was removed",
                field="label",
                value=label_filter,
            )
    return counts


def deadline_label(epoch_s: float) -> str:
    """The value of :data:`DEADLINE_LABEL` for a deadline at ``epoch_s`` (seconds since the
    epoch): ``"2026-05-12T10:05:00Z"`` (rounded up to the second)."""
    import datetime
    import math

    t = datetime.datetime.fromtimestamp(math.ceil(epoch_s), datetime.timezone.utc)
    return t.strftime("%Y-%m-%dT%H:%M:%SZ")


def _parse_deadline(text: object) -> float | None:
    import datetime

    if not isinstance(text, str) or not re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", text):
        return None
    try:
        t = datetime.datetime.strptime(text, "%Y-%m-%dT%H:%M:%SZ")
    except ValueError:
        return None
    return t.replace(tzinfo=datetime.timezone.utc).timestamp()


def stale_networks(client: docker.DockerClient, now: float | None = None,
                   label_filter: str | list[str] | None = None) -> list[dict]:
    """Networks of envbuild runs that ended without removing them (envbuild killed).

    A network is stale when it carries ``envbuild=1`` and a :data:`DEADLINE_LABEL` that
    has passed (``now``: seconds since the epoch, default the current time) and no
    container is attached to it. Networks without a deadline label, with one that does
    not parse, or still in use are never listed. ``label_filter`` narrows the search
    further (as in :func:`remove_by_label`; tests pass their session label).

    Returns:
        ``[{"name", "id", "run", "deadline"}]`` sorted by name (``run``: the
        ``envbuild.run`` label or None; ``deadline``: the label's text).
    """
    import time

    now = time.time() if now is None else now
    extra = [label_filter] if isinstance(label_filter, str) else list(label_filter or [])
    found = []
    for n in client.networks.list(filters={"label": [f"{LABEL}=1", DEADLINE_LABEL, *extra]}, greedy=True):
        labels = n.attrs.get("Labels") or {}
        deadline = _parse_deadline(labels.get(DEADLINE_LABEL))
        if deadline is None or deadline > now or n.attrs.get("Containers"):
            continue
        found.append({"name": n.name, "id": n.id, "run": labels.get(RUN_LABEL),
                      "deadline": labels.get(DEADLINE_LABEL)})
    return sorted(found, key=lambda d: d["name"])


def remove_stale_networks(client: docker.DockerClient, now: float | None = None,
                          label_filter: str | list[str] | None = None) -> list[dict]:
    """Remove the networks :func:`stale_networks` lists; returns those removed (same
    shape). One that got a container meanwhile or is already gone is skipped."""
    removed = []
    for net in stale_networks(client, now, label_filter):
        try:
            client.api.remove_network(net["id"])
        except docker.errors.APIError:
            continue  # gone, or in use again: not stale after all
        removed.append(net)
    return removed


def image_labels(client: docker.DockerClient, ref: str) -> dict[str, str]:
    """The labels of image ``ref`` (name, tag or ID): ``{key: value}``, ``{}`` when none.

    Raises:
        EnvbuildError: (exit 2) no such image.
    """
    try:
        return dict(client.images.get(ref).labels or {})
    except docker.errors.ImageNotFound:
        raise EnvbuildError("no such image", field="image", value=ref) from None


def image_env(client: docker.DockerClient, ref: str) -> dict[str, str]:
    """The environment image ``ref`` sets (its config's ``Env``): ``{name: value}``.

    Bounded: at most :data:`MAX_IMAGE_ENV` entries of at most
    :data:`MAX_IMAGE_ENV_ENTRY` bytes each.

    Raises:
        EnvbuildError: (exit 2) no such image; an ``Env`` that is not a list of
            ``NAME=VALUE`` strings or is over the bounds (field ``Config.Env[i]``).
    """
    try:
        attrs = client.images.get(ref).attrs
    except docker.errors.ImageNotFound:
        raise EnvbuildError("no such image", field="image", value=ref) from None
    entries = (attrs.get("Config") or {}).get("Env") or []
    if not isinstance(entries, list) or len(entries) > MAX_IMAGE_ENV:
        raise EnvbuildError(f"image config Env is not a list of at most {MAX_IMAGE_ENV} entries",
                            field=f"{ref}: Config.Env")
    env: dict[str, str] = {}
    for i, item in enumerate(entries):
        name, sep, value = item.partition("=") if isinstance(item, str) else ("", "", "")
        if not sep or not re.fullmatch(r"[^=\x00]+", name) or len(item) > MAX_IMAGE_ENV_ENTRY:
            raise EnvbuildError("is not NAME=VALUE (within the bounds)", field=f"Config.Env[{i}]",
                                value=item)
        env[name] = value
    return env


def read_bounded(chunks: Iterable[bytes], limit: int) -> tuple[bytes, bool]:
    """``(the first limit bytes of chunks joined, whether there was more)``; stops reading
    at the limit."""
    out, total = [], 0
    for chunk in chunks:
        if total + len(chunk) > limit:
            out.append(chunk[: limit - total])
            return b"".join(out), True
        out.append(chunk)
        total += len(chunk)
    return b"".join(out), False


def attach_output(client: docker.DockerClient, container_id: str):
    """Attach to a container's stdout and stderr (also what it printed before): an
    iterator of ``(stdout bytes | None, stderr bytes | None)`` frames that ends when the
    container stops. Meant to be called BEFORE the container starts (``docker run --rm``
    attaches first too), so that no output is lost to an early exit and removal.

    The stream's socket read timeout is disabled (as the SDK does for ``logs(follow=True)``):
    a quiet container must not end the stream after the client's request timeout.
    Returns the SDK's ``CancellableStream`` (``close()`` ends it from another thread).
    """
    api = client.api
    stream = api.attach(container_id, stdout=True, stderr=True, stream=True, logs=True, demux=True)
    try:  # the SDK's private helpers, as logs(follow=True) uses them
        api._disable_socket_timeout(api._get_raw_response_socket(stream._response))
    except AttributeError:  # pragma: no cover - another SDK layout: keep its timeout
        pass
    return stream


# --------------------------------------------------------------------------- probe


def _probe_result(container, image: str, code: int) -> dict:
    """The probe's document from the ended ``container`` (exit status ``code``), its
    output read with bounds. Raises EnvbuildError (exit 3) as :func:`run_probe` says."""
    def read(stdout: bool) -> tuple[str, bool]:
        raw, cut = read_bounded(container.logs(stdout=stdout, stderr=not stdout, stream=True, follow=False),
                                MAX_PROBE_OUTPUT)
        return raw.decode("utf-8", "replace"), cut

    out, cut = read(True)
    if code != 0:
        err = read(False)[0]
        last = (err.strip().splitlines() or out.strip().splitlines() or ["no output"])[-1]
        raise EnvbuildError(f"probe exited with code {code}: {one_line(last, 300)}", field="image",
                            value=image, exit_code=ExitCode.UNREACHABLE)
    if cut:
        raise EnvbuildError(f"probe printed more than {MAX_PROBE_OUTPUT} bytes", field="image",
                            value=image, exit_code=ExitCode.UNREACHABLE)
    doc = _probe_json(out)
    if not isinstance(doc, dict):
        raise EnvbuildError(f"probe printed no JSON object: {show(out.strip())}", field="image",
                            value=image, exit_code=ExitCode.UNREACHABLE)
    return doc


def _probe_json(out: str):
    """The probe's JSON object: the whole output, else its last line; bounded
    (:func:`builder.core.inputs.load_json`); None when neither is one."""
    from builder.core.inputs import load_json

    lines = out.strip().splitlines()
    for text in (out, lines[-1] if lines else ""):
        try:
            return load_json(text, "probe output", exit_code=ExitCode.UNREACHABLE)
        except EnvbuildError:
            continue
    return None


def run_probe(
    client: docker.DockerClient,
    image: str,
    probe_path: str | os.PathLike,
    *,
    labels: Mapping[str, str] | None = None,
    timeout_s: float = 300,
    gpus: bool = False,
) -> dict:
    """Run the probe in a throwaway container of ``image`` and return its JSON.

    Runs ``python3 /opt/envbuild/probe.py`` with ``probe_path`` bind-mounted read-only at
    that path (the image is not changed), no network, and the container labelled
    ``envbuild=1`` plus ``labels``. The container is removed afterwards, also on failure.

    Args:
        image: image name, tag or ID.
        probe_path: the probe script on the engine's host (e.g. ``builder/agent/probe.py``).
        labels: extra labels for the container.
        timeout_s: seconds the probe may run.
        gpus: request all GPUs (``--gpus all``).

    Returns:
        The JSON document the probe printed on stdout (a dict, e.g. schema
        ``envbuild.probe/1``).

    Raises:
        EnvbuildError: (exit 2) no such image or probe file.
        EnvbuildError: (exit 3) the probe exited non-zero (message ends with its last
            stderr line) or printed something other than a JSON object.
        Unreachable: (exit 3) the probe ran past ``timeout_s``.
    """
    probe = Path(probe_path).resolve()
    if not probe.is_file():
        raise EnvbuildError("no such file", field="probe", value=str(probe_path))
    kwargs: dict = {}
    if gpus:
        kwargs["device_requests"] = [docker.types.DeviceRequest(count=-1, capabilities=[["gpu"]])]
    try:
        container = client.containers.create(
            image,
            ["python3", PROBE_MOUNT],
            volumes={str(probe): {"bind": PROBE_MOUNT, "mode": "ro"}},
            labels={LABEL: "1", **(labels or {})},
            network_mode="none",
            **kwargs,
        )
    except docker.errors.ImageNotFound:
        raise EnvbuildError("no such image", field="image", value=image) from None
    try:
        container.start()
        try:
            status = container.wait(timeout=timeout_s)
        except (requests.exceptions.RequestException, OSError):
            raise Unreachable(
                f"probe did not finish within {timeout_s:g} s", field="image", value=image
            ) from None
        doc = _probe_result(container, image, status.get("StatusCode", -1))
        return doc
    finally:
        try:
            container.remove(force=True)
        except docker.errors.NotFound:
            pass

