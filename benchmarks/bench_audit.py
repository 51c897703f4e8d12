"""Speed target of `envbuild audit` on a typical file (not part of the test suite).

Run:  .venv/bin/python benchmarks/bench_audit.py [--repeat N]

Measures, in seconds of wall time: ``envbuild audit FILE`` as a fresh process (what a
user waits for: interpreter start, imports, the bundled facts, parsing, the rules) on a
typical multi-stage Dockerfile (``tests/audit/multistage.ok.Dockerfile``) and a typical
definition (``images/cuda12-torch2/Singularity.def``), the median of N runs, as wall and
as CPU seconds (user + system: the reference machine's 2 cores are shared, so its wall
time also counts other programs); and the audit itself in-process once warm
(:func:`builder.audit.run.audit_file`). Prints one JSON line and exits 1 when the target
(0.5 s of CPU for the fresh process) is missed. Most of a fresh process is the CLI's imports
and reading compat.yaml (pyyaml's pure-Python loader); the audit itself takes milliseconds.
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
FILES = ["tests/audit/multistage.ok.Dockerfile", "images/cuda12-torch2/Singularity.def"]
TARGET_S = 0.5


def _fresh(file: str) -> tuple[float, float]:
    """(wall seconds, CPU seconds user+sys) of one ``envbuild audit FILE`` process."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.monotonic()
    res = subprocess.run([sys.executable, "-m", "builder.cli", "audit", file], cwd=ROOT, capture_output=True, text=True)
    took = time.monotonic() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if res.returncode not in (0, 1):
        raise SystemExit(f"{file}: exit {res.returncode}: {res.stderr[-500:]}")
    return took, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=7, help="runs per file (the median is reported)")
    args = ap.parse_args()
    from builder.audit import run

    report: dict = {"target_s": TARGET_S}
    for file in FILES:
        runs = [_fresh(file) for _ in range(args.repeat)]
        wall, cpu = statistics.median(r[0] for r in runs), statistics.median(r[1] for r in runs)
        run.audit_file(str(ROOT / file))  # warm: imports and facts loaded
        t0 = time.monotonic()
        for _ in range(args.repeat):
            run.audit_file(str(ROOT / file))
        warm = (time.monotonic() - t0) / args.repeat
        report[file] = {"process_s": round(wall, 3), "process_cpu_s": round(cpu, 3), "in_process_s": round(warm, 4)}
    print(json.dumps(report))
    return 0 if all(v["process_cpu_s"] < TARGET_S for k, v in report.items() if k != "target_s") else 1


if __name__ == "__main__":
    sys.exit(main())
