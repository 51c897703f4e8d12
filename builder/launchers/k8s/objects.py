"""The Kubernetes objects of a certification run, as plain dicts of the API (ConfigMap, headless
Service, Indexed Job, TrainJob), pods under the "restricted" Pod Security Standard unless ``--rdma``."""

from __future__ import annotations

import hashlib
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from builder.agent.payload import MOUNT_POINT
from builder.core.errors import EnvbuildError, UsageError

from ..base import HOME, RESULTS_MOUNT, LaunchSpec, socket_env, torchrun_argv
from . import options as place
from .options import (
    DEFAULT_OPTIONS,
    TRAINJOB_API,
    K8sOptions,
    check_ifname,
    check_labels,
    check_options,
    configmap_name,
    manifest_labels,
    master_addr,
    object_name,
    require_digest,
)

#: ConfigMaps hold at most 1 MiB of data (Kubernetes ConfigMap docs).
CONFIGMAP_MAX_BYTES = 1024 * 1024
#: Files the pods cannot run without.
REQUIRED = ("bench/__main__.py", "probe/__main__.py")

_CM_KEY_RE = re.compile(r"[-._a-zA-Z0-9]+")


def in_image_code() -> dict[str, str]:
    """:func:`builder.agent.payload.files` as text. Raises EnvbuildError (exit 2): a file is not UTF-8."""
    from builder.agent import payload

    out: dict[str, str] = {}
    for path, data in payload.files().items():
        try:
            out[path] = data.decode("utf-8")
        except UnicodeDecodeError as e:
            raise EnvbuildError(f"is not UTF-8: {e}", file=str(payload.AGENT_DIR / path)) from None
    return out


def code_key(path: str) -> str:
    """ConfigMap key of an in-image file (``bench/node.py``: ``bench.node.py``); EnvbuildError (exit 2)."""
    key = path.replace("/", ".")
    if not _CM_KEY_RE.fullmatch(key) or len(key) > 253:
        raise EnvbuildError("cannot be a ConfigMap key", field="file", value=path)
    return key


@dataclass(frozen=True)
class CodeData:
    """The in-image code as the ConfigMap and the pods' volume carry it."""

    data: dict[str, str]
    items: list[dict[str, str]]
    sha256: str


def code_data(code: Mapping[str, str] | None = None) -> CodeData:
    """EnvbuildError (exit 2): an entry point missing, two paths with one key, over :data:`CONFIGMAP_MAX_BYTES`."""
    files = dict(in_image_code() if code is None else code)
    if any(p not in files for p in REQUIRED):
        raise EnvbuildError("in-image code lacks probe/__main__.py or bench/__main__.py", field="code",
                            value=sorted(files))
    paths = sorted(files)
    keys = [code_key(p) for p in paths]
    if len(set(keys)) != len(keys):
        raise EnvbuildError("two files map to the same ConfigMap key", field="code", value=paths)
    size = sum(len(t.encode("utf-8")) for t in files.values())
    if size > CONFIGMAP_MAX_BYTES:
        raise EnvbuildError(f"in-image code is {size} bytes; a ConfigMap holds at most "
                            f"{CONFIGMAP_MAX_BYTES}", field="code", value=paths)
    digest = hashlib.sha256()
    for p in paths:
        digest.update(p.encode() + b"\0" + files[p].encode("utf-8") + b"\0")
    return CodeData(data=dict(sorted(zip(keys, (files[p] for p in paths), strict=True))),
                    items=[{"key": k, "path": p} for k, p in zip(keys, paths, strict=True)], sha256=digest.hexdigest())


