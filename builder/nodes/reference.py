"""What nodes are compared against (``envbuild verify --against``, ``envbuild gate``): a
certificate (its rank probes are the reference), a node report, or an image (probed).

:func:`read_certificate` is the ONE place where the nodes stage reads a certificate
(``envbuild.certificate/1``, written by :mod:`builder.certify`): bounded
(:func:`builder.core.inputs.read_json`, 16 MiB), taking only the rank probes and the
metadata it needs. Each rank probe is validated as a :class:`~.report.NodeReport`.

The certified image's CUDA requirement comes, first found first: from the certificate's
``cuda_requirement`` (the certified image's config ``Env``, recorded by certify), its label
``envbuild.cuda.require`` (recorded at build time from the base's config), or the
``NVIDIA_REQUIRE_CUDA`` the rank probes saw; the torch variant's CUDA from the lock, the
label ``envbuild.cuda`` or the probes' ``torch.cuda``.
"""

from __future__ import annotations

import datetime
import os
from dataclasses import dataclass, field
from typing import Any, Literal

import msgspec

from builder.core import inputs
from builder.core.errors import EnvbuildError, ExitCode

from . import report as nodereport
from .report import Image, InvalidReport, NodeReport
from .verify.floor import CudaRequirement, is_true
from .verify.result import ReferenceSummary

#: Largest certificate read, in bytes.
MAX_CERTIFICATE_BYTES = 16 << 20
CERTIFICATE_SCHEMA = "envbuild.certificate/1"
#: The image label with the base's ``NVIDIA_REQUIRE_CUDA`` (:mod:`builder.image.build`).
LABEL_CUDA_REQUIRE = "envbuild.cuda.require"
LABEL_CUDA = "envbuild.cuda"
LABEL_LOCK_HASH = "envbuild.lock-hash"

Kind = Literal["certificate", "report", "image"]


@dataclass(frozen=True)
class CertifiedRun:
    """What the nodes stage takes from a certificate.

    Attributes:
        path: the file. probes: the validated rank probes, by rank. finished_at: when the
        run ended (UTC, as written). envbuild_version, recipe, lock_hash: of the run.
        image_ref, image_id, digests: the certified image (``sha256:...`` digests of its
        repository digests). labels: its envbuild labels. passed, failures: the verdict.
        torch_cuda: the lock's CUDA. require, require_source: the image's
        ``NVIDIA_REQUIRE_CUDA`` and where it was read (None: none recorded).
        disable_require: ``NVIDIA_DISABLE_REQUIRE`` is true in the image.
    """

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


def _text(doc: Any, *path: str, limit: int = 4096) -> str | None:
    """``doc[path...]`` when it is a string of at most ``limit`` characters, else None."""
    for key in path:
        doc = doc.get(key) if isinstance(doc, dict) else None
    return doc if isinstance(doc, str) and len(doc) <= limit else None


def _dict(value: Any) -> dict[str, Any]:
    """``value`` when it is a JSON object, else an empty one."""
    return value if isinstance(value, dict) else {}


def _rank_probes(doc: dict, path: str) -> dict[int, NodeReport]:
    """Every rank's probe, ``ranks.<r>.probe`` (else ``probe.<r>``), validated.

    Raises:
        InvalidReport: (exit 3) a probe that is not a valid node report, naming the rank;
            no rank probe at all.
    """
    ranks = _dict(doc.get("ranks"))
    flat = _dict(doc.get("probe"))
    probes: dict[int, NodeReport] = {}
    for key in sorted({*ranks, *flat}, key=lambda k: (len(str(k)), str(k)))[:65536]:
        entry = ranks.get(key)
        raw = entry.get("probe") if isinstance(entry, dict) and "probe" in entry else flat.get(key)
        if raw is None or not str(key).isdigit():
            continue
        where = "ranks" if isinstance(entry, dict) and "probe" in entry else "probe"
        probes[int(key)] = nodereport.validate(raw, f"{path}: {where}.{key}.probe")
    if not probes:
        raise InvalidReport("holds no rank probe (ranks.<r>.probe): nothing to compare with", file=path)
    return probes


