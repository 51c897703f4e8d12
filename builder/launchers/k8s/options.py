"""How the manifests are rendered (and applied): :class:`K8sOptions`, checked by
:func:`check_options` before anything is contacted."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from builder.core.errors import EnvbuildError, ExitCode

from ..base import SOCKET_IFNAME_RE
from .naming import DNS_SUBDOMAIN_RE

#: Default ``ttlSecondsAfterFinished`` of the Job (seconds): finished Jobs are removed.
DEFAULT_TTL_S = 3600
#: API version of the Kubeflow Trainer v2 TrainJob.
TRAINJOB_API = "trainer.kubeflow.org/v1alpha1"
#: Default ClusterTrainingRuntime of a TrainJob (ships with Kubeflow Trainer).
DEFAULT_RUNTIME = "torch-distributed"
#: Kubernetes release whose OpenAPI schemas the manifests are checked against in tests.
K8S_VERSION = "1.30"
#: Values of ``spread``.
SPREADS = ("preferred", "required", "none")


@dataclass(frozen=True)
class K8sOptions:
    """How to render (and apply) the manifests.

    Attributes:
        kubeflow: render a Kubeflow Trainer v2 ``TrainJob`` instead of Job + Service.
        runtime: the TrainJob's ``ClusterTrainingRuntime`` (default ``torch-distributed``).
        allow_tag: accept an image reference without digest (development clusters).
        ttl_s: ``ttlSecondsAfterFinished`` of the Job (seconds).
        spread: pod anti-affinity on ``kubernetes.io/hostname``: ``"preferred"``,
            ``"required"`` (each node on its own host; pods stay Pending without enough
            hosts) or ``"none"``.
        socket_ifname: the ``--socket-ifname`` override: sets ``GLOO_SOCKET_IFNAME`` and
            ``NCCL_SOCKET_IFNAME`` (:func:`~builder.launchers.base.socket_env`); None (the
            default): ``spec.socket_ifname``, else neither is set and the image's own
            settings stay in effect (unset, NCCL and gloo find the pod's interface by
            themselves). ``spec.env`` overrides either.
        annotations: extra annotations of the Job/TrainJob (e.g. the lock hash).
    """

    kubeflow: bool = False
    runtime: str = DEFAULT_RUNTIME
    allow_tag: bool = False
    ttl_s: int = DEFAULT_TTL_S
    spread: str = "preferred"
    socket_ifname: str | None = None
    annotations: Mapping[str, str] = field(default_factory=dict)


#: The default options (frozen: one object serves every call).
DEFAULT_OPTIONS = K8sOptions()


def check_options(options: K8sOptions) -> None:
    """Check the options that need no spec (the command line calls it before contacting
    anything).

    Raises:
        EnvbuildError: (exit 64) a bad spread, a negative TTL, an interface name list
            that is not one (:data:`~builder.launchers.base.SOCKET_IFNAME_RE`), a TrainJob
            runtime that is not a DNS subdomain.
    """
    if options.spread not in SPREADS:
        raise EnvbuildError("is not preferred, required or none", field="spread", value=options.spread,
                            exit_code=ExitCode.USAGE)
    if not isinstance(options.ttl_s, int) or options.ttl_s < 0:
        raise EnvbuildError("must be >= 0", field="ttl_s", value=options.ttl_s, exit_code=ExitCode.USAGE)
    if options.socket_ifname is not None and not SOCKET_IFNAME_RE.fullmatch(options.socket_ifname):
        raise EnvbuildError("is not a network interface name list", field="socket_ifname",
                            value=options.socket_ifname, exit_code=ExitCode.USAGE)
    if options.kubeflow and not DNS_SUBDOMAIN_RE.fullmatch(options.runtime or ""):
        raise EnvbuildError("is not a runtime name", field="runtime", value=options.runtime,
                            exit_code=ExitCode.USAGE)