#: Where the in-image code is mounted (read-only); also ``PYTHONPATH``.
CODE_MOUNT = MOUNT_POINT
#: The arbitrary UID and GID the pods run as (no passwd entry in the image).
RUN_UID = 12345
#: Name of the container in each pod (Kubeflow's runtimes name theirs ``node`` as well).
CONTAINER_NAME = "node"
#: Name of the rendezvous port (an IANA_SVC_NAME: at most 15 characters).
PORT_NAME = "rendezvous"
#: Name of the volume holding the in-image code (the ConfigMap).
CODE_VOLUME = "envbuild-code"
#: File mode of the in-image code files (read-only for all).
CODE_MODE = 0o444
#: Pod annotation holding an Indexed Job pod's completion index (Kubernetes Job docs).
INDEX_ANNOTATION = "batch.kubernetes.io/job-completion-index"
#: Label the Job controller puts on its pods (Kubernetes >= 1.27).
JOB_NAME_LABEL = "batch.kubernetes.io/job-name"
#: Marker lines around each result document in a pod's log.
RESULT_BEGIN = "@@envbuild-result-begin"
RESULT_END = "@@envbuild-result-end"

#: The POSIX ``sh`` wrapper each pod runs: torchrun (``"$@"``, the container's ``args``),
#: then every result file of this node between marker lines, then torchrun's exit status.
#: ``ENVBUILD_RESULTS`` is set to :data:`RESULTS_MOUNT` in the pod's environment.
NODE_SCRIPT = (
    '"$@"\n'
    "status=$?\n"
    'for f in "$ENVBUILD_RESULTS"/rank-*.json; do\n'
    '  [ -f "$f" ] || continue\n'
    f"  printf '\\n{RESULT_BEGIN} %s\\n' \"${{f##*/}}\"\n"
    '  cat "$f"\n'
    f"  printf '\\n{RESULT_END} %s\\n' \"${{f##*/}}\"\n"
    "done\n"
    'exit "$status"\n'
)
#: The container's ``command``: the wrapper, with ``args`` as its positional parameters.
COMMAND = ["/bin/sh", "-c", NODE_SCRIPT, "envbuild-node"]

_ENV_NAME_RE = re.compile(r"[-._a-zA-Z][-._a-zA-Z0-9]*")


def shm_quantity(size: str | None) -> str | None:
    """A Docker ``--shm-size`` value as a Kubernetes quantity. Raises EnvbuildError (exit 64)."""
    if size is None or str(size).strip() == "":
        return None
    text = str(size).strip()
    m = re.fullmatch(r"([1-9][0-9]*)\s*([kKmMgGtT]i)", text)
    if m:
        return f"{m.group(1)}{m.group(2)[0].upper()}i"
    m = re.fullmatch(r"([1-9][0-9]*)\s*([bBkKmMgGtT]?)[bB]?", text)
    if not m:
        raise UsageError("is not a size (e.g. 256m, 8g)", field="shm_size", value=size)
    number, unit = m.group(1), m.group(2).lower()
    return number if unit in ("", "b") else f"{number}{unit.upper()}i"


def base_env() -> list[dict[str, Any]]:
    """The environment every envbuild pod starts with (the in-image code on ``PYTHONPATH``)."""
    return [
        {"name": "PYTHONPATH", "value": CODE_MOUNT},
        {"name": "PYTHONDONTWRITEBYTECODE", "value": "1"},
        {"name": "PYTHONUNBUFFERED", "value": "1"},
        {"name": "HOME", "value": HOME},
        # getpass.getuser() looks at USER before the (missing) passwd entry
        {"name": "USER", "value": "envbuild"},
    ]


def code_volume(configmap: str, items: list[dict[str, str]]) -> dict[str, Any]:
    """The ConfigMap ``configmap`` projected as ``items`` (``[{"key", "path"}]``), read-only for all."""
    return {"name": CODE_VOLUME, "configMap": {"name": configmap, "defaultMode": FileMode(CODE_MODE), "items": items}}


