"""What ``envbuild gate`` costs per job start (the Slurm Prolog runs it before each job; not a test).

Run:  .venv/bin/python benchmarks/bench_gate.py [--runs 5] [--no-write]

Certifies the cpu-torch2 image on one container node (built first when missing), then times
fresh ``envbuild gate --against CERT --no-history`` processes (wall seconds, median of the runs):
host only; ``--image ID`` on a cold node (an empty probe cache: the image is probed in a
container); ``--image ID`` on a warm node (the probe kept for that image ID). Target: the warm
``--image`` run at most 2 s. Writes the table to benchmarks/GATE.md; exit 1 when the target is missed.
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
from pathlib import Path

from bench import ENVBUILD, ROOT, image_tag, machine

RESULTS = ROOT / "benchmarks" / "GATE.md"
TARGET_WARM_S = 2.0


def timed(argv: list[str], env: dict[str, str]) -> float:
    t0 = time.monotonic()
    proc = subprocess.run(argv, capture_output=True, text=True, env={**os.environ, **env}, timeout=600)
    took = time.monotonic() - t0
    if proc.returncode not in (0, 1):
        sys.exit(f"bench_gate: {' '.join(argv)} exited {proc.returncode}: {(proc.stdout + proc.stderr)[-400:]}")
    return took


def certificate(tag: str, folder: Path) -> Path:
    proc = subprocess.run([ENVBUILD, "certify", tag, "--nodes", "1"], cwd=folder, capture_output=True, text=True,
                          timeout=900)
    if proc.returncode != 0:
        sys.exit(f"bench_gate: certify exited {proc.returncode}: {proc.stdout[-400:]}")
    return next((folder / "images").rglob("*.json"))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--no-write", action="store_true", help=f"do not write {RESULTS.relative_to(ROOT)}")
    args = ap.parse_args()
    tag = image_tag()
    image_id = subprocess.run(["docker", "image", "inspect", "-f", "{{.Id}}", tag], capture_output=True, text=True,
                              check=True).stdout.strip()
    with tempfile.TemporaryDirectory(prefix="bench-gate-") as tmp:
        cert = certificate(tag, Path(tmp))
        gate = [ENVBUILD, "gate", "--against", str(cert), "--no-history"]
        host = [timed(gate, {}) for _ in range(args.runs)]
        cold, warm = [], []
        for i in range(args.runs):
            env = {"ENVBUILD_CACHE_DIR": str(Path(tmp) / f"cache{i}")}
            cold.append(timed([*gate, "--image", image_id], env))
            warm.append(timed([*gate, "--image", image_id], env))
    rows = [("host only", statistics.median(host)),
            ("`--image`, cold node (empty probe cache)", statistics.median(cold)),
            ("`--image`, warm node (probe kept per image ID)", statistics.median(warm))]
    met = rows[-1][1] <= TARGET_WARM_S
    table = "\n".join(["| `envbuild gate` | wall s (median) |", "|---|---|"] + [f"| {n} | {s:.2f} |" for n, s in rows])
    text = (f"# `envbuild gate` per job start\n\n{machine()}; image {tag}; median of {args.runs} runs; load average "
            f"{os.getloadavg()[0]:.2f}.\n\n{table}\n\nTarget: warm `--image` <= {TARGET_WARM_S} s: "
            f"{'met' if met else 'missed'}.\n")
    print(text)
    print(json.dumps({n: round(s, 3) for n, s in rows}))
    if not args.no_write:
        RESULTS.write_text(text)
    return 0 if met else 1


if __name__ == "__main__":
    sys.exit(main())
