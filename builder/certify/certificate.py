"""The certificate of a run: built from the launch and the verdict, written exclusively.

:func:`build_certificate` makes the :class:`~builder.certify.model.Certificate` (schema
``envbuild.certificate/1``); :func:`write_certificate` writes it to
``<images_dir>/<recipe>/certificates/<recipe>-<lockhash12>-<UTC stamp>-<run id>.json``
(:func:`certificate_path`), never over another certificate, for failing verdicts as well:
that is the record.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import re
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from builder import __version__
from builder.certify import nccl_log
from builder.core.errors import Unreachable
from builder.core.inputs import one_line
from builder.core.paths import image_dir
from builder.launchers.base import LaunchResult, utc_now_iso
from builder.launchers.model import RankResult
from builder.launchers.output import RESULT_PREFIX
from builder.launchers.progress import PROGRESS_PREFIX
from builder.recipe.lock import lock_hash

from .model import (
    CERT_SCHEMA,
    AllreduceRow,
    AllreduceSettings,
    Backend,
    Certificate,
    CudaRequirement,
    DdpRank,
    DdpSettings,
    DdpTable,
    Host,
    ImageInfo,
    NcclInfo,
    NodeStatus,
    PhaseTime,
    RankEntry,
    RunSettingsDoc,
    SocketRecord,
    Stack,
    Thresholds,
    Verdict,
)
from .profiles import collectives_section, features_section, profile_wall_s, scaling_section, training_section
from .settings import RunSettings, SocketSetting
from .source import ImageFacts, label_subset
from .verdict import compare_probe_to_lock, reference_rank

#: Lines of each node's log kept in the certificate when the verdict fails.
LOG_TAIL_LINES = 40


def _allreduce_table(results: Mapping[int, RankResult], world: int) -> list[AllreduceRow]:
    ref = reference_rank(results)
    if ref is None:
        return []
    rows = []
    for e in results[ref].allreduce:
        by_rank: list[int | None] = [*e.wrong_by_rank] if e.wrong_by_rank else [None] * world
        by_rank += [None] * (world - len(by_rank))
        for r, doc in results.items():  # each rank's own count wins over the gathered one
            own = next((x for x in doc.allreduce if x.size_bytes == e.size_bytes), None)
            if own is not None and r < world:
                by_rank[r] = own.wrong
        rows.append(AllreduceRow(
            size_bytes=e.size_bytes, count=e.count, type=e.type, redop=e.redop, time_us=e.time_us,
            algbw_gbps=e.algbw_gbps, busbw_gbps=e.busbw_gbps, wrong=sum(x for x in by_rank if x),
            wrong_by_rank=by_rank, rank_time_us=list(e.rank_time_us)))
    return rows


def _ddp_table(results: Mapping[int, RankResult]) -> DdpTable | None:
    docs = {r: d.ddp for r, d in sorted(results.items()) if d.ddp is not None}
    if not docs:
        return None
    first = docs[min(docs)]
    return DdpTable(
        model=first.model, source=first.source, steps=first.steps, batch_size=first.batch_size,
        image_size=first.image_size, params_identical=all(d.params_identical for d in docs.values()),
        mismatched_ranks=sorted({m for d in docs.values() for m in d.mismatched_ranks}),
        ranks={str(r): DdpRank(images_per_s=d.images_per_s, wall_s=d.wall_s, final_loss=d.final_loss,
                               param_checksum=d.param_checksum) for r, d in docs.items()})


def log_tail(text: str) -> list[str]:
    """The last :data:`LOG_TAIL_LINES` lines of a node log that are not envbuild's own
    progress or result lines, each one escaped line."""
    lines, in_block = [], False
    for line in (text or "").splitlines():
        if line.startswith("@@envbuild-result-"):  # the k8s launcher's result blocks
            in_block = line.startswith("@@envbuild-result-begin")
            continue
        if not in_block and not line.startswith((PROGRESS_PREFIX, RESULT_PREFIX)):
            lines.append(line)
    return [one_line(line, 2000) for line in lines[-LOG_TAIL_LINES:]]


def _nccl_sections(s: RunSettings, launch: LaunchResult) -> tuple[dict[str, list[str] | None] | None,
                                                                    NcclInfo | None]:
    """``(transports, nccl)`` of the certificate from the NCCL INFO lines (None on gloo)."""
    if s.backend != "nccl":
        return None, None
    parsed = nccl_log.parse(launch.node_logs.values())
    transports = {str(r): parsed.transports.get(r) for r in range(s.world_size)}
    nccl = NcclInfo(networks={str(r): v for r, v in parsed.networks.items()},
                    ib_devices={str(r): v for r, v in parsed.ib_devices.items()},
                    versions={str(r): v for r, v in parsed.versions.items()})
    return transports, nccl


def _rank_entries(s: RunSettings, launch: LaunchResult, lock: Mapping[str, Any] | None) -> dict[str, RankEntry]:
    """``ranks`` of the certificate: per rank, what it reported or why it did not."""
    ranks = {}
    for r in range(s.world_size):
        doc = launch.rank_results.get(r)
        kw: dict[str, Any] = {"node": r // s.nproc_per_node, "reported": doc is not None}
        if doc is not None:
            kw.update(hostname=doc.hostname, device=doc.device, elapsed_s=doc.elapsed_s, errors=list(doc.errors),
                      fault=doc.fault,
                      lock_mismatches=(compare_probe_to_lock(doc.probe, lock)
                                       if doc.probe and lock is not None else None))
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


def _settings_doc(s: RunSettings) -> RunSettingsDoc:
    return RunSettingsDoc(port=s.port, shm_size=s.shm_size, timeout_s=s.timeout_s,
                          allreduce=AllreduceSettings(sizes=list(s.sizes), iters=s.iters, warmup=s.warmup),
                          ddp=DdpSettings(steps=s.ddp_steps, batch_size=s.ddp_batch, image_size=s.ddp_image_size),
                          profiles=list(s.profiles), dtypes=list(s.dtypes))


def _stack(image: ImageFacts, results: Mapping[int, RankResult]) -> Stack:
    """The reference stack: the reference rank's probe (for a foreign image the only
    reference; else what was compared with the lock)."""
    ref = reference_rank({r: d for r, d in results.items() if isinstance(d.probe, dict)})
    p: Mapping[str, Any] = (results[ref].probe or {}) if ref is not None else {}

    def get(*path: str) -> str | None:
        node: Any = p
        for k in path:
            node = node.get(k) if isinstance(node, Mapping) else None
        return None if node is None else one_line(str(node), 200)

    found_os = p.get("os")
    os_: Mapping[str, Any] = found_os if isinstance(found_os, Mapping) else {}
    os_text = " ".join(str(x) for x in (os_.get("id"), os_.get("version_id")) if x) or None
    return Stack(source=image.reference, recipe=image.recipe or image.labels.get("envbuild.recipe"),
                 reference_rank=ref if image.reference == "probe" else None,
                 python=get("python", "version"), torch=get("torch", "version"), cuda=get("torch", "cuda"),
                 nccl=get("nccl", "loaded", "version"), glibc=get("glibc"), os=os_text)


def build_certificate(*, image: ImageFacts, settings: RunSettings, launch: LaunchResult, verdict: Verdict,
                      run_id: str, host: Mapping[str, Any], sock: SocketSetting | None = None) -> Certificate:
    """The certificate of a judged run.

    ``socket`` records the interface setting used (``source`` ``image``,
    ``--socket-ifname`` or ``default``) and ``seen_by_ranks``, what each rank saw;
    ``ranks.<r>.last_progress`` is the rank's last progress when the launch gave up.
    """
    s, results, labels, lock = settings, launch.rank_results, image.labels, image.lock
    compare_lock = None if image.reference == "probe" else lock
    transports, nccl = _nccl_sections(s, launch)
    socket_doc = None
    if sock is not None:
        socket_doc = SocketRecord(source=sock.source, override=sock.override,
                                  GLOO_SOCKET_IFNAME=sock.GLOO_SOCKET_IFNAME,
                                  NCCL_SOCKET_IFNAME=sock.NCCL_SOCKET_IFNAME,
                                  seen_by_ranks={str(r): dict(v) for r, v in sorted(launch.socket_seen.items())})
    return Certificate(
        schema=CERT_SCHEMA, envbuild_version=__version__, run_id=run_id,
        image=ImageInfo(ref=image.ref, id=image.image_id, repo_digests=list(image.repo_digests),
                        labels=label_subset(labels)),
        recipe=image.recipe or labels.get("envbuild.recipe") or lock.get("recipe"),
        lock_hash=lock_hash(lock) if image.reference == "recipe" else labels.get("envbuild.lock-hash"),
        lock=None if compare_lock is None else dict(lock), base_used=labels.get("envbuild.base.used"),
        backend=Backend(used=s.backend, recipe=s.recipe_backend), world_size=s.world_size, nodes=s.nodes,
        gpus_per_node=s.gpus_per_node, nproc_per_node=s.nproc_per_node, settings=_settings_doc(s),
        socket=socket_doc,
        thresholds=Thresholds(min_busbw_gbps=s.min_busbw_gbps, busbw_size=s.busbw_size,
                              source=s.busbw_source,
                              recipe_min_busbw_gbps=s.recipe_min_busbw_gbps,
                              min_scaling_efficiency=s.min_scaling_efficiency),
        probe={str(r): d.probe for r, d in sorted(results.items())},
        allreduce=_allreduce_table(results, s.world_size), ddp=_ddp_table(results),
        transports=transports, nccl=nccl, ranks=_rank_entries(s, launch, compare_lock),
        node_status=_node_status(s, launch, verdict.passed), timed_out=launch.timed_out, verdict=verdict,
        started_at=launch.started_at, finished_at=launch.finished_at, host=Host(**dict(host)),
        stack=_stack(image, results), profiles=list(s.profiles), collectives=collectives_section(results),
        training=training_section(results), scaling=scaling_section(results), features=features_section(results),
        overrides=dict(s.overrides), profile_wall_s=profile_wall_s(results),
        cuda_requirement=cuda_requirement(image),
        phases=[PhaseTime(name=n, seconds=s_) for n, s_ in launch.phases],
    )


def cuda_requirement(image: ImageFacts) -> CudaRequirement:
    """The certified image's CUDA requirement (issue 11) from its config ``Env`` and lock:
    ``NVIDIA_REQUIRE_CUDA`` is the NVIDIA runtime's hard driver floor for the image."""
    cuda = image.lock.get("cuda")
    return CudaRequirement(torch_cuda=str(cuda) if cuda is not None else None,
                           nvidia_require_cuda=image.env.get("NVIDIA_REQUIRE_CUDA"),
                           nvidia_disable_require=image.env.get("NVIDIA_DISABLE_REQUIRE"),
                           source=f"config Env of image {image.ref}")


