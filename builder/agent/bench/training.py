"""Shared parts of the training checks: tolerance, result shape, torch helpers. Each check trains with one strategy and,
on every rank, the same model in one process on the same global batch; it passes when every step's loss and every final
parameter agree within ``|a - b| <= ATOL + RTOL * |b|`` (``torch.allclose``'s rule). The distributed sums run in another
order, a few float32 roundings (eps 1.19e-7) apart: measured up to 1.5e-8 (torch 2.13/gloo, 2-3 CPU ranks), so RTOL 1e-5
leaves 100x for other BLAS and reduction orders, while every injected fault moves some parameter by more than 1e-4."""

from __future__ import annotations

import math
import sys
import time
from typing import Any, Callable

from .support import Unsupported, needs_numpy, unsupported_reason

RTOL = 1e-5
ATOL = 1e-6
TOLERANCE = {"rtol": RTOL, "atol": ATOL,
             "rule": "|distributed - reference| <= atol + rtol * |reference|, element-wise, "
                     "for every step's loss and every final parameter"}
LR = 0.05  # SGD learning rate of the small models
#: Distinct data slices of the data-parallel checks (DDP, FSDP): rank r trains on slice
#: r % K, K = min(N, SHARDS), so the reference costs K slices whatever N (docs/scale.md).
SHARDS = 4


def shard_weights(world: int, shards: int = SHARDS) -> list[float]:
    """Each distinct slice's weight in the mean over ``world`` ranks: ``shard_weights(6)``: 2/6, 2/6, 1/6, 1/6."""
    k = min(world, shards)
    return [len(range(q, world, k)) / world for q in range(k)]


def shard_of(rank: int, world: int, batch: int) -> slice:
    """The rows of the global batch (``batch`` x K rows) ``rank`` trains on."""
    q = rank % min(world, SHARDS)
    return slice(q * batch, (q + 1) * batch)


def close(a: float, b: float, rtol: float = RTOL, atol: float = ATOL) -> bool:
    """``|a - b| <= atol + rtol * |b|``; False when either is not finite."""
    if not (math.isfinite(a) and math.isfinite(b)):
        return False
    return abs(a - b) <= atol + rtol * abs(b)


def losses_match(distributed: list[float], reference: list[float]) -> bool:
    return len(distributed) == len(reference) and all(close(d, r) for d, r in zip(distributed, reference))


def result(model: str, distributed: list[float], reference: list[float], params_close: bool, max_param_diff: float,
           samples: int, wall_s: float, **extra) -> dict[str, Any]:
    """The JSON-able result of a check, the same on every rank; ``wall_s``: the slowest rank's seconds."""
    lm = losses_match(distributed, reference)
    return {"reference_match": bool(lm and params_close), "losses_match": bool(lm), "params_match": bool(params_close),
            "tolerance": dict(TOLERANCE), "losses": [_finite(x) for x in distributed],
            "reference_losses": [_finite(x) for x in reference], "max_param_diff": _finite(max_param_diff),
            "samples_per_s": _finite(samples / wall_s) if wall_s > 0 else None, "wall_s": _finite(wall_s),
            "steps": len(distributed), "model": model, **extra}


def _finite(x):
    x = float(x)
    return x if math.isfinite(x) else None


