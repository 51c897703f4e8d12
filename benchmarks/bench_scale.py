"""Local certify at 2, 4 and 8 container nodes: does it pass, and how each step grows (not a
test: the 8-node run takes minutes on this 2-core machine).

Run:  .venv/bin/python benchmarks/bench_scale.py [--image REF] [--nodes 2,4,8] [--rounds 1]

Runs ``envbuild certify IMAGE --nodes N`` as a user does (gloo, the ddp profile, the recipe's
sizes, iterations and DDP check; ``--image`` defaults to the cpu-torch2 image, built or reused
through envbuild) with a temporary ``--images-dir`` and reads its certificate: the verdict,
the host-side phases (containers up, ranks up, the in-rank phases, teardown) and per rank its
own elapsed seconds, the DDP check's and its reference's wall seconds and the certificate's
size. Prints one line per N and one JSON line; exits 1 when a verdict fails. Everything it
creates carries ``envbuild.bench=<uuid>`` and is removed at the end.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def one_run(image: str, nodes: int, label: dict[str, str]) -> dict:
    with tempfile.TemporaryDirectory(prefix="envbuild-bench-scale-") as d:
        env = {**os.environ, "ENVBUILD_EXTRA_LABELS": ",".join(f"{k}={v}" for k, v in label.items())}
        load = os.getloadavg()[0]
        t0 = time.monotonic()
        res = subprocess.run([sys.executable, "-m", "builder.cli", "--images-dir", d, "certify", image,
                              "--nodes", str(nodes), "--timeout", "1800"], cwd=ROOT, capture_output=True,
                             text=True, env=env, timeout=2400)
        wall = time.monotonic() - t0
        certs = list(Path(d).glob("*/certificates/*.json"))
        size = certs[0].stat().st_size if certs else 0
        cert = json.loads(certs[0].read_text()) if certs else {}
    ddp = (cert.get("training") or {}).get("ddp") or {}
    elapsed = [v.get("elapsed_s") or 0 for v in (cert.get("ranks") or {}).values()]
    return {"nodes": nodes, "exit": res.returncode, "passed": (cert.get("verdict") or {}).get("passed"),
            "wall_s": round(wall, 1), "load_average": round(load, 2),
            "phases": {p["name"]: p["seconds"] for p in cert.get("phases") or []},
            "rank_elapsed_s_max": round(max(elapsed, default=0), 1),
            "ddp_wall_s": ddp.get("wall_s"), "ddp_reference_wall_s": ddp.get("reference_wall_s"),
            "certificate_bytes": size,
            "tail": [] if cert.get("verdict", {}).get("passed") else res.stdout.splitlines()[-6:]}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--image", help="image to certify (default: the cpu-torch2 image)")
    ap.add_argument("--nodes", default="2,4,8")
    ap.add_argument("--rounds", type=int, default=1)
    args = ap.parse_args()
    from builder.image import build, engine, site

    client = engine.connect()
    label = {"envbuild.bench": uuid.uuid4().hex}
    image = args.image or build.build(build.BuildOptions(
        recipe="cpu-torch2", images_dir=ROOT / "images", site=site.SiteOptions.detect(), base_mode="auto",
        labels={}), client).tag
    runs = []
    try:
        for n in (int(x) for x in args.nodes.split(",")):
            for _ in range(args.rounds):
                r = one_run(image, n, label)
                print(json.dumps(r), flush=True)
                runs.append(r)
    finally:
        client.remove_by_label(f"envbuild.bench={label['envbuild.bench']}")
    by_n: dict[int, list[dict]] = {}
    for r in runs:
        by_n.setdefault(r["nodes"], []).append(r)
    summary = {n: {"wall_s": statistics.median(r["wall_s"] for r in rs),
                   "phases": {k: statistics.median(r["phases"].get(k, 0) for r in rs) for k in rs[0]["phases"]}}
               for n, rs in by_n.items()}
    ok = all(r["passed"] for r in runs)
    print(json.dumps({"image": image, "summary": summary, "all_passed": ok}))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
