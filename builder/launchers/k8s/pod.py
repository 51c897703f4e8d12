"""What runs in each pod: the container's command, arguments, environment and volumes.

Each pod runs the image with envbuild's in-image code mounted read-only at
:data:`CODE_MOUNT` (``PYTHONPATH``), torchrun under a POSIX ``sh`` wrapper
(:data:`NODE_SCRIPT`) that prints each rank's result file between marker lines into the
pod log, ``emptyDir`` volumes for ``/dev/shm`` (``medium: Memory``, the recipe's shm size),
``/tmp``, ``HOME`` and the results, under the "restricted" Pod Security Standard with a
read-only root filesystem. The pieces are plain data (dicts and lists of the Kubernetes
API), assembled into objects by :mod:`.objects`.
"""

from __future__ import annotations

import re
from typing import Any

from builder.agent.payload import MOUNT_POINT
from builder.core.errors import EnvbuildError, ExitCode

from ..base import LaunchSpec, socket_env
from .naming import master_addr

#: Where the in-image code is mounted (read-only); also ``PYTHONPATH``.
CODE_MOUNT = MOUNT_POINT
#: Where each rank writes ``rank-<r>.json`` inside a pod (an emptyDir).
RESULTS_MOUNT = "/results"
#: ``HOME`` inside each pod (an emptyDir).
HOME = "/tmp/home"
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
    """A Docker ``--shm-size`` value as a Kubernetes quantity for ``emptyDir.sizeLimit``.

    Docker's units are binary (``b``, ``k``, ``m``, ``g``; ``docker run`` reference,
    ``--shm-size``), Kubernetes' binary suffixes are ``Ki``, ``Mi``, ``Gi``, ``Ti``
    (Kubernetes "Quantity"); a plain ``m`` there would mean milli. ``"8g"`` -> ``"8Gi"``,
    ``"256m"`` -> ``"256Mi"``, ``"65536"`` -> ``"65536"``; a value already written as a
    binary quantity (``"1Gi"``) is kept. None or ``""`` gives None (no limit).

    Raises:
        EnvbuildError: (exit 64) not a size.
    """
    if size is None or str(size).strip() == "":
        return None
    text = str(size).strip()
    m = re.fullmatch(r"([1-9][0-9]*)\s*([kKmMgGtT]i)", text)
    if m:
        return f"{m.group(1)}{m.group(2)[0].upper()}i"
    m = re.fullmatch(r"([1-9][0-9]*)\s*([bBkKmMgGtT]?)[bB]?", text)
    if not m:
        raise EnvbuildError("is not a size (e.g. 256m, 8g)", field="shm_size", value=size,
                            exit_code=ExitCode.USAGE)
    number, unit = m.group(1), m.group(2).lower()
    return number if unit in ("", "b") else f"{number}{unit.upper()}i"


def torchrun_args(spec: LaunchSpec, kubeflow: bool = False) -> list[str]:
    """The container ``args``: torchrun running the bench.

    Indexed Job: static rendezvous on node 0 (``--node-rank $(JOB_COMPLETION_INDEX)``,
    ``--master-addr`` :func:`~.naming.master_addr`, ``--master-port`` the spec's port).
    TrainJob: no topology options; torchrun takes them from the ``PET_*`` variables the
    Trainer sets.
    """
    head = ["python3", "-m", "torch.distributed.run"]
    if not kubeflow:
        head += [
            "--nnodes", str(spec.nodes),
            "--nproc-per-node", str(spec.nproc_per_node),
            "--node-rank", "$(JOB_COMPLETION_INDEX)",
            "--master-addr", master_addr(spec.run_id),
            "--master-port", str(spec.port),
        ]
    return [*head, "--max-restarts", "0", "-m", "bench", "--out", RESULTS_MOUNT, *spec.bench_args]


