"""What nodes are compared against (``envbuild verify --against``, ``envbuild gate``): a
certificate (its rank probes are the reference), a node report, or an image (probed)."""

from __future__ import annotations

import datetime
import os
from dataclasses import dataclass, field
from typing import Any, Literal

import msgspec

from builder.core import inputs
from builder.core.certificate import CERT_SCHEMAS, Certificate, load_certificate
from builder.core.documents import Image, NodeReport, report_problem
from builder.core.errors import ExitCode, Unreachable

from . import report as nodereport
from .report import InvalidReport
from .verify.floor import CudaRequirement, is_true
from .verify.result import ReferenceSummary

#: Largest certificate read, in bytes.
MAX_CERTIFICATE_BYTES = 16 << 20
#: The image label with the base's ``NVIDIA_REQUIRE_CUDA`` (:mod:`builder.image.build`).
LABEL_CUDA_REQUIRE = "envbuild.cuda.require"
LABEL_CUDA = "envbuild.cuda"
LABEL_LOCK_HASH = "envbuild.lock-hash"

Kind = Literal["certificate", "report", "image"]


@dataclass(frozen=True)
class CertifiedRun:
    """What the nodes stage takes from a certificate."""

    path: str
    probes: dict[int, NodeReport]
    finished_at: str | None
    envbuild_version: str | None
    recipe: str | None
    lock_hash: str | None
    image_ref: str | None
    image_id: str | None
    digests: tuple[str, ...]
    labels: dict[str, str]
    passed: bool
    failures: tuple[str, ...]
    torch_cuda: str | None
    require: str | None
    require_source: str
    disable_require: bool = False
    #: GPUs per node the run certified (None: not said).
    gpus_per_node: int | None = None


def _requirement(cert: Certificate, probes: dict[int, NodeReport]) -> tuple[str | None, str, bool]:
    """(``NVIDIA_REQUIRE_CUDA``, where it was read, disabled) of a certificate."""
    rec, labels = cert.cuda_requirement, cert.image.labels
    if rec is not None:
        return rec.nvidia_require_cuda, rec.source, is_true(rec.nvidia_disable_require)
    if LABEL_CUDA_REQUIRE in labels:
        return labels[LABEL_CUDA_REQUIRE] or None, f"image label {LABEL_CUDA_REQUIRE}", False
    first = probes[min(probes)]
    value = first.env.get("NVIDIA_REQUIRE_CUDA")
    return value, "NVIDIA_REQUIRE_CUDA seen by the certified ranks", is_true(first.env.get("NVIDIA_DISABLE_REQUIRE"))


def read_certificate(path: str | os.PathLike[str]) -> CertifiedRun:
    """The certificate at ``path`` (the one model) as a reference: its rank probes. Unreachable (exit 3): unreadable,
    over 16 MiB, invalid; InvalidReport (exit 3): a rank probe invalid, or none."""
    p = str(path)
    doc = inputs.read_json(p, MAX_CERTIFICATE_BYTES, "certificate", exit_code=ExitCode.UNREACHABLE)
    if not isinstance(doc, dict) or doc.get("schema") not in CERT_SCHEMAS:
        raise Unreachable(f"is not a certificate ({', '.join(CERT_SCHEMAS)})", file=p, field="schema",
                          value=doc.get("schema") if isinstance(doc, dict) else type(doc).__name__)
    cert = load_certificate(doc, p, exit_code=ExitCode.UNREACHABLE)
    probes: dict[int, NodeReport] = {}
    for key, probe in sorted(cert.probe.items(), key=lambda kv: (len(kv[0]), kv[0])):
        if probe is None or not key.isdigit():
            continue
        problem = report_problem(probe)
        if problem is not None:
            raise InvalidReport(problem[2], file=f"{p}: probe.{key}", field=problem[0], value=problem[1])
        probes[int(key)] = probe
    if not probes:
        raise InvalidReport("holds no rank probe (probe.<r>): nothing to compare with", file=p)
    require, source, disabled = _requirement(cert, probes)
    first, lock_cuda = probes[min(probes)], (cert.lock or {}).get("cuda")
    labels = cert.image.labels
    return CertifiedRun(
        path=p, probes=probes, finished_at=cert.finished_at, envbuild_version=cert.envbuild_version,
        recipe=cert.recipe, lock_hash=cert.lock_hash or labels.get(LABEL_LOCK_HASH), image_ref=cert.image.ref,
        image_id=cert.image.id, digests=tuple(d.rsplit("@", 1)[1] for d in cert.image.repo_digests if "@" in d),
        labels=dict(labels), passed=cert.verdict.passed, failures=tuple(cert.verdict.failures),
        torch_cuda=(lock_cuda if isinstance(lock_cuda, str) else None) or labels.get(LABEL_CUDA)
        or (first.torch.cuda if first.torch else None),
        require=require, require_source=f"{source} of {p}", disable_require=disabled,
        gpus_per_node=cert.gpus_per_node)


# --------------------------------------------------------------------------- the reference