# --------------------------------------------------------------------------- writing


def certificate_path(images_dir: str | os.PathLike[str], cert: Certificate) -> Path:
    """``<images_dir>/<recipe>/certificates/<recipe>-<lockhash12>-<UTC stamp>-<run id>.json``.

    The stamp is ``finished_at`` as ``YYYYmmddTHHMMSSZ``; the hash is the lock hash
    without ``sha256:``, first 12 hex digits; the run id makes the name unique per run
    (:func:`write_certificate` adds ``-2``, ``-3``... should it still be taken).
    A foreign image (no recipe, no lock) goes to ``<images_dir>/<ref>/certificates/<ref>-<stamp>-<run id>.json``
    with the image reference made path-safe (``pytorch/pytorch:2.5`` -> ``pytorch_pytorch_2.5``).
    Characters outside ``[A-Za-z0-9._-]`` in any part become ``_``. Files that belong to
    the certificate (e.g. a report) take the stem of the path written.
    """
    def part(value: object, limit: int) -> str:
        return re.sub(r"[^A-Za-z0-9._-]", "_", str(value))[:limit].lstrip(".") or "_"

    stamp = part("".join(ch for ch in str(cert.finished_at or utc_now_iso()) if ch.isalnum()), 20)
    run = part(cert.run_id or "norun", 40)
    if cert.recipe is None and cert.lock is None:  # a foreign image: its folder is its reference
        return image_dir(images_dir, part(cert.image.ref, 128)).certificates / (
            f"{part(cert.image.ref, 64)}-{stamp}-{run}.json")
    recipe = part(cert.recipe or "unknown", 64)
    h = part(str(cert.lock_hash or "").split(":", 1)[-1][:12] or "nohash", 12)
    return image_dir(images_dir, recipe).certificates / f"{recipe}-{h}-{stamp}-{run}.json"