def _requirement(doc: dict, labels: dict[str, str], probes: dict[int, NodeReport]) -> tuple[str | None, str, bool]:
    """(``NVIDIA_REQUIRE_CUDA``, where it was read, disabled) of a certificate."""
    rec = doc.get("cuda_requirement") if isinstance(doc.get("cuda_requirement"), dict) else None
    if rec is not None and "nvidia_require_cuda" in rec:
        return (_text(rec, "nvidia_require_cuda"), _text(rec, "source") or "certificate cuda_requirement",
                is_true(_text(rec, "nvidia_disable_require")))
    if LABEL_CUDA_REQUIRE in labels:
        return labels[LABEL_CUDA_REQUIRE] or None, f"image label {LABEL_CUDA_REQUIRE}", False
    first = probes[min(probes)]
    value = first.env.get("NVIDIA_REQUIRE_CUDA")
    return value, "NVIDIA_REQUIRE_CUDA seen by the certified ranks", is_true(first.env.get("NVIDIA_DISABLE_REQUIRE"))


def read_certificate(path: str | os.PathLike[str]) -> CertifiedRun:
    """Read the certificate at ``path`` (see the module docstring).

    Raises:
        EnvbuildError: (exit 3) unreadable, over 16 MiB, not bounded JSON, not an
            ``envbuild.certificate/1`` document; InvalidReport (exit 3) a rank probe that is
            not a valid node report.
    """
    # The fields are read one by one, each checked for its type, rather than through
    # builder.certify.model.load_certificate: certificates written before a field was added
    # (cuda_requirement, probed_at in the rank probes) are still references.
    p = str(path)
    doc = inputs.read_json(p, MAX_CERTIFICATE_BYTES, "certificate", exit_code=ExitCode.UNREACHABLE)
    if not isinstance(doc, dict) or doc.get("schema") != CERTIFICATE_SCHEMA:
        raise EnvbuildError(f"is not a certificate ({CERTIFICATE_SCHEMA})", file=p, field="schema",
                            value=doc.get("schema") if isinstance(doc, dict) else type(doc).__name__,
                            exit_code=ExitCode.UNREACHABLE)
    probes = _rank_probes(doc, p)
    image = _dict(doc.get("image"))
    raw_labels = _dict(image.get("labels"))
    labels = {str(k)[:256]: v for k, v in list(raw_labels.items())[:1024] if isinstance(v, str) and len(v) <= 65536}
    digests = tuple(d.rsplit("@", 1)[1] for d in (image.get("repo_digests") or [])[:64]
                    if isinstance(d, str) and "@" in d and len(d) <= 4096)
    verdict = _dict(doc.get("verdict"))
    failures = tuple(str(f)[:4096] for f in (verdict.get("failures") or [])[:100] if isinstance(f, str))
    require, source, disabled = _requirement(doc, labels, probes)
    first = probes[min(probes)]
    torch_cuda = (_text(doc, "lock", "cuda", limit=64) or labels.get(LABEL_CUDA)
                  or (first.torch.cuda if first.torch else None))
    return CertifiedRun(
        path=p, probes=probes, finished_at=_text(doc, "finished_at", limit=64),
        envbuild_version=_text(doc, "envbuild_version", limit=256), recipe=_text(doc, "recipe", limit=256),
        lock_hash=_text(doc, "lock_hash", limit=256) or labels.get(LABEL_LOCK_HASH),
        image_ref=_text(image, "ref"), image_id=_text(image, "id", limit=256), digests=digests, labels=labels,
        passed=verdict.get("passed") is True, failures=failures, torch_cuda=torch_cuda, require=require,
        require_source=f"{source} of {p}", disable_require=disabled)


# --------------------------------------------------------------------------- the reference


@dataclass(frozen=True)
class Reference:
    """What every node is compared with.

    Attributes:
        kind: ``certificate``, ``report`` or ``image``. name: the file or image reference.
        report: the reference's node report (a certificate's lowest rank, with the
            certified image's ID and digest). requirement: its CUDA requirement.
        made_at: when it was made (certificate) or probed (report, image), UTC.
        run: the certificate read (kind ``certificate``), else None.
    """

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


def parse_time(text: str | None) -> datetime.datetime | None:
    """``2025-06-01T12:00:00Z`` (or with fractions, or ``+00:00``) as an aware UTC time; None
    when it is not one."""
    if not text or len(text) > 64:
        return None
    try:
        t = datetime.datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return None
    return t.astimezone(datetime.UTC) if t.tzinfo else None


def age_s(made_at: str | None, now: datetime.datetime | None = None) -> float | None:
    """Seconds from ``made_at`` to ``now`` (default: this moment), or None."""
    t = parse_time(made_at)
    if t is None:
        return None
    return ((now or datetime.datetime.now(datetime.UTC)) - t).total_seconds()


