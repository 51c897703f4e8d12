"""Shared parts of the training checks: tolerance, comparison with the single-process
reference, the result shape, and the torch helpers the checks use.

Every training check (``train_ddp``, ``train_fsdp``, ``train_tp``, ``train_pipeline``,
``train_moe``) trains a model for a few steps with one parallelism strategy and, on every
rank, the same model (same seed, same initial parameters) in ONE process with no process
group on the same global batch: the single-process reference. The check passes
(``reference_match``) when every step's loss and every final parameter agree within the
tolerance.

Tolerance: ``|a - b| <= ATOL + RTOL * |b|`` element-wise (``torch.allclose``'s rule) with
RTOL = 1e-5, ATOL = 1e-6, for the losses (distributed vs reference, per step) and for
every parameter element after the last step. Why: the distributed step computes the same
float32 sums as the reference but in another order (gradients summed over ranks by the
all-reduce/reduce-scatter ring, partial products of a sharded matmul summed across
ranks, microbatch gradients accumulated), so results differ by a few float32 rounding
errors (eps = 1.19e-7). Measured on torch 2.13/gloo, 2 and 3 CPU ranks, 3 steps: the
largest parameter difference is 1.5e-8 (FSDP, TP, pipeline, MoE in float32) and 3e-13
(DDP, which runs in float64: see ``train_ddp`` for why); ``max_param_diff`` is reported
so the margin can be read. RTOL = 1e-5 leaves 100x and more for other BLAS libraries
and reduction orders (e.g. NCCL's tree all-reduce), while every injected fault moves
some parameter by more than 1e-4 (an altered pipeline message: 5e-4; a perturbed shard:
1e-2) and a real bug (a gradient not averaged, a shard misplaced, a microbatch dropped)
by far more.

Pure functions here use no torch; the torch helpers take it as an argument or import it
lazily.
"""

from __future__ import annotations

import math
import time
from typing import Any, Callable

from .support import Unsupported, needs_numpy, unsupported_reason

RTOL = 1e-5
ATOL = 1e-6
TOLERANCE = {"rtol": RTOL, "atol": ATOL,
             "rule": "|distributed - reference| <= atol + rtol * |reference|, element-wise, "
                     "for every step's loss and every final parameter"}
LR = 0.05  # SGD learning rate of the small models


def close(a: float, b: float, rtol: float = RTOL, atol: float = ATOL) -> bool:
    """``|a - b| <= atol + rtol * |b|``; False when either is not finite.

    E.g. ``close(1.0, 1.0 + 5e-6)`` -> True; ``close(1.0, 1.001)`` -> False.
    """
    if not (math.isfinite(a) and math.isfinite(b)):
        return False
    return abs(a - b) <= atol + rtol * abs(b)


def losses_match(distributed: list[float], reference: list[float]) -> bool:
    """Same number of steps and every step :func:`close`."""
    return len(distributed) == len(reference) and all(
        close(d, r) for d, r in zip(distributed, reference))


def result(model: str, distributed: list[float], reference: list[float],
           params_close: bool, max_param_diff: float, samples: int, wall_s: float,
           **extra) -> dict[str, Any]:
    """The JSON-able result of a training check (the same dict on every rank).

    Args:
        model: what was trained, e.g. ``"mlp 16-32-32-8 (1,832 parameters)"``.
        distributed: the loss of each step over the global batch (distributed run).
        reference: the single-process reference's loss of each step.
        params_close: every final parameter within tolerance, on every rank.
        max_param_diff: max |distributed - reference| over all parameter elements, ranks.
        samples: samples processed in the timed steps (global batch x steps).
        wall_s: wall time of the distributed steps (slowest rank), seconds.
        extra: further keys (e.g. ``schedule``), added as given.

    Returns ``{"reference_match", "tolerance", "losses", "reference_losses",
    "max_param_diff", "params_match", "losses_match", "samples_per_s", "wall_s",
    "steps", "model", ...extra}``; non-finite floats become None (JSON-safe).
    """
    lm = losses_match(distributed, reference)
    out = {
        "reference_match": bool(lm and params_close),
        "losses_match": bool(lm),
        "params_match": bool(params_close),
        "tolerance": dict(TOLERANCE),
        "losses": [_finite(x) for x in distributed],
        "reference_losses": [_finite(x) for x in reference],
        "max_param_diff": _finite(max_param_diff),
        "samples_per_s": _finite(samples / wall_s) if wall_s > 0 else None,
        "wall_s": _finite(wall_s),
        "steps": len(distributed),
        "model": model,
    }
    out.update(extra)
    return out


def _finite(x):
    x = float(x)
    return x if math.isfinite(x) else None


