"""Mixture-of-experts check: expert e on rank e, tokens routed top-1 with ``all_to_all_single``
(autograd through the exchanges), the gate replicated; the reference holds the gate and every expert
in one process and runs the gate on the same slice shapes, so both route every token alike."""

from __future__ import annotations

import copy
from typing import Any

from . import training
from .profile_faults import EXPERT_DELTA

DEFAULT_STEPS = 3
DEFAULT_TOKENS = 8  # tokens per rank per step
DIM, HIDDEN = 8, 16


def _all_to_all_fn(torch, dist):
    """An autograd function around ``all_to_all_single``: the backward sends gradients back."""
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
    return torch.softmax(gate(x), dim=-1).max(dim=-1)


def moe_distributed(torch, dist, a2a, gate, expert, x, world: int, delta: float):
    """(this rank's MoE output for ``x``, tokens sent to each expert)."""
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
        outs = [moe_reference(torch, gate, experts, x[q * tokens:(q + 1) * tokens]) for q in range(world)]
        loss = F.mse_loss(torch.cat(outs), y)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


def run_moe_check(seed: int, device: str, steps: int = DEFAULT_STEPS,
                  tokens: int = DEFAULT_TOKENS, faults=()) -> dict[str, Any]:
    """Train the expert-parallel MoE layer; ``routed`` counts the tokens each expert received."""
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
    data = [(x.to(device), y.to(device)) for x, y in training.batches(torch, seed, steps, tokens * world, DIM, DIM)]
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
    want = [p.detach().cpu() for p in list(ref_gate.parameters()) + list(ref_experts[rank].parameters())]
    ok, diff, wall = training.agree(torch, dist, device, got, want, wall)
    losses = training.mean_over_ranks(torch, dist, device, local_losses)
    n = training.n_params(ref_gate) + sum(training.n_params(e) for e in ref_experts)
    return training.result(
        f"moe: gate {DIM:d}-{world:d}, {world:d} experts mlp {DIM:d}-{HIDDEN:d}-{DIM:d} ({n:,} parameters)",
        losses, ref_losses, ok, diff, steps * tokens * world, wall, experts=world, tokens_per_rank=tokens,
        routed=[int(v) for v in training.sum_over_ranks(torch, dist, device, routed)])
