"""Speed and size targets of `envbuild make cpu-torch2` (not part of the test suite).

Run:  .venv/bin/python benchmarks/make_cpu_torch2.py [--no-cache]

Measures, on the real engine: the build (wall seconds; ``--no-cache`` rebuilds every
layer), certification with 2 container nodes (wall seconds), the final image size (bytes),
and busbw at the largest all-reduce size (GB/s = 1e9 B/s). Prints one JSON line and exits 1
when a target is missed. Targets are for this project's reference machine (2 cores,
Debian bookworm, PyPI through a proxy): gloo busbw is reported, not targeted.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from pathlib import Path

from builder.image import build
from builder.certify import run
from builder.certify.source import EngineImage
from builder.image import engine
from builder.image import site

ROOT = Path(__file__).resolve().parent.parent
TARGETS = {"build_s": 600.0, "certify_s": 60.0, "image_bytes": 1.5e9}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--no-cache", action="store_true", help="rebuild every layer (BuildKit --no-cache)")
    args = ap.parse_args()
    client = engine.connect()
    t0 = time.monotonic()
    cli = engine.buildkit_cli()
    if args.no_cache:
        cli = dataclasses.replace(cli, argv=(*cli.argv, "--no-cache"))
    options = build.BuildOptions(recipe="cpu-torch2", images_dir=ROOT / "images", site=site.SiteOptions.detect(),
                                 rebuild=args.no_cache)
    result = build.build(options, client, cli=cli)
    build_s = time.monotonic() - t0
    t1 = time.monotonic()
    model, path = run.run(run.plan(EngineImage(client, result.tag)), images_dir=ROOT / "images")
    cert = model.to_dict()
    certify_s = time.monotonic() - t1
    size = client.images.get(result.tag).attrs["Size"]
    largest = cert["allreduce"][-1]
    figures = {
        "build_s": round(build_s, 1), "reused": result.reused, "certify_s": round(certify_s, 1),
        "image_bytes": size, "busbw_gbps_largest": largest["busbw_gbps"], "largest_size_bytes": largest["size_bytes"],
        "verdict": cert["verdict"]["passed"], "certificate": str(path),
    }
    print(json.dumps(figures))
    missed = [k for k, limit in TARGETS.items() if figures[k] > limit]
    if missed:
        print(f"missed targets: {', '.join(missed)} (targets {TARGETS})", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
