"""Where certification learns about the image: its labels, lock and environment."""

from __future__ import annotations

import json
import re
import shutil
import socket
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Protocol

from builder.core.errors import EnvbuildError, ExitCode, NoSuchImage, Unreachable
from builder.core.inputs import escape, has_control, one_line, read_text, show
from builder.image import engine
from builder.launchers.base import Launcher, extra_labels_from_env
from builder.recipe.lock import MAX_LOCK_BYTES, lock_hash, read_lock_text, validate_lock
from builder.recipe.model import Lock

#: What the ranks' stack is compared with: the image's own lock (``envbuild.lock`` label),
#: a recipe's lock (``--recipe``), or, for an image envbuild did not build, the stack the
#: probe discovers on the reference rank (every rank must match it).
Reference = Literal["lock", "recipe", "probe"]

#: Labels copied into the certificate (``envbuild.lock`` is stored parsed, as ``lock``).
LABEL_PREFIXES = ("envbuild.", "org.opencontainers.image.")
#: Such a label's key (Docker's recommended ``[a-z0-9.-]``, plus ``_`` and ``/``) and the
#: longest value (characters): one printable line.
_LABEL_KEY = re.compile(r"[A-Za-z0-9][A-Za-z0-9._/-]{0,254}")
MAX_LABEL_CHARS = 4096


