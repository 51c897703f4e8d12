"""Harness overhead: the profile sweep's all_reduce busbw vs a plain torch.distributed loop
(issue 10 item 6: >= 0.97x at sizes >= 1 MiB). Not part of the test suite.

Run:  .venv/bin/python benchmarks/bench_harness_ratio.py [--image REF] [--rounds 5]
          [--iters 20] [--sizes 1048576,4194304,16777216,67108864]

Starts two container nodes of the image (default: the cpu-torch2 image, built or reused
through envbuild) on an internal Docker network, runs ``harness_ratio_rank.py`` on both
under torchrun (2 nodes x 1 gloo rank), and prints, per size, the median busbw of each
over the rounds (GB/s = 1e9 B/s) and their ratio; then one JSON line. The two are
interleaved (their order alternating each round) so that drift on a shared machine
affects both alike. Exits 1 when a ratio at a size >= 1 MiB is below 0.97. Everything it
creates carries the label ``envbuild.bench=<uuid>`` and is removed at the end.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import uuid
from pathlib import Path

from builder.image import build
from builder.image import engine
from builder.image import site

ROOT = Path(__file__).resolve().parent.parent
TARGET = 0.97
MIB = 1 << 20


def node_command(node: int, args) -> list:
    return ["python3", "-m", "torch.distributed.run", "--nnodes", "2", "--nproc-per-node", "1",
            "--node-rank", str(node), "--master-addr", "node-0", "--master-port", "29500",
            "/opt/ratio/harness_ratio_rank.py", args.sizes, str(args.rounds), str(args.iters),
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
                         str(ROOT / "benchmarks"): {"bind": "/opt/ratio", "mode": "ro"}},
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
    ap.add_argument("--sizes", default=",".join(str(s * MIB) for s in (1, 4, 16, 64)))
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=3)
    args = ap.parse_args()
    client = engine.connect()
    image = args.image or build.build(build.BuildOptions(
        recipe="cpu-torch2", images_dir=ROOT / "images", site=site.SiteOptions.detect(), base_mode="auto",
        labels={}), client).tag
    res = run_nodes(client, image, args)
    rows, missed = [], []
    print("# %12s %14s %14s %7s" % ("size(B)", "harness GB/s", "plain GB/s", "ratio"))
    for size, h, p in zip(res["sizes"], res["harness"], res["plain"]):
        hm, pm = statistics.median(h), statistics.median(p)
        ratio = hm / pm if pm > 0 else 0.0
        rows.append({"size_bytes": size, "harness_busbw_gbps": hm, "plain_busbw_gbps": pm,
                     "ratio": ratio, "harness_rounds": h, "plain_rounds": p})
        print("  %12d %14.3f %14.3f %7.3f" % (size, hm, pm, ratio))
        if size >= MIB and ratio < TARGET:
            missed.append(size)
    print(json.dumps({"image": image, "rounds": args.rounds, "iters": args.iters, "rows": rows}))
    if missed:
        print("ratio below %.2f at sizes %s" % (TARGET, missed), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
