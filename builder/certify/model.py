"""The certificate document (schema ``envbuild.certificate/1``) and its verdict, as models.

:func:`builder.certify.certificate.build_certificate` makes a :class:`Certificate`; it is
written as JSON (:meth:`~builder.core.model.Model.to_dict`, key order as declared here) and
read back with :func:`load_certificate` (every field checked, unknown keys refused). Per-rank
and per-node maps are keyed by the rank or node as a string (JSON object keys). Optional
parts absent from a document (a rank that reported has no ``exit_code``, one that did not
has no ``hostname``) are ``UNSET`` (msgspec), so that they are left out of the JSON, not
written as null. The JSON Schema is published as ``schemas/certificate.schema.json``
(:func:`schemas`).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from msgspec import UNSET, Meta, UnsetType

from builder.core.errors import ExitCode
from builder.core.model import Model, convert
from builder.launchers.model import CollectiveRow, Features, Scaling, TrainingCheck, Unsupported

CERT_SCHEMA: Literal["envbuild.certificate/1"] = "envbuild.certificate/1"

Name = Annotated[str, Meta(max_length=256)]
Text = Annotated[str, Meta(max_length=4096)]
Line = Annotated[str, Meta(max_length=65536)]
Count = Annotated[int, Meta(ge=0, le=2**53)]
Stamp = Annotated[str, Meta(max_length=64)]
Lines = Annotated[list[Line], Meta(max_length=100_000)]


class Verdict(Model, frozen=True):
    """The judgement of a run: ``passed`` is the pass flag; ``exit_code`` 0 passed, 2 a check
    failed, 3 could not check; one line per failure and warning."""

    passed: bool
    exit_code: Annotated[int, Meta(ge=0, le=255)]
    failures: Lines
    warnings: Lines


class ImageInfo(Model, frozen=True):
    """The image certified: its reference, ID, repository digests and envbuild's labels."""

    ref: Text
    id: Name | None
    repo_digests: Annotated[list[Text], Meta(max_length=1000)]
    labels: dict[Name, Line]


class Backend(Model, frozen=True):
    used: Name
    recipe: Name


class AllreduceSettings(Model, frozen=True):
    sizes: Annotated[list[Count], Meta(max_length=4096)]
    iters: Count
    warmup: Count


class DdpSettings(Model, frozen=True):
    steps: Count
    batch_size: Count
    image_size: Count


class RunSettingsDoc(Model, frozen=True):
    """The settings the run used (``settings`` of the certificate)."""

    port: Annotated[int, Meta(ge=1, le=65535)]
    shm_size: Name | None
    timeout_s: float
    allreduce: AllreduceSettings
    ddp: DdpSettings
    profiles: Annotated[list[Name], Meta(max_length=16)] = []
    dtypes: Annotated[list[Name], Meta(max_length=16)] = []


class SocketRecord(Model, frozen=True):
    """The socket interface setting of the run (``source``: ``image``, ``--socket-ifname``
    or ``default``) and what each rank saw."""

    source: Literal["image", "--socket-ifname", "default"]
    override: Name | None
    GLOO_SOCKET_IFNAME: Name | None
    NCCL_SOCKET_IFNAME: Name | None
    seen_by_ranks: dict[Name, dict[Name, Name | None]]


class Thresholds(Model, frozen=True):
    """The busbw floor applied (None: not gated), at which size, where it came from."""

    min_busbw_gbps: float | None
    busbw_size: Count
    source: Literal["argument", "recipe"] | None
    recipe_min_busbw_gbps: float | None
    min_scaling_efficiency: float | None = None


class AllreduceRow(Model, frozen=True):
    """One all-reduce size, nccl-tests columns; ``wrong`` the total over ranks."""

    size_bytes: Count
    count: Count
    type: Name
    redop: Name
    time_us: float
    algbw_gbps: float
    busbw_gbps: float
    wrong: Count
    wrong_by_rank: list[Count | None]
    rank_time_us: list[float]


class DdpRank(Model, frozen=True):
    images_per_s: float
    wall_s: float
    final_loss: float | None
    param_checksum: Name


class DdpTable(Model, frozen=True):
    """The DDP check: the model and steps, whether every rank ended with the same
    parameters, and each rank's throughput."""

    model: Name
    source: Name
    steps: Count
    batch_size: Count
    image_size: Count
    params_identical: bool
    mismatched_ranks: list[Count]
    ranks: dict[Name, DdpRank]


class NcclInfo(Model, frozen=True):
    """From the NCCL INFO lines: each rank's network, InfiniBand devices and NCCL version."""

    networks: dict[Name, Name]
    ib_devices: dict[Name, list[Name]]
    versions: dict[Name, Name]


class RankEntry(Model, frozen=True):
    """One rank: what it reported, or why it did not (``exit_code``, ``problem``);
    ``last_progress`` its progress when the launch gave up waiting."""

    node: Count
    reported: bool
    hostname: Name | None | UnsetType = UNSET
    device: Name | None | UnsetType = UNSET
    elapsed_s: float | None | UnsetType = UNSET
    errors: Lines | UnsetType = UNSET
    fault: Name | None | UnsetType = UNSET
    lock_mismatches: Lines | None | UnsetType = UNSET
    exit_code: int | None | UnsetType = UNSET
    problem: Text | UnsetType = UNSET
    last_progress: dict[Name, Any] | UnsetType = UNSET


