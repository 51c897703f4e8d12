"""Test driver: ``run_profiles`` on the default process group, one JSON per rank.

Run under torchrun inside an image with ``bench`` importable (PYTHONPATH=/opt/envbuild):

    python3 -m torch.distributed.run --nproc-per-node 2 bench_profiles_driver.py \\
        --out DIR --profiles all --sizes 8,1024 --iters 3 --warmup 1

Writes ``DIR/rank-<RANK>.json`` (the ``run_profiles`` dict) and exits 0; a bad option or
fault spec exits 64 with one line on stderr. Faults come from
``ENVBUILD_BENCH_PROFILE_FAULT`` as in production.
"""

import argparse
import datetime
import json
import os
import sys


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True)
    p.add_argument("--profiles", default="all")
    p.add_argument("--sizes", default="8,1024,65536")
    p.add_argument("--iters", type=int, default=3)
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--dtypes", default="")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--no-scaling", action="store_true")
    p.add_argument("--no-features", action="store_true")
    args = p.parse_args()

    import torch.distributed as dist
    from bench import profiles

    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=120))
    rank = dist.get_rank()
    try:
        result = profiles.run_profiles(
            args.profiles, [int(s) for s in args.sizes.split(",")], args.iters, args.warmup,
            [d for d in args.dtypes.split(",") if d] or None, args.seed, "cpu", "gloo",
            scaling=not args.no_scaling, features=not args.no_features,
            log=print if rank == 0 else None)
    except ValueError as e:
        print(f"driver: error: {e}", file=sys.stderr)
        return 64
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, f"rank-{rank}.json"), "w") as f:
        json.dump(result, f, indent=1, allow_nan=False)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
