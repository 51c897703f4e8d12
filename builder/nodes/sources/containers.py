"""Running containers on this Docker engine as nodes: chosen by image, name or label, each
probed with ``docker exec`` (the agent payload on the exec's stdin; nothing is copied into
the container). ``ENVBUILD_IMAGE``, ``ENVBUILD_IMAGE_ID``, ``ENVBUILD_IMAGE_DIGEST`` and
``ENVBUILD_RUNTIME_VERSION`` tell the probe which image and engine it runs under.
"""

from __future__ import annotations

import os
import re
import signal
import socket
import threading
from collections.abc import Mapping, Sequence
from typing import Any

from builder.agent import payload
from builder.core.errors import EnvbuildError, Unreachable
from builder.core.inputs import has_control, one_line

from ..report import Node
from .base import DEFAULT_PYTHON, DEFAULT_TIMEOUT_S, Running, Target, check_python, payload_archive, probe_nodes, usage

_CONTAINER_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,254}")
_LABEL_KEY_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._/-]{0,255}")


def check_container(text: str) -> str:
    """``text`` if it is a container name or ID (Docker's ``[a-zA-Z0-9][a-zA-Z0-9_.-]+``);
    else exit 64."""
    if not isinstance(text, str) or _CONTAINER_RE.fullmatch(text) is None:
        raise usage("is not a container name or ID (letters, digits, _ . -)", "--container", text)
    return text


def check_label(text: str) -> str:
    """``text`` if it is ``KEY`` or ``KEY=VALUE`` (key: letters, digits, ``. _ / -``; value:
    at most 4096 characters, no control character); else exit 64."""
    key, sep, value = text.partition("=") if isinstance(text, str) else ("", "", "")
    if _LABEL_KEY_RE.fullmatch(key) is None or len(value) > 4096 or has_control(value):
        raise usage("is not a label KEY[=VALUE] (key: letters, digits, . _ / -; no control characters)",
                    "--label", text)
    return text


class ExecRunning(Running):
    """``docker exec`` through the SDK: ``python3 -c BOOTSTRAP MODULE ARGS`` in a running
    container, ``stdin`` (the payload archive) written to the exec's stdin, stdout and
    stderr read from the multiplexed stream."""

    def __init__(self, client: Any, container_id: str, argv: Sequence[str],
                 env: Mapping[str, str] | None, stdin: bytes, where: str) -> None:
        import docker.errors

        super().__init__(where)
        self.client = client
        try:
            self.exec_id = client.api.exec_create(container_id, list(argv), stdin=True, stdout=True,
                                                  stderr=True, environment=dict(env or {}))["Id"]
            sock = client.api.exec_start(self.exec_id, socket=True)
        except docker.errors.APIError as e:
            raise Unreachable(f"docker exec failed: {one_line(e.explanation or e, 200)}",
                              field=where) from None
        try:  # the SDK's private helper, as logs(follow=True) uses it: a quiet module must not time out
            client.api._disable_socket_timeout(sock)
        except AttributeError:  # pragma: no cover - another SDK layout: keep its timeout
            pass
        threading.Thread(target=self._feed, args=(sock, stdin), daemon=True).start()
        threading.Thread(target=self._read, args=(sock,), daemon=True).start()

    @staticmethod
    def _feed(sock: Any, data: bytes) -> None:
        raw = getattr(sock, "_sock", sock)
        try:
            raw.sendall(data)
            raw.shutdown(socket.SHUT_WR)  # end of stdin for the exec'd process
        except OSError:
            pass  # the process ended early; its exit status tells why

    def _read(self, sock: Any) -> None:
        from docker.utils.socket import STDERR, frames_iter

        rc = None
        try:
            for stream, data in frames_iter(sock, tty=False):
                if stream == STDERR:
                    self._err_bytes(data)
                elif not self._out_bytes(data):
                    break
            if not self._over:
                rc = self.client.api.exec_inspect(self.exec_id).get("ExitCode")
        except Exception as e:  # the engine went away: the node could not be checked
            self._err_bytes(f"docker exec stream: {one_line(e, 300)}".encode())
        finally:
            try:
                sock.close()
            except OSError:
                pass
        self._finish(rc)

    def kill(self) -> None:
        """SIGKILL the exec'd process by its host PID (works with a local engine, as root)."""
        try:
            pid = self.client.api.exec_inspect(self.exec_id).get("Pid")
            if pid:
                os.kill(int(pid), signal.SIGKILL)
        except Exception:
            pass


class ContainerTarget(Target):
    """A running container on this engine; modules run with ``docker exec``.

    Attributes:
        container_id: the container's ID; ``name``: its name; ``env``: extra environment
        for every exec (the probe's ``ENVBUILD_IMAGE*`` variables).
    """

    def __init__(self, client: Any, container_id: str, name: str, env: Mapping[str, str],
                 python: str = DEFAULT_PYTHON) -> None:
        self.client, self.container_id, self.name, self.env = client, container_id, name, dict(env)
        self.python = check_python(python)
        self.where = f"container {name}"
        self.machine = f"docker engine {getattr(client.api, 'base_url', '')}"

    def start(self, module: str, args: Sequence[str] = ()) -> Running:
        """``docker exec -i CONTAINER python3 -c BOOTSTRAP MODULE ARGS`` with :attr:`env`."""
        return ExecRunning(self.client, self.container_id, payload.command(self.python, module, args),
                           self.env, payload_archive(), self.where)


