"""Kubernetes launcher: render the manifests that run a certification on a cluster; apply them.

By default the ranks run as an **Indexed Job** with a **headless Service**, built-in kinds
that need no operator (Kubernetes docs: "Job" -> "Completion mode" and "Job with Pod-to-Pod
Communication"; "Service" -> "Headless Services"). For a :class:`LaunchSpec` of N nodes
with G GPUs each (P = max(G, 1) processes per node), :func:`render_manifests` writes:

``configmap.yaml``
    envbuild's in-image code (``builder/agent/probe.py``, ``builder/agent/bench/*.py``) as an immutable
    ConfigMap ``envbuild-<run>-code``. ConfigMap keys may not contain ``/``
    (``[-._a-zA-Z0-9]+``), so ``bench/ddp.py`` is stored under the key ``bench.ddp.py`` and
    the volume's ``items`` put it back at ``bench/ddp.py``; mounted read-only at
    ``/opt/envbuild`` (``PYTHONPATH``), so certifying never changes the image.
``service.yaml``
    Service ``envbuild-<run>`` with ``clusterIP: None`` selecting the Job's pods
    (``batch.kubernetes.io/job-name``), ``publishNotReadyAddresses: true``, and the
    rendezvous port declared. With the pods' ``subdomain`` set to it, pod i of an Indexed
    Job resolves as ``<job>-<i>.<service>``; node 0 is the master address.
``job.yaml``
    Job ``envbuild-<run>``: ``completionMode: Indexed``, ``completions`` = ``parallelism``
    = N, ``backoffLimit: 0`` (a failed node fails the run, the Job controller then stops the
    others), ``activeDeadlineSeconds`` = the timeout (counted from the Job's start, so it
    includes scheduling and image pulls), ``ttlSecondsAfterFinished``. Each pod runs the
    image **by digest** as::

        python3 -m torch.distributed.run --nnodes N --nproc-per-node P \\
            --node-rank $(JOB_COMPLETION_INDEX) --master-addr <job>-0.<service> \\
            --master-port PORT --max-restarts 0 -m bench --out /results <bench args>

    (the Job controller sets ``JOB_COMPLETION_INDEX`` in every container; Kubernetes expands
    ``$(VAR)`` in ``args``), wrapped by a POSIX ``sh`` script (:data:`NODE_SCRIPT`) that then
    prints each ``/results/rank-<r>.json`` between :data:`RESULT_BEGIN` / :data:`RESULT_END`
    marker lines and exits with torchrun's status, so the results come back with the pod
    logs. Per pod: ``nvidia.com/gpu: G`` as request and limit (extended resources: equal
    or limit only; "Schedule GPUs" docs), an ``emptyDir`` with ``medium: Memory`` at
    ``/dev/shm`` whose ``sizeLimit`` is the recipe's ``shm_size`` (Docker ``8g`` ->
    Kubernetes ``8Gi``: :func:`shm_quantity`), ``emptyDir`` volumes at ``/tmp``,
    ``/tmp/home`` (``HOME``) and ``/results``, the "restricted" Pod Security Standard
    (``runAsNonRoot`` with the arbitrary UID/GID 12345, no privilege escalation, all
    capabilities dropped, ``RuntimeDefault`` seccomp) and ``readOnlyRootFilesystem``; a
    pod anti-affinity on ``kubernetes.io/hostname`` (preferred by default, ``required``
    puts every node on its own host); labels ``app.kubernetes.io/managed-by: envbuild``,
    ``envbuild: "1"``, ``envbuild.run: <run>`` (plus ``spec.labels`` and
    ``$ENVBUILD_EXTRA_LABELS``).

With ``kubeflow=True`` it renders ``configmap.yaml`` and ``trainjob.yaml`` instead: a
Kubeflow Trainer v2 ``TrainJob`` (API ``trainer.kubeflow.org/v1alpha1``, field names of
Trainer v2.1: ``podTemplateOverrides``; Trainer v2.0 called it ``podSpecOverrides`` and
later releases replace it with ``runtimePatches``). Trainer v2 ``TrainJob`` replaces the
Training Operator v1 ``PyTorchJob`` (``kubeflow.org/v1``), which is not rendered. The
TrainJob references the ``ClusterTrainingRuntime`` ``torch-distributed`` by default; that
runtime's Torch plugin sets ``PET_NNODES``, ``PET_NPROC_PER_NODE``, ``PET_NODE_RANK``,
``PET_MASTER_ADDR`` (``<name>-node-0-0.<name>``) and ``PET_MASTER_PORT`` (29400, not the
recipe's port), which torchrun reads as its defaults; its security context and deadline
come from the runtime (Trainer v2.1 cannot override them per TrainJob). Sources: Kubeflow
Trainer docs ("Migrating to Kubeflow Trainer v2", "PodTemplate Overrides") and the
v1alpha1 Go types (``pkg/apis/trainer/v1alpha1/trainjob_types.go``).

Rendering is deterministic: the same spec, options and code give the same bytes (the run
id is part of the spec). Templates are ``builder/launchers/templates/k8s/*.yaml.j2`` (jinja2,
``StrictUndefined``); every string is written plain only when YAML 1.1 reads it back as
the same string, else JSON-quoted (:func:`yaml_scalar`).

:class:`K8sLauncher` (``--apply``) creates the objects with the ``kubernetes`` Python
client (extra ``envbuild[k8s]``) when a kubeconfig is present (:func:`find_kubeconfig`),
waits a bounded time, collects each rank's result from the pod logs, deletes what it
created (also on failure and Ctrl-C) and returns a :class:`LaunchResult`.

Command line (``builder/cli/app.py``): ``envbuild k8s render IMAGE|RECIPE --out DIR [--apply]``.
"""

from __future__ import annotations

import contextlib
import datetime
import hashlib
import json
import math
import os
import re
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Optional, Sequence

import jinja2
import yaml

from builder.core.errors import EnvbuildError, ExitCode, Unreachable
from builder.core.files import template_environment
from builder.core.inputs import MAX_REPORT_BYTES, load_json, one_line, read_json

from .base import SOCKET_IFNAME_RE, LaunchResult, LaunchSpec, OnProgress, socket_env
from .model import MAX_RESULT_BYTES
from .output import result_problem
from .progress import progress_from_logs

