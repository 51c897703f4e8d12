"""One rank of bench_harness_ratio.py (runs in the image under torchrun; not a test).

For each round and size, alternately: the harness's all_reduce sweep
(``bench.collectives.run_collective``) and a plain ``torch.distributed`` loop (zeroed
buffer, warmup, barrier, ``iters`` all-reduces, this rank's mean, slowest rank's time).
Rank 0 prints one JSON line: {"sizes": [...], "harness": [[busbw per round] per size],
"plain": [...]} in GB/s.
"""

import json
import sys
import time

import torch
import torch.distributed as dist

from bench import collectives as coll


def plain_busbw(size: int, iters: int, warmup: int) -> float:
    n = dist.get_world_size()
    buf = torch.zeros(size // 4, dtype=torch.float32)
    for _ in range(warmup):
        dist.all_reduce(buf)
    dist.barrier()
    t0 = time.perf_counter()
    for _ in range(iters):
        dist.all_reduce(buf)
    mine = torch.tensor([(time.perf_counter() - t0) / iters], dtype=torch.float64)
    dist.all_reduce(mine, op=dist.ReduceOp.MAX)
    return size / mine.item() / 1e9 * 2 * (n - 1) / n


def main() -> int:
    sizes = [int(s) for s in sys.argv[1].split(",")]
    rounds, iters, warmup = int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
    dist.init_process_group("gloo")
    harness = [[] for _ in sizes]
    plain = [[] for _ in sizes]
    for r in range(rounds):
        for i, size in enumerate(sizes):
            order = ("h", "p") if r % 2 == 0 else ("p", "h")  # alternate who goes first
            for who in order:
                if who == "h":
                    rows = coll.run_collective("all_reduce", [size], "float32", iters, warmup,
                                               "cpu")
                    harness[i].append(rows[0]["busbw_gbps"])
                else:
                    plain[i].append(plain_busbw(size, iters, warmup))
    if dist.get_rank() == 0:
        print(json.dumps({"sizes": sizes, "harness": harness, "plain": plain}), flush=True)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
