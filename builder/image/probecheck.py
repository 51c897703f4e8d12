"""Run the probe in an image (the agent folder mounted read-only, the image never changed) and
compare what it found with the lock. The comparison reads the environment the probe saw, never
the image's labels: labels that name one torch while another is installed fail here."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from builder.agent import payload
from builder.core.documents import NodeReport
from builder.core.errors import EnvbuildError, ExitCode, Unreachable
from builder.core.inputs import load_json, one_line, show
from builder.recipe.model import Lock

from . import probecache
from .engine import LABEL, Engine, Ran

PROBE_SCHEMA = "envbuild.probe/1"
#: The payload module that prints the probe document.
PROBE_MODULE = "probe"
#: Most bytes of a probe's output (as node reports, :data:`builder.core.inputs.MAX_REPORT_BYTES`).
MAX_PROBE_OUTPUT = 16 << 20


# --------------------------------------------------------------------------- running the probe


def _probe_result(ran: Ran, image: str) -> dict:
    out = ran.stdout.decode("utf-8", "replace")
    if ran.code != 0:
        err = ran.stderr.decode("utf-8", "replace")
        last = (err.strip().splitlines() or out.strip().splitlines() or ["no output"])[-1]
        raise Unreachable(f"probe exited with code {ran.code}: {one_line(last, 300)}", field="image", value=image)
    if ran.cut:
        raise Unreachable(f"probe printed more than {MAX_PROBE_OUTPUT} bytes", field="image", value=image)
    doc = _probe_json(out)
    if not isinstance(doc, dict):
        raise Unreachable(f"probe printed no JSON object: {show(out.strip())}", field="image", value=image)
    return doc


def _probe_json(out: str) -> Any:
    """The whole output as JSON, else its last line; None when neither is one."""
    lines = out.strip().splitlines()
    for text in (out, lines[-1] if lines else ""):
        try:
            return load_json(text, "probe output", exit_code=ExitCode.UNREACHABLE)
        except EnvbuildError:
            continue
    return None


def run_probe(client: Engine, image: str, agent_dir: str | os.PathLike = payload.AGENT_DIR, *,
              module: str = PROBE_MODULE, labels: Mapping[str, str] | None = None, timeout_s: float = 300,
              gpus: bool = False) -> dict:
    """The JSON object the probe printed in a throwaway container of ``image`` without network. EnvbuildError (exit 2):
    no such module; Unreachable (exit 3): no image, the probe failed, no JSON object, past ``timeout_s``."""
    folder = Path(agent_dir).resolve()
    if not ((folder / f"{module}.py").is_file() or (folder / module / "__main__.py").is_file()):
        raise EnvbuildError(f"no module {module} there", field="probe", value=str(agent_dir))
    ran = client.run_once(image, payload.mounted_command("python3", module), timeout_s=timeout_s, what="probe",
                          limit=MAX_PROBE_OUTPUT, volumes={str(folder): {"bind": payload.MOUNT_POINT, "mode": "ro"}},
                          labels={LABEL: "1", **(labels or {})}, network_mode="none", gpus=gpus)
    return _probe_result(ran, image)


def probe_cached(client: Engine, image: str, agent_dir: str | os.PathLike = payload.AGENT_DIR, *,
                 gpus: bool = False, cache_dir: Path | None = None, labels: Mapping[str, str] | None = None,
                 timeout_s: float = 300) -> tuple[dict, bool]:
    """``(probe document, whether cached)``: GPU-less probes run once per image ID; raises as run_probe."""
    image_id = None if gpus else client.image_id(image)
    cache = cache_dir or probecache.default_dir()
    if image_id:
        doc = probecache.load(cache, image_id, agent_dir)
        if doc is not None:
            return doc, True
    doc = run_probe(client, image, agent_dir, labels=labels, timeout_s=timeout_s, gpus=gpus)
    if image_id and doc.get("schema") == PROBE_SCHEMA:
        probecache.store(cache, image_id, agent_dir, doc)
    return doc, False


# --------------------------------------------------------------------------- probe vs lock


def _major_minor(version: Any) -> str | None:
    """``"3.11.2"`` -> ``"3.11"``; ``"12.8"`` -> ``"12.8"``; None -> None."""
    return None if version is None else ".".join(str(version).split(".")[:2])


def _text(value: Any) -> str | None:
    return None if value is None else str(value)


def compare_probe_to_lock(probe: NodeReport, lock: Lock) -> list[str]:
    """Every difference of a probe and a lock, a line each (``"torch.version: lock '2.13.0+cpu', image '2.99.0+cpu'"``);
    Python and CUDA as major.minor; NCCL (mapped after torch) only where the lock has CUDA and NCCL."""
    torch, loaded = probe.torch, probe.nccl.loaded
    pairs = [("torch.version", lock.torch.local, torch.version if torch else None, _text),
             ("python.version", lock.python, probe.python.version, _major_minor),
             ("torch.cuda", lock.cuda, torch.cuda if torch else None, _major_minor),
             ("os.id", lock.os.id, probe.os.id, _text),
             ("os.version_id", lock.os.version_id, probe.os.version_id, _text)]
    if lock.cuda is not None and lock.nccl is not None:
        pairs.append(("nccl.loaded.version", lock.nccl, loaded.version if loaded else None, _text))
    return [f"{name}: lock {want!r}, image {got!r}" for name, want, got, norm in pairs if norm(want) != norm(got)]
