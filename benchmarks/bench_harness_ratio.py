"""Harness overhead: the profile sweep's busbw vs a plain torch.distributed loop of the same
call (all_reduce, broadcast, and the all-gather FSDP2 calls: all_gather_single on torch 2.13,
all_gather_into_tensor before; >= 0.95x at every size >= 64 KiB). Not part of the test suite.

Run:  .venv/bin/python benchmarks/bench_harness_ratio.py [--image REF] [--rounds 5]
          [--iters 20] [--sizes 65536,1048576,4194304,16777216] [--collectives all_reduce,broadcast,all_gather]

Starts two container nodes of the image (default: the cpu-torch2 image, built or reused
through envbuild) on an internal Docker network, runs ``harness_ratio_rank.py`` on both
under torchrun (2 nodes x 1 gloo rank), and prints, per collective and size, the median busbw
of each over the rounds (GB/s = 1e9 B/s), the median of the rounds' ratios and the lowest;
then one JSON line with the load average before and after. The two are interleaved (their
order alternating each round) so that drift on a shared machine affects both alike. Exits 1
when a median ratio at a size >= 64 KiB is below 0.95. Everything it
creates carries the label ``envbuild.bench=<uuid>`` and is removed at the end.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import uuid
from pathlib import Path

from builder.image import build
from builder.image import engine
from builder.image import site

ROOT = Path(__file__).resolve().parent.parent
TARGET = 0.95
KIB, MIB = 1 << 10, 1 << 20


def node_command(node: int, args) -> list:
    return ["python3", "-m", "torch.distributed.run", "--nnodes", "2", "--nproc-per-node", "1",
            "--node-rank", str(node), "--master-addr", "node-0", "--master-port", "29500",
            "/opt/ratio/harness_ratio_rank.py", args.collectives, args.sizes, str(args.rounds), str(args.iters),
            str(args.warmup)]


def run_nodes(client, image: str, args) -> dict:
    label = {"envbuild.bench": uuid.uuid4().hex}
    net = client.networks.create("envbuild-ratio-" + label["envbuild.bench"][:12], internal=True,
                                 labels=label)
    nodes = []
    try:
        for node in (0, 1):
            alias = "node-%d" % node
            nodes.append(client.containers.create(
                image, command=node_command(node, args), hostname=alias, labels=label,
                name="envbuild-ratio-%s-%d" % (label["envbuild.bench"][:12], node),
                environment={"PYTHONPATH": "/opt/envbuild", "HOME": "/tmp",
                             "GLOO_SOCKET_IFNAME": "eth0"},
                volumes={str(ROOT / "builder" / "agent" / "bench"): {"bind": "/opt/envbuild/bench",
                                                           "mode": "ro"},
                         # only the rank script (benchmarks/bench.py would shadow the bench package)
                         str(ROOT / "benchmarks" / "harness_ratio_rank.py"): {
                             "bind": "/opt/ratio/harness_ratio_rank.py", "mode": "ro"}},
                network=net.name,
                networking_config={net.name: client.api.create_endpoint_config(aliases=[alias])}))
        for c in nodes:
            c.start()
        codes = [c.wait(timeout=1800)["StatusCode"] for c in nodes]
        out = nodes[0].logs(stderr=False).decode()
        if codes != [0, 0]:
            raise SystemExit("nodes exited %s:\n%s" % (codes, nodes[0].logs().decode()[-3000:]))
        return json.loads([line for line in out.splitlines() if line.startswith("{")][-1])
    finally:
        for c in nodes:
            c.remove(force=True)
        net.remove()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--image", help="image reference (default: cpu-torch2 through envbuild)")
    ap.add_argument("--sizes", default=",".join(str(s) for s in (64 * KIB, MIB, 4 * MIB, 16 * MIB)))
    ap.add_argument("--collectives", default="all_reduce,broadcast,all_gather")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=3)
    args = ap.parse_args()
    client = engine.connect()
    image = args.image or build.build(build.BuildOptions(
        recipe="cpu-torch2", images_dir=ROOT / "images", site=site.SiteOptions.detect(), base_mode="auto",
        labels={}), client).tag
    load = os.getloadavg()[0]
    res = run_nodes(client, image, args)
    rows, missed = [], []
    print("# %-10s %-24s %10s %12s %12s %7s %7s" % ("collective", "api", "size(B)", "harness GB/s", "plain GB/s",
                                                  "ratio", "lowest"))
    for r in res["rows"]:
        ratios = [h / p for h, p in zip(r["harness"], r["plain"]) if p > 0]
        ratio = statistics.median(ratios) if ratios else 0.0
        rows.append({**r, "harness_busbw_gbps": statistics.median(r["harness"]),
                     "plain_busbw_gbps": statistics.median(r["plain"]), "ratio": ratio})
        print("  %-10s %-24s %10d %12.3f %12.3f %7.3f %7.3f" % (
            r["collective"], r["api"], r["size_bytes"], rows[-1]["harness_busbw_gbps"],
            rows[-1]["plain_busbw_gbps"], ratio, min(ratios, default=0.0)))
        if r["size_bytes"] >= 64 * KIB and ratio < TARGET:
            missed.append((r["collective"], r["size_bytes"]))
    print(json.dumps({"image": image, "rounds": args.rounds, "iters": args.iters,
                      "load_before": load, "load_after": os.getloadavg()[0], "rows": rows}))
    if missed:
        print("median ratio below %.2f at %s" % (TARGET, missed), file=sys.stderr)
        return 1
    return 0

if __name__ == "__main__":
    sys.exit(main())
