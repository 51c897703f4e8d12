"""Mixture-of-experts training check: tokens routed with all-to-all to experts on other
ranks, against the single-process computation of the same experts.

Expert parallel: ``world`` experts (each an MLP 8-16-8), expert e on rank e, and a gate
Linear(8, world) replicated on every rank. Rank r takes slice r of the global tokens,
routes each token to its top-1 expert (argmax of the softmax of the gate), sends the
tokens to the experts' ranks with ``all_to_all_single`` (per-expert counts exchanged
first with another ``all_to_all_single``), each expert runs on what it received, the
outputs come back by the reverse all-to-all and are weighted by the gate probability.
The backward runs the same exchanges in reverse (an autograd function around
``all_to_all_single``); the gate's gradients are summed over ranks with an all-reduce.
Loss: mean-squared error; each rank back-propagates its slice's loss / world, so the
gradients are those of the global mean. SGD lr ``training.LR``.

The reference, on every rank with no process group, holds the gate and ALL experts
(same seed, same initial values) and computes each slice with the same routing, then the
loss over the global batch. The gate runs on the same slice shapes as on the ranks, so
both see the same gate outputs and route every token alike. Compared: every step's loss,
the gate, and this rank's expert against the reference's (tolerance: ``training``).
"""

from __future__ import annotations

import copy
from typing import Any

from . import training
from .profile_faults import EXPERT_DELTA

DEFAULT_STEPS = 3
DEFAULT_TOKENS = 8  # tokens per rank per step
DIM, HIDDEN = 8, 16


def _all_to_all_fn(torch, dist):
    """An autograd function: ``apply(x, out_splits, in_splits)`` sends ``in_splits[j]``
    rows of ``x`` to rank j and returns the ``sum(out_splits)`` rows received; its
    backward sends the gradients back the same way."""
    function: Any = torch.autograd.Function  # torch is a parameter here: a base class mypy can name

    class AllToAll(function):
        @staticmethod
        def forward(ctx, x, out_splits, in_splits):
            ctx.splits = (out_splits, in_splits)
            out = x.new_empty((sum(out_splits),) + tuple(x.shape[1:]))
            dist.all_to_all_single(out, x.contiguous(), out_splits, in_splits)
            return out

        @staticmethod
        def backward(ctx, grad):
            out_splits, in_splits = ctx.splits
            back = grad.new_empty((sum(in_splits),) + tuple(grad.shape[1:]))
            dist.all_to_all_single(back, grad.contiguous(), in_splits, out_splits)
            return back, None, None

    return AllToAll


def route(torch, gate, x):
    """(probability, expert index) of each token: top-1 of ``softmax(gate(x))``."""
    return torch.softmax(gate(x), dim=-1).max(dim=-1)


def moe_distributed(torch, dist, a2a, gate, expert, x, world: int, delta: float):
    """(this rank's MoE output for its tokens ``x``, tokens it sent to each expert);
    autograd runs through the exchanges."""
    prob, idx = route(torch, gate, x)
    order = torch.argsort(idx, stable=True)
    send = torch.bincount(idx, minlength=world)
    recv = torch.empty_like(send)
    dist.all_to_all_single(recv, send)
    send_l, recv_l = send.cpu().tolist(), recv.cpu().tolist()
    tokens = a2a.apply(x[order], recv_l, send_l)
    out = expert(tokens)
    if delta:
        out = out + delta
    back = a2a.apply(out, send_l, recv_l)
    y = torch.empty_like(back)
    y[order] = back
    return y * prob.unsqueeze(-1), send_l


def moe_reference(torch, gate, experts, x):
    """The same MoE layer in one process: every expert local."""
    prob, idx = route(torch, gate, x)
    y = torch.zeros_like(x)
    for e, expert in enumerate(experts):
        mask = idx == e
        if bool(mask.any()):
            y = y.index_put((mask.nonzero(as_tuple=True)[0],), expert(x[mask]))
    return y * prob.unsqueeze(-1)