#: Where the in-image code is mounted (read-only); also ``PYTHONPATH``.
CODE_MOUNT = "/opt/envbuild"
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
#: Default ``ttlSecondsAfterFinished`` of the Job (seconds): finished Jobs are removed.
DEFAULT_TTL_S = 3600
#: Kubernetes release whose OpenAPI schemas the manifests are checked against in tests.
K8S_VERSION = "1.30"
#: API version of the Kubeflow Trainer v2 TrainJob.
TRAINJOB_API = "trainer.kubeflow.org/v1alpha1"
#: Default ClusterTrainingRuntime of a TrainJob (ships with Kubeflow Trainer).
DEFAULT_RUNTIME = "torch-distributed"
#: Marker lines around each result document in a pod's log.
RESULT_BEGIN = "@@envbuild-result-begin"
RESULT_END = "@@envbuild-result-end"
#: Result schema the bench writes (``builder/agent/bench/__init__.py``).
#: Pod annotation holding an Indexed Job pod's completion index (Kubernetes Job docs).
INDEX_ANNOTATION = "batch.kubernetes.io/job-completion-index"
#: Label the Job controller puts on its pods (Kubernetes >= 1.27).
JOB_NAME_LABEL = "batch.kubernetes.io/job-name"
#: ConfigMaps hold at most 1 MiB of data (Kubernetes ConfigMap docs).
CONFIGMAP_MAX_BYTES = 1024 * 1024
#: Most bytes of a pod's log read (``limitBytes``); a run's log holds the results and the
#: progress lines (about 100 bytes per rank every 2 s).
LOG_MAX_BYTES = 32 << 20
#: ``kubeconfig`` value meaning "use the pod's service account" (running inside a cluster).
IN_CLUSTER = "in-cluster"
#: Where a pod's service account token is mounted (in-cluster configuration).
SA_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"

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

_RUN_ID_RE = re.compile(r"^[a-z0-9]([a-z0-9-]{0,38}[a-z0-9])?$")
_CM_KEY_RE = re.compile(r"^[-._a-zA-Z0-9]+$")
_LABEL_NAME_RE = re.compile(r"^([A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?)$")
_DNS_SUBDOMAIN_RE = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_ENV_NAME_RE = re.compile(r"^[-._a-zA-Z][-._a-zA-Z0-9]*$")

# Image references (grammar of the distribution project's ``reference`` package).
_ALNUM = r"[a-z0-9]+"
_COMPONENT = rf"{_ALNUM}(?:(?:[._]|__|-+){_ALNUM})*"
_DOMAIN_PART = r"(?:[a-zA-Z0-9]|[a-zA-Z0-9][a-zA-Z0-9-]*[a-zA-Z0-9])"
_DOMAIN = rf"(?:{_DOMAIN_PART}(?:\.{_DOMAIN_PART})*|\[[0-9a-fA-F:]+\])(?::[0-9]+)?"
_IMAGE_REF_RE = re.compile(
    rf"^(?P<name>(?:{_DOMAIN}/)?{_COMPONENT}(?:/{_COMPONENT})*)"
    r"(?::(?P<tag>[\w][\w.-]{0,127}))?"
    r"(?:@(?P<digest>[A-Za-z][A-Za-z0-9]*(?:[-_+.][A-Za-z][A-Za-z0-9]*)*:[0-9a-fA-F]{32,}))?$"
)
_SHA256_RE = re.compile(r"^sha256:[0-9a-f]{64}$")


# --------------------------------------------------------------------------- references


@dataclass(frozen=True)
class ImageReference:
    """A parsed image reference ``[host[:port]/]path[:tag][@sha256:<64 hex>]``.

    Attributes:
        name: ``[host[:port]/]path``, e.g. ``"registry.example/envbuild/cpu-torch2"``.
        tag: e.g. ``"fbe68042d4fa"``, or None.
        digest: ``"sha256:<64 lowercase hex>"``, or None.
    """

    name: str
    tag: Optional[str]
    digest: Optional[str]

    @property
    def by_digest(self) -> bool:
        """Whether the reference pins a digest (the only immutable kind of reference)."""
        return self.digest is not None


def parse_image_ref(text: str) -> ImageReference:
    """Parse an image reference (the ``reference`` grammar of the distribution project,
    as used by Docker and Kubernetes); only ``sha256`` digests are accepted.

    Raises:
        EnvbuildError: (exit 64) not an image reference, or a digest other than
            ``sha256:<64 lowercase hex>``.
    """
    m = _IMAGE_REF_RE.fullmatch(text or "")
    first, sep, _ = (m.group("name") if m else "").partition("/")
    if m and sep and not ("." in first or ":" in first or first == "localhost") \
            and not re.fullmatch(_COMPONENT, first):
        m = None  # not a registry host (Docker's rule), so a path component: lowercase only
    if not m:
        raise EnvbuildError("is not an image reference ([host/]path[:tag][@sha256:digest])",
                            field="image", value=text, exit_code=ExitCode.USAGE)
    digest = m.group("digest")
    if digest is not None and not _SHA256_RE.fullmatch(digest):
        raise EnvbuildError("digest is not sha256:<64 lowercase hex>", field="image", value=text,
                            exit_code=ExitCode.USAGE)
    return ImageReference(m.group("name"), m.group("tag"), digest)


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
    ref = parse_image_ref(text)
    if ref.by_digest or allow_tag:
        return text
    hint = f"use {candidates[0]}" if candidates else "push it and use REPO@sha256:<digest>"
    raise EnvbuildError(
        f"is not pinned by digest: pods would run whatever the tag points to then; {hint} "
        "(or --allow-tag on a development cluster)",
        field="image", value=text,
    )


# --------------------------------------------------------------------------- small conversions


def shm_quantity(size: Optional[str]) -> Optional[str]:
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


def check_labels(labels: Mapping[str, str], what: str = "label") -> dict[str, str]:
    """Check Kubernetes label keys and values; returns them as a sorted dict.

    Key: optional DNS-subdomain prefix (<= 253) and ``/``, then a name of at most 63 of
    ``[-A-Za-z0-9_.]`` starting and ending alphanumeric. Value: empty or such a name
    (Kubernetes "Labels and Selectors" -> "Syntax and character set").

    Raises:
        EnvbuildError: (exit 64) an invalid key or value.
    """
    out = {}
    for key, value in sorted(labels.items()):
        prefix, _, name = key.rpartition("/")
        if (prefix and (len(prefix) > 253 or not _DNS_SUBDOMAIN_RE.fullmatch(prefix))) or not _LABEL_NAME_RE.fullmatch(name):
            raise EnvbuildError(f"is not a Kubernetes {what} key", field=what, value=key, exit_code=ExitCode.USAGE)
        value = str(value)
        if what == "label" and value and not _LABEL_NAME_RE.fullmatch(value):
            raise EnvbuildError(f"is not a Kubernetes label value (key {key})", field=what, value=value,
                                exit_code=ExitCode.USAGE)
        out[key] = value
    return out


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


# --------------------------------------------------------------------------- in-image code