def pod_env(spec: LaunchSpec, socket_ifname: str | None = None) -> list[dict[str, Any]]:
    """``env``: the launcher's, then ``spec.env``; ``NCCL_DEBUG=INFO`` (transports logged); UsageError (64)."""
    ifname = socket_ifname if socket_ifname is not None else spec.socket_ifname
    env: list[dict[str, Any]] = [
        *base_env(),
        *({"name": k, "value": v} for k, v in socket_env(ifname).items()),
        {"name": "ENVBUILD_RUN_ID", "value": spec.run_id},
        {"name": "ENVBUILD_NODE",
         "valueFrom": {"fieldRef": {"fieldPath": f"metadata.annotations['{INDEX_ANNOTATION}']"}}},
        {"name": "ENVBUILD_RESULTS", "value": RESULTS_MOUNT},
    ]
    if spec.backend == "nccl":
        env.append({"name": "NCCL_DEBUG", "value": "INFO"})
    for name, value in spec.env.items():
        if not _ENV_NAME_RE.fullmatch(name):
            raise UsageError("is not an environment variable name", field="env", value=name)
        entry = {"name": name, "value": str(value)}
        names = [e["name"] for e in env]
        if name in names:
            env[names.index(name)] = entry
        else:
            env.append(entry)
    return env


def volume_mounts() -> list[dict[str, Any]]:
    """The container's ``volumeMounts`` (the volumes of :func:`volumes`)."""
    return [{"name": CODE_VOLUME, "mountPath": CODE_MOUNT, "readOnly": True}, {"name": "dshm", "mountPath": "/dev/shm"},
            {"name": "tmp", "mountPath": "/tmp"}, {"name": "home", "mountPath": HOME},
            {"name": "results", "mountPath": RESULTS_MOUNT}]


class FileMode(int):
    """A file mode, written in octal in the manifests (YAML 1.1, as Kubernetes reads it)."""


def volumes(configmap: str, items: list[dict[str, str]], shm_limit: str | None) -> list[dict[str, Any]]:
    """The pod's ``volumes``: the code ConfigMap (mode 0444) and ``/dev/shm`` in memory."""
    shm: dict[str, Any] = {"medium": "Memory"}
    if shm_limit:
        shm["sizeLimit"] = shm_limit
    return [code_volume(configmap, items), {"name": "dshm", "emptyDir": shm}, {"name": "tmp", "emptyDir": {}},
            {"name": "home", "emptyDir": {}}, {"name": "results", "emptyDir": {}}]


def pod_security_context(root: bool = False) -> dict[str, Any]:
    """The pod's ``securityContext`` ("restricted" Pod Security Standard; ``root``: as UID 0)."""
    user: dict[str, Any] = {"runAsUser": 0} if root else {"runAsNonRoot": True, "runAsUser": RUN_UID,
                                                         "runAsGroup": RUN_UID}
    return {**user, "seccompProfile": {"type": "RuntimeDefault"}}


def container_security_context(add: tuple[str, ...] = ()) -> dict[str, Any]:
    """The container's ``securityContext`` (the "restricted" Pod Security Standard)."""
    caps: dict[str, Any] = {"add": list(add), "drop": ["ALL"]} if add else {"drop": ["ALL"]}
    return {"allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True,
            **({} if add else {"runAsNonRoot": True}), "capabilities": caps}


def anti_affinity(spread: str, run_id: str) -> dict[str, Any] | None:
    """The pod's anti-affinity among the run's pods for ``spread`` (``none``: None)."""
    term = {"topologyKey": "kubernetes.io/hostname", "labelSelector": {"matchLabels": {"envbuild.run": run_id}}}
    if spread == "required":
        return {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [term]}}
    if spread == "preferred":
        return {"podAntiAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [
            {"weight": 100, "podAffinityTerm": term}]}}
    return None


#: Seconds a pod gets between SIGTERM and SIGKILL.
GRACE_PERIOD_S = 10