@dataclass(frozen=True)
class ImageFacts:
    """What certification needs to know about an image."""

    ref: str
    labels: Mapping[str, str]
    lock: Lock | None  # None: a foreign image, compared with its own probe
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
    """An image on a Docker engine, read once (:meth:`read`); the default launcher runs the nodes on the same engine."""

    def __init__(self, client: engine.Engine, ref: str, *, recipe: tuple[str, Lock] | None = None) -> None:
        self.client = client
        self.ref = ref
        self.recipe = recipe
        self._facts: ImageFacts | None = None

    def read(self) -> ImageFacts:
        """The image's facts; a foreign image's lock is the recipe's, or none (reference ``"probe"``).
        Raises EnvbuildError: (exit 3) no such image; (exit 2) a foreign image without python3 or
        torch, a lock label that is not a valid lock or was changed after the build."""
        if self._facts is None:
            img = self.client.image(self.ref)
            labels = img.labels
            reference: Reference = "lock"
            if not labels.get("envbuild.lock") and not labels.get("envbuild.lock-hash"):
                check_labels(labels, None, self.ref)
                check_foreign(self.client, self.ref)
                lock: Lock | None = None
                reference = "probe"
            else:
                labels, lock = read_image(self.client, self.ref)
            if self.recipe is not None:
                lock, reference = self.recipe[1], "recipe"
            self._facts = ImageFacts(self.ref, labels, lock, img.env(), img.id, img.repo_digests, reference=reference,
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


def gpu_runtime_visible(client: engine.Engine) -> bool:
    """Whether the engine can hand GPUs to containers: an ``nvidia`` runtime in
    ``docker info``, or the NVIDIA container hook on this machine's PATH."""
    try:
        info = client.info()
    except Exception:  # noqa: BLE001 - treated as no GPU
        return False
    if "nvidia" in (info.get("Runtimes") or {}) or info.get("DefaultRuntime") == "nvidia":
        return True
    return bool(shutil.which("nvidia-container-runtime-hook") or shutil.which("nvidia-container-cli"))


def read_image(client: engine.Engine, image: str) -> tuple[dict[str, str], Lock]:
    """``(labels, lock)`` of ``image`` on the engine.
    Raises EnvbuildError: (exit 3) no such image; (exit 2) a lock label over 1 MiB or not a valid lock."""
    labels = client.image(image).labels
    if labels.get("envbuild.lock"):
        read_lock_text(labels["envbuild.lock"], f"{image}: label envbuild.lock")
    lock = lock_from_labels(labels, image)
    check_labels(labels, lock, image)
    return labels, lock


def check_labels(labels: Mapping[str, str], lock: Lock | None, image: str) -> None:
    """The recorded labels are shown and name the certificate's folder: each must be one short
    printable line, and ``envbuild.recipe`` the lock's recipe.
    Raises EnvbuildError: (exit 2) naming the label and its value, escaped."""
    for key, value in label_subset(labels).items():
        if not _LABEL_KEY.fullmatch(key) or has_control(value) or len(value) > MAX_LABEL_CHARS:
            raise EnvbuildError(f"label {escape(key, 100)}={show(value, 100)} is not one line of at most "
                                f"{MAX_LABEL_CHARS} printable characters", field="image", value=image)
    # an empty value is how a derived image drops a label (Docker cannot remove one)
    said, recipe = labels.get("envbuild.recipe") or None, lock.recipe if lock else None
    if said is not None and said != recipe:
        why = f"is not its lock's recipe {show(recipe, 100)}" if recipe else "names a recipe without a lock label"
        raise EnvbuildError(f"label envbuild.recipe={show(said, 100)} {why}; rebuild the image with "
                            "`envbuild build RECIPE`", field="image", value=image)


def lock_from_labels(labels: Mapping[str, str], image: str) -> Lock:
    """The lock label, checked against ``envbuild.lock-hash`` so that an edited lock label is refused.
    Raises EnvbuildError (exit 2): no such labels, not a JSON object, or the hash differs."""
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
    return validate_lock(lock, f"{image}: label envbuild.lock")


def label_subset(labels: Mapping[str, str]) -> dict[str, str]:
    """The labels a certificate records (:data:`LABEL_PREFIXES`, without the lock itself)."""
    return {k: v for k, v in sorted(labels.items()) if k.startswith(LABEL_PREFIXES) and k != "envbuild.lock"}


#: What :func:`check_foreign` runs in the image: prints one JSON line, exits 0. It finds torch without importing it
#: (seconds on a loaded machine): the module's spec, and its version from the installed distribution's metadata
#: (``torch.version`` read as a file when there is none); the ranks import it for real.
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


def check_foreign(client: engine.Engine, ref: str, timeout_s: float = 120) -> dict[str, Any]:
    """Check that a foreign image can be certified, in a throwaway container without network.
    Raises EnvbuildError: (exit 3) no such image; (exit 2) no python3, or one older than 3.8."""
    try:
        ran = client.run_once(ref, [], entrypoint=["python3", "-c", _FOREIGN_CHECK], timeout_s=timeout_s,
                              what="the python3 check", network_mode="none",
                              labels={engine.LABEL: "1", **extra_labels_from_env()})
    except NoSuchImage:
        raise
    except Unreachable as e:
        raise Unreachable(f"could not check the image: {one_line(e.message, 300)}", field="image",
                          value=ref) from None
    if ran.code == engine.NOT_STARTED:
        raise EnvbuildError("cannot be certified: it has no python3 (envbuild runs python3 >= 3.8 with torch "
                            "in it)", field="image", value=ref)
    code, text = ran.code, ran.stdout[-4096:].decode("utf-8", "replace").strip()
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


def recipe_lock(images_dir: str | Path, recipe: str) -> tuple[str, Lock]:
    """``(recipe, lock)``: the rendered lock of ``--recipe``.
    Raises EnvbuildError: (exit 64) not a recipe name; (exit 2) no such file or not a valid lock;
    Unreachable (exit 3) unreadable."""
    import re

    from builder.core.paths import image_dir

    if not re.fullmatch(r"[a-z0-9][a-z0-9._-]{0,63}", recipe):
        raise EnvbuildError("is not a recipe name ([a-z0-9][a-z0-9._-]*)", field="recipe", value=recipe,
                            exit_code=ExitCode.USAGE)
    path = image_dir(images_dir, recipe).lock
    if not path.is_file():
        raise EnvbuildError(f"recipe {recipe} has no lock there; write it with `envbuild render {recipe}`",
                            file=str(path))
    return recipe, read_lock_text(read_text(path, MAX_LOCK_BYTES, "lock"), str(path))