class CertificateNotWritten(Unreachable):
    """The certificate could not be written (exit 3): a full disk, a read-only or
    missing folder. ``certificate`` holds the document, so that the verdict can still
    be shown; ``path`` the file that was being written."""

    def __init__(self, message: str, *, certificate: Certificate, path: Path) -> None:
        self.certificate = certificate
        self.path = path
        super().__init__(message, file=str(path))


#: Most ``-N`` suffixes tried for one certificate name.
MAX_NAME_TRIES = 1000


def certificate_bytes(cert: Certificate) -> bytes:
    """The certificate as written: JSON, 2-space indent, keys in the model's order, newline."""
    return (json.dumps(cert.to_dict(), indent=2, sort_keys=False) + "\n").encode()


def write_certificate(cert: Certificate, images_dir: str | os.PathLike[str]) -> Path:
    """Create the certificate file at :func:`certificate_path`, exclusively: it is written
    to a temporary file in the same folder (fsync'd), then hard-linked to its name, which
    fails when the name exists (``os.link`` never replaces), so no certificate ever
    overwrites another; a taken name gets ``-2``, ``-3``... The temporary file is removed
    in every case. Returns the path.

    Raises:
        CertificateNotWritten: (exit 3) the folder cannot be made or the file not
            written (e.g. ``No space left on device``), naming the file; nothing
            half-written remains.
    """
    path = certificate_path(images_dir, cert)
    data = certificate_bytes(cert)
    tmp = None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.stem}.", suffix=".tmp")
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.chmod(tmp, 0o644)
        stem = path.stem
        for n in range(1, MAX_NAME_TRIES + 1):
            target = path if n == 1 else path.with_name(f"{stem}-{n}.json")
            try:
                os.link(tmp, target)
            except FileExistsError:
                continue
            return target
        raise OSError(errno.EEXIST, f"{MAX_NAME_TRIES} certificates of this name exist")
    except OSError as e:
        raise CertificateNotWritten(f"cannot write the certificate: {e.strerror or e}",
                                    certificate=cert, path=path) from None
    finally:
        if tmp is not None:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
