"""Where certification learns about the image: its labels, lock and environment.

An image source is an input of the run (:func:`builder.certify.run.plan`): an image on a
Docker engine (:class:`EngineImage`: the labels, config and GPU runtime are read through
the engine, and its local launcher is the default), or the facts already known
(:class:`ImageFacts`: a lock file and the labels it implies, e.g. ``envbuild k8s render
RECIPE --image REF``), where no engine is asked anything. Both give an :class:`ImageFacts`.
"""

from __future__ import annotations

import json
import shutil
import socket
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from builder.core.errors import EnvbuildError
from builder.image import engine
from builder.launchers.base import Launcher
from builder.recipe.lock import lock_hash, read_lock_text

#: Labels copied into the certificate (``envbuild.lock`` is stored parsed, as ``lock``).
LABEL_PREFIXES = ("envbuild.", "org.opencontainers.image.")


@dataclass(frozen=True)
class ImageFacts:
    """What certification needs to know about an image.

    Attributes:
        ref: the reference the nodes run (name:tag, ID, or ``REPO@sha256:...``).
        labels: its labels (``envbuild.recipe``, ``envbuild.lock-hash``, ...).
        lock: its recipe lock (``envbuild.lock``, parsed and checked).
        env: the environment the image sets (its config's ``Env``).
        image_id: its ID, if known.
        repo_digests: its repository digests, if known.
    """

    ref: str
    labels: Mapping[str, str]
    lock: Mapping[str, Any]
    env: Mapping[str, str] = field(default_factory=dict)
    image_id: str | None = None
    repo_digests: tuple[str, ...] = ()

    def read(self) -> ImageFacts:
        """The facts themselves (an :class:`ImageSource` that asks no engine)."""
        return self

    def gpu_visible(self) -> bool:
        """True: where the facts come from a file, the nodes' scheduler decides."""
        return True

    def default_launcher(self) -> Launcher | None:
        """None: a launcher must be given."""
        return None

    def host(self) -> dict[str, Any]:
        """``{"hostname"}`` of this machine."""
        return {"hostname": socket.gethostname()}


class ImageSource(Protocol):
    """Where the facts about an image come from (:class:`EngineImage`, :class:`ImageFacts`)."""

    def read(self) -> ImageFacts: ...

    def gpu_visible(self) -> bool: ...

    def default_launcher(self) -> Launcher | None: ...

    def host(self) -> dict[str, Any]: ...


class EngineImage:
    """An image on a Docker engine: ``client`` (:func:`builder.image.engine.connect`) and
    ``ref`` (name:tag or ID). Labels, environment, ID and digests are read through the
    engine (:meth:`read`, once); the default launcher runs the nodes on the same engine."""

    def __init__(self, client: Any, ref: str) -> None:
        self.client = client
        self.ref = ref
        self._facts: ImageFacts | None = None

    def read(self) -> ImageFacts:
        """The image's facts (:func:`read_image`, :func:`builder.image.engine.image_env`).

        Raises:
            EnvbuildError: (exit 2) no such image, not built by envbuild, a lock label that
                is not a valid lock or was changed after the build.
        """
        if self._facts is None:
            labels, lock = read_image(self.client, self.ref)
            env = engine.image_env(self.client, self.ref)
            try:
                img = self.client.images.get(self.ref)
                image_id, digests = img.id, tuple(img.attrs.get("RepoDigests") or [])
            except Exception:  # noqa: BLE001 - read_image just found it; informational
                image_id, digests = None, ()
            self._facts = ImageFacts(self.ref, labels, lock, env, image_id, digests)
        return self._facts

    def gpu_visible(self) -> bool:
        """:func:`gpu_runtime_visible` of the engine."""
        return gpu_runtime_visible(self.client)

    def default_launcher(self) -> Launcher:
        """The local Docker launcher on this engine."""
        from builder.launchers.local import LocalDockerLauncher

        return LocalDockerLauncher(self.client)

    def host(self) -> dict[str, Any]:
        """``{"hostname", "docker_server_version"}``."""
        try:
            version = self.client.version().get("Version")
        except Exception:  # noqa: BLE001 - informational only
            version = None
        return {"hostname": socket.gethostname(), "docker_server_version": version}


def gpu_runtime_visible(client: Any) -> bool:
    """Whether the engine can hand GPUs to containers: an ``nvidia`` runtime in
    ``docker info``, or the NVIDIA container hook on this machine's PATH."""
    try:
        info = client.info()
    except Exception:  # noqa: BLE001 - treated as no GPU
        return False
    if "nvidia" in (info.get("Runtimes") or {}) or info.get("DefaultRuntime") == "nvidia":
        return True
    return bool(shutil.which("nvidia-container-runtime-hook") or shutil.which("nvidia-container-cli"))


def read_image(client: Any, image: str) -> tuple[dict[str, str], dict[str, Any]]:
    """``(labels, lock)`` of ``image`` on the engine: the label ``envbuild.lock`` read with
    bounds and checked with the recipe's schema (:func:`builder.recipe.lock.read_lock_text`),
    then against its hash label (:func:`lock_from_labels`).

    Raises:
        EnvbuildError: (exit 2) no such image; a lock label over 1 MiB, not bounded JSON or
            breaking the schema (``IMAGE: label envbuild.lock: certify.nodes: 'abc' must be
            an integer in 1..1024``); see :func:`lock_from_labels`.
    """
    labels = engine.image_labels(client, image)
    if labels.get("envbuild.lock"):
        read_lock_text(labels["envbuild.lock"], f"{image}: label envbuild.lock")
    return labels, lock_from_labels(labels, image)


def lock_from_labels(labels: Mapping[str, str], image: str) -> dict[str, Any]:
    """The lock in the labels of ``image``: ``envbuild.lock`` parsed, checked against
    ``envbuild.lock-hash`` (:func:`builder.recipe.lock.lock_hash` of the parsed lock, as the
    renderer wrote it), so that an image rebuilt with an edited lock label is refused.

    Raises:
        EnvbuildError: (exit 2) not built by envbuild (no ``envbuild.lock`` /
            ``envbuild.lock-hash`` label); the lock label is not a JSON object; its hash
            differs from ``envbuild.lock-hash``.
    """
    missing = [k for k in ("envbuild.lock", "envbuild.lock-hash") if not labels.get(k)]
    if missing:
        raise EnvbuildError(f"was not built by envbuild (no {' / '.join(missing)} label); build it with "
                            "`envbuild build RECIPE`", field="image", value=image)
    err: json.JSONDecodeError | None = None
    try:
        lock = json.loads(labels["envbuild.lock"])
    except json.JSONDecodeError as e:
        lock, err = None, e
    if not isinstance(lock, dict):
        raise EnvbuildError(f"label envbuild.lock is not a JSON object ({err or type(lock).__name__})",
                            field="image", value=image)
    actual, said = lock_hash(lock), labels["envbuild.lock-hash"]
    if actual != said:
        raise EnvbuildError(
            f"label envbuild.lock was changed after the build: it hashes to {actual}, label "
            f"envbuild.lock-hash says {said}; rebuild the image with `envbuild build RECIPE`",
            field="image", value=image)
    return lock


def label_subset(labels: Mapping[str, str]) -> dict[str, str]:
    """The labels a certificate records (:data:`LABEL_PREFIXES`, without the lock itself)."""
    return {k: v for k, v in sorted(labels.items()) if k.startswith(LABEL_PREFIXES) and k != "envbuild.lock"}
