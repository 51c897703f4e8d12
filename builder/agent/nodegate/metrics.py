"""The in-pod gate's Prometheus metrics, served on ``--metrics-port`` at ``/metrics`` (text
format 0.0.4) for a scrape by pod annotation. The names, help lines and rendering are those of
``builder.core.metrics`` (which the pod cannot import; a unit test holds the two equal)."""

from __future__ import annotations

import http.server
import math
import re
import threading
from typing import Any, Iterable, Mapping, Tuple

HELP = {"envbuild_gate_passed": "1 when the gate passed (exit 0 or 1), else 0",
        "envbuild_gate_exit_code": "exit code of the gate",
        "envbuild_certificate_age_seconds": "seconds since the certificate was finished",
        "envbuild_check_status": "a check's status: 0 pass or skip, 1 warn, 2 fail, 3 unknown",
        "envbuild_last_run_timestamp_seconds": "when this file was written, Unix seconds"}
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
Sample = Tuple[str, Mapping[str, str], float]


def _label(value: object) -> str:
    text = re.sub(r"[\x00-\x1f\x7f]", "?", str(value)).strip()
    text = text if len(text) <= 200 else text[:197] + "..."
    return text.replace("\\", "\\\\").replace('"', '\\"')


def render(samples: Iterable[Sample]) -> bytes:
    """The exposition text of ``samples`` grouped by name (HELP/TYPE once each); NaN/inf dropped."""
    by_name: dict[str, list[str]] = {}
    for name, labels, value in samples:
        if not math.isfinite(value):
            continue
        lab = ",".join(f'{k}="{_label(v)}"' for k, v in sorted(labels.items()) if v is not None)
        by_name.setdefault(name, []).append(f"{name}{{{lab}}} {float(value)!r}" if lab else f"{name} {float(value)!r}")
    out: list[str] = []
    for name, lines in by_name.items():
        out += [f"# HELP {name} {HELP[name]}", f"# TYPE {name} gauge", *dict.fromkeys(lines)]
    return ("\n".join(out) + "\n").encode()


def gate_samples(node: str, image: str, code: int, statuses: Mapping[str, int], age_s: float,
                 now: float) -> list[Sample]:
    """One check's gauges: the verdict, its exit code, each check's status, the certificate's age."""
    labels = {"node": node, "image": image}
    out: list[Sample] = [("envbuild_gate_passed", labels, float(code <= 1)),
                         ("envbuild_gate_exit_code", labels, float(code)),
                         ("envbuild_certificate_age_seconds", labels, age_s)]
    out += [("envbuild_check_status", {"check": c, **labels}, float(s)) for c, s in sorted(statuses.items())]
    return out + [("envbuild_last_run_timestamp_seconds", {}, now)]


class Exposition:
    """The latest exposition, swapped whole after each check; empty (503) before the first."""

    def __init__(self) -> None:
        self.body = b""

    def serve(self, port: int, host: str = "0.0.0.0") -> http.server.ThreadingHTTPServer:
        """Serve ``GET /metrics`` on ``host:port`` from a daemon thread."""
        expo = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def do_GET(self) -> None:  # noqa: N802 - the http.server API
                body = expo.body
                code = 404 if self.path.split("?")[0] != "/metrics" else 200 if body else 503
                self.send_response(code)
                self.send_header("Content-Type", CONTENT_TYPE)
                self.send_header("Content-Length", str(len(body) if code == 200 else 0))
                self.end_headers()
                if code == 200:
                    self.wfile.write(body)

        httpd = http.server.ThreadingHTTPServer((host, port), Handler)
        httpd.daemon_threads = True
        threading.Thread(target=httpd.serve_forever, name="envbuild-gate-metrics", daemon=True).start()
        return httpd