def in_image_code() -> dict[str, str]:
    """envbuild's in-image code from the installed package: ``{path: text}`` with paths
    ``probe.py`` and ``bench/<file>.py`` (sorted; no caches).

    Raises:
        EnvbuildError: (exit 2) a file is missing or not UTF-8.
    """
    from builder import agent

    root = Path(agent.__file__).resolve().parent
    files = sorted({root / "probe.py", root / "bench" / "__main__.py", *(root / "bench").glob("*.py")})
    out: dict[str, str] = {}
    for p in files:
        try:
            out[p.relative_to(root).as_posix()] = p.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as e:
            raise EnvbuildError(f"cannot be read: {e}", file=str(p)) from None
    return out


def code_key(path: str) -> str:
    """ConfigMap key of an in-image file: ``/`` replaced by ``.`` (``bench/ddp.py`` ->
    ``bench.ddp.py``); keys may only hold ``[-._a-zA-Z0-9]``.

    Raises:
        EnvbuildError: (exit 2) the path has other characters.
    """
    key = path.replace("/", ".")
    if not _CM_KEY_RE.fullmatch(key) or len(key) > 253:
        raise EnvbuildError("cannot be a ConfigMap key", field="file", value=path)
    return key


# --------------------------------------------------------------------------- YAML scalars

_YAML11_SPECIAL = re.compile(r"^(y|n|yes|no|on|off|true|false|null|nan|inf)$", re.I)
_PLAIN_SAFE = re.compile(r"^(?:[A-Za-z_/]|-+[A-Za-z])[A-Za-z0-9_./-]*$")


def yaml_quote(value: Any) -> str:
    """``value`` as a JSON string literal, which YAML reads as a double-quoted scalar."""
    return json.dumps(str(value), ensure_ascii=True)


