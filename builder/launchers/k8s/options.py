"""What a Kubernetes run is rendered from, checked whole (Kubernetes "Labels and Selectors" ->
"Syntax and character set")."""

from __future__ import annotations

import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from builder.core.errors import EnvbuildError, ExitCode, UsageError
from builder.core.inputs import MAX_REPORT_BYTES, read_json
from builder.core.paths import image_dir
from builder.oci import reference

from ..base import SOCKET_IFNAME_RE, LaunchSpec

_RUN_ID_RE = re.compile(r"[a-z0-9]([a-z0-9-]{0,38}[a-z0-9])?")
_NAMESPACE_RE = re.compile(r"[a-z0-9](?:[-a-z0-9]{0,61}[a-z0-9])?")
_LABEL_NAME_RE = re.compile(r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?")
#: An RFC 1123 subdomain (object names such as a TrainJob runtime, label key prefixes).
DNS_SUBDOMAIN_RE = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")


def check_run_id(run_id: str) -> str:
    """``run_id``, checked to fit object names. Raises EnvbuildError (exit 64)."""
    if not _RUN_ID_RE.fullmatch(run_id or ""):
        raise UsageError("is not a run id (1 to 40 of [a-z0-9-], alphanumeric at both ends)",
                         field="run_id", value=run_id)
    return run_id


def object_name(run_id: str) -> str:
    """Name of the Job, Service and TrainJob of run ``run_id``: ``envbuild-<run>``."""
    return f"envbuild-{check_run_id(run_id)}"


def configmap_name(run_id: str) -> str:
    """Name of the code ConfigMap of run ``run_id``: ``envbuild-<run>-code``."""
    return f"{object_name(run_id)}-code"


def master_addr(run_id: str, kubeflow: bool = False) -> str:
    """DNS name of node 0 inside the namespace."""
    name = object_name(run_id)
    return f"{name}-node-0-0.{name}" if kubeflow else f"{name}-0.{name}"


def check_labels(labels: Mapping[str, str], what: str = "label") -> dict[str, str]:
    """Check label (or annotation) keys and values; returns them sorted. Raises UsageError (exit 64)."""
    out = {}
    for key, value in sorted(labels.items()):
        prefix, _, name = key.rpartition("/")
        if (prefix and (len(prefix) > 253 or not DNS_SUBDOMAIN_RE.fullmatch(prefix))) \
                or not _LABEL_NAME_RE.fullmatch(name):
            raise UsageError(f"is not a Kubernetes {what} key", field=what, value=key)
        value = str(value)
        if what == "label" and value and not _LABEL_NAME_RE.fullmatch(value):
            raise UsageError(f"is not a Kubernetes label value (key {key})", field=what, value=value)
        out[key] = value
    return out


def manifest_labels(spec: LaunchSpec, environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """Labels of every object; envbuild's own win over ``spec.labels`` and ``$ENVBUILD_EXTRA_LABELS``.
    Raises EnvbuildError: (exit 64) an invalid label; (exit 2) a malformed ``$ENVBUILD_EXTRA_LABELS``."""
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
    Raises EnvbuildError: (exit 2) a reference without digest and ``allow_tag`` false; (exit 64) not an image
    reference."""
    ref = reference.parse(text, field="image")
    if ref.by_digest or allow_tag:
        return text
    hint = f"use {candidates[0]}" if candidates else "push it and use REPO@sha256:<digest>"
    raise EnvbuildError(
        f"is not pinned by digest: pods would run whatever the tag points to then; {hint} "
        "(or --allow-tag on a development cluster)",
        field="image", value=text,
    )


#: Default ``ttlSecondsAfterFinished`` of the Job (seconds): finished Jobs are removed.
DEFAULT_TTL_S = 3600
#: API version of the Kubeflow Trainer v2 TrainJob.
TRAINJOB_API = "trainer.kubeflow.org/v1alpha1"
#: Default ClusterTrainingRuntime of a TrainJob (ships with Kubeflow Trainer).
DEFAULT_RUNTIME = "torch-distributed"
#: Kubernetes releases whose OpenAPI schemas the manifests are checked against in tests.
K8S_VERSIONS = ("1.30", "1.35")
#: Values of ``spread``.
SPREADS = ("preferred", "required", "none")


@dataclass(frozen=True)
class Placement:
    """Scheduling and resources of the pods (values as the command line gives them)."""

    requests: Mapping[str, str] = field(default_factory=dict)
    limits: Mapping[str, str] = field(default_factory=dict)
    node_selector: Mapping[str, str] = field(default_factory=dict)
    tolerations: tuple[str, ...] = ()
    node_affinity: tuple[str, ...] = ()
    priority_class: str | None = None


@dataclass(frozen=True)
class K8sOptions:
    """How to render (and apply) the manifests (``rdma``: ``--rdma NAME=N``; ``rdma_network``:
    ``host`` or secondary networks; ``namespace``: of the objects, else the context's)."""

    kubeflow: bool = False
    runtime: str = DEFAULT_RUNTIME
    allow_tag: bool = False
    ttl_s: int = DEFAULT_TTL_S
    spread: str = "preferred"
    socket_ifname: str | None = None
    annotations: Mapping[str, str] = field(default_factory=dict)
    placement: Placement = field(default_factory=Placement)
    namespace: str | None = None
    rdma: str | None = None
    rdma_network: str | None = None


#: The default options (frozen: one object serves every call).
DEFAULT_OPTIONS = K8sOptions()


def check_options(options: K8sOptions) -> None:
    """The options that need no spec, checked before anything is contacted.
    Raises EnvbuildError (exit 64): naming the bad option."""
    from .placement import check_rdma, place, resources

    if options.spread not in SPREADS:
        raise UsageError("is not preferred, required or none", field="spread", value=options.spread)
    if not isinstance(options.ttl_s, int) or options.ttl_s < 0:
        raise UsageError("must be >= 0", field="ttl_s", value=options.ttl_s)
    check_ifname(options.socket_ifname)
    if options.kubeflow and not DNS_SUBDOMAIN_RE.fullmatch(options.runtime or ""):
        raise UsageError("is not a runtime name", field="runtime", value=options.runtime)
    if options.namespace is not None:
        check_namespace(options.namespace)
    resources("job", options.placement)
    place({}, options.placement)
    check_rdma(options.rdma, options.rdma_network)


def check_namespace(name: str) -> str:
    """Check a namespace name (an RFC 1123 label); returns it. Raises UsageError (exit 64)."""
    if not (isinstance(name, str) and _NAMESPACE_RE.fullmatch(name)):
        raise UsageError("is not a Kubernetes namespace name", field="--namespace", value=name)
    return name


def lock_from_file(images_dir: str | os.PathLike[str], recipe: str) -> tuple[dict[str, Any], dict[str, str]]:
    """``(lock, labels an image built from it would carry)`` of a rendered recipe.
    Raises EnvbuildError: (exit 2) missing, not JSON or not a lock; (exit 3) not a regular file, over 16 MiB."""
    from builder.recipe.fields import LOCK_SCHEMA
    from builder.recipe.lock import lock_hash

    path = image_dir(images_dir, recipe).lock
    if not os.path.lexists(path):
        raise EnvbuildError(f"not found; run `envbuild render {recipe}`", file=str(path))
    lock = read_json(path, MAX_REPORT_BYTES, "lock file", ExitCode.CHECK_FAILED)
    if not isinstance(lock, dict) or lock.get("schema") != LOCK_SCHEMA:
        raise EnvbuildError(f"is not an envbuild lock (schema {LOCK_SCHEMA})", file=str(path))
    labels = {
        "envbuild.recipe": str(lock.get("recipe") or recipe),
        "envbuild.lock-hash": lock_hash(lock),
    }
    backend = (lock.get("certify") or {}).get("backend")
    if backend:
        labels["envbuild.backend"] = str(backend)
    return lock, labels


def check_ifname(value: str | None) -> None:
    """Raises EnvbuildError (exit 64) for a ``socket_ifname`` that is not an interface name list."""
    if value is not None and not SOCKET_IFNAME_RE.fullmatch(value):
        raise UsageError("is not a network interface name list", field="socket_ifname", value=value)
