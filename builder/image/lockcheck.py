"""Compare what the probe found inside an image with what the lock promised.

The lock is ``images/<recipe>/envbuild.lock.json`` (written by the renderer); the probe
document has schema ``envbuild.probe/1`` (see ``builder/agent/probe.py``). The comparison reads
the environment as the probe saw it, never the image's labels: an image whose labels say
one torch while another is installed fails here.
"""

from __future__ import annotations

from typing import Any

PROBE_SCHEMA = "envbuild.probe/1"


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
