"""Names and labels of a run's Kubernetes objects, and the checks on what goes into them.

Object names are ``envbuild-<run>`` (Job, Service, TrainJob) and ``envbuild-<run>-code``
(the ConfigMap); label keys and values follow Kubernetes "Labels and Selectors" -> "Syntax
and character set".
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence

from builder.core.errors import EnvbuildError, ExitCode
from builder.oci import reference

from ..base import LaunchSpec

_RUN_ID_RE = re.compile(r"[a-z0-9]([a-z0-9-]{0,38}[a-z0-9])?")
_LABEL_NAME_RE = re.compile(r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?")
#: An RFC 1123 subdomain (object names such as a TrainJob runtime, label key prefixes).
DNS_SUBDOMAIN_RE = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")


def check_run_id(run_id: str) -> str:
    """Check that a run id can be part of object names; returns it.

    Names are ``envbuild-<run>`` (Job, Service, TrainJob: RFC 1035 labels of at most 63
    characters; pod hostnames add ``-<index>``), so the id is 1 to 40 characters of
    ``[a-z0-9-]``, starting and ending alphanumeric.

    Raises:
        EnvbuildError: (exit 64) otherwise.
    """
    if not _RUN_ID_RE.fullmatch(run_id or ""):
        raise EnvbuildError("is not a run id (1 to 40 of [a-z0-9-], alphanumeric at both ends)",
                            field="run_id", value=run_id, exit_code=ExitCode.USAGE)
    return run_id


def object_name(run_id: str) -> str:
    """Name of the Job, Service and TrainJob of run ``run_id``: ``envbuild-<run>``."""
    return f"envbuild-{check_run_id(run_id)}"


def configmap_name(run_id: str) -> str:
    """Name of the code ConfigMap of run ``run_id``: ``envbuild-<run>-code``."""
    return f"{object_name(run_id)}-code"


def master_addr(run_id: str, kubeflow: bool = False) -> str:
    """DNS name of node 0 inside the namespace.

    Indexed Job: ``<job>-0.<service>`` (pod hostname ``<job>-<index>``, subdomain = the
    headless Service). TrainJob: ``<name>-node-0-0.<name>`` (JobSet pod naming, as the
    Trainer's Torch plugin sets ``PET_MASTER_ADDR``).
    """
    name = object_name(run_id)
    return f"{name}-node-0-0.{name}" if kubeflow else f"{name}-0.{name}"


def check_labels(labels: Mapping[str, str], what: str = "label") -> dict[str, str]:
    """Check Kubernetes label (or annotation) keys and label values; returns them as a
    sorted dict.

    Key: optional DNS-subdomain prefix (<= 253) and ``/``, then a name of at most 63 of
    ``[-A-Za-z0-9_.]`` starting and ending alphanumeric. Label value: empty or such a name;
    annotation values are free text.

    Raises:
        EnvbuildError: (exit 64) an invalid key or value.
    """
    out = {}
    for key, value in sorted(labels.items()):
        prefix, _, name = key.rpartition("/")
        if (prefix and (len(prefix) > 253 or not DNS_SUBDOMAIN_RE.fullmatch(prefix))) \
                or not _LABEL_NAME_RE.fullmatch(name):
            raise EnvbuildError(f"is not a Kubernetes {what} key", field=what, value=key, exit_code=ExitCode.USAGE)
        value = str(value)
        if what == "label" and value and not _LABEL_NAME_RE.fullmatch(value):
            raise EnvbuildError(f"is not a Kubernetes label value (key {key})", field=what, value=value,
                                exit_code=ExitCode.USAGE)
        out[key] = value
    return out


def manifest_labels(spec: LaunchSpec, environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """Labels of every object: ``$ENVBUILD_EXTRA_LABELS``, then ``spec.labels``,
    then ``app.kubernetes.io/name: envbuild``, ``app.kubernetes.io/managed-by: envbuild``,
    ``envbuild: "1"`` and ``envbuild.run: <run>`` (which win); sorted.

    Raises:
        EnvbuildError: (exit 64) an invalid label; (exit 2) a malformed
            ``$ENVBUILD_EXTRA_LABELS``.
    """
    from builder.image import engine

    from ..base import extra_labels_from_env

    return check_labels({
        **extra_labels_from_env(environ),
        **spec.labels,
        "app.kubernetes.io/name": "envbuild",
        "app.kubernetes.io/managed-by": "envbuild",
        **engine.run_labels(spec.run_id),
    })


def require_digest(text: str, allow_tag: bool = False, candidates: Sequence[str] = ()) -> str:
    """Check that ``text`` names its image by digest; returns ``text`` unchanged.

    A tag can be moved after certification, so a certificate only means something for a
    reference by digest (``repo@sha256:...``, or ``repo:tag@sha256:...`` where the digest
    wins). ``allow_tag`` (``--allow-tag``, for development clusters) lets a tag through.

    Args:
        candidates: repo digests known for the image (e.g. Docker's ``RepoDigests``),
            suggested in the error.

    Raises:
        EnvbuildError: (exit 2) a reference without digest and ``allow_tag`` false;
            (exit 64) not an image reference.
    """
    ref = reference.parse(text, field="image")
    if ref.by_digest or allow_tag:
        return text
    hint = f"use {candidates[0]}" if candidates else "push it and use REPO@sha256:<digest>"
    raise EnvbuildError(
        f"is not pinned by digest: pods would run whatever the tag points to then; {hint} "
        "(or --allow-tag on a development cluster)",
        field="image", value=text,
    )
