"""One rank of the bare run (benchmarks/bare_certify.py): a plain torch.distributed all-reduce
loop of the certification's sizes, then the same DDP steps of ResNet-18, nothing else (no
probe, no checks, no heartbeat, no result file). Runs in the image under torchrun; not a test.

Arguments: SIZES ITERS WARMUP STEPS BATCH IMAGE_SIZE (sizes in bytes, comma-separated).
Rank 0 prints one JSON line: {"allreduce_s": ..., "ddp_s": ..., "total_s": ...} (seconds).
"""

import json
import sys
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F
from bench.resnet import resnet18  # the certification's own built-in ResNet-18 (mounted)
from torch.nn.parallel import DistributedDataParallel as DDP


def main() -> int:
    sizes = [int(s) for s in sys.argv[1].split(",")]
    iters, warmup, steps, batch, image_size = (int(a) for a in sys.argv[2:7])
    t0 = time.perf_counter()
    dist.init_process_group("gloo")
    for size in sizes:
        buf = torch.ones(max(1, size // 4), dtype=torch.float32)
        for _ in range(warmup + iters):
            dist.all_reduce(buf)
    t1 = time.perf_counter()
    torch.manual_seed(0)
    model = DDP(resnet18(num_classes=1000))
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    gen = torch.Generator().manual_seed(1000003 + dist.get_rank())
    for _ in range(steps):
        x = torch.randn(batch, 3, image_size, image_size, generator=gen)
        y = torch.randint(0, 1000, (batch,), generator=gen)
        opt.zero_grad(set_to_none=True)
        F.cross_entropy(model(x), y).backward()
        opt.step()
    t2 = time.perf_counter()
    if dist.get_rank() == 0:
        print(json.dumps({"allreduce_s": t1 - t0, "ddp_s": t2 - t1, "total_s": t2 - t0}), flush=True)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