@dataclass(frozen=True)
class Reference:
    """What every node is compared with."""

    kind: Kind
    name: str
    report: NodeReport
    requirement: CudaRequirement
    made_at: str | None = None
    run: CertifiedRun | None = None
    notes: tuple[str, ...] = field(default=())

    @property
    def label(self) -> str:
        """How messages name the reference's values: ``certified``, ``reference``, ``image``."""
        return {"certificate": "certified", "report": "reference", "image": "image"}[self.kind]

    def summary(self, now: datetime.datetime | None = None) -> ReferenceSummary:
        """The :class:`~.verify.result.ReferenceSummary` of the JSON document."""
        age = age_s(self.made_at, now)
        req = self.requirement
        shown = (f"{req.require} ({req.source})" if req.require else
                 f"torch CUDA {req.torch_cuda}" if req.torch_cuda else None)
        run = self.run
        return ReferenceSummary(kind=self.kind, name=self.name, made_at=self.made_at, age_s=age,
                                envbuild_version=run.envbuild_version if run else None,
                                recipe=run.recipe if run else None, lock_hash=run.lock_hash if run else None,
                                image=(run.image_ref if run else None) or (self.report.image.ref
                                                                          if self.report.image else None),
                                cuda_requirement=shown, passed=run.passed if run else None)


def age_s(made_at: str | None, now: datetime.datetime | None = None) -> float | None:
    """Seconds from ``made_at`` (``2025-06-01T12:00:00Z``, or with fractions, or ``+00:00``) to ``now`` (default: this
    moment); None when it is no zoned time."""
    if not made_at or len(made_at) > 64:
        return None
    try:
        t = datetime.datetime.fromisoformat(made_at.replace("Z", "+00:00"))
    except ValueError:
        return None
    return ((now or datetime.datetime.now(datetime.UTC)) - t).total_seconds() if t.tzinfo else None


def from_certificate(path: str) -> Reference:
    """A certificate's reference: its lowest rank's probe, with the image's ref, ID, first digest."""
    run = read_certificate(path)
    probe = run.probes[min(run.probes)]
    image = Image(ref=run.image_ref or (probe.image.ref if probe.image else None),
                  digest=run.digests[0] if run.digests else (probe.image.digest if probe.image else None),
                  id=run.image_id or (probe.image.id if probe.image else None))
    req = CudaRequirement(torch_cuda=run.torch_cuda, torch=probe.torch.version if probe.torch else None,
                          require=run.require, source=run.require_source, disabled=run.disable_require)
    return Reference(kind="certificate", name=run.path, report=msgspec.structs.replace(probe, image=image),
                     requirement=req, made_at=run.finished_at, run=run)


def from_report(path: str) -> Reference:
    """A node report file's reference: its torch CUDA, the ``NVIDIA_REQUIRE_CUDA`` it saw; InvalidReport (exit 3)."""
    r = nodereport.load_file(path)
    req = CudaRequirement(torch_cuda=r.torch.cuda if r.torch else None, torch=r.torch.version if r.torch else None,
                          require=r.env.get("NVIDIA_REQUIRE_CUDA"), source=f"NVIDIA_REQUIRE_CUDA in the report {path}",
                          disabled=is_true(r.env.get("NVIDIA_DISABLE_REQUIRE")))
    return Reference(kind="report", name=path, report=r, requirement=req, made_at=r.probed_at)


def from_image(image: str, client: Any = None, gpus: bool = False) -> Reference:
    """An image's reference: the probe run in it; EnvbuildError (exit 3): no image or engine, probe failed."""
    from builder.image import engine
    from builder.image.probecheck import probe_cached

    client = client or engine.connect()
    doc, _ = probe_cached(client, image, gpus=gpus)
    r = nodereport.validate(doc, f"probe of {image}")
    img = client.image(image)
    env, labels, digests = img.env(), img.labels, img.digests
    r = msgspec.structs.replace(r, image=Image(ref=image, digest=digests[0] if digests else None, id=img.id))
    req = CudaRequirement(torch_cuda=labels.get(LABEL_CUDA) or (r.torch.cuda if r.torch else None),
                          torch=r.torch.version if r.torch else None, require=env.get("NVIDIA_REQUIRE_CUDA"),
                          source=f"config Env of image {image}", disabled=is_true(env.get("NVIDIA_DISABLE_REQUIRE")))
    return Reference(kind="image", name=image, report=r, requirement=req, made_at=r.probed_at)


def load_reference(ref: str, client: Any = None, gpus: bool = False) -> Reference:
    """``--against REF``: a certificate or node report (by ``schema``), else an image here; EnvbuildError (exit 3)."""
    if os.path.exists(ref) or ref.endswith(".json") or ref.startswith(("/", "./", "../")):  # no image ref starts so
        doc = inputs.read_json(ref, MAX_CERTIFICATE_BYTES, "certificate or node report", exit_code=ExitCode.UNREACHABLE)
        schema = doc.get("schema") if isinstance(doc, dict) and isinstance(doc.get("schema"), str) else None
        if schema in CERT_SCHEMAS:
            return from_certificate(ref)
        if schema in nodereport.SUPPORTED_SCHEMAS:
            return from_report(ref)
        raise Unreachable(f"is neither a certificate ({', '.join(CERT_SCHEMAS)}) nor a node report "
                          f"({', '.join(nodereport.SUPPORTED_SCHEMAS)})", file=ref, field="schema", value=schema)
    from builder.oci import reference

    reference.parse(ref, field="--against")
    return from_image(ref, client, gpus)
