"""The Docker engine: connect, build (BuildKit, through the docker CLI), labels, clean up.

Everything envbuild creates on the engine (images, containers, networks) carries the label
``envbuild=1`` (:data:`LABEL`) and, per invocation, ``envbuild.run=<id>`` (:data:`RUN_LABEL`,
see :func:`run_labels`), so that :func:`remove_by_label` can find and remove it.

Engine calls go through the docker SDK (``docker`` package) except image builds: the SDK
only speaks the classic builder, and the rendered Dockerfiles need BuildKit
(``RUN --mount=type=secret|bind``, ``--secret``), so :func:`build_image` runs a docker CLI
found by :func:`builder.image.buildkit.buildkit_cli`. Running the probe in an image is
:func:`builder.image.probecheck.run_probe`.
"""

from __future__ import annotations

import os
import re
import tempfile
import uuid
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

import docker
import docker.errors
import requests

from builder.core.errors import EnvbuildError, Unreachable
from builder.core.inputs import one_line

from .buildkit import BuildkitCLI, build_argv, build_failed, buildkit_cli, run_build

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
#: Default ``DOCKER_HOST`` of the docker SDK and CLI when the variable is unset.
DEFAULT_DOCKER_HOST = "unix:///var/run/docker.sock"

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
            f"no Docker engine answers at {url} ({one_line(e, 120)}); start one with "
            "`dockerd &` or `systemctl start docker`, or run scripts/setup.sh"
        ) from None
    return client


# --------------------------------------------------------------------------- build


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

    Runs the client from :func:`builder.image.buildkit.buildkit_cli` with
    ``--progress=plain``; each output line (without its newline) goes to ``on_line`` as it
    arrives. The build is tagged with a temporary tag first and retagged ``tag`` only once
    it succeeded, so a failed or interrupted build leaves no ``tag`` behind (a ``tag`` that
    existed before is kept).

    Args:
        context_dir: the build context folder.
        tag: ``repo[:tag]``, e.g. ``"envbuild/x:0123456789ab"``.
        build_args: ``--build-arg NAME=VALUE`` pairs.
        labels: ``--label KEY=VALUE`` pairs.
        secrets: ``{id: path}``, passed as ``--secret id=ID,src=PATH``; the file must exist.
        on_line: called with every output line.
        dockerfile: the Dockerfile (default ``context_dir/Dockerfile``).
        client: SDK client used for tagging (default :func:`connect`).
        cli: the BuildKit client (default :func:`builder.image.buildkit.buildkit_cli`).
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
    ok = False
    with tempfile.TemporaryDirectory(prefix="envbuild-iid-") as tmp:
        iidfile = Path(tmp) / "iid"
        argv = build_argv(cli, dockerfile, tmp_tag, iidfile, context, build_args, labels, secrets)
        try:
            rc, log, timed_out = run_build(argv, {**os.environ, **cli.env}, on_line, timeout_s, keep_lines)
            if timed_out:
                raise Unreachable(f"docker build of {tag} did not finish within {timeout_s:g} s", file=origin)
            if rc != 0:
                raise build_failed(tag, log, origin)
            image_id = iidfile.read_text().strip() if iidfile.exists() else ""
            if not image_id:
                image_id = client.images.get(tmp_tag).id
            client.api.tag(image_id, repo, name, force=True)
            ok = True
            return image_id
        finally:
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
            detail = "; ".join(f"{i[7:19]}: {one_line(errors[i], 200)}" for i in sorted(pending))
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

    t = datetime.datetime.fromtimestamp(math.ceil(epoch_s), datetime.UTC)
    return t.strftime("%Y-%m-%dT%H:%M:%SZ")


def _parse_deadline(text: object) -> float | None:
    import datetime

    if not isinstance(text, str) or not re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", text):
        return None
    try:
        t = datetime.datetime.strptime(text, "%Y-%m-%dT%H:%M:%SZ")
    except ValueError:
        return None
    return t.replace(tzinfo=datetime.UTC).timestamp()


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


def attach_output(client: docker.DockerClient, container_id: str) -> Any:
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
