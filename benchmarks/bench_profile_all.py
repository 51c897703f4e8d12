"""Cost of ``envbuild certify IMAGE --profile all`` on 2 CPU nodes (issue 10 item 6: < 90 s on
this project's 2-core machine). Not part of the test suite.

Run:  .venv/bin/python benchmarks/bench_profile_all.py [--image REF] [--foreign] [--rounds 1]

Runs the command line as a user does (``python -m builder.cli certify IMAGE --profile all``,
every other setting the default: 2 nodes, gloo, the recipe's sizes 8 B..4 MiB, 10 iterations
after 2 warmup, float32) with a temporary ``--images-dir``, and measures its wall time from
start to exit (container start, the probe, every collective and training check, scaling,
the numpy features, the certificate). ``--image`` defaults to the cpu-torch2 image (built or
reused through envbuild); ``--foreign`` first makes a copy of it without envbuild's labels
(``docker export`` | ``docker import`` with its Env), so the foreign-image path (the python3 /
torch check, the probe as the reference) is what is timed. Prints each round and one JSON
line; exits 1 when the median is 90 s or more or a verdict fails. Everything it creates
carries ``envbuild.bench=<uuid>`` and is removed at the end.
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

from builder.image import build, engine, site

ROOT = Path(__file__).resolve().parent.parent
TARGET_S = 90.0


def foreign_copy(client, image: str, label: dict[str, str]) -> str:
    """A copy of ``image`` without its labels (its Env kept), tagged ``envbuild-bench/foreign:<uuid>``."""
    env = client.images.get(image).attrs["Config"]["Env"] or []
    tag = f"envbuild-bench/foreign:{next(iter(label.values()))[:12]}"
    changes = [*(f"ENV {e.split('=', 1)[0]}={e.split('=', 1)[1]}" for e in env), 'CMD ["python3"]',
               *(f"LABEL {k}={v}" for k, v in label.items())]
    c = client.containers.create(image, labels=label)
    try:
        exp = subprocess.Popen(["docker", "export", c.id], stdout=subprocess.PIPE)
        subprocess.run(["docker", "import", *(x for ch in changes for x in ("--change", ch)), "-", tag],
                       stdin=exp.stdout, check=True, capture_output=True, timeout=900)
        exp.wait(timeout=60)
    finally:
        c.remove(force=True)
    return tag


def one_round(image: str, label: dict[str, str]) -> dict:
    with tempfile.TemporaryDirectory(prefix="envbuild-bench-") as d:
        env = {**os.environ, "ENVBUILD_EXTRA_LABELS": ",".join(f"{k}={v}" for k, v in label.items())}
        t0 = time.monotonic()
        res = subprocess.run([sys.executable, "-m", "builder.cli", "--images-dir", d, "certify", image,
                              "--profile", "all"], cwd=ROOT, capture_output=True, text=True, env=env, timeout=900)
        wall = time.monotonic() - t0
        certs = list(Path(d).glob("*/certificates/*.json"))
        cert = json.loads(certs[0].read_text()) if certs else {}
    ranks = cert.get("ranks", {})
    return {"wall_s": round(wall, 1), "exit": res.returncode,
            "passed": cert.get("verdict", {}).get("passed"),
            "rank_elapsed_s": {r: round(v.get("elapsed_s") or 0, 1) for r, v in ranks.items()},
            "training_s": {p: round(t.get("check_wall_s") or 0, 1) for p, t in cert.get("training", {}).items()},
            "scaling_efficiency": (cert.get("scaling") or {}).get("efficiency"),
            "stack": (cert.get("stack") or {}).get("source"), "tail": res.stdout.splitlines()[-3:]}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--image", help="image to certify (default: the cpu-torch2 image)")
    ap.add_argument("--foreign", action="store_true", help="certify a label-less copy of it")
    ap.add_argument("--rounds", type=int, default=1)
    args = ap.parse_args()
    client = engine.connect()
    label = {"envbuild.bench": uuid.uuid4().hex}
    image = args.image or build.build(build.BuildOptions(
        recipe="cpu-torch2", images_dir=ROOT / "images", site=site.SiteOptions.detect(), base_mode="auto",
        labels={}), client).tag
    copy = foreign_copy(client, image, label) if args.foreign else None
    try:
        rounds = []
        for i in range(args.rounds):
            r = one_round(copy or image, label)
            print(f"round {i + 1}: {json.dumps(r)}", flush=True)
            rounds.append(r)
    finally:
        if copy:
            client.images.remove(copy, force=True)
        client.remove_by_label(f"envbuild.bench={label['envbuild.bench']}")
    median = statistics.median(r["wall_s"] for r in rounds)
    ok = median < TARGET_S and all(r["passed"] for r in rounds)
    print(json.dumps({"image": copy or image, "foreign": bool(copy), "rounds": len(rounds), "median_wall_s": median,
                      "target_s": TARGET_S, "ok": ok}))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
