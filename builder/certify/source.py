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
from pathlib import Path
from typing import Any, Literal, Protocol

from builder.core.errors import EnvbuildError, ExitCode
from builder.core.inputs import one_line, read_text
from builder.image import engine
from builder.launchers.base import Launcher, extra_labels_from_env
from builder.recipe.lock import MAX_LOCK_BYTES, lock_hash, read_lock_text

#: What the ranks' stack is compared with: the image's own lock (``envbuild.lock`` label),
#: a recipe's lock (``--recipe``), or, for an image envbuild did not build, the stack the
#: probe discovers on the reference rank (every rank must match it).
Reference = Literal["lock", "recipe", "probe"]

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
        reference: what the ranks' stack is compared with (:data:`Reference`); ``"probe"``
            for a foreign image (``lock`` is then empty: no recipe lock exists).
        recipe: the recipe whose lock ``--recipe`` compares with, else None.
    """

    ref: str
    labels: Mapping[str, str]
    lock: Mapping[str, Any]
    env: Mapping[str, str] = field(default_factory=dict)
    image_id: str | None = None
    repo_digests: tuple[str, ...] = ()
    reference: Reference = "lock"
    recipe: str | None = None

    @property
    def foreign(self) -> bool:
        """True for an image without envbuild's lock labels."""
        return not self.labels.get("envbuild.lock")

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

    def __init__(self, client: Any, ref: str, *, recipe: tuple[str, dict[str, Any]] | None = None) -> None:
        self.client = client
        self.ref = ref
        self.recipe = recipe
        self._facts: ImageFacts | None = None

    def read(self) -> ImageFacts:
        """The image's facts (:func:`read_image`, :func:`builder.image.engine.image_env`).
        An image without envbuild's labels (a foreign image) is first checked to run
        python3 >= 3.8 with torch (:func:`check_foreign`); its lock is the recipe's
        (``recipe``) or none (reference ``"probe"``).

        Raises:
            EnvbuildError: (exit 2) no such image, a foreign image without python3 or
                torch, a lock label that is not a valid lock or was changed after the build.
        """
        if self._facts is None:
            labels = engine.image_labels(self.client, self.ref)
            reference: Reference = "lock"
            if not labels.get("envbuild.lock") and not labels.get("envbuild.lock-hash"):
                check_foreign(self.client, self.ref)
                lock: dict[str, Any] = {}
                reference = "probe"
            else:
                labels, lock = read_image(self.client, self.ref)
            if self.recipe is not None:
                lock, reference = dict(self.recipe[1]), "recipe"
            env = engine.image_env(self.client, self.ref)
            try:
                img = self.client.images.get(self.ref)
                image_id, digests = img.id, tuple(img.attrs.get("RepoDigests") or [])
            except Exception:  # noqa: BLE001 - read_image just found it; informational
                image_id, digests = None, ()
            self._facts = ImageFacts(self.ref, labels, lock, env, image_id, digests, reference=reference,
                                     recipe=self.recipe[0] if self.recipe else None)
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


#: What :func:`check_foreign` runs in the image: prints one JSON line, exits 0. It finds
#: torch without importing it (seconds on a loaded machine): the module's spec, and its
#: version from the installed distribution's metadata (``torch.version`` read as a file
#: when there is none); the ranks import it for real.
_FOREIGN_CHECK = (
    "import json, sys\n"
    "out = {'python': list(sys.version_info[:3]), 'torch': None, 'error': None}\n"
    "try:\n"
    "    import importlib.util\n"
    "    spec = importlib.util.find_spec('torch')\n"
    "    if spec is None:\n"
    "        out['error'] = \"ModuleNotFoundError: No module named 'torch'\"\n"
    "    else:\n"
    "        try:\n"
    "            from importlib.metadata import version\n"
    "            out['torch'] = version('torch')\n"
    "        except Exception:\n"
    "            out['torch'] = 'unknown version'\n"
    "except Exception as e:\n"
    "    out['error'] = '%s: %s' % (type(e).__name__, e)\n"
    "print(json.dumps(out))\n"
)