def yaml_scalar(value: Any) -> str:
    """``value`` (a string, an int or a bool) as a YAML scalar: ints and bools as such;
    strings plain when they are unambiguous (``[A-Za-z_/]`` or dashes and a letter, then
    ``[A-Za-z0-9_./-]*``; not a YAML
    1.1 boolean/null word such as ``on`` or ``y``, which Kubernetes' YAML reader would
    turn into a boolean), else JSON-quoted."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    text = str(value)
    if _PLAIN_SAFE.fullmatch(text) and not _YAML11_SPECIAL.fullmatch(text):
        return text
    return yaml_quote(text)


def _literal_ok(text: str) -> bool:
    if not text or text[0] in " \t\n" or "\r" in text:
        return False
    return all(ch in "\t\n" or (ch.isprintable() and ch not in "\u2028\u2029\ufeff") for ch in text)


def yaml_block(value: Any, indent: int) -> str:
    """A multi-line string as a YAML literal block scalar (``|``, ``|-`` or ``|+`` after the
    trailing newlines) with its lines indented by ``indent`` spaces, the first line break
    included; other strings go through :func:`yaml_scalar`. Text a literal block cannot
    carry exactly (leading blank, CR, control characters) is JSON-quoted."""
    text = str(value)
    if "\n" not in text.rstrip("\n") and not text.endswith("\n"):
        return yaml_scalar(text)
    if not _literal_ok(text):
        return yaml_quote(text)
    body = text.rstrip("\n")
    trailing = len(text) - len(body)
    chomp = "-" if trailing == 0 else ("" if trailing == 1 else "+")
    pad = " " * indent
    lines = [(pad + line) if line else "" for line in body.split("\n")]
    extra = [""] * (trailing - 1) if trailing > 1 else []
    return f"|{chomp}\n" + "\n".join(lines + extra)


def _nest(text: str, indent: int) -> str:
    """Indent every line but the first by ``indent`` spaces; drop the final newline."""
    lines = text.rstrip("\n").split("\n")
    pad = " " * indent
    return "\n".join([lines[0]] + [(pad + line) if line else "" for line in lines[1:]])


def _environment() -> jinja2.Environment:
    return template_environment({"s": yaml_scalar, "q": yaml_quote, "scalar": yaml_block, "nest": _nest},
                                package="builder.launchers")


# --------------------------------------------------------------------------- rendering


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
    socket_ifname: Optional[str] = None
    annotations: Mapping[str, str] = field(default_factory=dict)


def manifest_labels(spec: LaunchSpec, environ: Optional[Mapping[str, str]] = None) -> dict[str, str]:
    """Labels of every object: ``$ENVBUILD_EXTRA_LABELS``, then ``spec.labels``, then
    ``app.kubernetes.io/name: envbuild``, ``app.kubernetes.io/managed-by: envbuild``,
    ``envbuild: "1"`` and ``envbuild.run: <run>`` (which win); sorted.

    Raises:
        EnvbuildError: (exit 64) an invalid label; (exit 2) a malformed
            ``$ENVBUILD_EXTRA_LABELS``.
    """
    from builder.image import engine
    from .base import extra_labels_from_env

    labels = {
        **extra_labels_from_env(environ),
        **spec.labels,
        "app.kubernetes.io/name": "envbuild",
        "app.kubernetes.io/managed-by": "envbuild",
        **engine.run_labels(spec.run_id),
    }
    return check_labels(labels)


def torchrun_args(spec: LaunchSpec, kubeflow: bool = False) -> list[str]:
    """The container ``args``: torchrun running the bench.

    Indexed Job: static rendezvous on node 0 (``--node-rank $(JOB_COMPLETION_INDEX)``,
    ``--master-addr`` :func:`master_addr`, ``--master-port`` the spec's port). TrainJob:
    no topology options; torchrun takes them from the ``PET_*`` variables the Trainer sets.
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


def pod_env(spec: LaunchSpec, options: K8sOptions = K8sOptions()) -> list[dict[str, str]]:
    """Environment of each node, in order: the launcher's settings, then ``spec.env``
    (a name already set is replaced in place). ``ENVBUILD_NODE`` comes from the pod's
    completion-index annotation (downward API); ``NCCL_DEBUG=INFO`` with nccl so that the
    transports can be read from the logs.

    Returns:
        ``[{"name": ..., "value": ...} | {"name": ..., "field_path": ...}]``.

    Raises:
        EnvbuildError: (exit 64) a name that is not a C identifier-like env name.
    """
    env: list[dict[str, str]] = [
        {"name": "PYTHONPATH", "value": CODE_MOUNT},
        {"name": "PYTHONDONTWRITEBYTECODE", "value": "1"},
        {"name": "PYTHONUNBUFFERED", "value": "1"},
        {"name": "HOME", "value": HOME},
        # getpass.getuser() looks at USER before the (missing) passwd entry
        {"name": "USER", "value": "envbuild"},
        *({"name": k, "value": v} for k, v in socket_env(
            options.socket_ifname if options.socket_ifname is not None else spec.socket_ifname).items()),
        {"name": "ENVBUILD_RUN_ID", "value": spec.run_id},
        {"name": "ENVBUILD_NODE", "field_path": f"metadata.annotations['{INDEX_ANNOTATION}']"},
        {"name": "ENVBUILD_RESULTS", "value": RESULTS_MOUNT},
    ]
    if spec.backend == "nccl":
        env.append({"name": "NCCL_DEBUG", "value": "INFO"})
    for name, value in spec.env.items():
        if not _ENV_NAME_RE.fullmatch(name):
            raise EnvbuildError("is not an environment variable name", field="env", value=name,
                                exit_code=ExitCode.USAGE)
        entry = {"name": name, "value": str(value)}
        for i, e in enumerate(env):
            if e["name"] == name:
                env[i] = entry
                break
        else:
            env.append(entry)
    return env


def check_options(options: K8sOptions) -> None:
    """Check the options that need no spec (the command line calls it before contacting
    anything).

    Raises:
        EnvbuildError: (exit 64) a bad spread, a negative TTL, an interface name list
            that is not one (:data:`~builder.launchers.base.SOCKET_IFNAME_RE`), a TrainJob
            runtime that is not a DNS subdomain.
    """
    if options.spread not in ("preferred", "required", "none"):
        raise EnvbuildError("is not preferred, required or none", field="spread", value=options.spread,
                            exit_code=ExitCode.USAGE)
    if not isinstance(options.ttl_s, int) or options.ttl_s < 0:
        raise EnvbuildError("must be >= 0", field="ttl_s", value=options.ttl_s, exit_code=ExitCode.USAGE)
    if options.socket_ifname is not None and not SOCKET_IFNAME_RE.fullmatch(options.socket_ifname):
        raise EnvbuildError("is not a network interface name list", field="socket_ifname",
                            value=options.socket_ifname, exit_code=ExitCode.USAGE)
    if options.kubeflow and not _DNS_SUBDOMAIN_RE.fullmatch(options.runtime or ""):
        raise EnvbuildError("is not a runtime name", field="runtime", value=options.runtime,
                            exit_code=ExitCode.USAGE)


def render_context(spec: LaunchSpec, options: K8sOptions = K8sOptions(),
                   code: Optional[Mapping[str, str]] = None,
                   environ: Optional[Mapping[str, str]] = None) -> dict[str, Any]:
    """The plain-data context of the templates: names, labels, the pod's command, args,
    env and volumes, the code as ConfigMap data. Arguments and errors as
    :func:`render_manifests`."""
    image = require_digest(spec.image, options.allow_tag)
    if spec.nodes < 1:
        raise EnvbuildError("must be >= 1", field="nodes", value=spec.nodes, exit_code=ExitCode.USAGE)
    if spec.gpus_per_node < 0:
        raise EnvbuildError("must be >= 0", field="gpus_per_node", value=spec.gpus_per_node,
                            exit_code=ExitCode.USAGE)
    if not 1 <= spec.port <= 65535:
        raise EnvbuildError("is not a TCP port", field="port", value=spec.port, exit_code=ExitCode.USAGE)
    if not spec.timeout_s > 0:
        raise EnvbuildError("must be > 0", field="timeout_s", value=spec.timeout_s, exit_code=ExitCode.USAGE)
    check_options(options)
    for value in (spec.socket_ifname,):
        if value is not None and not SOCKET_IFNAME_RE.fullmatch(value):
            raise EnvbuildError("is not a network interface name list", field="socket_ifname", value=value,
                                exit_code=ExitCode.USAGE)
    code = dict(in_image_code() if code is None else code)
    if "bench/__main__.py" not in code or "probe.py" not in code:
        raise EnvbuildError("in-image code lacks probe.py or bench/__main__.py", field="code",
                            value=sorted(code))
    paths = sorted(code)
    keys = [code_key(p) for p in paths]
    if len(set(keys)) != len(keys):
        raise EnvbuildError("two files map to the same ConfigMap key", field="code", value=paths)
    size = sum(len(t.encode("utf-8")) for t in code.values())
    if size > CONFIGMAP_MAX_BYTES:
        raise EnvbuildError(f"in-image code is {size} bytes; a ConfigMap holds at most "
                            f"{CONFIGMAP_MAX_BYTES}", field="code", value=paths)
    digest = hashlib.sha256()
    for p in paths:
        digest.update(p.encode() + b"\0" + code[p].encode("utf-8") + b"\0")
    labels = manifest_labels(spec, environ)
    name = object_name(spec.run_id)
    annotations = check_labels({"envbuild.image": image, **options.annotations}, what="annotation")
    return {
        "header": [f"envbuild run {spec.run_id}, rendered by `envbuild k8s render`.",
                   "Apply the folder with `kubectl apply -f DIR`; remove it with `kubectl delete -f DIR`."],
        "run_id": spec.run_id,
        "job_name": name,
        "service_name": name,
        "configmap_name": configmap_name(spec.run_id),
        "master_addr": master_addr(spec.run_id, options.kubeflow),
        "labels": labels,
        "annotations": annotations,
        "configmap_annotations": {"envbuild.code-sha256": digest.hexdigest()},
        "image": image,
        "nodes": spec.nodes,
        "nproc": spec.nproc_per_node,
        "gpus": spec.gpus_per_node,
        "port": spec.port,
        "port_name": PORT_NAME,
        "deadline_s": max(1, math.ceil(spec.timeout_s)),
        "ttl_s": int(options.ttl_s),
        "spread": options.spread,
        "uid": RUN_UID,
        "container_name": CONTAINER_NAME,
        "command": ["/bin/sh", "-c", NODE_SCRIPT, "envbuild-node"],
        "args": torchrun_args(spec, options.kubeflow),
        "env": pod_env(spec, options),
        "shm_limit": shm_quantity(spec.shm_size),
        "code_mount": CODE_MOUNT,
        "results_mount": RESULTS_MOUNT,
        "home": HOME,
        "code_items": list(zip(keys, paths)),
        "code_data": sorted(zip(keys, (code[p] for p in paths))),
        "runtime": options.runtime,
        "trainjob_api": TRAINJOB_API,
    }


def render_manifests(spec: LaunchSpec, options: K8sOptions = K8sOptions(),
                     code: Optional[Mapping[str, str]] = None,
                     environ: Optional[Mapping[str, str]] = None) -> dict[str, str]:
    """Render the manifests of ``spec`` (see the module doc).

    Args:
        spec: what to launch; ``spec.image`` must be ``repo@sha256:...`` unless
            ``options.allow_tag``; ``spec.run_id`` names the objects.
        options: how (:class:`K8sOptions`).
        code: ``{path: text}`` of the in-image code (default :func:`in_image_code`).
        environ: where ``ENVBUILD_EXTRA_LABELS`` is read (default ``os.environ``).

    Returns:
        ``{file name: YAML text}``: ``configmap.yaml``, ``service.yaml``, ``job.yaml``, or
        with ``options.kubeflow`` ``configmap.yaml``, ``trainjob.yaml``; one object each.

    Raises:
        EnvbuildError: (exit 2) a tag-only image, code that does not fit a ConfigMap;
            (exit 64) values out of range, invalid labels, run id or env names.
    """
    ctx = render_context(spec, options, code, environ)
    env = _environment()
    names = ["configmap.yaml", "trainjob.yaml"] if options.kubeflow else ["configmap.yaml", "service.yaml", "job.yaml"]
    out = {n: env.get_template(f"k8s/{n}.j2").render(ctx) for n in names}
    # the ConfigMap must carry the files byte for byte: read it back
    data = yaml.safe_load(out["configmap.yaml"]).get("data") or {}
    if data != dict(ctx["code_data"]):
        raise EnvbuildError("rendered ConfigMap does not read back as the code (template bug)",
                            file="configmap.yaml")
    return out


def write_manifests(files: Mapping[str, str], out_dir: str | os.PathLike) -> list[Path]:
    """Write ``files`` into ``out_dir`` (created), each atomically; returns the paths.

    Manifests of an earlier render in that folder that are not part of this one
    (``job.yaml`` after ``--kubeflow``...) are removed, so ``kubectl apply -f DIR`` applies
    exactly this render.

    Raises:
        EnvbuildError: (exit 3) the folder cannot be written.
    """
    out = Path(out_dir)
    known = {"configmap.yaml", "service.yaml", "job.yaml", "trainjob.yaml"}
    paths = []
    try:
        out.mkdir(parents=True, exist_ok=True)
        for stale in sorted(known - set(files)):
            with contextlib.suppress(FileNotFoundError):
                (out / stale).unlink()
        for name, text in files.items():
            path = out / name
            tmp = path.with_name(f".{name}.tmp")
            tmp.write_text(text, encoding="utf-8")
            os.replace(tmp, path)
            paths.append(path)
    except OSError as e:
        raise EnvbuildError(f"cannot write manifests: {e}", file=str(out), exit_code=ExitCode.UNREACHABLE) from None
    return paths


def load_objects(files: Mapping[str, str]) -> list[dict]:
    """Parse rendered files into their objects (``yaml.safe_load_all``), in file order."""
    objs = []
    for text in files.values():
        objs.extend(o for o in yaml.safe_load_all(text) if o)
    return objs


# --------------------------------------------------------------------------- results from logs

_BEGIN_RE = re.compile(rf"^{re.escape(RESULT_BEGIN)} rank-(\d+)\.json$")
_END_RE = re.compile(rf"^{re.escape(RESULT_END)} rank-(\d+)\.json$")


def parse_result_blocks(log: str, run_id: Optional[str] = None, world_size: Optional[int] = None
                        ) -> tuple[dict[int, dict], dict[int, str]]:
    """The result documents a node printed between marker lines (:data:`NODE_SCRIPT`).

    Each block is parsed with :func:`builder.core.inputs.load_json` (bounded; at most
    :data:`~builder.launchers.model.MAX_RESULT_BYTES`) and checked with
    :func:`~builder.launchers.output.result_problem` (and the run id and world size when
    given).

    Returns:
        ``(results, problems)``: ``{rank: document}`` for blocks that hold an
        ``envbuild.rank-result/1`` document of that rank, ``{rank: reason}`` for blocks
        that are unterminated, not JSON, of another schema, rank, run or world size.
    """
    results: dict[int, dict] = {}
    problems: dict[int, str] = {}
    lines = log.splitlines()
    i = 0
    while i < len(lines):
        m = _BEGIN_RE.fullmatch(lines[i].rstrip())
        if not m:
            i += 1
            continue
        rank = int(m.group(1))
        body: list[str] = []
        j = i + 1
        while j < len(lines) and not _END_RE.fullmatch(lines[j].rstrip()):
            body.append(lines[j])
            j += 1
        i = j + 1
        if j >= len(lines):
            problems[rank] = "result block in the pod log is not terminated (log cut short?)"
            continue
        text = "\n".join(body)
        if len(text) > MAX_RESULT_BYTES:
            problems[rank] = f"result in the pod log is over {MAX_RESULT_BYTES} bytes"
            continue
        try:
            doc = load_json(text, "result in the pod log")
        except EnvbuildError as e:
            problems[rank] = one_line(str(e), 300)
            continue
        problem = result_problem(doc, rank, "result", run_id=run_id, world_size=world_size)
        if problem:
            problems[rank] = problem
            continue
        results[rank] = doc
        problems.pop(rank, None)
    return results, problems


# --------------------------------------------------------------------------- sources


def lock_from_file(images_dir: str | os.PathLike, recipe: str) -> tuple[dict, dict[str, str]]:
    """``(lock, labels)`` for a recipe name: ``<images_dir>/<recipe>/envbuild.lock.json``
    (written by ``envbuild render``) and the labels an image built from it would carry
    that matter here: ``envbuild.recipe``, ``envbuild.lock-hash`` (of this file's lock;
    an image built after ``envbuild lock`` also holds the resolved pins, so its hash
    differs) and ``envbuild.backend``.

    Raises:
        EnvbuildError: (exit 2) the file is missing, not JSON (bounded:
            :func:`builder.core.inputs.read_json`) or not a lock (``schema`` ``envbuild.lock/1``);
            (exit 3) not a regular file or over 16 MiB.
    """
    from builder.recipe import compat

    path = Path(images_dir) / recipe / "envbuild.lock.json"
    if not os.path.lexists(path):
        raise EnvbuildError(f"not found; run `envbuild render {recipe}`", file=str(path))
    lock = read_json(path, MAX_REPORT_BYTES, "lock file", ExitCode.CHECK_FAILED)
    if not isinstance(lock, dict) or lock.get("schema") != compat.LOCK_SCHEMA:
        raise EnvbuildError(f"is not an envbuild lock (schema {compat.LOCK_SCHEMA})", file=str(path))
    labels = {
        "envbuild.recipe": str(lock.get("recipe") or recipe),
        "envbuild.lock-hash": compat.lock_hash(lock),
    }
    backend = (lock.get("certify") or {}).get("backend")
    if backend:
        labels["envbuild.backend"] = str(backend)
    return lock, labels


# --------------------------------------------------------------------------- kubeconfig


def find_kubeconfig(environ: Optional[Mapping[str, str]] = None, home: Optional[str] = None,
                    manifests: Optional[str] = None) -> str:
    """Where the cluster's credentials are: the first existing file of ``$KUBECONFIG``
    (a ``:``-separated list), else ``~/.kube/config`` (only when ``$KUBECONFIG`` is unset,
    as kubectl does), else :data:`IN_CLUSTER` when running in a pod with a service account
    (``KUBERNETES_SERVICE_HOST`` and a token).

    Args:
        manifests: the folder of the rendered manifests, named in the error.

    Raises:
        Unreachable: (exit 3) none of these; one line.
    """
    environ = os.environ if environ is None else environ
    listed = [p for p in (environ.get("KUBECONFIG") or "").split(os.pathsep) if p]
    for p in listed:
        if os.path.isfile(p):
            return p
    default = os.path.join(home or environ.get("HOME") or os.path.expanduser("~"), ".kube", "config")
    if not listed and os.path.isfile(default):
        return default
    if environ.get("KUBERNETES_SERVICE_HOST") and os.path.isfile(os.path.join(SA_DIR, "token")):
        return IN_CLUSTER
    where = f"KUBECONFIG={environ.get('KUBECONFIG')!r} names no file" if listed else f"no {default}"
    raise Unreachable(f"no kubeconfig ({where}, not in a pod): cannot apply; the manifests are "
                      f"rendered: `kubectl apply -f {manifests or 'DIR'}` where a cluster answers")


# --------------------------------------------------------------------------- the API seam


@dataclass
class PodState:
    """What the launcher needs to know about one pod (plain data).

    Attributes:
        name: pod name.
        node: completion index (the envbuild node), None when the annotation is missing.
        phase: ``Pending``, ``Running``, ``Succeeded``, ``Failed`` or ``Unknown``.
        exit_code: the container's exit status once terminated, else None.
        waiting_reason: e.g. ``ImagePullBackOff`` while the container waits, else None.
        message: the waiting or termination message, if any.
        host: the Kubernetes node the pod runs on, if scheduled.
    """

    name: str
    node: Optional[int]
    phase: str
    exit_code: Optional[int] = None
    waiting_reason: Optional[str] = None
    message: Optional[str] = None
    host: Optional[str] = None


class KubeApi:
    """The few Kubernetes API calls :class:`K8sLauncher` makes, over the ``kubernetes``
    client (a seam: tests pass an object with the same methods).

    Args:
        kubeconfig: a file, or :data:`IN_CLUSTER`.
        context: the kubeconfig context (None: the current one).
        namespace: None: the context's namespace, else ``default``.

    Raises:
        Unreachable: (exit 3) the ``kubernetes`` package is missing or the configuration
            cannot be loaded.
    """

    def __init__(self, kubeconfig: str, context: Optional[str] = None, namespace: Optional[str] = None) -> None:
        try:
            from kubernetes import client, config
        except ImportError:
            raise Unreachable("--apply needs the kubernetes package: pip install 'envbuild[k8s]'") from None
        try:
            if kubeconfig == IN_CLUSTER:
                config.load_incluster_config()
                ns_file = os.path.join(SA_DIR, "namespace")
                ctx_ns = Path(ns_file).read_text().strip() if os.path.isfile(ns_file) else None
            else:
                config.load_kube_config(config_file=kubeconfig, context=context)
                _, active = config.list_kube_config_contexts(config_file=kubeconfig)
                if context:
                    contexts, _ = config.list_kube_config_contexts(config_file=kubeconfig)
                    active = next((c for c in contexts if c.get("name") == context), active)
                ctx_ns = ((active or {}).get("context") or {}).get("namespace")
        except Exception as e:  # noqa: BLE001 - config errors of many kinds
            raise Unreachable(f"kubeconfig {kubeconfig}: {_one_line(e)}") from None
        self.namespace = namespace or ctx_ns or "default"
        self._client = client
        self.core = client.CoreV1Api()
        self.batch = client.BatchV1Api()
        self.custom = client.CustomObjectsApi()

    def _call(self, what: str, fn, *args, missing_ok: bool = False, **kw):
        from kubernetes.client.exceptions import ApiException

        try:
            return fn(*args, **kw)
        except ApiException as e:
            if missing_ok and e.status == 404:
                return None
            reason = _one_line(getattr(e, "body", None) or e.reason or e)
            code = ExitCode.CHECK_FAILED if e.status in (400, 403, 409, 422) else ExitCode.UNREACHABLE
            raise EnvbuildError(f"Kubernetes API: {what}: {e.status} {reason}", exit_code=code) from None
        except Exception as e:  # noqa: BLE001 - urllib3/OS errors: cluster unreachable
            raise Unreachable(f"Kubernetes API: {what}: {_one_line(e)}") from None

    # creates and deletes pass _preload_content=False: the answer is not needed, and not
    # decoding it keeps a server's variant of it (Status or the object) from mattering

    def create(self, obj: Mapping[str, Any]) -> None:
        """Create one rendered object (ConfigMap, Service, Job or TrainJob) in the namespace."""
        kind, name = obj["kind"], obj["metadata"]["name"]
        what = f"create {kind} {name}"
        raw = {"_preload_content": False}
        if kind == "ConfigMap":
            self._call(what, self.core.create_namespaced_config_map, self.namespace, obj, **raw)
        elif kind == "Service":
            self._call(what, self.core.create_namespaced_service, self.namespace, obj, **raw)
        elif kind == "Job":
            self._call(what, self.batch.create_namespaced_job, self.namespace, obj, **raw)
        elif kind == "TrainJob":
            group, version = TRAINJOB_API.split("/")
            self._call(what, self.custom.create_namespaced_custom_object, group, version,
                       self.namespace, "trainjobs", obj, **raw)
        else:
            raise EnvbuildError("cannot be created by envbuild", field="kind", value=kind)

    def delete(self, kind: str, name: str) -> None:
        """Delete an object (a Job with its pods, in the background); a missing one is fine."""
        what = f"delete {kind} {name}"
        raw = {"_preload_content": False, "missing_ok": True}
        if kind == "ConfigMap":
            self._call(what, self.core.delete_namespaced_config_map, name, self.namespace, **raw)
        elif kind == "Service":
            self._call(what, self.core.delete_namespaced_service, name, self.namespace, **raw)
        elif kind == "Job":
            self._call(what, self.batch.delete_namespaced_job, name, self.namespace,
                       propagation_policy="Background", **raw)
        elif kind == "TrainJob":
            group, version = TRAINJOB_API.split("/")
            self._call(what, self.custom.delete_namespaced_custom_object, group, version, self.namespace,
                       "trainjobs", name, **raw)

    def delete_pods(self, selector: str) -> None:
        """Delete every pod matching the label ``selector`` (immediately)."""
        self._call(f"delete pods {selector}", self.core.delete_collection_namespaced_pod, self.namespace,
                   label_selector=selector, grace_period_seconds=0, _preload_content=False)

    def job_conditions(self, name: str) -> list[dict[str, str]]:
        """The Job's conditions ``[{"type", "status", "reason", "message"}]`` ([] when none).

        Raises:
            EnvbuildError: (exit 3) the Job is gone.
        """
        job = self._call(f"read Job {name}", self.batch.read_namespaced_job_status, name, self.namespace)
        conds = (job.status.conditions if job and job.status else None) or []
        return [{"type": c.type, "status": c.status, "reason": c.reason or "", "message": c.message or ""}
                for c in conds]

    def pods(self, selector: str) -> list[PodState]:
        """The pods matching the label ``selector``, as :class:`PodState`, sorted by name."""
        res = self._call(f"list pods {selector}", self.core.list_namespaced_pod, self.namespace,
                         label_selector=selector)
        out = []
        for p in sorted(res.items if res else [], key=lambda p: p.metadata.name):
            idx = ((p.metadata.annotations or {}).get(INDEX_ANNOTATION))
            state = PodState(name=p.metadata.name, node=int(idx) if idx and idx.isdigit() else None,
                             phase=(p.status.phase if p.status else None) or "Unknown",
                             host=p.spec.node_name if p.spec else None)
            for cs in (p.status.container_statuses if p.status else None) or []:
                if cs.name != CONTAINER_NAME:
                    continue
                if cs.state and cs.state.terminated:
                    state.exit_code = cs.state.terminated.exit_code
                    state.message = cs.state.terminated.reason
                elif cs.state and cs.state.waiting:
                    state.waiting_reason = cs.state.waiting.reason
                    state.message = cs.state.waiting.message
            out.append(state)
        return out

    def log(self, pod: str) -> str:
        """The log (stdout and stderr) of the pod's container, at most
        :data:`LOG_MAX_BYTES` (the API's ``limitBytes``); ``""`` when there is none (pod
        gone, container never started: the API answers 404 or 400).

        Raises:
            EnvbuildError: (exit 3) the API cannot be reached.
        """
        try:
            text = self._call(f"read log of pod {pod}", self.core.read_namespaced_pod_log, pod, self.namespace,
                              container=CONTAINER_NAME, limit_bytes=LOG_MAX_BYTES, missing_ok=True)
        except EnvbuildError as e:
            if e.exit_code == ExitCode.CHECK_FAILED:
                return ""
            raise
        return text or ""


def _one_line(text: Any, limit: int = 200) -> str:
    return one_line(text, limit)


def _utc_now_iso() -> str:
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def assemble_result(spec: LaunchSpec, outcome: Mapping[str, Any], *, started_at: str, finished_at: str,
                    cleanup_errors: Optional[list[str]] = None) -> LaunchResult:
    """Build the :class:`LaunchResult` of a run from what was seen of its pods.

    Args:
        outcome: ``{"timed_out": bool, "failed": bool, "exit_codes": {node: int|None},
            "logs": {node: text}, "headers": {node: one line + newline}}`` (nodes are
            completion indexes; a node absent from ``exit_codes`` was killed or never ended).

    Results come from the logs (:func:`parse_result_blocks`, checked against the run),
    only for the ranks the node hosts; the per-rank exit codes from torchrun's failure
    summary in the logs; the ranks' progress from their progress lines
    (:func:`~builder.launchers.progress.progress_from_logs`). A failed
    (not timed-out) run whose other nodes were stopped by the Job controller gets
    ``killed_after_s`` 0 (``backoffLimit: 0`` gives them no grace).
    """
    from .output import parse_torchrun_failures

    exit_codes: dict[int, Optional[int]] = {n: None for n in range(spec.nodes)}
    for node, code in (outcome.get("exit_codes") or {}).items():
        if 0 <= node < spec.nodes:
            exit_codes[node] = code
    node_logs: dict[int, str] = {}
    results: dict[int, dict] = {}
    problems: dict[int, str] = {}
    rank_exit: dict[int, int] = {}
    logs = outcome.get("logs") or {}
    headers = outcome.get("headers") or {}
    for node in range(spec.nodes):
        text = logs.get(node)
        if text is None:
            continue
        node_logs[node] = headers.get(node, "") + text
        got, bad = parse_result_blocks(text, spec.run_id, spec.world_size)
        mine = set(spec.ranks_of_node(node))
        for rank, doc in got.items():
            if rank in mine:
                results[rank] = doc
            else:
                problems.setdefault(rank, f"result of rank {rank} printed by node {node}, which does not host it")
        for rank, why in bad.items():
            problems.setdefault(rank, why)
        for rank, code in parse_torchrun_failures(text).items():
            rank_exit.setdefault(rank, code)
    for rank in results:
        problems.pop(rank, None)
    timed_out = bool(outcome.get("timed_out"))
    killed = [n for n, c in exit_codes.items() if c is None]
    tracker = progress_from_logs(logs.values(), spec.world_size, spec.run_id)
    return LaunchResult(
        rank_results=results,
        node_logs=node_logs,
        node_exit_codes=exit_codes,
        timed_out=timed_out,
        missing_ranks=[r for r in range(spec.world_size) if r not in results],
        started_at=started_at,
        finished_at=finished_at,
        rank_exit_codes=rank_exit,
        rank_problems=problems,
        killed_after_s=0.0 if (outcome.get("failed") and killed and not timed_out) else None,
        cleanup_errors=cleanup_errors if cleanup_errors is not None else [],
        progress=tracker.snapshot(at=tracker.latest) if tracker.latest else {},
        socket_seen=dict(tracker.socket), interfaces_seen=dict(tracker.interfaces),
    )


# --------------------------------------------------------------------------- launcher

#: Container waiting reasons that will not resolve by waiting (image or config errors).
FATAL_WAITING = ("ErrImagePull", "ImagePullBackOff", "InvalidImageName", "CreateContainerConfigError",
                 "CreateContainerError", "ErrImageNeverPull")


class K8sLauncher:
    """Runs the ranks of a :class:`LaunchSpec` as an Indexed Job on a Kubernetes cluster.

    :meth:`run` renders the manifests (:func:`render_manifests`), creates the ConfigMap,
    Service and Job, polls the Job every ``poll_s`` seconds until it is ``Complete`` or
    ``Failed`` or ``timeout_s + slack_s`` seconds passed, reads every pod's log (also while
    they run, every ``log_every_s``, since the Job controller deletes the pods it stops),
    takes the result documents from the logs (:func:`parse_result_blocks`) and ALWAYS
    (``finally``, also on Ctrl-C) deletes the Job (with its pods), the Service, the
    ConfigMap and any pod labelled ``envbuild.run=<run>``.

    A container stuck for ``pull_grace_s`` in a waiting state of :data:`FATAL_WAITING`
    (an image that cannot be pulled) ends the run with an error. TrainJobs are rendered
    only (``options.kubeflow`` is refused here).

    Args:
        options: rendering options (:class:`K8sOptions`).
        api: a :class:`KubeApi` (or an object with its methods); default: one built from
            ``kubeconfig`` (default :func:`find_kubeconfig`), ``context`` and ``namespace``.
    """

    def __init__(self, options: K8sOptions = K8sOptions(), *, api: Any = None, kubeconfig: Optional[str] = None,
                 context: Optional[str] = None, namespace: Optional[str] = None, poll_s: float = 2.0,
                 log_every_s: float = 10.0, slack_s: float = 30.0, pull_grace_s: float = 60.0,
                 code: Optional[Mapping[str, str]] = None) -> None:
        if options.kubeflow:
            raise EnvbuildError("--apply runs the Indexed Job only; apply a TrainJob with "
                                "`kubectl apply -f DIR`", field="kubeflow", value=True, exit_code=ExitCode.USAGE)
        self.options = options
        self._api = api
        self.kubeconfig = kubeconfig
        self.context = context
        self.namespace = namespace
        self.poll_s = poll_s
        self.log_every_s = log_every_s
        self.slack_s = slack_s
        self.pull_grace_s = pull_grace_s
        self.code = code

    @property
    def api(self):
        """The API seam, connected on first use (:class:`KubeApi`)."""
        if self._api is None:
            self._api = KubeApi(self.kubeconfig or find_kubeconfig(), self.context, self.namespace)
        return self._api

    def run(self, spec: LaunchSpec, on_progress: Optional[OnProgress] = None) -> LaunchResult:
        """Launch ``spec`` on the cluster and return what the ranks produced.

        Raises:
            EnvbuildError: (exit 2) a tag-only image, the API refused an object; (exit 3) no
                kubeconfig, cluster unreachable, an image that cannot be pulled.
            KeyboardInterrupt: passed on, after the cleanup.
        """
        from .base import deferred_signals

        say = on_progress or (lambda msg: None)
        objects = load_objects(render_manifests(spec, self.options, self.code))
        api = self.api
        name = object_name(spec.run_id)
        # every object whose creation was asked for: a request cut short by Ctrl-C may still
        # have been carried out, so the cleanup deletes them all (a missing one is fine)
        created: list[tuple[str, str]] = []
        cleanup_errors: list[str] = []
        try:
            for obj in objects:
                created.append((obj["kind"], obj["metadata"]["name"]))
                try:
                    api.create(obj)
                except EnvbuildError as e:
                    if e.exit_code == ExitCode.CHECK_FAILED:  # refused (e.g. 409: exists): not ours
                        created.pop()
                    raise
            started_at = _utc_now_iso()
            say(f"run {spec.run_id}: created Job {name} in namespace {getattr(api, 'namespace', '?')}: "
                f"{spec.nodes} pod(s) x {spec.nproc_per_node} rank(s)")
            outcome = self._wait(spec, name, say)
            result = assemble_result(spec, outcome, started_at=started_at, finished_at=_utc_now_iso(),
                                     cleanup_errors=cleanup_errors)
            say(f"run {spec.run_id}: {len(result.rank_results)}/{spec.world_size} rank result(s)"
                + (" (timed out)" if result.timed_out else ""))
            return result
        finally:
            try:
                with deferred_signals():
                    self._cleanup(spec, created, cleanup_errors)
            except KeyboardInterrupt:
                with deferred_signals():
                    self._cleanup(spec, created, cleanup_errors)
                raise

    def _wait(self, spec: LaunchSpec, name: str, say: OnProgress) -> dict:
        """Poll the Job; returns ``{"timed_out", "failed", "exit_codes", "logs", "headers"}``."""
        api = self.api
        selector = f"{JOB_NAME_LABEL}={name}"
        t0 = time.monotonic()
        deadline = t0 + float(spec.timeout_s) + self.slack_s
        logs: dict[int, str] = {}
        headers: dict[int, str] = {}
        exit_codes: dict[int, Optional[int]] = {}
        last_log: dict[str, float] = {}
        waiting_since: dict[str, float] = {}
        timed_out = failed = False
        last_msg = ""
        while True:
            conds = {c["type"]: c for c in api.job_conditions(name) if c.get("status") == "True"}
            done = "Complete" in conds or "Failed" in conds
            pods = api.pods(selector)
            now = time.monotonic()
            for p in pods:
                if p.node is None:
                    continue
                headers[p.node] = f"[envbuild] pod {p.name} on {p.host or '?'}\n"
                final = p.exit_code is not None
                # a pod that ended before the Job did ended on its own; once the Job failed,
                # 137/143 (SIGKILL/SIGTERM) is the controller stopping the others: killed
                if final and (not done or "Complete" in conds or p.exit_code not in (137, 143)):
                    exit_codes.setdefault(p.node, p.exit_code)
                if p.phase in ("Running", "Succeeded", "Failed") and (
                        final or done or now - last_log.get(p.name, -1e9) >= self.log_every_s):
                    text = api.log(p.name)
                    if text or p.node not in logs:
                        logs[p.node] = text
                    last_log[p.name] = now
                if p.waiting_reason in FATAL_WAITING:
                    since = waiting_since.setdefault(p.name, now)
                    if now - since >= self.pull_grace_s:
                        raise Unreachable(f"pod {p.name}: {p.waiting_reason}: {_one_line(p.message or '')}"
                                          f" (image {spec.image})")
                else:
                    waiting_since.pop(p.name, None)
            if done:
                failed = "Failed" in conds
                timed_out = failed and conds["Failed"].get("reason") == "DeadlineExceeded"
                break
            if now >= deadline:
                timed_out = True
                break
            running = sum(1 for p in pods if p.phase == "Running")
            msg = (f"run {spec.run_id}: {running}/{spec.nodes} pod(s) running, "
                   f"{now - t0:.0f} s of {float(spec.timeout_s):g} s")
            if msg != last_msg:
                say(msg)
                last_msg = msg
            time.sleep(self.poll_s)
        return {"timed_out": timed_out, "failed": failed, "exit_codes": exit_codes, "logs": logs,
                "headers": headers}

    def _cleanup(self, spec: LaunchSpec, created: list[tuple[str, str]], errors: list[str]) -> None:
        """Delete what was created (newest first) and every pod labelled with the run."""
        from builder.image import engine

        for kind, obj_name in reversed(created):
            try:
                self.api.delete(kind, obj_name)
            except Exception as e:  # noqa: BLE001 - cleanup goes on
                errors.append(f"delete {kind} {obj_name}: {_one_line(e)}")
        if created:
            try:
                self.api.delete_pods(f"{engine.RUN_LABEL}={spec.run_id}")
            except Exception as e:  # noqa: BLE001
                errors.append(f"delete pods labelled {engine.RUN_LABEL}={spec.run_id}: {_one_line(e)}")
