"""The certificate document (``envbuild.certificate/2``; ``/1`` upgraded on reading) with the
settings it stores: written by certify, read typed by report, reference, gate and publish."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from msgspec import UNSET, Meta, UnsetType

from .documents import CollectiveRow, Features, NodeReport, Scaling, TrainingCheck, Unsupported
from .errors import EnvbuildError, ExitCode, FailureClass
from .inputs import one_line
from .model import Model, convert

CERT_SCHEMA: Literal["envbuild.certificate/2"] = "envbuild.certificate/2"
#: Every schema this version reads (``/1``: upgraded on reading).
CERT_SCHEMAS = ("envbuild.certificate/1", CERT_SCHEMA)

Name = Annotated[str, Meta(max_length=256)]
Text = Annotated[str, Meta(max_length=4096)]
Line = Annotated[str, Meta(max_length=65536)]
Count = Annotated[int, Meta(ge=0, le=2**53)]
Stamp = Annotated[str, Meta(max_length=64)]
Lines = Annotated[list[Line], Meta(max_length=100_000)]


class Ranks:
    """The ranks of ``nodes`` nodes of ``gpus_per_node`` GPUs (one rank on a CPU node), in torchrun's
    static rendezvous: the one place the launch spec and the run settings count them."""

    __slots__ = ()
    nodes: int
    gpus_per_node: int

    @property
    def nproc_per_node(self) -> int:
        return max(self.gpus_per_node, 1)

    @property
    def world_size(self) -> int:
        return self.nodes * self.nproc_per_node

    def ranks_of_node(self, node: int) -> list[int]:
        p = self.nproc_per_node
        return list(range(node * p, node * p + p))

    def node_of_rank(self, rank: int) -> int:
        return rank // self.nproc_per_node


class RunSettings(Model, Ranks, frozen=True):
    """The resolved settings of one certification, as the certificate stores them."""

    recipe: str
    recipe_backend: str
    backend: str
    nodes: int
    gpus_per_node: int
    port: int
    shm_size: str | None
    timeout_s: float
    sizes: list[int]
    iters: int
    warmup: int
    ddp_steps: int
    ddp_batch: int
    ddp_image_size: int
    min_busbw_gbps: float | None
    busbw_size: int
    busbw_source: Literal["argument", "recipe"] | None
    recipe_min_busbw_gbps: float | None
    profiles: list[str]
    dtypes: list[str]
    min_scaling_efficiency: float | None = None
    warnings: list[str] = []
    overrides: dict[str, Any] = {}

    def bench_args(self) -> list[str]:
        """Arguments of ``python3 -m bench`` after ``--out``."""
        return ["--backend", self.backend, "--sizes", ",".join(str(s) for s in self.sizes), "--iters", str(self.iters),
                "--warmup", str(self.warmup), "--ddp-steps", str(self.ddp_steps), "--ddp-batch", str(self.ddp_batch),
                "--ddp-image-size", str(self.ddp_image_size), "--pg-timeout-s", f"{float(self.timeout_s):g}",
                "--profiles", ",".join(self.profiles), "--dtypes", ",".join(self.dtypes)]


class Verdict(Model, frozen=True):
    """The judgement of a run: ``passed`` is the pass flag; ``exit_code`` 0 passed, 2 a check
    failed, 3 could not check; one line per failure and warning."""

    passed: bool
    exit_code: Annotated[int, Meta(ge=0, le=255)]
    failures: Lines
    warnings: Lines
    failure_class: FailureClass | None = None
    next_step: Line | None = None


class ImageInfo(Model, frozen=True):
    """The image certified: its reference, ID, repository digests and envbuild's labels."""

    ref: Text
    id: Name | None
    repo_digests: Annotated[list[Text], Meta(max_length=1000)]
    labels: dict[Name, Line]


class Backend(Model, frozen=True):
    used: Name
    recipe: Name


class SocketSetting(Model, frozen=True):
    """The socket interface setting of a run, where it came from (the image's ``ENV``, the
    option, or neither: NCCL and gloo choose) and, in a certificate, what each rank saw."""

    source: Literal["image", "--socket-ifname", "default"]
    override: Name | None
    GLOO_SOCKET_IFNAME: Name | None
    NCCL_SOCKET_IFNAME: Name | None
    seen_by_ranks: dict[Name, dict[Name, Name | None]] = {}

    def get(self, var: str) -> str | None:
        """The value of ``GLOO_SOCKET_IFNAME`` or ``NCCL_SOCKET_IFNAME``."""
        return self.GLOO_SOCKET_IFNAME if var == "GLOO_SOCKET_IFNAME" else self.NCCL_SOCKET_IFNAME


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
    """Where envbuild ran: the host and, per source and launcher, the engine's version or the cluster's namespace."""

    hostname: Name
    docker_server_version: Name | None | UnsetType = UNSET
    launcher: Name | UnsetType = UNSET
    namespace: Name | None | UnsetType = UNSET


