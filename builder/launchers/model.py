"""The rank result document, schema ``envbuild.rank-result/1``: what one rank of the in-image
bench reports (``builder/agent/bench/__init__.py`` documents the writer's side).

Every launcher reads a rank's document through :func:`builder.launchers.output.check_result`,
which checks it belongs to this run (schema, rank, run id, world size) and converts it into
a :class:`RankResult` (:func:`builder.core.model.convert`: unknown keys refused, every value
bounded). The JSON Schema of the model is published as ``schemas/rank-result.schema.json``
(:func:`schemas`).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

import msgspec
from msgspec import Meta

from builder.core.model import Model

#: Schema of the per-rank result the in-image bench writes.
RESULT_SCHEMA = "envbuild.rank-result/1"
#: Largest result document or progress line read, in bytes (as node reports: 16 MiB).
MAX_RESULT_BYTES = 16 << 20
#: Most ranks of one run (1024 nodes x 64 GPUs, the command line's bounds).
MAX_WORLD = 1024 * 64

Rank = Annotated[int, Meta(ge=0, lt=MAX_WORLD)]
Count = Annotated[int, Meta(ge=0, le=2**53)]
Seconds = Annotated[float, Meta(ge=0)]
Rate = Annotated[float, Meta(ge=0)]
Name = Annotated[str, Meta(max_length=256)]
Line = Annotated[str, Meta(max_length=65536)]
Stamp = Annotated[str, Meta(max_length=64)]
PerRank = Annotated[list[Seconds], Meta(max_length=MAX_WORLD)]


class AllreduceEntry(Model, frozen=True):
    """One all-reduce size: nccl-tests columns (``time_us`` the slowest rank's mean per
    iteration; algbw = size / time, busbw = algbw x 2(n-1)/n, GB/s = 1e9 B/s) and the
    exact check: ``wrong`` is this rank's count of wrong elements, ``wrong_by_rank`` all
    ranks' (gathered)."""

    size_bytes: Annotated[int, Meta(ge=0, le=2**40)]
    count: Count
    type: Name
    redop: Name
    time_us: Seconds
    rank_time_us: PerRank
    algbw_gbps: Rate
    busbw_gbps: Rate
    wrong: Count | None
    wrong_by_rank: Annotated[list[Count], Meta(max_length=MAX_WORLD)]


class DdpResult(Model, frozen=True):
    """The DDP steps of one rank: throughput, loss, and whether the parameters of every
    rank agree after them (``param_checksum``: sha256 hex of this rank's parameters)."""

    model: Name
    source: Name
    steps: Count
    batch_size: Count
    image_size: Count
    wall_s: Seconds
    images_per_s: Rate
    final_loss: float | None
    param_checksum: Name
    params_identical: bool
    mismatched_ranks: Annotated[list[Rank], Meta(max_length=MAX_WORLD)]
    checksums_by_rank: Annotated[list[Name], Meta(max_length=MAX_WORLD)] = []


class CollectiveRow(Model, frozen=True):
    """One size of one collective and element type (``bench.collectives.summarize``):
    nccl-tests columns (``size_bytes`` = max(send, recv) bytes of one rank, ``time_us``
    the slowest rank's mean, GB/s = 1e9 B/s, busbw = algbw x the collective's factor)
    and the exact check: ``wrong`` the total over ranks, ``wrong_by_rank`` each rank's."""

    size_bytes: Annotated[int, Meta(ge=0, le=2**40)]
    count: Count
    type: Name
    redop: Name
    time_us: Seconds
    rank_time_us: PerRank
    algbw_gbps: Rate
    busbw_gbps: Rate
    wrong: Count
    wrong_by_rank: Annotated[list[Count], Meta(max_length=MAX_WORLD)]
    root: Annotated[int, Meta(ge=-1, lt=MAX_WORLD)] = -1
    api: Name | None = None


class Unsupported(Model, frozen=True):
    """What the image's torch or backend lacks, with the reason (not a failure)."""

    unsupported: Line


Floats = Annotated[list[float | None], Meta(max_length=10_000)]


class TrainingCheck(Model, frozen=True):
    """One profile's training check against its single-process reference
    (``bench.training.result``), or ``{"unsupported": reason}`` (``needs_numpy`` when
    numpy is the reason). ``tolerance``: ``{"rtol", "atol", "rule"}``; ``losses`` per step
    (distributed, over the global batch); ``samples_per_s`` of the distributed steps."""

    unsupported: Line | None = None
    needs_numpy: bool = False
    reference_match: bool | None = None
    losses_match: bool | None = None
    params_match: bool | None = None
    tolerance: dict[Name, float | Line] | None = None
    losses: Floats = []
    reference_losses: Floats = []
    max_param_diff: float | None = None
    samples_per_s: Rate | None = None
    wall_s: Seconds | None = None
    steps: Count | None = None
    model: Line | None = None
    check_wall_s: Seconds | None = None
    # per-check details
    dtype: Name | None = None
    batch_per_rank: Count | None = None
    global_batch: Count | None = None
    image_size: Count | None = None
    reference_wall_s: Seconds | None = None
    schedule: Name | None = None
    stages: Count | None = None
    microbatches: Count | None = None
    microbatch_size: Count | None = None
    batch: Count | None = None
    hidden: Count | None = None
    experts: Count | None = None
    tokens_per_rank: Count | None = None
    routed: Annotated[list[Count], Meta(max_length=MAX_WORLD)] | None = None


