"""One rank of bench_harness_ratio.py (runs in the image under torchrun; not a test).

Per round, collective and size, alternately (who goes first alternates each round): the
harness's sweep (``bench.collectives.run_collective``) and a plain ``torch.distributed`` loop
of the same call (a zeroed buffer made once, warmup, barrier, ``iters`` calls, this rank's
mean, the slowest rank's time). Rank 0 prints one JSON line: {"rows": [{"collective", "api",
"size_bytes", "harness": [busbw per round], "plain": [...]}]} in GB/s.
"""

import json
import sys
import time

import torch
import torch.distributed as dist

from bench import collectives as coll



def plain_busbw(name: str, size: int, iters: int, warmup: int) -> float:
    n = dist.get_world_size()
    count, size = coll.count_and_size(name, size, "float32", n)
    send = torch.zeros(count, dtype=torch.float32)
    if name == "all_gather":
        out = torch.zeros(count * n, dtype=torch.float32)
        gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor  # as FSDP2 calls it
        op = lambda: gather(out, send)  # noqa: E731
    elif name == "broadcast":
        op = lambda: dist.broadcast(send, src=0)  # noqa: E731
    else:
        op = lambda: dist.all_reduce(send)  # noqa: E731
    for _ in range(warmup):
        op()
    dist.barrier()
    t0 = time.perf_counter()
    for _ in range(iters):
        op()
    mine = torch.tensor([(time.perf_counter() - t0) / iters], dtype=torch.float64)
    dist.all_reduce(mine, op=dist.ReduceOp.MAX)
    return size / mine.item() / 1e9 * coll.bus_factor(name, n)


def main() -> int:
    names = sys.argv[1].split(",")
    sizes = [int(s) for s in sys.argv[2].split(",")]
    rounds, iters, warmup = int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
    dist.init_process_group("gloo")
    rows = [{"collective": c, "api": "", "size_bytes": s, "harness": [], "plain": []} for c in names for s in sizes]
    for r in range(rounds):
        for row in rows:
            for who in (("h", "p") if r % 2 == 0 else ("p", "h")):
                if who == "h":
                    got = coll.run_collective(row["collective"], [row["size_bytes"]], "float32", iters, warmup, "cpu")
                    row["api"] = got[0]["api"]
                    row["harness"].append(got[0]["busbw_gbps"])
                else:
                    row["plain"].append(plain_busbw(row["collective"], row["size_bytes"], iters, warmup))
    if dist.get_rank() == 0:
        print(json.dumps({"rows": rows}), flush=True)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