def guarded(check: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    """Run a check, with ``check_wall_s``; ``{"unsupported": reason}`` when it says so (other errors propagate)."""
    t0 = time.perf_counter()
    try:
        out = check()
    except Unsupported as e:
        out = {"unsupported": str(e)}
    except (RuntimeError, NotImplementedError) as e:
        reason = unsupported_reason(e)
        if reason is None:
            raise
        out = {"unsupported": reason}
    if "unsupported" in out and needs_numpy(out["unsupported"]):
        out["needs_numpy"] = True
    out["check_wall_s"] = time.perf_counter() - t0
    return out


def resolve(what: str, getter: Callable[[], object]):
    """``getter()`` (a torch API lookup); ImportError or AttributeError become :class:`Unsupported`."""
    try:
        return getter()
    except (ImportError, AttributeError) as e:
        version = getattr(sys.modules.get("torch"), "__version__", "?")
        raise Unsupported(f"torch {version} has no {what} ({type(e).__name__}: {str(e)[:200]})") from e


# --------------------------------------------------------------------------- torch side


def mlp(torch, sizes: list[int]):
    """Linear layers with Tanh between them, initialized from torch's global RNG."""
    layers = []
    for i in range(len(sizes) - 1):
        layers.append(torch.nn.Linear(sizes[i], sizes[i + 1]))
        if i < len(sizes) - 2:
            layers.append(torch.nn.Tanh())
    return torch.nn.Sequential(*layers)


def n_params(module) -> int:
    return sum(p.numel() for p in module.parameters())


def batches(torch, seed: int, steps: int, batch: int, in_dim: int, out_dim: int):
    """``steps`` (x, y) N(0, 1) float32 pairs from a CPU generator seeded ``seed + 1`` (same on every rank)."""
    gen = torch.Generator().manual_seed(seed + 1)
    return [(torch.randn(batch, in_dim, generator=gen), torch.randn(batch, out_dim, generator=gen))
            for _ in range(steps)]


def train_reference(torch, model, data, loss_fn, lr: float = LR) -> list[float]:
    """Plain single-process SGD over ``data``; the loss of each step."""
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    losses = []
    for x, y in data:
        opt.zero_grad(set_to_none=True)
        loss = loss_fn(model(x), y)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


def local_tensor(p):
    """The full value of a parameter on CPU; a DTensor is gathered (a collective: same order on every rank)."""
    t = p.detach()
    if hasattr(t, "full_tensor"):
        t = t.full_tensor()
    return t.cpu()


def compare_params(torch, got: list, want: list):
    """(all within tolerance, max abs difference) of two tensor lists."""
    ok, worst = len(got) == len(want), 0.0
    for g, w in zip(got, want):
        if g.shape != w.shape:
            return False, float("inf")
        diff = (g - w).abs()
        if diff.numel():
            worst = max(worst, float(diff.max().item()))
        ok = ok and bool(torch.allclose(g, w, rtol=RTOL, atol=ATOL))
    return ok, worst


def run_mse(torch, dist, device: str, model, reference, data, sl=slice(None), weights=None):
    """SGD (MSE) on ``model`` over rows ``sl`` of ``data`` and ``reference`` over all (``weights``:
    :func:`shard_weights`): (mean losses over ranks, reference losses, all close, max diff, slowest wall s)."""
    import torch.nn.functional as F

    def ref_loss(out, y):
        if weights is None:
            return F.mse_loss(out, y)
        b = out.shape[0] // len(weights)
        return sum(w * F.mse_loss(out[q * b:(q + 1) * b], y[q * b:(q + 1) * b]) for q, w in enumerate(weights))

    opt = torch.optim.SGD(model.parameters(), lr=LR)

    def train():
        losses = []
        for x, y in data:
            opt.zero_grad(set_to_none=True)
            loss = F.mse_loss(model(x[sl]), y[sl])
            loss.backward()
            opt.step()
            losses.append(loss.item())
        return losses

    local_losses, wall = timed(torch, device, train)
    ref_losses = train_reference(torch, reference, data, ref_loss)
    got = [local_tensor(p) for p in model.parameters()]
    want = [p.detach().cpu() for p in reference.parameters()]
    ok, diff, wall = agree(torch, dist, device, got, want, wall)
    return mean_over_ranks(torch, dist, device, local_losses), ref_losses, ok, diff, wall


def agree(torch, dist, device: str, got: list, want: list, wall_s: float):
    """:func:`compare_params` over all ranks: (all close, max diff, max wall_s) by one MAX all-reduce."""
    params_close, max_diff = compare_params(torch, got, want)
    t = torch.tensor([0.0 if params_close else 1.0, max_diff, wall_s], dtype=torch.float64, device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    bad, diff, wall = t.cpu().tolist()
    return bad == 0.0, diff, wall


def max_over_ranks(torch, dist, device: str, values: list[float], op: str = "MAX") -> list[float]:
    t = torch.tensor(values, dtype=torch.float64, device=device)
    dist.all_reduce(t, op=getattr(dist.ReduceOp, op))
    return t.cpu().tolist()


def sum_over_ranks(torch, dist, device: str, values: list[float]) -> list[float]:
    return max_over_ranks(torch, dist, device, values, "SUM")


def mean_over_ranks(torch, dist, device: str, values: list[float]) -> list[float]:
    return [v / dist.get_world_size() for v in sum_over_ranks(torch, dist, device, values)]


def timed(torch, device: str, fn: Callable[[], object]):
    """(fn(), wall seconds), synchronizing CUDA around it."""
    cuda = device.startswith("cuda")
    if cuda:
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    out = fn()
    if cuda:
        torch.cuda.synchronize()
    return out, time.perf_counter() - t0


def describe(name: str, sizes: list[int], count: int) -> str:
    """e.g. ``"mlp 16-32-8 (808 parameters)"``."""
    return "{} {} ({} parameters)".format(name, "-".join(str(s) for s in sizes), format(count, ","))


def fault_hits(faults, kind: str, rank: int, target: str | None = None) -> bool:
    return any(f.hits(kind, rank, target) for f in (faults or ()))