def _reference_losses(torch, gate, experts, data, world: int, tokens: int) -> list[float]:
    import torch.nn.functional as F

    params = list(gate.parameters()) + [p for e in experts for p in e.parameters()]
    opt = torch.optim.SGD(params, lr=training.LR)
    losses = []
    for x, y in data:
        opt.zero_grad(set_to_none=True)
        outs = [moe_reference(torch, gate, experts, x[q * tokens:(q + 1) * tokens])
                for q in range(world)]
        loss = F.mse_loss(torch.cat(outs), y)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


def run_moe_check(seed: int, device: str, steps: int = DEFAULT_STEPS,
                  tokens: int = DEFAULT_TOKENS, faults=()) -> dict[str, Any]:
    """Train the expert-parallel MoE layer for ``steps`` steps of ``tokens`` per rank.

    Args:
        seed: init seed on every rank; data seed ``seed + 1``.
        device: ``"cpu"`` or ``"cuda:<i>"``; faults: parsed ``profile_faults``
            (``moe-expert-perturb`` is used).

    Returns ``training.result`` plus ``experts``, ``tokens_per_rank`` and
    ``routed`` (tokens each expert received over the steps, index = expert/rank).
    """
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F

    rank, world = dist.get_rank(), dist.get_world_size()
    a2a = _all_to_all_fn(torch, dist)
    torch.manual_seed(seed)
    gate = torch.nn.Linear(DIM, world)
    experts = [training.mlp(torch, [DIM, HIDDEN, DIM]) for _ in range(world)]
    ref_gate, ref_experts = copy.deepcopy(gate).to(device), copy.deepcopy(experts)
    ref_experts = [e.to(device) for e in ref_experts]
    gate, expert = gate.to(device), experts[rank].to(device)
    delta = EXPERT_DELTA if training.fault_hits(faults, "moe-expert-perturb", rank) else 0.0
    data = [(x.to(device), y.to(device)) for x, y in training.batches(
        torch, seed, steps, tokens * world, DIM, DIM)]
    opt = torch.optim.SGD(list(gate.parameters()) + list(expert.parameters()), lr=training.LR)
    routed = [0.0] * world

    def train():
        losses = []
        for x, y in data:
            opt.zero_grad(set_to_none=True)
            sl = slice(rank * tokens, (rank + 1) * tokens)
            out, sent = moe_distributed(torch, dist, a2a, gate, expert, x[sl], world, delta)
            loss = F.mse_loss(out, y[sl])
            (loss / world).backward()
            for p in gate.parameters():
                dist.all_reduce(p.grad)
            opt.step()
            losses.append(loss.item())
            for e, c in enumerate(sent):
                routed[e] += c
        return losses

    local_losses, wall = training.timed(torch, device, train)
    ref_losses = _reference_losses(torch, ref_gate, ref_experts, data, world, tokens)
    got = [training.local_tensor(p) for p in list(gate.parameters()) + list(expert.parameters())]
    want = [p.detach().cpu()
            for p in list(ref_gate.parameters()) + list(ref_experts[rank].parameters())]
    ok, diff = training.compare_params(torch, got, want)
    ok, diff, wall = training.agree(torch, dist, device, ok, diff, wall)
    losses = training.mean_over_ranks(torch, dist, device, local_losses)
    n = training.n_params(ref_gate) + sum(training.n_params(e) for e in ref_experts)
    return training.result(
        f"moe: gate {DIM:d}-{world:d}, {world:d} experts mlp {DIM:d}-{HIDDEN:d}-{DIM:d} ({n:,} parameters)",
        losses, ref_losses, ok, diff, steps * tokens * world, wall, experts=world,
        tokens_per_rank=tokens,
        routed=[int(v) for v in training.sum_over_ranks(torch, dist, device, routed)])
