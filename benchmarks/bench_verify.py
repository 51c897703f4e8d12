"""``envbuild verify`` at scale (issue 13, item 6; not part of the test suite).

Run:  .venv/bin/python benchmarks/bench_verify.py [--nodes 10000] [--pairs 3]

Writes ``--nodes`` node reports (the hand-written GPU report of the tests, one per node: own
hostname, address and GPU UUID; every 1000th node with another loaded NCCL, every 500th with
another kernel, so the summary has groups and differing rows) into a temporary folder and
times, as fresh processes, the default view (the summary: one line per group of equal nodes,
full rows only for the nodes that differ) against ``--json`` on the same reports, in
interleaved pairs (median), with each process's peak memory (``ru_maxrss`` of the child, MiB).
Prints one JSON line and exits 1 when a target is missed: the default view <= 3 s and
<= 300 MiB, and within 1.5x of ``--json``.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
TARGET_S = 3.0
TARGET_MIB = 300.0
TARGET_RATIO = 1.5


def write_reports(folder: Path, n: int) -> list[str]:
    from fixtures_nodes import GPU_REPORT

    paths = []
    for i in range(n):
        doc = copy.deepcopy(GPU_REPORT)
        doc["hostname"] = f"node-{i:05d}"
        doc["gpus"][0]["uuid"] = f"GPU-8f6a1c52-0d1e-4a7b-9c3e-{i:012x}"
        doc["network"]["interfaces"][1]["addresses"][0]["address"] = f"10.{i // 65536 % 256}.{i // 256 % 256}.{i % 256}"
        if i % 1000 == 999:
            doc["nccl"]["loaded"] = {**doc["nccl"]["loaded"], "version": "2.26.2", "code": 22602}
        if i % 500 == 499:
            doc["kernel"] = "6.8.0-51-generic"
        p = folder / f"n{i:05d}.json"
        p.write_text(json.dumps(doc))
        paths.append(str(p))
    return paths


def run(args: list[str]) -> tuple[float, float]:
    """(wall seconds, peak MiB) of one ``envbuild verify ARGS`` process."""
    code = ("import resource, subprocess, sys, time; t = time.monotonic(); "
            "p = subprocess.run(sys.argv[1:], stdout=subprocess.DEVNULL); "
            "print(time.monotonic() - t, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss, p.returncode)")
    out = subprocess.run([sys.executable, "-c", code, sys.executable, "-m", "builder.cli", "verify", *args],
                         cwd=ROOT, capture_output=True, text=True, check=True).stdout.split()
    if int(out[2]) not in (1, 2):
        raise SystemExit(f"verify exited {out[2]}")
    return float(out[0]), int(out[1]) / 1024


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--nodes", type=int, default=10_000)
    ap.add_argument("--pairs", type=int, default=3)
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        write_reports(folder, a.nodes)
        glob = sorted(str(p) for p in folder.iterdir())
        table, js, table_mib, js_mib = [], [], [], []
        for _ in range(a.pairs):
            t, m = run(glob)
            table.append(t)
            table_mib.append(m)
            t, m = run([*glob, "--json"])
            js.append(t)
            js_mib.append(m)
    med_t, med_j = statistics.median(table), statistics.median(js)
    result = {"nodes": a.nodes, "default_s": round(med_t, 2), "json_s": round(med_j, 2),
              "ratio": round(med_t / med_j, 2), "default_peak_mib": round(max(table_mib)),
              "json_peak_mib": round(max(js_mib)), "cpus": os.cpu_count(),
              "targets": {"default_s": TARGET_S, "peak_mib": TARGET_MIB, "ratio": TARGET_RATIO}}
    result["met"] = med_t <= TARGET_S and max(table_mib) <= TARGET_MIB and med_t / med_j <= TARGET_RATIO
    print(json.dumps(result))
    return 0 if result["met"] else 1


if __name__ == "__main__":
    sys.exit(main())
