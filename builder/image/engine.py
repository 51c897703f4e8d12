"""The Docker engine behind one class (repo2docker's ``ContainerEngine`` shape), the only module
that imports the docker SDK. Builds run the docker CLI (the SDK speaks only the classic builder);
the SDK's import costs ~0.25 s, so :meth:`Engine.inspect_image` asks a local socket itself."""

from __future__ import annotations

import contextlib
import os
import re
import socket
import tempfile
import threading
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

from builder.core import clock
from builder.core.errors import EnvbuildError, NoSuchImage, Unreachable
from builder.core.inputs import one_line

from .buildkit import BuildFailed, BuildkitCLI, build_argv, build_failed, buildkit_cli, run_build
from .objects import MAX_ANSWER_BYTES, Container, Image, Ran, SocketError, socket_get

if TYPE_CHECKING:
    import docker

    from builder.oci.client import Credentials

__all__ = ["BuildFailed", "BuildkitCLI", "Container", "Engine", "Gone", "Image", "PullFailed", "buildkit_cli",
           "connect"]

LABEL = "envbuild"
RUN_LABEL = "envbuild.run"
#: A run network's deadline, UTC ``YYYY-mm-ddTHH:MM:SSZ``; past it, a network without containers is stale.
DEADLINE_LABEL = "envbuild.deadline"

DEFAULT_DOCKER_HOST = "unix:///var/run/docker.sock"
#: Seconds a pull may take before the base counts as unreachable.
PULL_TIMEOUT_S = 30
#: Exit status of a container whose command could not start (as ``docker run`` reports it).
NOT_STARTED = 127

OnLine = Callable[[str], None]


def new_run_id() -> str:
    """A fresh id for one envbuild invocation: 12 random hex digits."""
    return uuid.uuid4().hex[:12]


def run_labels(run_id: str) -> dict[str, str]:
    return {LABEL: "1", RUN_LABEL: run_id}


def deadline_label(epoch_s: float) -> str:
    """:data:`DEADLINE_LABEL`'s value for ``epoch_s`` (seconds), rounded up to the second."""
    import math

    return clock.utc_stamp(math.ceil(epoch_s))


def _parse_deadline(text: object) -> float | None:
    import datetime

    if not isinstance(text, str) or not re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", text):
        return None
    try:
        t = datetime.datetime.strptime(text, clock.FORMAT)
    except ValueError:
        return None
    return t.replace(tzinfo=datetime.UTC).timestamp()


class PullFailed(Unreachable):
    """The engine could not pull an image (exit 3); ``reason`` is the engine's one line."""

    def __init__(self, reason: str, ref: str) -> None:
        self.reason = reason
        super().__init__(f"cannot be pulled: {reason}", field="image", value=ref)


class Gone(Unreachable):
    """The container, network or exec asked for is not (or no longer) on the engine (exit 3)."""


class _StreamError(Unreachable):
    """An error event of the engine's progress stream (a push or a pull)."""


_STATUS_DIGEST = re.compile(r"Digest: (sha256:[0-9a-f]{64})")


def _stream_digest(events: Iterable[Any]) -> str | None:
    """The manifest digest a push or pull progress stream reports; _StreamError at its first error event."""
    digest = None
    for msg in events:
        if not isinstance(msg, dict):
            continue
        if msg.get("error") or msg.get("errorDetail"):
            raise _StreamError(one_line((msg.get("errorDetail") or {}).get("message") or msg.get("error"), 300))
        digest = (msg.get("aux") or {}).get("Digest") or digest
        m = _STATUS_DIGEST.search(str(msg.get("status") or ""))
        digest = m.group(1) if m else digest
    return digest


def _why(e: Exception) -> str:
    return str(getattr(e, "explanation", None) or e)


@contextlib.contextmanager
def _call(what: str, image: str | None = None) -> Iterator[None]:
    """The SDK's and its transport's errors as envbuild's: NoSuchImage, Gone, else Unreachable."""
    import docker.errors
    import requests

    try:
        yield
    except docker.errors.ImageNotFound:
        raise NoSuchImage(image or what) from None
    except docker.errors.NotFound as e:
        raise Gone(f"Docker engine: {what}: {one_line(_why(e), 300)}") from None
    except (docker.errors.DockerException, requests.exceptions.RequestException, OSError) as e:
        raise Unreachable(f"Docker engine: {what}: {one_line(_why(e), 300)}") from None