def pod_env(spec: LaunchSpec, socket_ifname: str | None = None) -> list[dict[str, Any]]:
    """Environment of each node (the container's ``env``), in order: the launcher's
    settings, then ``spec.env`` (a name already set is replaced in place).

    ``ENVBUILD_NODE`` comes from the pod's completion-index annotation (downward API);
    ``NCCL_DEBUG=INFO`` with nccl so that the transports can be read from the logs;
    ``GLOO_SOCKET_IFNAME``/``NCCL_SOCKET_IFNAME`` from ``socket_ifname`` (the
    ``--socket-ifname`` override), else ``spec.socket_ifname``, else neither
    (:func:`~builder.launchers.base.socket_env`).

    Returns:
        ``[{"name": ..., "value": ...} | {"name": ..., "valueFrom": {"fieldRef": ...}}]``.

    Raises:
        EnvbuildError: (exit 64) a name that is not an environment variable name.
    """
    ifname = socket_ifname if socket_ifname is not None else spec.socket_ifname
    env: list[dict[str, Any]] = [
        {"name": "PYTHONPATH", "value": CODE_MOUNT},
        {"name": "PYTHONDONTWRITEBYTECODE", "value": "1"},
        {"name": "PYTHONUNBUFFERED", "value": "1"},
        {"name": "HOME", "value": HOME},
        # getpass.getuser() looks at USER before the (missing) passwd entry
        {"name": "USER", "value": "envbuild"},
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
            raise EnvbuildError("is not an environment variable name", field="env", value=name,
                                exit_code=ExitCode.USAGE)
        entry = {"name": name, "value": str(value)}
        names = [e["name"] for e in env]
        if name in names:
            env[names.index(name)] = entry
        else:
            env.append(entry)
    return env


def gpu_resources(gpus: int) -> dict[str, Any]:
    """``nvidia.com/gpu: G`` as request and limit (extended resources: equal, or the limit
    only; Kubernetes "Schedule GPUs")."""
    return {"requests": {"nvidia.com/gpu": str(gpus)}, "limits": {"nvidia.com/gpu": str(gpus)}}


def volume_mounts() -> list[dict[str, Any]]:
    """The container's ``volumeMounts`` (the volumes of :func:`volumes`)."""
    return [
        {"name": CODE_VOLUME, "mountPath": CODE_MOUNT, "readOnly": True},
        {"name": "dshm", "mountPath": "/dev/shm"},
        {"name": "tmp", "mountPath": "/tmp"},
        {"name": "home", "mountPath": HOME},
        {"name": "results", "mountPath": RESULTS_MOUNT},
    ]


class FileMode(int):
    """A file mode, written in octal in the manifests (``0444``; YAML 1.1, as Kubernetes
    reads it)."""


def volumes(configmap: str, items: list[dict[str, str]], shm_limit: str | None) -> list[dict[str, Any]]:
    """The pod's ``volumes``: the ConfigMap ``configmap`` projected as ``items``
    (``[{"key", "path"}]``, mode 0444), and the ``emptyDir`` volumes (``/dev/shm`` in
    memory, limited to ``shm_limit`` when given)."""
    shm: dict[str, Any] = {"medium": "Memory"}
    if shm_limit:
        shm["sizeLimit"] = shm_limit
    return [
        {"name": CODE_VOLUME, "configMap": {"name": configmap, "defaultMode": FileMode(CODE_MODE), "items": items}},
        {"name": "dshm", "emptyDir": shm},
        {"name": "tmp", "emptyDir": {}},
        {"name": "home", "emptyDir": {}},
        {"name": "results", "emptyDir": {}},
    ]


def pod_security_context() -> dict[str, Any]:
    """The pod's ``securityContext`` ("restricted" Pod Security Standard)."""
    return {"runAsNonRoot": True, "runAsUser": RUN_UID, "runAsGroup": RUN_UID,
            "seccompProfile": {"type": "RuntimeDefault"}}


def container_security_context() -> dict[str, Any]:
    """The container's ``securityContext``: no privilege escalation, no capabilities,
    read-only root filesystem."""
    return {"allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True, "runAsNonRoot": True,
            "capabilities": {"drop": ["ALL"]}}


def anti_affinity(spread: str, run_id: str) -> dict[str, Any] | None:
    """The pod's ``affinity`` for ``spread`` (``preferred``, ``required`` or ``none``: None):
    a pod anti-affinity on ``kubernetes.io/hostname`` among the run's pods."""
    term = {"topologyKey": "kubernetes.io/hostname", "labelSelector": {"matchLabels": {"envbuild.run": run_id}}}
    if spread == "required":
        return {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [term]}}
    if spread == "preferred":
        return {"podAntiAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [
            {"weight": 100, "podAffinityTerm": term}]}}
    return None