def check_foreign(client: Any, ref: str, timeout_s: float = 120) -> dict[str, Any]:
    """Check that a foreign image can be certified: run ``python3 -c CHECK`` as its
    entrypoint in a throwaway container (no network, labelled ``envbuild=1`` plus
    ``$ENVBUILD_EXTRA_LABELS``, removed afterwards) and read ``{"python": [3, 11, 2],
    "torch": "2.13.0" | None, "error": str | None}``.

    Raises:
        EnvbuildError: (exit 2) no such image; ``has no python3`` (the entrypoint cannot
            start); ``python3 3.6 is older than 3.8``; ``has no torch (ModuleNotFoundError:
            No module named 'torch')``. (exit 3) the engine failed or the check ran past
            ``timeout_s``.
    """
    import docker.errors

    try:
        c = client.containers.create(ref, entrypoint=["python3", "-c", _FOREIGN_CHECK], command=[],
                                     network_mode="none", labels={engine.LABEL: "1", **extra_labels_from_env()})
    except docker.errors.ImageNotFound:
        raise EnvbuildError("no such image", field="image", value=ref) from None
    no_python = False
    try:
        try:
            c.start()
        except docker.errors.APIError as e:
            if "executable file not found" not in str(e) and "no such file" not in str(e).lower():
                raise
            no_python = True
        if not no_python:
            code = c.wait(timeout=timeout_s).get("StatusCode")
            text = c.logs(stdout=True, stderr=False)[-4096:].decode("utf-8", "replace").strip()
    except docker.errors.APIError as e:
        raise EnvbuildError(f"could not check the image: {one_line(str(e), 300)}", field="image", value=ref,
                            exit_code=ExitCode.UNREACHABLE) from None
    except Exception as e:  # noqa: BLE001 - the wait timed out or the engine went away
        raise EnvbuildError(f"could not check the image: {type(e).__name__}: {one_line(str(e), 200)}",
                            field="image", value=ref, exit_code=ExitCode.UNREACHABLE) from None
    finally:
        try:
            c.remove(force=True)
        except Exception:  # noqa: BLE001, S110 - already gone
            pass
    if no_python:
        raise EnvbuildError("cannot be certified: it has no python3 (envbuild runs python3 >= 3.8 with torch "
                            "in it)", field="image", value=ref)
    try:
        found = json.loads(text.splitlines()[-1]) if text else None
    except ValueError:
        found = None
    if code != 0 or not isinstance(found, dict):
        raise EnvbuildError(f"cannot be certified: python3 failed to run (exit {code}): {one_line(text, 200)}",
                            field="image", value=ref)
    py = found.get("python") or [0, 0]
    if tuple(py[:2]) < (3, 8):
        raise EnvbuildError(f"cannot be certified: python3 {'.'.join(map(str, py))} is older than 3.8",
                            field="image", value=ref)
    if not found.get("torch"):
        raise EnvbuildError(f"cannot be certified: it has no torch ({one_line(found.get('error') or '', 200)})",
                            field="image", value=ref)
    return found


def recipe_lock(images_dir: str | Path, recipe: str) -> tuple[str, dict[str, Any]]:
    """``(recipe, lock)``: the rendered lock ``<images_dir>/<recipe>/envbuild.lock.json``
    of ``--recipe``, read with bounds and checked with the lock schema.

    Raises:
        EnvbuildError: (exit 64) not a recipe name; (exit 2) no such file (``envbuild
            render RECIPE`` writes it), not a valid lock; Unreachable (exit 3) unreadable.
    """
    import re

    from builder.core.paths import image_dir

    if not re.fullmatch(r"[a-z0-9][a-z0-9._-]{0,63}", recipe):
        raise EnvbuildError("is not a recipe name ([a-z0-9][a-z0-9._-]*)", field="recipe", value=recipe,
                            exit_code=ExitCode.USAGE)
    path = image_dir(images_dir, recipe).lock
    if not path.is_file():
        raise EnvbuildError(f"recipe {recipe} has no lock there; write it with `envbuild render {recipe}`",
                            file=str(path))
    text = read_text(path, MAX_LOCK_BYTES, "lock")
    read_lock_text(text, str(path))
    return recipe, json.loads(text)
