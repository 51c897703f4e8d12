"""Run the probe inside an image and compare what it found with what the lock promised.

:func:`run_probe` runs :mod:`builder.agent.probe` in a throwaway container of the image,
the agent folder (:data:`builder.agent.payload.AGENT_DIR`) bind-mounted read-only at
:data:`builder.agent.payload.MOUNT_POINT`; the image itself is never changed.
:func:`compare_probe_to_lock` compares the probe's document (schema ``envbuild.probe/1``,
see :mod:`builder.agent.probe`) with the lock (``images/<recipe>/envbuild.lock.json``,
written by the renderer). The comparison reads the environment as the probe saw it, never
the image's labels: an image whose labels say one torch while another is installed fails
here.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import docker
import docker.errors
import requests

from builder.agent import payload
from builder.core.errors import EnvbuildError, ExitCode, Unreachable
from builder.core.inputs import load_json, one_line, show

from .engine import LABEL, read_bounded

PROBE_SCHEMA = "envbuild.probe/1"
#: The payload module that prints the probe document.
PROBE_MODULE = "probe"
#: Most bytes of a container's output read by :func:`run_probe` (a probe document is a
#: few KiB; node reports are bounded to 16 MiB, :data:`builder.core.inputs.MAX_REPORT_BYTES`).
MAX_PROBE_OUTPUT = 16 << 20


# --------------------------------------------------------------------------- running the probe


def _probe_result(container: Any, image: str, code: int) -> dict:
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


def _probe_json(out: str) -> Any:
    """The probe's JSON object: the whole output, else its last line; bounded
    (:func:`builder.core.inputs.load_json`); None when neither is one."""
    lines = out.strip().splitlines()
    for text in (out, lines[-1] if lines else ""):
        try:
            return load_json(text, "probe output", exit_code=ExitCode.UNREACHABLE)
        except EnvbuildError:
            continue
    return None


def _has_module(agent_dir: Path, module: str) -> bool:
    return (agent_dir / f"{module}.py").is_file() or (agent_dir / module / "__main__.py").is_file()


def run_probe(
    client: docker.DockerClient,
    image: str,
    agent_dir: str | os.PathLike = payload.AGENT_DIR,
    *,
    module: str = PROBE_MODULE,
    labels: Mapping[str, str] | None = None,
    timeout_s: float = 300,
    gpus: bool = False,
) -> dict:
    """Run the probe in a throwaway container of ``image`` and return its JSON.

    Runs ``python3 -c MOUNTED probe`` (:func:`builder.agent.payload.mounted_command`: the
    module as ``python3 -m probe`` would) with ``agent_dir`` bind-mounted read-only at
    ``/opt/envbuild`` (the image is not changed), no network, and the container labelled
    ``envbuild=1`` plus ``labels``. The container is removed afterwards, also on failure.

    Args:
        image: image name, tag or ID.
        agent_dir: the agent folder on the engine's host (default ``builder/agent``).
        module: the module of ``agent_dir`` to run (``probe.py`` or ``probe/__main__.py``).
        labels: extra labels for the container.
        timeout_s: seconds the probe may run.
        gpus: request all GPUs (``--gpus all``).

    Returns:
        The JSON document the probe printed on stdout (a dict, e.g. schema
        ``envbuild.probe/1``).

    Raises:
        EnvbuildError: (exit 2) no such image, or no such module in ``agent_dir``.
        EnvbuildError: (exit 3) the probe exited non-zero (message ends with its last
            stderr line) or printed something other than a JSON object.
        Unreachable: (exit 3) the probe ran past ``timeout_s``.
    """
    folder = Path(agent_dir).resolve()
    if not _has_module(folder, module):
        raise EnvbuildError(f"no module {module} there", field="probe", value=str(agent_dir))
    kwargs: dict = {}
    if gpus:
        kwargs["device_requests"] = [docker.types.DeviceRequest(count=-1, capabilities=[["gpu"]])]
    try:
        container = client.containers.create(
            image,
            payload.mounted_command("python3", module),
            volumes={str(folder): {"bind": payload.MOUNT_POINT, "mode": "ro"}},
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
        return _probe_result(container, image, status.get("StatusCode", -1))
    finally:
        try:
            container.remove(force=True)
        except docker.errors.NotFound:
            pass


# --------------------------------------------------------------------------- probe vs lock


def _major_minor(version: Any) -> str | None:
    """``"3.11.2"`` -> ``"3.11"``; ``"12.8"`` -> ``"12.8"``; None -> None."""
    if version is None:
        return None
    parts = str(version).split(".")
    return ".".join(parts[:2])


def _get(doc: Any, *path: str) -> Any:
    for key in path:
        if not isinstance(doc, dict):
            return None
        doc = doc.get(key)
    return doc


def compare_probe_to_lock(probe: dict, lock: dict) -> list[str]:
    """Every difference between a probe document and a lock, as messages.

    Compared (lock field -> probe field):

    * ``torch.local`` (e.g. ``"2.13.0+cpu"``) == ``torch.version``
    * ``python`` (``"3.11"``) == major.minor of ``python.version``
    * ``cuda`` (null or ``"12.8"``) == major.minor of ``torch.cuda``
    * ``os.id`` / ``os.version_id`` == ``os.id`` / ``os.version_id``
    * where the lock has CUDA and an ``nccl`` version: ``nccl`` == ``nccl.loaded.version``
      (the libnccl mapped after importing torch)

    Args:
        probe: the probe's JSON document (``envbuild.probe/1``).
        lock: the lock's JSON document.

    Returns:
        One string per difference naming the field, the lock's value and the probe's
        value, e.g. ``"torch.version: lock '2.13.0+cpu', image '2.99.0+cpu'"``;
        ``[]`` when everything matches.
    """
    out: list[str] = []

    def differs(name: str, want: Any, got: Any) -> None:
        out.append(f"{name}: lock {want!r}, image {got!r}")

    want = _get(lock, "torch", "local")
    got = _get(probe, "torch", "version")
    if want != got:
        differs("torch.version", want, got)

    want = lock.get("python")
    got = _get(probe, "python", "version")
    if _major_minor(want) != _major_minor(got):
        differs("python.version", want, got)

    want = lock.get("cuda")
    got = _get(probe, "torch", "cuda")
    if _major_minor(want) != _major_minor(got):
        differs("torch.cuda", want, got)

    for key in ("id", "version_id"):
        want = _get(lock, "os", key)
        got = _get(probe, "os", key)
        if (None if want is None else str(want)) != (None if got is None else str(got)):
            differs(f"os.{key}", want, got)

    if lock.get("cuda") is not None and lock.get("nccl") is not None:
        loaded = _get(probe, "nccl", "loaded")
        got = loaded.get("version") if isinstance(loaded, dict) else loaded
        if str(lock["nccl"]) != (None if got is None else str(got)):
            differs("nccl.loaded.version", lock["nccl"], got)
    return out