def guarded(check: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    """Run a check; ``{"unsupported": reason}`` when it raises :class:`Unsupported` or an
    error that says something is not supported (see ``support.unsupported_reason``),
    with ``"needs_numpy": True`` when the reason is the missing numpy. Any other error
    propagates (it is a failure, not a missing feature). Adds ``check_wall_s``."""
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
    """``getter()`` (an import or attribute lookup of a torch API); ImportError or
    AttributeError become :class:`Unsupported` naming ``what`` and torch's version."""
    try:
        return getter()
    except (ImportError, AttributeError) as e:
        try:
            import torch

            version = torch.__version__
        except Exception:  # pragma: no cover - torch is there when a check runs
            version = "?"
        raise Unsupported(f"torch {version} has no {what} ({type(e).__name__}: {str(e)[:200]})") from e


# --------------------------------------------------------------------------- torch side


def mlp(torch, sizes: list[int]):
    """``nn.Sequential`` of Linear layers with Tanh between them: sizes [16, 32, 8] ->
    Linear(16, 32), Tanh, Linear(32, 8). Uses torch's global RNG for the init."""
    layers = []
    for i in range(len(sizes) - 1):
        layers.append(torch.nn.Linear(sizes[i], sizes[i + 1]))
        if i < len(sizes) - 2:
            layers.append(torch.nn.Tanh())
    return torch.nn.Sequential(*layers)


def n_params(module) -> int:
    """Number of parameter elements of ``module`` (full, unsharded sizes)."""
    return sum(p.numel() for p in module.parameters())


def batches(torch, seed: int, steps: int, batch: int, in_dim: int, out_dim: int):
    """``steps`` (x, y) pairs of float32 N(0, 1) of shapes (batch, in_dim), (batch,
    out_dim) from a CPU generator seeded ``seed + 1`` (the same on every rank)."""
    gen = torch.Generator().manual_seed(seed + 1)
    return [(torch.randn(batch, in_dim, generator=gen), torch.randn(batch, out_dim, generator=gen))
            for _ in range(steps)]


def train_reference(torch, model, data, loss_fn, lr: float = LR) -> list[float]:
    """Plain single-process SGD (no momentum) over ``data``; the loss of each step."""
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
    """The full value of a parameter: a DTensor is gathered (``full_tensor()``, a
    collective: every rank calls it in the same order), a plain tensor is returned as
    is; detached, on CPU, in its dtype."""
    t = p.detach()
    if hasattr(t, "full_tensor"):
        t = t.full_tensor()
    return t.cpu()


def compare_params(torch, got: list, want: list):
    """(all within tolerance, max abs difference) of two equal-length tensor lists."""
    ok, worst = len(got) == len(want), 0.0
    for g, w in zip(got, want):
        if g.shape != w.shape:
            return False, float("inf")
        diff = (g - w).abs()
        if diff.numel():
            worst = max(worst, float(diff.max().item()))
        ok = ok and bool(torch.allclose(g, w, rtol=RTOL, atol=ATOL))
    return ok, worst


def agree(torch, dist, device: str, params_close: bool, max_diff: float, wall_s: float):
    """Over all ranks: (all close, max of max_diff, max of wall_s) by one MAX all-reduce."""
    t = torch.tensor([0.0 if params_close else 1.0, max_diff, wall_s], dtype=torch.float64,
                     device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    bad, diff, wall = t.cpu().tolist()
    return bad == 0.0, diff, wall


def max_over_ranks(torch, dist, device: str, values: list[float]) -> list[float]:
    """Element-wise max over ranks of a float list (one MAX all-reduce, float64)."""
    t = torch.tensor(values, dtype=torch.float64, device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return t.cpu().tolist()


def sum_over_ranks(torch, dist, device: str, values: list[float]) -> list[float]:
    """Element-wise sum over ranks of a float list (one SUM all-reduce, float64)."""
    t = torch.tensor(values, dtype=torch.float64, device=device)
    dist.all_reduce(t)
    return t.cpu().tolist()


def mean_over_ranks(torch, dist, device: str, values: list[float]) -> list[float]:
    """Element-wise mean over ranks of a float list."""
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
    """e.g. ``describe("mlp", [16, 32, 8], 808)`` -> ``"mlp 16-32-8 (808 parameters)"``."""
    return "{} {} ({} parameters)".format(name, "-".join(str(s) for s in sizes), format(count, ","))


def fault_hits(faults, kind: str, rank: int, target: str | None = None) -> bool:
    """True when a fault of ``kind`` (and ``target``) targets ``rank`` (see profile_faults)."""
    return any(f.hits(kind, rank, target) for f in (faults or ()))