class NodeStatus(Model, frozen=True):
    """One node: its name, exit status (None: killed or never started) and, when the
    verdict failed, the tail of its log."""

    name: Name
    exit_code: int | None
    log_tail: Lines | UnsetType = UNSET


class Host(Model, frozen=True):
    """Where envbuild ran: the host and, per source and launcher, the engine's version or
    the cluster's namespace."""

    hostname: Name
    docker_server_version: Name | None | UnsetType = UNSET
    launcher: Name | UnsetType = UNSET
    namespace: Name | None | UnsetType = UNSET


class CudaRequirement(Model, frozen=True):
    """What the certified image needs of a node's driver (issue 11), from the image's own
    config: ``torch_cuda`` the torch variant's CUDA (the lock's), ``nvidia_require_cuda``
    and ``nvidia_disable_require`` its ``Env`` values (None when unset), ``source`` where
    they were read (``config Env of image REF``)."""

    torch_cuda: Name | None
    nvidia_require_cuda: Text | None
    nvidia_disable_require: Name | None
    source: Text


class PhaseTime(Model, frozen=True):
    """One host-side phase of the run (:mod:`builder.launchers.phases`): ``name`` (``containers
    up``, ``ranks up``, ``init``, ``all-reduce``, ``ddp``, ``probe``, ``write``, ``exit``,
    ``teardown``...) and its wall ``seconds`` on the host's clock."""

    name: Name
    seconds: Annotated[float, Meta(ge=0, le=1e9)]


class Stack(Model, frozen=True):
    """The software stack every rank must match, and what it was taken from: ``source``
    ``lock`` (the image's own lock), ``recipe`` (``--recipe``'s lock) or ``probe`` (a
    foreign image: no recipe lock exists; the reference rank's probe discovered it).
    ``reference_rank`` is that rank (``probe`` only); the versions are the probe's."""

    source: Literal["lock", "recipe", "probe"]
    recipe: Name | None
    reference_rank: Count | None
    python: Name | None
    torch: Name | None
    cuda: Name | None
    nccl: Name | None
    glibc: Name | None
    os: Name | None


class Certificate(Model, frozen=True):
    """A certificate: the image, its recipe lock, the settings, every rank's results and
    probe, and the verdict (``verdict.passed``).

    The profiles' sections (issue 10): ``profiles`` the profiles run; ``collectives.<name>``
    a list of rows (``size_bytes``, ``count``, ``type``, ``time_us``, ``algbw_gbps``,
    ``busbw_gbps``, ``wrong`` = total over ranks, ``wrong_by_rank``...) or
    ``{"unsupported": reason}``; ``training.<profile>`` (``ddp``, ``fsdp``, ``tp``,
    ``pipeline``, ``moe``) each with a boolean ``reference_match``, the ``tolerance``,
    ``losses`` and ``reference_losses`` per step and ``samples_per_s``, or
    ``{"unsupported": reason}``; ``scaling`` the throughputs at world size 1 and N and
    ``efficiency`` = throughput_n / (N x throughput_1); ``features`` what needs numpy;
    ``stack`` the reference stack (``source`` ``probe`` and ``lock`` null: a foreign
    image, no recipe lock); ``overrides`` the settings given on the command line;
    ``profile_wall_s`` where the reference rank's time went (seconds: ``collectives.<name>``,
    ``training.<profile>``, ``scaling``, ``features``, ``total``).
    """

    schema: Literal["envbuild.certificate/1"]
    envbuild_version: Name
    run_id: Name
    image: ImageInfo
    recipe: Name | None
    lock_hash: Name | None
    lock: dict[str, Any] | None
    base_used: Text | None
    backend: Backend
    world_size: Count
    nodes: Count
    gpus_per_node: Count
    nproc_per_node: Count
    settings: RunSettingsDoc
    socket: SocketRecord | None
    thresholds: Thresholds
    probe: dict[Name, dict[str, Any] | None]
    allreduce: list[AllreduceRow]
    ddp: DdpTable | None
    transports: dict[Name, list[Name] | None] | None
    nccl: NcclInfo | None
    ranks: dict[Name, RankEntry]
    node_status: dict[Name, NodeStatus]
    timed_out: bool
    verdict: Verdict
    started_at: Stamp
    finished_at: Stamp
    host: Host
    phases: Annotated[list[PhaseTime], Meta(max_length=256)] = []
    stack: Stack | None = None
    profiles: Annotated[list[Name], Meta(max_length=16)] = []
    collectives: dict[Name, list[CollectiveRow] | Unsupported] = {}
    training: dict[Name, TrainingCheck] = {}
    scaling: Scaling | None = None
    features: Features | None = None
    overrides: dict[Name, Any] = {}
    profile_wall_s: dict[Name, Any] = {}
    #: Absent from certificates made before issue 11 (None: not recorded).
    cuda_requirement: CudaRequirement | None = None


def load_certificate(data: Any, file: str | None = None) -> Certificate:
    """``data`` (a parsed certificate document) as a :class:`Certificate`.

    Raises:
        ManyErrors: (exit 2) every violation, with its field path and value.
    """
    return convert(data, Certificate, file=file, exit_code=ExitCode.CHECK_FAILED)


def schemas() -> dict[str, tuple[type[Model], str, str]]:
    """``{file stem: (model, $id, title)}`` of the documents of this package (``schemas/``)."""
    return {"certificate": (Certificate, "https://envbuild.dev/schemas/certificate.schema.json",
                            "envbuild certificate (envbuild.certificate/1)")}
