"""The Kubernetes objects of a certification run, as plain dicts of the Kubernetes API.

:func:`render_context` checks a :class:`~builder.launchers.base.LaunchSpec` and its
:class:`~.options.K8sOptions` once into a :class:`RenderContext`; one function per kind
builds its object from it: :func:`configmap` (the in-image code), :func:`service` (the
headless Service), :func:`job` (the Indexed Job), :func:`trainjob` (Kubeflow Trainer v2).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from builder.core.errors import EnvbuildError, ExitCode

from ..base import SOCKET_IFNAME_RE, LaunchSpec
from . import pod
from .code import CodeData, code_data
from .naming import check_labels, configmap_name, manifest_labels, master_addr, object_name, require_digest
from .options import DEFAULT_OPTIONS, TRAINJOB_API, K8sOptions, check_options

#: Seconds a pod gets between SIGTERM and SIGKILL.
GRACE_PERIOD_S = 10


@dataclass(frozen=True)
class RenderContext:
    """What every object of a run is built from, checked by :func:`render_context`.

    Attributes:
        spec: the launch (nodes, GPUs, port, run id...).
        options: how to render.
        image: the image reference the pods run (by digest unless ``allow_tag``).
        name: ``envbuild-<run>``: the Job, Service and TrainJob.
        labels: of every object and pod (:func:`~.naming.manifest_labels`).
        annotations: of the Job/TrainJob (``envbuild.image`` and the options').
        code: the in-image code as ConfigMap data.
        env: the container's ``env``.
        args: the container's ``args``.
        shm_limit: ``sizeLimit`` of ``/dev/shm`` (a Kubernetes quantity) or None.
    """

    spec: LaunchSpec
    options: K8sOptions
    image: str
    name: str
    labels: dict[str, str]
    annotations: dict[str, str]
    code: CodeData
    env: list[dict[str, Any]]
    args: list[str]
    shm_limit: str | None

    @property
    def configmap_name(self) -> str:
        """``envbuild-<run>-code``."""
        return configmap_name(self.spec.run_id)

    @property
    def master_addr(self) -> str:
        """DNS name of node 0 (:func:`~.naming.master_addr`)."""
        return master_addr(self.spec.run_id, self.options.kubeflow)


def _check_spec(spec: LaunchSpec) -> None:
    """Raises EnvbuildError (exit 64) for values of ``spec`` out of range."""
    if spec.nodes < 1:
        raise EnvbuildError("must be >= 1", field="nodes", value=spec.nodes, exit_code=ExitCode.USAGE)
    if spec.gpus_per_node < 0:
        raise EnvbuildError("must be >= 0", field="gpus_per_node", value=spec.gpus_per_node,
                            exit_code=ExitCode.USAGE)
    if not 1 <= spec.port <= 65535:
        raise EnvbuildError("is not a TCP port", field="port", value=spec.port, exit_code=ExitCode.USAGE)
    if not spec.timeout_s > 0:
        raise EnvbuildError("must be > 0", field="timeout_s", value=spec.timeout_s, exit_code=ExitCode.USAGE)
    if spec.socket_ifname is not None and not SOCKET_IFNAME_RE.fullmatch(spec.socket_ifname):
        raise EnvbuildError("is not a network interface name list", field="socket_ifname",
                            value=spec.socket_ifname, exit_code=ExitCode.USAGE)


def render_context(spec: LaunchSpec, options: K8sOptions = DEFAULT_OPTIONS, code: Mapping[str, str] | None = None,
                   environ: Mapping[str, str] | None = None) -> RenderContext:
    """Check ``spec`` and ``options`` into a :class:`RenderContext`. Arguments and errors
    as :func:`~.manifests.render_manifests`."""
    image = require_digest(spec.image, options.allow_tag)
    _check_spec(spec)
    check_options(options)
    data = code_data(code)
    labels = manifest_labels(spec, environ)
    name = object_name(spec.run_id)
    annotations = check_labels({"envbuild.image": image, **options.annotations}, what="annotation")
    args = pod.torchrun_args(spec, options.kubeflow)
    env = pod.pod_env(spec, options.socket_ifname)
    return RenderContext(spec=spec, options=options, image=image, name=name, labels=labels, annotations=annotations,
                         code=data, env=env, args=args, shm_limit=pod.shm_quantity(spec.shm_size))


def _metadata(ctx: RenderContext, name: str, annotations: Mapping[str, str] | None) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "labels": dict(ctx.labels)}
    if annotations is not None:
        meta["annotations"] = dict(annotations)
    return meta


def configmap(ctx: RenderContext) -> dict[str, Any]:
    """The immutable ConfigMap ``envbuild-<run>-code`` holding the in-image code."""
    return {
        "apiVersion": "v1", "kind": "ConfigMap",
        "metadata": _metadata(ctx, ctx.configmap_name, {"envbuild.code-sha256": ctx.code.sha256}),
        "immutable": True,
        "data": dict(ctx.code.data),
    }


def service(ctx: RenderContext) -> dict[str, Any]:
    """The headless Service ``envbuild-<run>`` selecting the Job's pods: with the pods'
    ``subdomain`` set to it, pod i resolves as ``<job>-<i>.<service>``."""
    return {
        "apiVersion": "v1", "kind": "Service",
        "metadata": _metadata(ctx, ctx.name, None),
        "spec": {
            "clusterIP": "None",
            "publishNotReadyAddresses": True,
            "selector": {pod.JOB_NAME_LABEL: ctx.name},
            "ports": [{"name": pod.PORT_NAME, "port": ctx.spec.port, "targetPort": ctx.spec.port, "protocol": "TCP"}],
        },
    }


def _container(ctx: RenderContext) -> dict[str, Any]:
    """The one container of each Job pod."""
    c: dict[str, Any] = {
        "name": pod.CONTAINER_NAME, "image": ctx.image, "imagePullPolicy": "IfNotPresent",
        "command": list(pod.COMMAND), "args": list(ctx.args), "env": list(ctx.env),
        "ports": [{"name": pod.PORT_NAME, "containerPort": ctx.spec.port, "protocol": "TCP"}],
    }
    if ctx.spec.gpus_per_node:
        c["resources"] = pod.gpu_resources(ctx.spec.gpus_per_node)
    c["securityContext"] = pod.container_security_context()
    c["volumeMounts"] = pod.volume_mounts()
    return c


def job(ctx: RenderContext) -> dict[str, Any]:
    """The Indexed Job ``envbuild-<run>``: N pods, pod i runs torchrun with
    ``--node-rank i``; ``backoffLimit: 0`` (a failed node fails the run),
    ``activeDeadlineSeconds`` the timeout, ``ttlSecondsAfterFinished`` the options'."""
    spec = ctx.spec
    pod_spec: dict[str, Any] = {
        "subdomain": ctx.name, "restartPolicy": "Never", "terminationGracePeriodSeconds": GRACE_PERIOD_S,
        "enableServiceLinks": False, "automountServiceAccountToken": False,
        "securityContext": pod.pod_security_context(),
    }
    affinity = pod.anti_affinity(ctx.options.spread, spec.run_id)
    if affinity:
        pod_spec["affinity"] = affinity
    pod_spec["containers"] = [_container(ctx)]
    pod_spec["volumes"] = pod.volumes(ctx.configmap_name, ctx.code.items, ctx.shm_limit)
    return {
        "apiVersion": "batch/v1", "kind": "Job",
        "metadata": _metadata(ctx, ctx.name, ctx.annotations),
        "spec": {
            "completionMode": "Indexed", "completions": spec.nodes, "parallelism": spec.nodes,
            "backoffLimit": 0, "activeDeadlineSeconds": max(1, math.ceil(spec.timeout_s)),
            "ttlSecondsAfterFinished": int(ctx.options.ttl_s),
            "template": {"metadata": {"labels": dict(ctx.labels)}, "spec": pod_spec},
        },
    }


def trainjob(ctx: RenderContext) -> dict[str, Any]:
    """The Kubeflow Trainer v2 TrainJob ``envbuild-<run>`` (Trainer v2.1 field names) on the
    ``ClusterTrainingRuntime`` of the options; the runtime sets the ``PET_*`` topology."""
    trainer: dict[str, Any] = {
        "image": ctx.image, "command": list(pod.COMMAND), "args": list(ctx.args), "env": list(ctx.env),
        "numNodes": ctx.spec.nodes, "numProcPerNode": ctx.spec.nproc_per_node,
    }
    if ctx.spec.gpus_per_node:
        trainer["resourcesPerNode"] = pod.gpu_resources(ctx.spec.gpus_per_node)
    return {
        "apiVersion": TRAINJOB_API, "kind": "TrainJob",
        "metadata": _metadata(ctx, ctx.name, ctx.annotations),
        "spec": {
            "runtimeRef": {"name": ctx.options.runtime, "apiGroup": "trainer.kubeflow.org",
                           "kind": "ClusterTrainingRuntime"},
            "trainer": trainer,
            "podTemplateOverrides": [{
                "targetJobs": [{"name": pod.CONTAINER_NAME}],
                "metadata": {"labels": dict(ctx.labels)},
                "spec": {
                    "volumes": pod.volumes(ctx.configmap_name, ctx.code.items, ctx.shm_limit),
                    "containers": [{"name": pod.CONTAINER_NAME, "volumeMounts": pod.volume_mounts()}],
                },
            }],
        },
    }