class Scaling(Model, frozen=True):
    """The same DDP step at world size 1 and N (``bench.scaling``): throughputs in
    images/s, ``efficiency`` = throughput_n / (N x throughput_1) (None: not measurable)."""

    model: Line
    batch_per_rank: Count
    image_size: Count
    steps: Count
    world_size: Annotated[int, Meta(ge=1, le=MAX_WORLD)]
    throughput_1: Rate
    throughput_n: Rate
    time_1_s: Seconds
    time_n_s: Seconds
    efficiency: Rate | None


class NumpyState(Model, frozen=True):
    available: bool
    problem: Line | None
    ranks_without: Annotated[list[Rank], Meta(max_length=MAX_WORLD)]


class FeatureUnsupported(Model, frozen=True):
    unsupported: Line
    needs_numpy: bool = False
    ran: bool = True


class Features(Model, frozen=True):
    """The torch.distributed features that need numpy (``bench.features``): ``"ok"`` or why not."""

    numpy: NumpyState
    all_gather_object: Literal["ok"] | FeatureUnsupported
    pipeline_shape_inference: Literal["ok"] | FeatureUnsupported
    dcp_save: Literal["ok"] | FeatureUnsupported


class ProfilesResult(Model, frozen=True):
    """What ``bench.profiles.run_profiles`` returned on this rank: the collectives of the
    profiles (``{name: [row] | {"unsupported"}}``), their training checks, scaling and the
    numpy features (None: not run); ``wall_s`` where the time went (this rank)."""

    profiles: Annotated[list[Name], Meta(max_length=16)]
    world_size: Annotated[int, Meta(ge=1, le=MAX_WORLD)]
    backend: Name
    device: Name
    dtypes: Annotated[list[Name], Meta(max_length=16)]
    sizes: Annotated[list[Count], Meta(max_length=4096)]
    iters: Count
    warmup: Count
    seed: int
    faults: Annotated[list[Name], Meta(max_length=64)] = []
    fault_notes: Annotated[list[Line], Meta(max_length=64)] = []
    collectives: dict[Name, list[CollectiveRow] | Unsupported] = {}
    unsupported_types: dict[Name, dict[Name, Line]] = {}
    training: dict[Name, TrainingCheck] = {}
    scaling: Scaling | None = None
    features: Features | None = None
    wall_s: dict[Name, Any] = {}


class RankOptions(Model, frozen=True):
    """The bench options the rank ran with (as the host passed them)."""

    sizes: Annotated[list[Count], Meta(max_length=4096)] | None = None
    iters: Count | None = None
    warmup: Count | None = None
    ddp_steps: Count | None = None
    ddp_batch: Count | None = None
    ddp_image_size: Count | None = None
    seed: int | None = None
    pg_timeout_s: Seconds | None = None


class RankSocket(Model, frozen=True):
    """The socket interface settings the rank saw in its environment."""

    GLOO_SOCKET_IFNAME: Name | None = None
    NCCL_SOCKET_IFNAME: Name | None = None


class RankResult(Model, frozen=True):
    """One rank's result document (``envbuild.rank-result/1``). Only ``schema``, ``rank``
    and ``world_size`` are required (what makes it a result of a rank of this run); the
    bench writes every field, and what a document lacks is judged as missing (``no DDP
    result``, ``probe failed``), not refused. Every field present is checked.

    ``probe`` is the rank's node report (``envbuild.probe/1``, checked against the lock by
    :mod:`builder.image.probecheck`); None when the probe failed (``errors`` says why).
    """

    schema: Literal["envbuild.rank-result/1"]
    rank: Rank
    world_size: Annotated[int, Meta(ge=1, le=MAX_WORLD)]
    run_id: Name | None = None
    hostname: Name | None = None
    backend: Name | None = None
    device: Name | None = None
    allreduce: list[AllreduceEntry] = []  # bounded by MAX_RESULT_BYTES; unannotated: violations name the entry
    ddp: DdpResult | None = None
    profiles: ProfilesResult | None = None
    probe: dict[str, Any] | None = None
    local_rank: Rank | None = None
    node_rank: Rank | None = None
    dtype: Name | None = None
    options: RankOptions = msgspec.field(default_factory=RankOptions)
    socket: RankSocket | None = None
    fault: Name | None = None
    errors: Annotated[list[Line], Meta(max_length=1000)] = []
    started_at: Stamp | None = None
    finished_at: Stamp | None = None
    elapsed_s: Seconds | None = None


def schemas() -> dict[str, tuple[type[Model], str, str]]:
    """``{file stem: (model, $id, title)}`` of the documents of this package (``schemas/``)."""
    return {"rank-result": (RankResult, "https://envbuild.dev/schemas/rank-result.schema.json",
                            "envbuild rank result (envbuild.rank-result/1)")}