class CudaRequirement(Model, frozen=True):
    """What the certified image needs of a node's driver, from the image's own config ``Env``."""

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
    """The software stack every rank must match; ``source`` ``probe``: a foreign image without a
    lock, whose stack the reference rank's probe discovered."""

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
    """A certificate: the image, its recipe lock, the resolved settings, every rank's
    results and probe, the profiles' measurements and the verdict (``verdict.passed``).
    ``stack`` is the reference stack (``source`` ``probe``: a foreign image, no lock)."""

    schema: Literal["envbuild.certificate/1", "envbuild.certificate/2"]
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
    settings: RunSettings
    socket: SocketSetting | None
    probe: dict[Name, NodeReport | None]
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
    profile_wall_s: dict[Name, Any] = {}
    #: Absent from older certificates (None: not recorded).
    cuda_requirement: CudaRequirement | None = None


def _v1_settings(doc: dict[str, Any]) -> dict[str, Any]:
    """The ``/2`` settings of a ``/1`` certificate, from its ``settings``, ``backend``,
    ``thresholds`` and ``overrides``."""
    def part(d: Any, key: str) -> dict[str, Any]:
        v = d.get(key) if isinstance(d, dict) else None
        return v if isinstance(v, dict) else {}

    st, th, be = part(doc, "settings"), part(doc, "thresholds"), part(doc, "backend")
    ar, dd = part(st, "allreduce"), part(st, "ddp")
    return {"recipe": doc.get("recipe") or "unknown", "recipe_backend": be.get("recipe"),
            "backend": be.get("used"), "nodes": doc.get("nodes"), "gpus_per_node": doc.get("gpus_per_node"),
            "port": st.get("port"), "shm_size": st.get("shm_size"), "timeout_s": st.get("timeout_s"),
            "sizes": ar.get("sizes"), "iters": ar.get("iters"), "warmup": ar.get("warmup"),
            "ddp_steps": dd.get("steps"), "ddp_batch": dd.get("batch_size"), "ddp_image_size": dd.get("image_size"),
            "min_busbw_gbps": th.get("min_busbw_gbps"), "busbw_size": th.get("busbw_size"),
            "busbw_source": th.get("source"), "recipe_min_busbw_gbps": th.get("recipe_min_busbw_gbps"),
            "profiles": st.get("profiles", []), "dtypes": st.get("dtypes", []),
            "min_scaling_efficiency": th.get("min_scaling_efficiency"), "overrides": doc.get("overrides", {})}


def upgrade_v1(data: dict[str, Any]) -> dict[str, Any]:
    """A ``/1`` certificate as a ``/2`` one: the settings in one section, a legacy all-reduce sweep
    as ``collectives.all_reduce`` (its thresholds and tables still read), the legacy DDP table
    dropped (its check is the ddp profile's)."""
    doc = {k: v for k, v in data.items() if k not in ("allreduce", "ddp", "thresholds", "overrides")}
    doc["schema"] = CERT_SCHEMA
    doc["settings"] = _v1_settings(data)
    coll = dict(doc.get("collectives") or {}) if isinstance(doc.get("collectives"), dict) else {}
    legacy = data.get("allreduce")
    if "all_reduce" not in coll and isinstance(legacy, list) and legacy:
        coll["all_reduce"] = [{**r, "wrong_by_rank": [w or 0 for w in r.get("wrong_by_rank") or []]}
                              if isinstance(r, dict) else r for r in legacy]
    doc["collectives"] = coll
    return doc


def load_certificate(data: Any, file: str | None = None, exit_code: ExitCode = ExitCode.CHECK_FAILED) -> Certificate:
    """``data`` (a parsed certificate document, ``/1`` or ``/2``) as a :class:`Certificate`.
    Raises ManyErrors: (``exit_code``) every violation, with its field path and value."""
    schema = data.get("schema") if isinstance(data, dict) else None
    if schema not in CERT_SCHEMAS:
        raise EnvbuildError(f"not a certificate (schema {one_line(repr(schema), 80)}; "
                            f"want {CERT_SCHEMA})", file=file, exit_code=exit_code)
    if schema == CERT_SCHEMAS[0]:
        data = upgrade_v1(data)
    return convert(data, Certificate, file=file, exit_code=exit_code)


def schemas() -> dict[str, tuple[type[Model], str, str]]:
    """``{file stem: (model, $id, title)}`` of the documents of this package (``schemas/``)."""
    return {"certificate": (Certificate, "https://envbuild.dev/schemas/certificate.schema.json",
                            "envbuild certificate (envbuild.certificate/2)")}
