"""The certificate of a run: built from the launch and the verdict, written exclusively."""

from __future__ import annotations

import contextlib
import json
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import msgspec

from builder import __version__
from builder.certify import nccl_log
from builder.core import inputs, retention
from builder.core.certificate import (
    CERT_SCHEMA,
    Backend,
    Certificate,
    CudaRequirement,
    Host,
    ImageInfo,
    NcclInfo,
    NodeStatus,
    PhaseTime,
    RankEntry,
    RunSettings,
    SocketSetting,
    Stack,
    Verdict,
)
from builder.core.clock import utc_stamp
from builder.core.documents import RankResult
from builder.core.errors import EnvbuildError, ExitCode, Unreachable
from builder.core.files import write_new
from builder.core.inputs import one_line
from builder.core.paths import image_dir
from builder.launchers.base import LaunchResult
from builder.launchers.output import plain_lines
from builder.recipe.lock import lock_hash
from builder.recipe.model import Lock

from .profiles import collectives_section, features_section, profile_wall_s, scaling_section, training_section
from .source import ImageFacts, label_subset
from .verdict import reference_rank

#: Lines of each node's log kept in the certificate when the verdict fails.
LOG_TAIL_LINES = 40


def log_tail(text: str) -> list[str]:
    """The last :data:`LOG_TAIL_LINES` of a node log's :func:`~builder.launchers.output.plain_lines`,
    each one escaped line."""
    return [one_line(line, 2000) for line in plain_lines(text)[-LOG_TAIL_LINES:]]


def _nccl_sections(s: RunSettings, launch: LaunchResult) -> tuple[dict[str, list[str] | None] | None, NcclInfo | None]:
    """``(transports, nccl)`` of the certificate from the NCCL INFO lines (None on gloo)."""
    if s.backend != "nccl":
        return None, None
    parsed = nccl_log.parse(launch.node_logs.values())
    transports = {str(r): parsed.transports.get(r) for r in range(s.world_size)}
    nccl = NcclInfo(networks={str(r): v for r, v in parsed.networks.items()},
                    ib_devices={str(r): v for r, v in parsed.ib_devices.items()},
                    versions={str(r): v for r, v in parsed.versions.items()})
    return transports, nccl


def _rank_entries(s: RunSettings, launch: LaunchResult, lock: Lock | None) -> dict[str, RankEntry]:
    """``ranks`` of the certificate: per rank, what it reported or why it did not."""
    ranks = {}
    for r in range(s.world_size):
        doc = launch.rank_results.get(r)
        kw: dict[str, Any] = {"node": s.node_of_rank(r), "reported": doc is not None}
        if doc is not None:
            kw.update(hostname=doc.hostname, device=doc.device, elapsed_s=doc.elapsed_s, errors=list(doc.errors),
                      fault=doc.fault, lock_mismatches=launch.lock_mismatches.get(r) if lock is not None else None)
        else:
            kw["exit_code"] = launch.rank_exit_codes.get(r)
            if r in launch.rank_problems:
                kw["problem"] = one_line(launch.rank_problems[r], 400)
        if r in launch.progress:
            kw["last_progress"] = dict(launch.progress[r])
        ranks[str(r)] = RankEntry(**kw)
    return ranks


def _node_status(s: RunSettings, launch: LaunchResult, passed: bool) -> dict[str, NodeStatus]:
    nodes = {}
    for n in range(s.nodes):
        kw: dict[str, Any] = {"name": f"node-{n}", "exit_code": launch.node_exit_codes.get(n)}
        if not passed:
            kw["log_tail"] = log_tail(launch.node_logs.get(n) or "")
        nodes[str(n)] = NodeStatus(**kw)
    return nodes


def _stack(image: ImageFacts, results: Mapping[int, RankResult]) -> Stack:
    """The reference stack: the reference rank's probe (for a foreign image the only
    reference; else what was compared with the lock)."""
    ref = reference_rank({r: d for r, d in results.items() if d.probe is not None})
    p = results[ref].probe if ref is not None else None

    def text(value: Any) -> str | None:
        return None if value is None else one_line(str(value), 200)

    torch = p.torch if p is not None else None
    loaded = p.nccl.loaded if p is not None else None
    os_text = (" ".join(str(x) for x in (p.os.id, p.os.version_id) if x) or None) if p is not None else None
    return Stack(source=image.reference, recipe=image.recipe or image.labels.get("envbuild.recipe"),
                 reference_rank=ref if image.reference == "probe" else None, python=text(p and p.python.version),
                 torch=text(torch and torch.version), cuda=text(torch and torch.cuda),
                 nccl=text(loaded and loaded.version), glibc=text(p and p.glibc), os=os_text)