class Exec:
    """A ``docker exec`` started with its stdin, stdout and stderr on one socket."""

    def __init__(self, engine: Engine, exec_id: str, sock: Any) -> None:
        self.engine, self.id, self.sock = engine, exec_id, sock

    def send(self, data: bytes) -> None:
        """Write ``data`` to the process's stdin and close it; an ended process is fine."""
        raw = getattr(self.sock, "_sock", self.sock)
        with contextlib.suppress(OSError):
            raw.sendall(data)
            raw.shutdown(socket.SHUT_WR)

    def frames(self) -> Iterator[tuple[bool, bytes]]:
        """``(is_stderr, data)`` until the process closes its output."""
        from docker.utils.socket import STDERR, frames_iter

        with _call("exec stream"):
            for stream, data in frames_iter(self.sock, tty=False):
                yield stream == STDERR, data

    def inspect(self) -> dict[str, Any]:
        with _call("exec inspect"):
            return dict(self.engine.sdk.api.exec_inspect(self.id))

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.sock.close()


class Engine:
    """The Docker engine of ``DOCKER_HOST`` (``env``, default ``os.environ``); :attr:`sdk` connects on first use."""

    def __init__(self, timeout_s: float = 60, env: Mapping[str, str] | None = None,
                 client: docker.DockerClient | None = None) -> None:
        self.timeout_s = timeout_s
        self.env = dict(os.environ if env is None else env)
        self.host = self.env.get("DOCKER_HOST") or DEFAULT_DOCKER_HOST
        self._client = client
        path = self.host[len("unix://"):] if self.host.startswith("unix://") else None
        self._socket = path if path and os.path.exists(path) else None

    @property
    def sdk(self) -> docker.DockerClient:
        """Raises Unreachable (exit 3) when no engine answers."""
        if self._client is None:
            import docker
            import docker.errors
            import requests

            try:
                client = docker.from_env(timeout=int(self.timeout_s), environment=self.env)
                client.ping()
            except (docker.errors.DockerException, requests.exceptions.RequestException, OSError) as e:
                raise Unreachable(
                    f"no Docker engine answers at {self.host} ({one_line(e, 120)}); start one with "
                    "`dockerd &` or `systemctl start docker`, or run scripts/setup.sh") from None
            self._client = client
        return self._client

    def ping(self) -> bool:
        with _call("ping"):
            return bool(self.sdk.ping())

    def info(self) -> dict[str, Any]:
        with _call("info"):
            return dict(self.sdk.info())

    def version(self) -> dict[str, Any]:
        with _call("version"):
            return dict(self.sdk.version())

    def events(self, filters: Mapping[str, Any]) -> Any:
        """The engine's events matching ``filters`` as decoded dicts; ``close()`` ends the stream."""
        with _call("events"):
            return self.sdk.events(decode=True, filters=dict(filters))

    def close(self) -> None:
        if self._client is not None:
            self._client.close()

    # ------------------------------------------------------------------ images

    def inspect_image(self, ref: str) -> Image | None:
        """Image ``ref`` (name, tag or ID), None when there is none."""
        if self._socket:
            try:
                doc = socket_get(self._socket, f"/images/{quote(ref, safe='')}/json", min(self.timeout_s, 10))
                if doc is None or (isinstance(doc, dict) and isinstance(doc.get("Id"), str)):
                    return None if doc is None else Image.of(doc)
            except SocketError:
                pass  # the SDK asks again and reports what is wrong
        with contextlib.suppress(NoSuchImage), _call("inspect image", ref):
            return Image.of(self.sdk.api.inspect_image(ref))
        return None

    def image(self, ref: str) -> Image:
        """Raises NoSuchImage (exit 3)."""
        img = self.inspect_image(ref)
        if img is None:
            raise NoSuchImage(ref)
        return img

    def image_id(self, ref: str) -> str | None:
        img = self.inspect_image(ref)
        return img.id if img else None

    def tag(self, image: str, repo: str, tag: str) -> None:
        with _call(f"tag {repo}:{tag}", image):
            self.sdk.api.tag(image, repo, tag, force=True)

    def untag(self, ref: str, *, prune: bool = False) -> bool:
        """Remove name ``ref`` (``prune``: the image too if last); whether it went (gone or in use: kept quietly)."""
        try:
            with _call(f"remove image {ref}", ref):
                self.sdk.api.remove_image(ref, noprune=not prune)
        except Unreachable:
            return False
        return True

    def push(self, name: str, tag: str, auth: Mapping[str, str] | None) -> str | None:
        """``docker push name:tag``; the manifest digest the engine reported. Raises Unreachable (exit 3)."""
        try:
            with _call(f"docker push {name}:{tag}"):
                return _stream_digest(self.sdk.api.push(name, tag=tag, stream=True, decode=True, auth_config=auth))
        except _StreamError as e:
            raise Unreachable(f"docker push {name}:{tag} failed: {e.message}") from None

    def import_tar(self, chunks: Iterable[bytes], repo: str, tag: str, changes: list[str]) -> None:
        """``docker import`` of a root filesystem tar stream as ``repo:tag``."""
        api = self.sdk.api
        saved, api.timeout = api.timeout, 900  # the engine writes the layer before it answers
        try:
            with _call(f"docker import {repo}:{tag}"):
                api.import_image(src=chunks, repository=repo, tag=tag, changes=changes, stream_src=True)
        finally:
            api.timeout = saved

    def pull(self, ref: str, timeout_s: float | None = PULL_TIMEOUT_S, *, tag: str | None = None,
             auth: Mapping[str, str] | None = None) -> str:
        """Pull ``ref`` (``tag``: tag or digest); its image ID. PullFailed (exit 3): failed or past ``timeout_s``."""
        outcome: dict[str, Any] = {}

        def _pull() -> None:
            try:
                _stream_digest(self.sdk.api.pull(ref, tag=tag, stream=True, decode=True, auth_config=auth))
            except Exception as e:  # noqa: BLE001 - reported below, in the calling thread
                outcome["error"] = e.message if isinstance(e, _StreamError) else _why(e)

        self.ping()  # an unreachable engine is Unreachable, not a pull failure
        worker = threading.Thread(target=_pull, daemon=True, name=f"pull {ref}")
        worker.start()
        worker.join(timeout_s)
        if worker.is_alive():
            raise PullFailed(f"pull did not finish within {timeout_s:g} s", ref)
        if "error" in outcome:
            raise PullFailed(" ".join(str(outcome["error"]).split()), ref)
        pulled = ref if tag is None else f"{ref}{'@' if tag.startswith('sha256:') else ':'}{tag}"
        image_id = self.image_id(pulled)
        if image_id is None:
            raise Unreachable("pulled but not found afterwards", field="image", value=pulled)
        return image_id

    def build(self, context_dir: str | os.PathLike, tag: str, build_args: Mapping[str, str] | None = None,
              labels: Mapping[str, str] | None = None, secrets: Mapping[str, str | os.PathLike] | None = None,
              on_line: OnLine | None = None, *, dockerfile: str | os.PathLike | None = None,
              cli: BuildkitCLI | None = None, origin: str | None = None, timeout_s: float | None = None,
              keep_lines: int = 30) -> str:
        """Build with BuildKit (``--progress=plain`` lines to ``on_line``) under a temporary tag renamed on success; the
        image ID (``origin``: the file errors name). BuildFailed/EnvbuildError (exit 2): a step failed, a secret
        missing, no BuildKit; Unreachable (exit 3): past ``timeout_s``, no engine."""
        from builder.oci import reference

        context = Path(context_dir)
        dockerfile = Path(dockerfile) if dockerfile else context / "Dockerfile"
        origin = origin or str(dockerfile)
        for sid, src in (secrets or {}).items():
            if not Path(src).is_file():
                raise EnvbuildError("no such file", field=f"secret {sid}", value=str(src))
        cli = cli or buildkit_cli()
        ref = reference.parse(tag, field="tag")
        repo, name = ref.name, ref.tag or "latest"
        tmp_tag = f"{repo}:{name[:90]}-building-{uuid.uuid4().hex[:8]}"
        self.ping()
        ok = False
        with tempfile.TemporaryDirectory(prefix="envbuild-iid-") as tmp:
            iidfile = Path(tmp) / "iid"
            argv = build_argv(cli, dockerfile, tmp_tag, iidfile, context, build_args, labels, secrets)
            try:
                rc, log, timed_out = run_build(argv, {**self.env, **cli.env}, on_line, timeout_s, keep_lines)
                if timed_out:
                    raise Unreachable(f"docker build of {tag} did not finish within {timeout_s:g} s", file=origin)
                if rc != 0:
                    raise build_failed(tag, log, origin)
                image_id = (iidfile.read_text().strip() if iidfile.exists() else "") or self.image(tmp_tag).id
                self.tag(image_id, repo, name)
                ok = True
                return str(image_id)
            finally:  # untag only: the image stays under `tag` on success
                self.untag(tmp_tag, prune=not ok)

    # ------------------------------------------------------------------ containers

    def create_container(self, image: str, command: Sequence[str] | None = None, *,
                         gpus: Sequence[str] | bool = (), aliases: Sequence[str] = (), **options: Any) -> Container:
        """Create (not start) a container: ``options`` as the SDK's, ``gpus`` (indices, True: all), ``aliases``."""
        import docker.types

        if gpus:
            ids = {"count": -1} if gpus is True else {"device_ids": list(gpus)}
            options["device_requests"] = [docker.types.DeviceRequest(capabilities=[["gpu"]], **ids)]
        with _call(f"create a container of {image}", image):
            if aliases:
                options["networking_config"] = {
                    options["network"]: self.sdk.api.create_endpoint_config(aliases=list(aliases))}
            c = self.sdk.containers.create(image, None if command is None else list(command), **options)
        return Container.of(c.attrs)

    def start(self, container_id: str) -> None:
        with _call(f"start container {container_id[:12]}"):
            self.sdk.api.start(container_id)

    def kill(self, container_id: str) -> None:
        """SIGKILL (a paused container too); one gone already is fine."""
        with contextlib.suppress(Unreachable), _call("kill"):
            self.sdk.api.kill(container_id)

    def remove_container(self, container_id: str) -> None:
        """Force-remove; one gone already (or being removed) is fine. Raises Unreachable (exit 3)."""
        try:
            with _call(f"remove container {container_id[:12]}"):
                self.sdk.api.remove_container(container_id, force=True)
        except Gone:
            pass
        except Unreachable as e:
            if "already in progress" not in e.message:
                raise

    def wait(self, container_id: str, timeout_s: float | None = None, condition: str = "not-running") -> int:
        """The container's exit status once it meets ``condition``; Unreachable (exit 3) past ``timeout_s``."""
        with _call(f"wait for container {container_id[:12]}"):
            return int(self.sdk.api.wait(container_id, timeout=timeout_s, condition=condition)["StatusCode"])

    def logs(self, container_id: str, *, stderr: bool = False, limit: int = MAX_ANSWER_BYTES) -> tuple[bytes, bool]:
        """``(the container's stdout or stderr, cut at limit bytes; whether there was more)``."""
        with _call("logs"):
            chunks = self.sdk.api.logs(container_id, stdout=not stderr, stderr=stderr, stream=True, follow=False)
            return read_bounded(chunks, limit)

    def container(self, name: str) -> Container:
        """Raises Gone (exit 3): no such container."""
        with _call(f"container {name}"):
            return Container.of(self.sdk.api.inspect_container(name))

    def containers(self, labels: Sequence[str] = (), *, running: bool = False, inspect: bool = True) -> list[Container]:
        """Containers with every label (``key[=value]``), only running ones with ``running``; ``inspect``: inspected."""
        filters: dict[str, Any] = {"label": list(labels)} if labels else {}
        if running:
            filters["status"] = "running"
        with _call("list containers"):
            found = [Container.of(c) for c in self.sdk.api.containers(all=not running, filters=filters)]
        if not inspect:
            return found
        out = []
        for c in found:
            with contextlib.suppress(Gone):  # removed since the list
                out.append(self.container(c.id))
        return out

    def run_once(self, image: str, command: Sequence[str] | None, *, timeout_s: float, what: str = "container",
                 limit: int = MAX_ANSWER_BYTES, **options: Any) -> Ran:
        """Create, start, wait for, remove a container (also on failure); one that cannot start is :data:`NOT_STARTED`,
        the engine's reason as stderr (as ``docker run``). NoSuchImage, Unreachable (exit 3): past ``timeout_s``."""
        c = self.create_container(image, command, **options)
        try:
            try:
                self.start(c.id)
            except Unreachable as e:
                if "executable file not found" not in e.message and "no such file" not in e.message.lower():
                    raise
                return Ran(NOT_STARTED, b"", e.message.encode())
            try:
                code = self.wait(c.id, timeout_s)
            except Unreachable:
                raise Unreachable(f"{what} did not finish within {timeout_s:g} s", field="image", value=image) from None
            out, cut = self.logs(c.id, limit=limit)
            err, cut_err = self.logs(c.id, stderr=True, limit=limit)
            return Ran(code, out, err, cut or cut_err)
        finally:
            self.remove_container(c.id)

    @contextlib.contextmanager
    def export(self, image: str, labels: Mapping[str, str]) -> Iterator[Iterator[bytes]]:
        """``image``'s filesystem as tar chunks, from a never started container; NoSuchImage, Unreachable (3)."""
        c = self.create_container(image, ["/envbuild-export-never-started"], labels={LABEL: "1", **labels},
                                  network_disabled=True)
        try:
            with _call(f"export of {image}", image):
                yield iter(self.sdk.api.export(c.id, chunk_size=1 << 20))
        finally:
            self.remove_container(c.id)

    def exec(self, container_id: str, argv: Sequence[str], env: Mapping[str, str]) -> Exec:
        """Start ``argv`` in a running container; no read timeout (a quiet process keeps it); Unreachable."""
        api = self.sdk.api
        with _call("docker exec"):
            exec_id = api.exec_create(container_id, list(argv), stdin=True, stdout=True, stderr=True,
                                      environment=dict(env))["Id"]
            sock = api.exec_start(exec_id, socket=True)
        with contextlib.suppress(AttributeError):  # the SDK's private helper, as logs(follow=True) uses it
            api._disable_socket_timeout(sock)
        return Exec(self, exec_id, sock)

    def attach_output(self, container_id: str) -> Any:
        """``(stdout, stderr)`` frames until the container stops (attach BEFORE start); no read timeout."""
        api = self.sdk.api
        with _call("attach"):
            stream = api.attach(container_id, stdout=True, stderr=True, stream=True, logs=True, demux=True)
        with contextlib.suppress(AttributeError):  # the SDK's private helpers, as logs(follow=True) uses them
            api._disable_socket_timeout(api._get_raw_response_socket(stream._response))
        return stream

    # ------------------------------------------------------------------ networks and clean up

    def create_network(self, name: str, labels: Mapping[str, str], *, internal: bool = True) -> str:
        """A bridge network; its ID."""
        with _call(f"create network {name}"):
            return str(self.sdk.api.create_network(name, driver="bridge", internal=internal, labels=dict(labels))["Id"])

    def remove_network(self, network_id: str) -> None:
        """One gone already is fine. Raises Unreachable (exit 3): in use, the engine failed."""
        with contextlib.suppress(Gone), _call(f"remove network {network_id[:12]}"):
            self.sdk.api.remove_network(network_id)

    def remove_by_label(self, label_filter: str | list[str]) -> dict[str, int]:
        """Counts of containers (forced), networks, images removed by ``label_filter``; exit 2: an image in use."""
        labels = [label_filter] if isinstance(label_filter, str) else list(label_filter)
        counts = {"containers": 0, "networks": 0, "images": 0}
        for c in self.containers(labels, inspect=False):
            self.remove_container(c.id)
            counts["containers"] += 1
        with _call("list networks"):
            nets = self.sdk.api.networks(filters={"label": labels})
        for n in nets:
            with contextlib.suppress(Gone):
                self.remove_network(n["Id"])
                counts["networks"] += 1
        with _call("list images"):
            pending = {img["Id"] for img in self.sdk.api.images(filters={"label": labels})}
        errors: dict[str, str] = {}
        while pending:  # an image built FROM another must go first: retry while a pass removes something
            progress = False
            for image_id in sorted(pending):
                try:
                    with _call(f"remove image {image_id[7:19]}", image_id):
                        self.sdk.api.remove_image(image_id, force=True)
                    counts["images"] += 1
                except (NoSuchImage, Gone):
                    pass
                except Unreachable as e:
                    errors[image_id] = e.message
                    continue
                pending.discard(image_id)
                progress = True
            if not progress:
                detail = "; ".join(f"{i[7:19]}: {one_line(errors[i], 200)}" for i in sorted(pending))
                raise EnvbuildError(f"could not remove {len(pending)} image(s) ({detail}); the rest was removed",
                                    field="label", value=label_filter)
        return counts

    def stale_networks(self, now: float | None = None, label_filter: str | list[str] | None = None) -> list[dict]:
        """Networks of ended runs: ``envbuild=1``, past :data:`DEADLINE_LABEL` (``now``: epoch s), no container."""
        import time

        now = time.time() if now is None else now
        extra = [label_filter] if isinstance(label_filter, str) else list(label_filter or [])
        found = []
        with _call("list networks"):
            listed = self.sdk.api.networks(filters={"label": [f"{LABEL}=1", DEADLINE_LABEL, *extra]})
        for summary in listed:
            try:
                with _call("inspect network"):
                    n = self.sdk.api.inspect_network(summary["Id"])
            except Gone:
                continue
            labels = n.get("Labels") or {}
            deadline = _parse_deadline(labels.get(DEADLINE_LABEL))
            if deadline is None or deadline > now or n.get("Containers"):
                continue
            found.append({"name": n["Name"], "id": n["Id"], "run": labels.get(RUN_LABEL),
                          "deadline": labels.get(DEADLINE_LABEL)})
        return sorted(found, key=lambda d: d["name"])

    def remove_stale_networks(self, now: float | None = None,
                              label_filter: str | list[str] | None = None) -> list[dict]:
        """Remove the :meth:`stale_networks`; those removed (one in use again or gone is skipped)."""
        removed = []
        for net in self.stale_networks(now, label_filter):
            try:
                with _call("remove network"):
                    self.sdk.api.remove_network(net["id"])
            except Unreachable:
                continue
            removed.append(net)
        return removed