def from_certificate(path: str) -> Reference:
    """The reference of a certificate: its lowest rank's probe, with the certified image's
    reference, ID and (first) digest. Raises as :func:`read_certificate`."""
    run = read_certificate(path)
    probe = run.probes[min(run.probes)]
    image = Image(ref=run.image_ref or (probe.image.ref if probe.image else None),
                  digest=run.digests[0] if run.digests else (probe.image.digest if probe.image else None),
                  id=run.image_id or (probe.image.id if probe.image else None))
    req = CudaRequirement(torch_cuda=run.torch_cuda, torch=probe.torch.version if probe.torch else None,
                          require=run.require, source=run.require_source, disabled=run.disable_require)
    return Reference(kind="certificate", name=run.path, report=msgspec.structs.replace(probe, image=image),
                     requirement=req, made_at=run.finished_at, run=run)


def report_requirement(r: NodeReport, source: str) -> CudaRequirement:
    """The requirement a report shows: its torch CUDA and the ``NVIDIA_REQUIRE_CUDA`` it saw."""
    return CudaRequirement(torch_cuda=r.torch.cuda if r.torch else None, torch=r.torch.version if r.torch else None,
                           require=r.env.get("NVIDIA_REQUIRE_CUDA"), source=source,
                           disabled=is_true(r.env.get("NVIDIA_DISABLE_REQUIRE")))


def from_report(path: str) -> Reference:
    """The reference of a node report file. Raises InvalidReport (exit 3)."""
    r = nodereport.load_file(path)
    return Reference(kind="report", name=path, report=r,
                     requirement=report_requirement(r, f"NVIDIA_REQUIRE_CUDA in the report {path}"),
                     made_at=r.probed_at)


def from_image(image: str, client: Any = None, gpus: bool = False) -> Reference:
    """The reference of an image on this engine: the probe run in it (no network), with the
    engine's image ID and repository digest; the requirement from its config ``Env`` and its
    label ``envbuild.cuda``.

    Raises:
        EnvbuildError: (exit 2) no such image; (exit 3) no engine, the probe failed or
            printed an invalid report.
    """
    from builder.image import engine
    from builder.image.probecheck import run_probe

    client = client or engine.connect()
    doc = run_probe(client, image, gpus=gpus)
    r = nodereport.validate(doc, f"probe of {image}")
    img = client.images.get(image)
    digests = [d.rsplit("@", 1)[1] for d in img.attrs.get("RepoDigests") or [] if isinstance(d, str) and "@" in d]
    env = engine.image_env(client, image)
    labels = engine.image_labels(client, image)
    r = msgspec.structs.replace(r, image=Image(ref=image, digest=digests[0] if digests else None, id=img.id))
    req = CudaRequirement(torch_cuda=labels.get(LABEL_CUDA) or (r.torch.cuda if r.torch else None),
                          torch=r.torch.version if r.torch else None, require=env.get("NVIDIA_REQUIRE_CUDA"),
                          source=f"config Env of image {image}", disabled=is_true(env.get("NVIDIA_DISABLE_REQUIRE")))
    return Reference(kind="image", name=image, report=r, requirement=req, made_at=r.probed_at)


def sniff(path: str) -> str | None:
    """The ``schema`` of the JSON document at ``path`` (bounded read), or None."""
    doc = inputs.read_json(path, MAX_CERTIFICATE_BYTES, "certificate or node report", exit_code=ExitCode.UNREACHABLE)
    return doc.get("schema") if isinstance(doc, dict) and isinstance(doc.get("schema"), str) else None


def load_reference(ref: str, client: Any = None, gpus: bool = False) -> Reference:
    """``--against REF``: a certificate or node report file (told apart by its ``schema``),
    else an image on this engine.

    Raises:
        EnvbuildError: (exit 3) a ``.json`` name that is no file, a file that is neither a
            certificate nor a node report, or as :func:`from_certificate`,
            :func:`from_report`, :func:`from_image`.
    """
    if os.path.exists(ref) or ref.endswith(".json"):
        schema = sniff(ref)
        if schema == CERTIFICATE_SCHEMA:
            return from_certificate(ref)
        if schema in nodereport.SUPPORTED_SCHEMAS:
            return from_report(ref)
        raise EnvbuildError(f"is neither a certificate ({CERTIFICATE_SCHEMA}) nor a node report "
                            f"({', '.join(nodereport.SUPPORTED_SCHEMAS)})", file=ref, field="schema", value=schema,
                            exit_code=ExitCode.UNREACHABLE)
    from builder.oci import reference

    reference.parse(ref, field="--against")
    return from_image(ref, client, gpus)