def build_certificate(*, image: ImageFacts, settings: RunSettings, launch: LaunchResult, verdict: Verdict,
                      run_id: str, host: Mapping[str, Any], sock: SocketSetting | None = None) -> Certificate:
    """The certificate of a judged run."""
    s, results, labels, lock = settings, launch.rank_results, image.labels, image.lock
    compare_lock = None if image.reference == "probe" else lock
    transports, nccl = _nccl_sections(s, launch)
    socket_doc = None if sock is None else msgspec.structs.replace(
        sock, seen_by_ranks={str(r): dict(v) for r, v in sorted(launch.socket_seen.items())})
    return Certificate(
        schema=CERT_SCHEMA, envbuild_version=__version__, run_id=run_id,
        image=ImageInfo(ref=image.ref, id=image.image_id, repo_digests=list(image.repo_digests),
                        labels=label_subset(labels)),
        recipe=image.recipe or labels.get("envbuild.recipe") or (lock.recipe if lock else None),
        lock_hash=lock_hash(lock) if lock and image.reference == "recipe" else labels.get("envbuild.lock-hash"),
        lock=None if compare_lock is None else compare_lock.to_dict(), base_used=labels.get("envbuild.base.used"),
        backend=Backend(used=s.backend, recipe=s.recipe_backend), world_size=s.world_size, nodes=s.nodes,
        gpus_per_node=s.gpus_per_node, nproc_per_node=s.nproc_per_node, settings=s,
        socket=socket_doc, probe={str(r): d.probe for r, d in sorted(results.items())}, transports=transports,
        nccl=nccl, ranks=_rank_entries(s, launch, compare_lock),
        node_status=_node_status(s, launch, verdict.passed), timed_out=launch.timed_out, verdict=verdict,
        started_at=launch.started_at, finished_at=launch.finished_at, host=Host(**dict(host)),
        stack=_stack(image, results), profiles=list(s.profiles), collectives=collectives_section(results),
        training=training_section(results), scaling=scaling_section(results), features=features_section(results),
        profile_wall_s=profile_wall_s(results),
        cuda_requirement=cuda_requirement(image),
        phases=[PhaseTime(name=n, seconds=s_) for n, s_ in launch.phases],
    )


def cuda_requirement(image: ImageFacts) -> CudaRequirement:
    """The certified image's CUDA requirement from its config ``Env`` and lock:
    ``NVIDIA_REQUIRE_CUDA`` is the NVIDIA runtime's hard driver floor for the image."""
    cuda = image.lock.cuda if image.lock else None
    return CudaRequirement(torch_cuda=str(cuda) if cuda is not None else None,
                           nvidia_require_cuda=image.env.get("NVIDIA_REQUIRE_CUDA"),
                           nvidia_disable_require=image.env.get("NVIDIA_DISABLE_REQUIRE"),
                           source=f"config Env of image {image.ref}")


# --------------------------------------------------------------------------- writing


def certificate_path(images_dir: str | os.PathLike[str], cert: Certificate) -> Path:
    """``<images_dir>/<recipe>/certificates/<recipe>-<lockhash12>-<UTC stamp>-<run id>.json``."""
    def part(value: object, limit: int) -> str:
        return re.sub(r"[^A-Za-z0-9._-]", "_", str(value))[:limit].lstrip(".") or "_"

    stamp = part("".join(ch for ch in str(cert.finished_at or utc_stamp()) if ch.isalnum()), 20)
    run = part(cert.run_id or "norun", 40)
    if cert.recipe is None and cert.lock is None:  # a foreign image: its folder is its reference
        return image_dir(images_dir, part(cert.image.ref, 128)).certificates / (
            f"{part(cert.image.ref, 64)}-{stamp}-{run}.json")
    recipe = part(cert.recipe or "unknown", 64)
    h = part(str(cert.lock_hash or "").split(":", 1)[-1][:12] or "nohash", 12)
    return image_dir(images_dir, recipe).certificates / f"{recipe}-{h}-{stamp}-{run}.json"


class CertificateNotWritten(Unreachable):
    """The certificate could not be written (exit 3); ``certificate`` holds the document, so that the
    verdict can still be shown."""

    def __init__(self, message: str, *, certificate: Certificate, path: Path) -> None:
        self.certificate = certificate
        self.path = path
        super().__init__(message, file=str(path))


#: Most ``-N`` suffixes tried for one certificate name.
MAX_NAME_TRIES = 1000


def write_certificate(cert: Certificate, images_dir: str | os.PathLike[str]) -> Path:
    """Create the certificate file, never replacing one (a taken name gets ``-2``, ``-3``...); its path.
    Raises CertificateNotWritten (exit 3), naming the file; nothing half-written remains."""
    path = certificate_path(images_dir, cert)
    names = [path.name] + [f"{path.stem}-{n}.json" for n in range(2, MAX_NAME_TRIES + 1)]
    try:
        written = write_new(path.parent, names, (json.dumps(cert.to_dict(), indent=2, sort_keys=False) + "\n").encode())
    except EnvbuildError as e:
        reason = e.message.removeprefix("cannot write: ")
        raise CertificateNotWritten(f"cannot write the certificate: {reason}", certificate=cert,
                                    path=Path(e.file or path)) from None
    prune_certificates(written)
    return written


def _passed(path: Path) -> bool:
    with contextlib.suppress(EnvbuildError, LookupError, TypeError):
        doc = inputs.read_json(path, inputs.MAX_REPORT_BYTES, "certificate", ExitCode.CHECK_FAILED)
        return doc["verdict"]["passed"] is True
    return False


def prune_certificates(written: Path) -> None:
    """The certificates beside ``written`` past their retention (:mod:`builder.core.retention`) go;
    ``written`` and the newest passing one stay (``push`` and ``gate`` need it)."""
    kept, gone = retention.split(written.parent.glob("*.json"), "certificates")
    gone = [p for p in gone if p != written]
    if gone and not any(_passed(p) for p in [written, *kept]):
        spare = next((p for p in gone if _passed(p)), None)
        gone = [p for p in gone if p != spare]
    retention.remove(gone)
