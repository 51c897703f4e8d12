"""torch.distributed features that need numpy (object collectives, pipeline shape inference, ``dcp.save``): torch wheels
do not depend on numpy, and without it these fail. The ranks first agree on who lacks numpy. Only ``all_gather_object``
runs when every rank lacks it (it fails before communicating); the others would fail on one side only and hang the
peers until the process-group timeout, so they are reported without running."""

from __future__ import annotations

import os
import shutil
import tempfile
from typing import Any

from .support import Unsupported, needs_numpy, numpy_problem, unsupported_reason

FEATURES = ("all_gather_object", "pipeline_shape_inference", "dcp_save")
# Fail on every rank alike when numpy is missing everywhere (no one-sided hang).
SYMMETRIC = ("all_gather_object",)


def _all_gather_object(torch, dist, device):
    world = dist.get_world_size()
    out = [None] * world
    dist.all_gather_object(out, {"rank": dist.get_rank()})
    if out != [{"rank": r} for r in range(world)]:
        raise AssertionError(f"all_gather_object returned {out!r}")


def _shape_inference(torch, dist, device):
    """A 1-microbatch forward through a chain of stages given no example shapes."""
    if dist.get_world_size() < 2:
        raise Unsupported("shape inference between stages needs >= 2 ranks")
    from torch.distributed.pipelining import PipelineStage, ScheduleGPipe

    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    mod = torch.nn.Linear(4, 4).to(device)
    stage = PipelineStage(mod, rank, world, torch.device(device))
    sched = ScheduleGPipe(stage, n_microbatches=1, loss_fn=torch.nn.functional.mse_loss)
    x, y = torch.zeros(2, 4, device=device), torch.zeros(2, 4, device=device)
    if rank == 0:
        sched.step(x)
    elif rank == world - 1:
        sched.step(target=y)
    else:
        sched.step()


def _dcp_save(torch, dist, device):
    import torch.distributed.checkpoint as dcp

    token = torch.randint(0, 2 ** 62, (1,), dtype=torch.int64).to(device)
    dist.broadcast(token, src=0)
    path = os.path.join(tempfile.gettempdir(), f"envbuild-dcp-{int(token.item()):x}")
    try:
        dcp.save({"w": torch.arange(4.0, device=device)}, checkpoint_id=path)
    finally:
        dist.barrier()
        shutil.rmtree(path, ignore_errors=True)


def _agree(torch, dist, device, problem):
    world = dist.get_world_size()
    flags = torch.zeros(world, dtype=torch.float64, device=device)
    flags[dist.get_rank()] = 1.0 if problem else 0.0
    dist.all_reduce(flags)
    return [r for r, f in enumerate(flags.cpu().tolist()) if f]


def run_features(device: str) -> dict[str, Any]:
    """numpy on every rank, then each of ``FEATURES``: ``"ok"`` or ``{"unsupported": ...}``; other errors propagate."""
    import torch
    import torch.distributed as dist

    problem = numpy_problem()
    without = _agree(torch, dist, device, problem)
    everywhere = len(without) == dist.get_world_size()
    out: dict[str, Any] = {"numpy": {"available": not without, "problem": problem, "ranks_without": without}}
    runners = {"all_gather_object": _all_gather_object,
               "pipeline_shape_inference": _shape_inference, "dcp_save": _dcp_save}
    for name in FEATURES:
        if without and not (everywhere and name in SYMMETRIC):
            where = "every rank" if everywhere else "rank(s) {}".format(",".join(map(str, without)))
            out[name] = {"unsupported": "needs numpy, missing on {} (not run: it would fail "
                                        "on one side only): {}".format(where, problem or "see those ranks"),
                         "needs_numpy": True, "ran": False}
            continue
        out[name] = _run_one(torch, dist, device, runners[name])
    return out


def _run_one(torch, dist, device, runner):
    try:
        runner(torch, dist, device)
        return "ok"
    except Unsupported as e:
        res: dict[str, Any] = {"unsupported": str(e), "ran": True}
    except (ImportError, AttributeError) as e:
        res = {"unsupported": f"torch {torch.__version__} lacks it: {type(e).__name__}: {str(e)[:200]}", "ran": True}
    except (RuntimeError, NotImplementedError) as e:
        reason = unsupported_reason(e)
        if reason is None:
            raise
        res = {"unsupported": reason, "ran": True}
    if needs_numpy(res["unsupported"]):
        res["needs_numpy"] = True
    return res