@dataclass(frozen=True)
class RenderContext:
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
    resources: dict[str, Any]
    rdma: tuple[str, int] | None

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
        raise UsageError("must be >= 1", field="nodes", value=spec.nodes)
    if spec.gpus_per_node < 0:
        raise UsageError("must be >= 0", field="gpus_per_node", value=spec.gpus_per_node)
    if not 1 <= spec.port <= 65535:
        raise UsageError("is not a TCP port", field="port", value=spec.port)
    if not spec.timeout_s > 0:
        raise UsageError("must be > 0", field="timeout_s", value=spec.timeout_s)
    check_ifname(spec.socket_ifname)


def render_context(spec: LaunchSpec, options: K8sOptions = DEFAULT_OPTIONS, code: Mapping[str, str] | None = None,
                   environ: Mapping[str, str] | None = None) -> RenderContext:
    """``spec`` and ``options`` checked; arguments and errors as :func:`~.manifests.render_manifests`."""
    image = require_digest(spec.image, options.allow_tag)
    _check_spec(spec)
    check_options(options)
    data = code_data(code)
    labels = manifest_labels(spec, environ)
    name = object_name(spec.run_id)
    annotations = check_labels({"envbuild.image": image, **options.annotations}, what="annotation")
    for flag, value in (("--rdma", options.rdma), ("--priority-class", options.placement.priority_class)):
        if options.kubeflow and value is not None:  # a TrainJob's runtime sets them
            raise UsageError("is set by the TrainJob's runtime; render the Indexed Job for it", field=flag, value=value)
    args = torchrun_argv(spec, "$(JOB_COMPLETION_INDEX)", master_addr=master_addr(spec.run_id),
                         topology=not options.kubeflow, to_stdout=False)
    env = pod_env(spec, options.socket_ifname)
    shm = shm_quantity(spec.shm_size)
    rdma = place.check_rdma(options.rdma, options.rdma_network)
    res = place.resources("job", options.placement, spec.nproc_per_node, shm,
                          {"nvidia.com/gpu": spec.gpus_per_node, **dict([rdma] if rdma else [])})
    return RenderContext(spec=spec, options=options, image=image, name=name, labels=labels, annotations=annotations,
                         code=data, env=env, args=args, shm_limit=shm, resources=res, rdma=rdma)


def metadata(name: str, labels: Mapping[str, str], namespace: str | None = None,
             annotations: Mapping[str, str] | None = None) -> dict[str, Any]:
    """An object's ``metadata`` (``namespace`` None: the context's, or a cluster-scoped object)."""
    meta: dict[str, Any] = {"name": name}
    if namespace:
        meta["namespace"] = namespace
    meta["labels"] = dict(labels)
    if annotations is not None:
        meta["annotations"] = dict(annotations)
    return meta


def _metadata(ctx: RenderContext, name: str, annotations: Mapping[str, str] | None) -> dict[str, Any]:
    return metadata(name, ctx.labels, ctx.options.namespace, annotations)


def code_configmap(name: str, labels: Mapping[str, str], namespace: str | None, code: CodeData) -> dict[str, Any]:
    """The immutable ConfigMap ``name`` holding ``code`` (a run's in-image code, or the gate's)."""
    return {"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": metadata(name, labels, namespace, {"envbuild.code-sha256": code.sha256}),
            "immutable": True, "data": dict(code.data)}


def configmap(ctx: RenderContext) -> dict[str, Any]:
    """The ConfigMap ``envbuild-<run>-code`` holding the in-image code."""
    return code_configmap(ctx.configmap_name, ctx.labels, ctx.options.namespace, ctx.code)


def service(ctx: RenderContext) -> dict[str, Any]:
    """The headless Service ``envbuild-<run>``; pods with it as ``subdomain`` are ``<job>-<i>.<service>``."""
    return {
        "apiVersion": "v1", "kind": "Service",
        "metadata": _metadata(ctx, ctx.name, None),
        "spec": {
            "clusterIP": "None",
            "publishNotReadyAddresses": True,
            "selector": {JOB_NAME_LABEL: ctx.name},
            "ports": [{"name": PORT_NAME, "port": ctx.spec.port, "targetPort": ctx.spec.port, "protocol": "TCP"}],
        },
    }


