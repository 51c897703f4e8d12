"""One rank of the bare run (benchmarks/bare_certify.py): the work of the default (ddp)
profile written as plain torch.distributed, nothing else (no probe, no heartbeat, no result
file, no certificate). Runs in the image under torchrun; not a test.

The same work as ``bench.profiles.run_profiles("ddp", ...)``: an all-reduce and a broadcast
loop over the sizes (warmup, iterations, then one run checked against its exact value), the
DDP steps of ResNet-18 in float64 against the single-process reference over every rank's
slice, and the scaling timing (1 warm-up + 3 float32 steps on rank 0 alone, then on all).

Arguments: SIZES ITERS WARMUP STEPS BATCH IMAGE_SIZE (sizes in bytes, comma-separated).
Rank 0 prints one JSON line: {"collectives_s", "ddp_s", "scaling_s", "total_s"} (seconds).
"""

import copy
import json
import sys
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F
from bench.resnet import resnet18  # the certification's own built-in ResNet-18 (mounted)
from torch.nn.parallel import DistributedDataParallel as DDP


def collectives(sizes, iters, warmup):
    rank, n = dist.get_rank(), dist.get_world_size()
    for op, want in ((dist.all_reduce, lambda: float(n * (n + 1) // 2)),
                     (lambda b: dist.broadcast(b, src=0), lambda: 1.0)):
        for size in sizes:
            buf = torch.zeros(max(1, size // 4), dtype=torch.float32)
            for _ in range(warmup + iters):
                op(buf)
            buf.fill_(rank + 1)
            op(buf)
            assert bool((buf == want()).all())


def steps(model, opt, data):
    for x, y in data:
        opt.zero_grad(set_to_none=True)
        F.cross_entropy(model(x), y).backward()
        opt.step()


def ddp_check(n_steps, batch, image_size):
    rank, n = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    model = resnet18(num_classes=1000).double()
    reference = copy.deepcopy(model)
    gen = torch.Generator().manual_seed(1)
    data = [(torch.randn(batch * n, 3, image_size, image_size, generator=gen, dtype=torch.float64),
             torch.randint(0, 1000, (batch * n,), generator=gen)) for _ in range(n_steps)]
    ddp = DDP(model)
    steps(ddp, torch.optim.SGD(ddp.parameters(), lr=0.01, momentum=0.9),
          [(x[rank * batch:(rank + 1) * batch], y[rank * batch:(rank + 1) * batch]) for x, y in data])
    opt = torch.optim.SGD(reference.parameters(), lr=0.01, momentum=0.9)
    for x, y in data:
        opt.zero_grad(set_to_none=True)
        for q in range(n):
            (F.cross_entropy(reference(x[q * batch:(q + 1) * batch]), y[q * batch:(q + 1) * batch]) / n).backward()
        opt.step()
    diff = max(float((a - b).abs().max()) for a, b in zip(model.parameters(), reference.parameters()))
    assert diff < 1e-9, diff


def scaling(batch, image_size):
    rank = dist.get_rank()
    x, y = torch.randn(batch, 3, image_size, image_size), torch.randint(0, 1000, (batch,))
    solo = dist.new_group([0])
    torch.manual_seed(0)
    model = resnet18(num_classes=1000)
    if rank == 0:
        ddp = DDP(model, process_group=solo)
        steps(ddp, torch.optim.SGD(ddp.parameters(), lr=0.01, momentum=0.9), [(x, y)] * 4)
        del ddp
    dist.barrier()
    ddp = DDP(model)
    steps(ddp, torch.optim.SGD(ddp.parameters(), lr=0.01, momentum=0.9), [(x, y)] * 4)


def main() -> int:
    sizes = [int(s) for s in sys.argv[1].split(",")]
    iters, warmup, n_steps, batch, image_size = (int(a) for a in sys.argv[2:7])
    t0 = time.perf_counter()
    dist.init_process_group("gloo")
    collectives(sizes, iters, warmup)
    t1 = time.perf_counter()
    ddp_check(n_steps, batch, image_size)
    t2 = time.perf_counter()
    scaling(batch, image_size)
    t3 = time.perf_counter()
    if dist.get_rank() == 0:
        print(json.dumps({"collectives_s": t1 - t0, "ddp_s": t2 - t1, "scaling_s": t3 - t2, "total_s": t3 - t0}),
              flush=True)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
