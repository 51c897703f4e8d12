"""The collectives and the training check of each parallelism strategy (``all``: the six collectives);
only :func:`run_profiles` and below use torch."""

from __future__ import annotations

import functools
import os
import re
import time
from typing import Any, Callable, Sequence

from . import collectives as coll
from .profile_faults import ENV_VAR as FAULT_ENV_VAR
from .profile_faults import _show, parse_faults

PROFILES = {"ddp": ("all_reduce", "broadcast"), "fsdp": ("all_gather", "reduce_scatter"),
            "tp": ("all_reduce", "all_gather"), "pipeline": ("send_recv",), "moe": ("all_to_all",)}
ALL = "all"
MAX_TEXT = 200
MAX_SIZES = 64
MAX_SIZE_BYTES = 1 << 40  # 1 TiB per buffer
_NAME = re.compile(r"[a-z]{1,16}")


def parse_profiles(text: str) -> list[str]:
    """``"fsdp, ddp,fsdp"`` -> ``["ddp", "fsdp"]``, validated whole; ValueError names the bad item."""
    allowed = ", ".join(list(PROFILES) + [ALL])
    if not isinstance(text, str):
        raise ValueError(f"profiles must be text, got {type(text).__name__}")
    if len(text) > MAX_TEXT:
        raise ValueError(f"profile list of {len(text):d} characters (at most {MAX_TEXT:d})")
    chosen: set[str] = set()
    for item in text.split(","):
        name = item.strip()
        if not name:
            raise ValueError(f"empty profile name in {_show(text)} (allowed: {allowed})")
        if not _NAME.fullmatch(name) or (name not in PROFILES and name != ALL):
            raise ValueError(f"unknown profile {_show(name)} (allowed: {allowed})")
        chosen.update(PROFILES if name == ALL else (name,))
    return [p for p in PROFILES if p in chosen]


def collectives_for(profiles: Sequence[str]) -> list[str]:
    """The collectives the profiles use, each once, in ``COLLECTIVES`` order; ValueError on an unknown profile."""
    needed: set[str] = set()
    for p in profiles:
        if p not in PROFILES:
            raise ValueError(f"unknown profile {_show(str(p))}")
        needed.update(PROFILES[p])
    return [c for c in coll.COLLECTIVES if c in needed]


def default_dtypes(backend: str) -> list[str]:
    """float32, and bfloat16 on nccl (the GPU training type); CPU training is float32."""
    return ["float32", "bfloat16"] if backend == "nccl" else ["float32"]


def check_options(profiles, sizes, iters, warmup, dtypes, backend):
    """(profile names, dtypes) after checking :func:`run_profiles`' options whole; ValueError otherwise."""
    names = parse_profiles(profiles if isinstance(profiles, str) else ",".join(profiles))
    dtypes = list(dtypes) if dtypes else default_dtypes(backend)
    for d in dtypes:
        coll.typesize(d)
    if len(set(dtypes)) != len(dtypes):
        raise ValueError("dtype given twice in {}".format(_show(",".join(dtypes))))
    if not 1 <= len(sizes) <= MAX_SIZES or not all(type(s) is int and 1 <= s <= MAX_SIZE_BYTES for s in sizes):
        raise ValueError(f"sizes must be 1 to {MAX_SIZES:d} integers in 1..{MAX_SIZE_BYTES:d} bytes, "
                         f"got {_show(str(list(sizes)))}")
    if type(iters) is not int or type(warmup) is not int or iters < 1 or warmup < 0:
        raise ValueError(f"iters must be an integer >= 1 and warmup >= 0, got {iters!r}, {warmup!r}")
    return names, dtypes


def _sweep(name: str, sizes, dtypes, iters, warmup, device, faults, rank, log):
    """Rows of every dtype of one collective; ``{"unsupported"}`` when none ran."""
    corrupt = any(f.hits("collective-corrupt", rank, name) for f in faults)
    rows, skipped = [], {}
    for dtype in dtypes:
        out = coll.run_collective(name, sizes, dtype, iters, warmup, device, corrupt=corrupt, log=log)
        if isinstance(out, dict):
            skipped[dtype] = out["unsupported"]
        else:
            rows.extend(out)
    if not rows:
        reasons = list(skipped.values())
        if len(set(reasons)) == 1:
            return {"unsupported": reasons[0]}, skipped
        return {"unsupported": "; ".join("{}: {}".format(*kv) for kv in skipped.items())}, skipped
    return rows, skipped


