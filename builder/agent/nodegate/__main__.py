"""``python3 -m nodegate SPEC.json [--once] [--interval S] [--metrics-port P]`` (see :mod:`nodegate`)."""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
import time
from typing import Any

from . import check, kube, metrics

DEFAULT_INTERVAL_S = 600.0
_STOP = threading.Event()


def _probe() -> dict[str, Any]:
    import probe  # the sibling package on PYTHONPATH (the ConfigMap at /opt/envbuild)

    return probe.collect("image")


def run_once(spec: dict[str, Any], node: str | None, expo: metrics.Exposition | None = None) -> int:
    """One check: print one line per failure and warning, mark the node, update ``expo``; 0/1/2 (3: not marked)."""
    code, failures, warnings = _check(spec, node)
    if expo is not None:
        age = check.age_s(spec)
        expo.body = metrics.render(metrics.gate_samples(
            node or "", os.environ.get("ENVBUILD_IMAGE", ""), code, check.statuses(spec, failures, warnings),
            float("nan") if age is None else age, time.time()))
    return code


def _check(spec: dict[str, Any], node: str | None) -> tuple[int, list[tuple[str, str]], list[str]]:
    failures, warnings = check.evaluate(spec, _probe())
    for _, line in failures:
        print("fail: " + line, flush=True)
    for line in warnings:
        print("warn: " + line, flush=True)
    label = str(spec.get("label_value") or "")
    verdict = "passed" if not failures else "failed: " + failures[0][1]
    if node:
        try:
            if failures:
                key, line = failures[0]
                cls = ((spec.get("next_steps") or {}).get(key) or ["image"])[0]
                kube.mark_node(node, None, check.label_value(key), str(cls), line)
            else:
                kube.mark_node(node, check.label_value(label), None, "Certified",
                               f"matches the certificate of lock {label}")
        except (kube.KubeError, OSError) as e:
            print(f"error: cannot mark node {node}: {e}", flush=True)
            return 3, failures, warnings
    print("envbuild gate: node {} {}".format(node or "(unknown)", verdict), flush=True)
    return 2 if failures else 1 if warnings else 0, failures, warnings


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if not args:
        print("usage: python3 -m nodegate SPEC.json [--once] [--interval S] [--metrics-port P]", file=sys.stderr)
        return 64
    with open(args[0], encoding="utf-8") as f:
        spec = json.load(f)
    once = "--once" in args
    interval = float(args[args.index("--interval") + 1]) if "--interval" in args else DEFAULT_INTERVAL_S
    node = os.environ.get("NODE_NAME") or None
    expo = None
    if "--metrics-port" in args:
        expo = metrics.Exposition()
        expo.serve(int(args[args.index("--metrics-port") + 1]))
    signal.signal(signal.SIGTERM, lambda *_: _STOP.set())
    while True:
        code = run_once(spec, node, expo)
        if once or _STOP.wait(interval):
            return code if once else 0


if __name__ == "__main__":
    sys.exit(main())