def _container(ctx: RenderContext) -> dict[str, Any]:
    c: dict[str, Any] = {"name": CONTAINER_NAME, "image": ctx.image, "imagePullPolicy": "IfNotPresent",
                         "command": list(COMMAND), "args": list(ctx.args), "env": list(ctx.env),
                         "ports": [{"name": PORT_NAME, "containerPort": ctx.spec.port, "protocol": "TCP"}]}
    c["resources"] = ctx.resources
    c["securityContext"] = container_security_context(("IPC_LOCK",) if ctx.rdma else ())
    c["volumeMounts"] = volume_mounts()
    return c


def job(ctx: RenderContext) -> dict[str, Any]:
    """The Indexed Job ``envbuild-<run>``: pod i is node rank i; ``backoffLimit: 0`` (a failed node fails the run)."""
    spec = ctx.spec
    pod_spec: dict[str, Any] = {"subdomain": ctx.name, "restartPolicy": "Never",
                                "terminationGracePeriodSeconds": GRACE_PERIOD_S, "enableServiceLinks": False,
                                "automountServiceAccountToken": False,
                                "securityContext": pod_security_context(root=ctx.rdma is not None)}
    host = ctx.options.rdma_network == "host"
    if host:
        pod_spec.update(hostNetwork=True, dnsPolicy="ClusterFirstWithHostNet")
    place.place(pod_spec, ctx.options.placement, affinity=anti_affinity(ctx.options.spread, spec.run_id))
    pod_spec["containers"] = [_container(ctx)]
    pod_spec["volumes"] = volumes(ctx.configmap_name, ctx.code.items, ctx.shm_limit)
    pss = place.pss_annotations("restricted" if not ctx.rdma else "rdma-host" if host else "rdma")
    pod_annotations = dict(pss)
    if ctx.options.rdma_network and not host:
        pod_annotations[place.NETWORKS_ANNOTATION] = ctx.options.rdma_network
    return {
        "apiVersion": "batch/v1", "kind": "Job",
        "metadata": _metadata(ctx, ctx.name, {**ctx.annotations, **pss}),
        "spec": {
            "completionMode": "Indexed", "completions": spec.nodes, "parallelism": spec.nodes,
            "backoffLimit": 0, "activeDeadlineSeconds": max(1, math.ceil(spec.timeout_s)),
            "ttlSecondsAfterFinished": int(ctx.options.ttl_s),
            "template": {"metadata": {"labels": dict(ctx.labels), "annotations": pod_annotations}, "spec": pod_spec},
        },
    }


def trainjob(ctx: RenderContext) -> dict[str, Any]:
    """A Kubeflow Trainer v2.1 TrainJob ``envbuild-<run>`` on the options' runtime (it sets ``PET_*``)."""
    trainer: dict[str, Any] = {"image": ctx.image, "command": list(COMMAND), "args": list(ctx.args),
                               "env": list(ctx.env), "numNodes": ctx.spec.nodes,
                               "numProcPerNode": ctx.spec.nproc_per_node}
    trainer["resourcesPerNode"] = ctx.resources
    override: dict[str, Any] = {}
    place.place(override, ctx.options.placement)
    return {
        "apiVersion": TRAINJOB_API, "kind": "TrainJob",
        "metadata": _metadata(ctx, ctx.name, ctx.annotations),
        "spec": {
            "runtimeRef": {"name": ctx.options.runtime, "apiGroup": "trainer.kubeflow.org",
                           "kind": "ClusterTrainingRuntime"},
            "trainer": trainer,
            "podTemplateOverrides": [{
                "targetJobs": [{"name": CONTAINER_NAME}],
                "metadata": {"labels": dict(ctx.labels)},
                "spec": {
                    **override,
                    "volumes": volumes(ctx.configmap_name, ctx.code.items, ctx.shm_limit),
                    "containers": [{"name": CONTAINER_NAME, "volumeMounts": volume_mounts()}],
                },
            }],
        },
    }