def _training_runner(profile: str) -> Callable[..., dict[str, Any]]:
    from . import train_ddp, train_fsdp, train_moe, train_pipeline, train_tp

    runners: dict[str, Callable[..., dict[str, Any]]] = {
        "ddp": train_ddp.run_ddp_check, "fsdp": train_fsdp.run_fsdp_check,
        "tp": train_tp.run_tp_check, "pipeline": train_pipeline.run_pipeline_check,
        "moe": train_moe.run_moe_check}
    return runners[profile]


def run_profiles(profiles, sizes: list[int], iters: int, warmup: int, dtypes: list[str] | None, seed: int, device: str,
                 backend: str, *, ddp: tuple[int, int, int] = (3, 4, 32), faults=None, scaling: bool = True,
                 features: bool = True, log: Callable[[str], None] | None = None) -> dict[str, Any]:
    """The collectives (each once), training, scaling and feature checks of ``profiles``, the same on every rank but
    wall times (s) and numpy problem; ``ddp``: (steps, images per rank, side). ValueError before any collective."""
    import torch.distributed as dist

    t_start = time.perf_counter()
    names, dtypes = check_options(profiles, sizes, iters, warmup, dtypes, backend)
    if faults is None:
        faults = parse_faults(os.environ.get(FAULT_ENV_VAR))
    rank, world = dist.get_rank(), dist.get_world_size()
    out = {"profiles": names, "world_size": world, "backend": backend, "device": device, "dtypes": dtypes,
           "sizes": list(sizes), "iters": iters, "warmup": warmup, "seed": seed, "faults": [str(f) for f in faults],
           "fault_notes": [f"fault {f} targets no rank of a world of {world:d}" for f in faults if f.rank >= world],
           "collectives": {}, "unsupported_types": {}, "training": {}, "scaling": None, "features": None,
           "wall_s": {"collectives": {}, "training": {}, "scaling": None, "features": None}}
    if log:
        log(coll.HEADER)
    for name in collectives_for(names):
        t0 = time.perf_counter()
        result, skipped = _sweep(name, sizes, dtypes, iters, warmup, device, faults, rank, log)
        out["collectives"][name] = result
        if skipped and isinstance(result, list):
            out["unsupported_types"][name] = skipped
        out["wall_s"]["collectives"][name] = time.perf_counter() - t0
    _run_rest(out, names, seed, device, faults, scaling, features, log, ddp)
    out["wall_s"]["total"] = time.perf_counter() - t_start
    return out


def _run_rest(out, names, seed, device, faults, scaling, features, log, ddp) -> None:
    from . import training

    for profile in names:
        t0 = time.perf_counter()
        runner = functools.partial(_training_runner(profile), seed, device, faults=faults)
        if profile == "ddp":
            runner = functools.partial(runner, steps=ddp[0], batch=ddp[1], image_size=ddp[2])
        res = training.guarded(runner)
        out["training"][profile] = res
        out["wall_s"]["training"][profile] = time.perf_counter() - t0
        if log:
            log(training_line(profile, res))
    if scaling:
        from .scaling import run_scaling

        t0 = time.perf_counter()
        out["scaling"] = run_scaling(seed, device, batch=ddp[1], image_size=ddp[2])
        out["wall_s"]["scaling"] = time.perf_counter() - t0
        if log:
            log("# scaling: {:.2f} images/s at 1 rank, {:.2f} at {:d}, efficiency {:.3f}".format(
                   out["scaling"]["throughput_1"], out["scaling"]["throughput_n"],
                   out["scaling"]["world_size"], out["scaling"]["efficiency"] or 0.0))
    if features:
        from .features import run_features

        t0 = time.perf_counter()
        out["features"] = run_features(device)
        out["wall_s"]["features"] = time.perf_counter() - t0


def training_line(profile: str, res: dict[str, Any]) -> str:
    if "unsupported" in res:
        return "# training {}: unsupported: {}".format(profile, res["unsupported"])
    return "# training {}: reference match {}, max param diff {:.3g}, {:.1f} samples/s".format(
        profile, "yes" if res["reference_match"] else "NO", res["max_param_diff"] or 0.0,
        res["samples_per_s"] or 0.0)