def _container_address(attrs: dict, network: str | None) -> str | None:
    nets = (attrs.get("NetworkSettings") or {}).get("Networks") or {}
    if network and nets.get(network, {}).get("IPAddress"):
        return nets[network]["IPAddress"]
    for name in sorted(nets):
        if nets[name].get("IPAddress"):
            return nets[name]["IPAddress"]
    return None


def _shared_network(containers: Sequence[Any]) -> str | None:
    """The network every container is on (user networks before ``bridge``), or None."""
    sets = [set((c.attrs.get("NetworkSettings") or {}).get("Networks") or {}) for c in containers]
    if not sets:
        return None
    common = set.intersection(*sets)
    for name in sorted(common, key=lambda n: (n == "bridge", n)):
        return name
    return None


def find_containers(client: Any, images: Sequence[str] = (), names: Sequence[str] = (),
                    labels: Sequence[str] = ()) -> list:
    """Running containers chosen by image, name or label, sorted by name, no duplicates.

    Args:
        images: image references; a container matches when it runs that image's ID.
        names: container names or IDs (must exist and run).
        labels: ``key`` or ``key=value`` filters; all must match (alone: select by label).

    Raises:
        EnvbuildError: (exit 2) no such image; (exit 3) a named container is not running.
    """
    import docker.errors

    chosen: dict[str, Any] = {}
    filters: dict[str, Any] = {"status": "running"}
    if labels:
        filters["label"] = list(labels)
    for ref in images:
        try:
            image_id = client.images.get(ref).id
        except docker.errors.ImageNotFound:
            raise EnvbuildError("no such image", field="image", value=ref) from None
        for c in client.containers.list(filters=filters):
            if c.attrs.get("Image") == image_id:
                chosen[c.id] = c
    for name in names:
        try:
            c = client.containers.get(name)
        except docker.errors.NotFound:
            raise Unreachable("no such container", field="container", value=name) from None
        if c.status != "running":
            raise Unreachable(f"is {c.status}, not running", field="container", value=name)
        chosen[c.id] = c
    if labels and not images and not names:
        for c in client.containers.list(filters=filters):
            chosen[c.id] = c
    return sorted(chosen.values(), key=lambda c: c.name)


def _probe_env(client: Any, container: Any, engine_version: str | None) -> dict[str, str]:
    """The ``ENVBUILD_*`` variables that tell the probe its image and engine."""
    image_id = container.attrs.get("Image")
    ref = (container.attrs.get("Config") or {}).get("Image") or image_id
    digest = None
    try:
        repo_digests = client.images.get(image_id).attrs.get("RepoDigests") or []
        if repo_digests:
            digest = repo_digests[0].split("@", 1)[1]
    except Exception:
        pass
    env = {"ENVBUILD_IMAGE": ref, "ENVBUILD_IMAGE_ID": image_id or ""}
    if digest:
        env["ENVBUILD_IMAGE_DIGEST"] = digest
    if engine_version:
        env["ENVBUILD_RUNTIME_VERSION"] = engine_version
    return env


def container_nodes(client: Any, containers: Sequence[Any], python: str = DEFAULT_PYTHON) -> list[Node]:
    """Nodes (without reports yet) for running containers: name, address on the network
    they share, and a :class:`ContainerTarget` with the probe's ``ENVBUILD_*`` variables."""
    try:
        engine_version = client.version().get("Version")
    except Exception:
        engine_version = None
    network = _shared_network(containers)
    return [Node(name=c.name, source=f"container {c.name}", address=_container_address(c.attrs, network),
                 target=ContainerTarget(client, c.id, c.name, _probe_env(client, c, engine_version), python))
            for c in containers]


def from_containers(client: Any, images: Sequence[str] = (), names: Sequence[str] = (),
                    labels: Sequence[str] = (), expect: int | None = None,
                    timeout_s: float = DEFAULT_TIMEOUT_S, python: str = DEFAULT_PYTHON) -> list[Node]:
    """Probe running containers (see :func:`find_containers`); one node per container,
    named by the container.

    Args:
        expect: the number of containers there must be (``--nodes``), or None.

    Raises:
        Unreachable: (exit 3) no running container matches, or not ``expect`` of them
            (the message lists those found).
    """
    containers = find_containers(client, images, names, labels)
    what = ", ".join([*(f"image {i}" for i in images), *(f"container {n}" for n in names),
                      *(f"label {lab}" for lab in labels)])
    if not containers:
        raise Unreachable(f"no running container of {what}")
    if expect is not None and len(containers) != expect:
        raise Unreachable(f"expected {expect} running containers of {what}, found "
                          f"{len(containers)}: {', '.join(c.name for c in containers)}",
                          field="--nodes", value=expect)
    return probe_nodes(container_nodes(client, containers, python), timeout_s)