def docker_login(host: str) -> Credentials:
    """Credentials for ``host`` in the docker CLI's config (username empty: none); Unreachable (3): unreadable."""
    import docker.auth
    import docker.utils.config

    from builder.oci.client import Credentials

    found = docker.utils.config.find_config_file()
    path = str(found) if found else os.path.join(
        os.environ.get("DOCKER_CONFIG") or os.path.join(os.path.expanduser("~"), ".docker"), "config.json")
    try:
        auth = docker.auth.load_config(found).resolve_authconfig(host) if found else None
    except Exception as e:  # noqa: BLE001 - the SDK raises several types here
        raise Unreachable(f"cannot read registry credentials: {e}", file=path) from None
    user = (auth or {}).get("username") or (auth or {}).get("Username")
    password = (auth or {}).get("password") or (auth or {}).get("Password")
    return Credentials(user, password, path) if user and password is not None else Credentials("", "", path)


def connect(timeout_s: float = 60) -> Engine:
    """The engine of the environment, connected now. Raises Unreachable (exit 3): none answers."""
    eng = Engine(timeout_s)
    eng.ping()
    return eng


def read_bounded(chunks: Iterable[bytes], limit: int) -> tuple[bytes, bool]:
    """``(the first limit bytes of chunks, whether there was more)``; stops reading at the limit."""
    out, total = [], 0
    for chunk in chunks:
        if total + len(chunk) > limit:
            out.append(chunk[: limit - total])
            return b"".join(out), True
        out.append(chunk)
        total += len(chunk)
    return b"".join(out), False
