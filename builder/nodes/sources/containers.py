"""Running containers on this Docker engine as nodes, probed with ``docker exec`` (the payload
on stdin; nothing is copied into the container)."""

from __future__ import annotations

import os
import re
import signal
import threading
from collections.abc import Mapping, Sequence

from builder.agent import payload
from builder.core.errors import Unreachable, UsageError
from builder.core.inputs import has_control, one_line
from builder.image.engine import Container, Engine, Gone

from ..report import Node
from .base import DEFAULT_PYTHON, DEFAULT_TIMEOUT_S, Running, Target, check_python, payload_archive, probe_nodes

_CONTAINER_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,254}")
_LABEL_KEY_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._/-]{0,255}")


def check_container(text: str) -> str:
    """``text`` if it is a container name or ID (Docker's ``[a-zA-Z0-9][a-zA-Z0-9_.-]+``); else exit 64."""
    if not isinstance(text, str) or _CONTAINER_RE.fullmatch(text) is None:
        raise UsageError("is not a container name or ID (letters, digits, _ . -)", field="--container", value=text)
    return text


def check_label(text: str) -> str:
    """``text`` if ``KEY[=VALUE]`` (key: letters, digits, ``. _ / -``; value: 4096 printable); else 64."""
    key, sep, value = text.partition("=") if isinstance(text, str) else ("", "", "")
    if _LABEL_KEY_RE.fullmatch(key) is None or len(value) > 4096 or has_control(value):
        raise UsageError("is not a label KEY[=VALUE] (key: letters, digits, . _ / -; no control characters)",
                         field="--label", value=text)
    return text


class ExecRunning(Running):
    """``docker exec`` with the payload archive written to its stdin."""

    def __init__(self, client: Engine, container_id: str, argv: Sequence[str],
                 env: Mapping[str, str] | None, stdin: bytes, where: str) -> None:
        super().__init__(where)
        try:
            self.exec = client.exec(container_id, argv, dict(env or {}))
        except Unreachable as e:
            raise Unreachable(f"docker exec failed: {one_line(e.message, 200)}", field=where) from None
        threading.Thread(target=self.exec.send, args=(stdin,), daemon=True).start()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        rc = None
        try:
            for is_err, data in self.exec.frames():
                if is_err:
                    self._err_bytes(data)
                elif not self._out_bytes(data):
                    break
            if not self._over:
                rc = self.exec.inspect().get("ExitCode")
        except Exception as e:  # the engine went away: the node could not be checked
            self._err_bytes(f"docker exec stream: {one_line(e, 300)}".encode())
        finally:
            self.exec.close()
        self._finish(rc)

    def kill(self) -> None:
        """SIGKILL the exec'd process by its host PID (works with a local engine, as root)."""
        try:
            pid = self.exec.inspect().get("Pid")
            if pid:
                os.kill(int(pid), signal.SIGKILL)
        except Exception:
            pass


class ContainerTarget(Target):
    """A running container on this engine; modules run with ``docker exec``."""

    def __init__(self, client: Engine, container_id: str, name: str, env: Mapping[str, str],
                 python: str = DEFAULT_PYTHON) -> None:
        self.client, self.container_id, self.name, self.env = client, container_id, name, dict(env)
        self.python = check_python(python)
        self.where = f"container {name}"
        self.machine = f"docker engine {client.host}"

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


def _shared_network(containers: Sequence[Container]) -> str | None:
    """The network every container is on (user networks before ``bridge``), or None."""
    sets = [set((c.doc.get("NetworkSettings") or {}).get("Networks") or {}) for c in containers]
    if not sets:
        return None
    common = set.intersection(*sets)
    for name in sorted(common, key=lambda n: (n == "bridge", n)):
        return name
    return None


def find_containers(client: Engine, images: Sequence[str] = (), names: Sequence[str] = (),
                    labels: Sequence[str] = ()) -> list[Container]:
    """Running containers by image, name or label, sorted, once each; Unreachable (3): no image, not running."""
    chosen: dict[str, Container] = {}
    for ref in images:
        image_id = client.image(ref).id
        for c in client.containers(labels, running=True):
            if c.doc.get("Image") == image_id:
                chosen[c.id] = c
    for name in names:
        try:
            c = client.container(name)
        except Gone:
            raise Unreachable("no such container", field="container", value=name) from None
        if c.status != "running":
            raise Unreachable(f"is {c.status}, not running", field="container", value=name)
        chosen[c.id] = c
    if labels and not images and not names:
        for c in client.containers(labels, running=True):
            chosen[c.id] = c
    return sorted(chosen.values(), key=lambda c: c.name)


def _probe_env(client: Engine, container: Container, engine_version: str | None) -> dict[str, str]:
    """The ``ENVBUILD_*`` variables that tell the probe its image and engine."""
    image_id = str(container.doc.get("Image") or "")
    ref = str((container.doc.get("Config") or {}).get("Image") or image_id)
    img = client.inspect_image(image_id) if image_id else None
    digest = img.digests[0] if img and img.digests else None
    env = {"ENVBUILD_IMAGE": ref, "ENVBUILD_IMAGE_ID": image_id}
    if digest:
        env["ENVBUILD_IMAGE_DIGEST"] = digest
    if engine_version:
        env["ENVBUILD_RUNTIME_VERSION"] = engine_version
    return env


def container_nodes(client: Engine, containers: Sequence[Container], python: str = DEFAULT_PYTHON) -> list[Node]:
    """Nodes (no reports yet) for running containers: name, address on their network, a :class:`ContainerTarget`."""
    try:
        engine_version = client.version().get("Version")
    except Exception:
        engine_version = None
    network = _shared_network(containers)
    return [Node(name=c.name, source=f"container {c.name}", address=_container_address(c.doc, network),
                 target=ContainerTarget(client, c.id, c.name, _probe_env(client, c, engine_version), python))
            for c in containers]


def from_containers(client: Engine, images: Sequence[str] = (), names: Sequence[str] = (),
                    labels: Sequence[str] = (), expect: int | None = None,
                    timeout_s: float = DEFAULT_TIMEOUT_S, python: str = DEFAULT_PYTHON) -> list[Node]:
    """Probe running containers, a node each; Unreachable (3): none match, or not ``expect`` (those listed)."""
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
