"""The host side of certify at many ranks, synthetic (not part of the test suite).

Run:  .venv/bin/python benchmarks/bench_ranks.py [--ranks 512,4096] [--rounds 3]

Per world size N, a fresh process makes N rank results of ``--profile all`` on nccl (six
collectives x float32, bfloat16 x 17 sizes = 204 rows, the five training checks, scaling, a
probe), each as the one ``@@envbuild-result`` line a rank prints, then times what the host
does with them: parse each line (:func:`builder.core.inputs.load_json`), check it against the
model (:func:`builder.launchers.output.check_result`), judge the run
(:func:`builder.certify.verdict.judge`) and build the certificate. Prints per N the bytes read,
the median seconds and the process's peak memory growth over its state before parsing
(``ru_maxrss``, MiB), then one JSON line; exits 1 unless time and memory per rank at the largest
N are within 1.5x of the smallest's (linear, not quadratic).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
SIZES = [1 << k for k in range(14, 31)]  # 16 KiB .. 1 GiB, the recipe's gate size last
DTYPES = ("float32", "bfloat16")
LINEAR = 1.5


def rank_line(rank: int, world: int) -> bytes:
    """Rank ``rank``'s result line of a passing ``--profile all`` nccl run of ``world`` ranks."""
    from builder.agent.bench import collectives as coll

    from factories import profiles_result, rank_result

    rows = {}
    for name in coll.COLLECTIVES:
        rows[name] = []
        for dtype in DTYPES:
            for size in SIZES:
                count, nbytes = coll.count_and_size(name, size, dtype, world)
                stats = [10.0 + size / 1e4, 11.0 + size / 1e4, 12.0 + size / 1e4, float(world - 1), 0.0]
                rows[name].append(coll.summarize(name, max(count, 1), max(nbytes, 1), dtype, name, stats,
                                                 11.0 + size / 1e4 + rank % 3, 0, world))
    prof = profiles_result(rank, world)
    check = prof["training"]["ddp"]
    prof.update(profiles=["ddp", "fsdp", "tp", "pipeline", "moe"], backend="nccl", device=f"cuda:{rank % 8}",
                dtypes=list(DTYPES), sizes=SIZES, collectives=rows,
                training={p: check for p in ("ddp", "fsdp", "tp", "pipeline", "moe")},
                scaling={"model": "resnet18 (torchvision)", "batch_per_rank": 8, "image_size": 64, "steps": 3,
                         "world_size": world, "throughput_1": 100.0, "throughput_n": 90.0 * world,
                         "time_1_s": 0.24, "time_n_s": 0.27, "efficiency": 0.9})
    doc = rank_result(rank, world, backend="nccl", device=f"cuda:{rank % 8}", local_rank=rank % 8,
                      node_rank=rank // 8, profiles=prof)
    return b"@@envbuild-result " + json.dumps(doc, separators=(",", ":")).encode()


def host_side(lines: list[bytes], world: int) -> None:
    """What the host does with the lines: parse, check, judge, certificate."""
    from builder.certify import certificate, source, verdict
    from builder.certify import settings as certify_settings
    from builder.core.inputs import load_json
    from builder.launchers.base import LaunchResult
    from builder.launchers.output import check_result

    results = {}
    for r, line in enumerate(lines):
        doc = load_json(line[len(b"@@envbuild-result "):], "result line")
        res, why = check_result(doc, r, "result", run_id="0123456789ab", world_size=world)
        assert res is not None, why
        results[r] = res
    lock = json.loads((ROOT / "images" / "cuda12-torch2" / "envbuild.lock.json").read_text())
    s = certify_settings.resolve(lock, certify_settings.Overrides(
        nodes=world // 8, gpus_per_node=8, profiles=["ddp", "fsdp", "tp", "pipeline", "moe"],
        dtypes=list(DTYPES), sizes=SIZES, min_busbw_gbps=1.0), gpu_visible=True)
    nodes = range(world // 8)
    launch = LaunchResult(rank_results=results, node_logs={n: "" for n in nodes},
                          node_exit_codes={n: 0 for n in nodes}, timed_out=False, missing_ranks=[],
                          started_at="2026-05-12T10:00:00Z", finished_at="2026-05-12T10:00:09Z")
    v = verdict.judge(s, launch, None)  # a foreign image: the ranks' probes agree with rank 0's
    assert v.passed, v.failures[:3]
    image = source.ImageFacts("site/train:1", {}, {}, image_id="sha256:" + "1" * 64, recipe="foreign")
    certificate.build_certificate(image=image, settings=s, launch=launch, verdict=v, run_id="0123456789ab",
                                  host={"hostname": "h", "docker_server_version": "20.10.24"})


def child(world: int) -> None:
    """One measurement: prints ``bytes seconds MiB``."""
    lines = [rank_line(r, world) for r in range(min(world, 64))]
    lines += [lines[r % 64].replace(b'"rank":%d,' % (r % 64), b'"rank":%d,' % r, 1) for r in range(64, world)]
    lines = [line if i < 64 else line.replace(b'"hostname":"node-%d"' % (i % 64), b'"hostname":"node-%d"' % i)
             for i, line in enumerate(lines)]
    base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    t0 = time.perf_counter()
    host_side(lines, world)
    elapsed = time.perf_counter() - t0
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    print(sum(map(len, lines)), elapsed, (peak - base) / 1024)


def measure(world: int) -> tuple[int, float, float]:
    out = subprocess.run([sys.executable, __file__, "--child", str(world)], cwd=ROOT, capture_output=True,
                         text=True, check=False)
    if out.returncode:
        sys.exit(f"N={world}: {out.stderr[-2000:]}")
    n, sec, mib = out.stdout.split()
    return int(n), float(sec), float(mib)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--ranks", default="512,4096")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--child", type=int, default=None, help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.child is not None:
        child(a.child)
        return 0
    worlds = [int(x) for x in a.ranks.split(",")]
    rows = {}
    for w in worlds:
        got = [measure(w) for _ in range(a.rounds)]
        rows[w] = {"bytes": got[0][0], "seconds": statistics.median(g[1] for g in got),
                   "peak_mib": statistics.median(g[2] for g in got)}
        r = rows[w]
        print(f"N={w}: {r['bytes']:,} B read ({r['bytes'] / w:,.0f} per rank), parse+judge {r['seconds']:.2f} s "
              f"({r['seconds'] / w * 1e3:.2f} ms per rank), peak memory +{r['peak_mib']:.0f} MiB "
              f"({r['peak_mib'] / w * 1024:.0f} KiB per rank)", flush=True)
    lo, hi = rows[worlds[0]], rows[worlds[-1]]
    ratio_t = (hi["seconds"] / worlds[-1]) / (lo["seconds"] / worlds[0])
    ratio_m = (hi["peak_mib"] / worlds[-1]) / (lo["peak_mib"] / worlds[0])
    print(json.dumps({"rows": rows, "per_rank_time_ratio": ratio_t, "per_rank_memory_ratio": ratio_m,
                      "load_average": os.getloadavg()[0]}))
    return 0 if ratio_t <= LINEAR and ratio_m <= LINEAR else 1


if __name__ == "__main__":
    sys.exit(main())
