"""Certify an image: THE certification run, for every caller (``envbuild certify``, ``make``,
``k8s render --apply``, the benchmarks)."""

from __future__ import annotations

import os
import sys
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec

from builder.core.certificate import Certificate, RunSettings, SocketSetting, Verdict
from builder.core.errors import EnvbuildError, UsageError
from builder.core.files import write_atomic
from builder.core.inputs import one_line
from builder.image import engine
from builder.launchers.base import Launcher, LaunchResult, LaunchSpec, check_socket_ifname

from . import report
from .certificate import build_certificate, write_certificate
from .settings import Overrides, resolve, socket_settings
from .source import ImageFacts, ImageSource
from .verdict import check_results, judge


@dataclass(frozen=True)
class Plan:
    """A certification run, resolved; nothing started yet."""

    source: ImageSource
    image: ImageFacts
    settings: RunSettings
    socket: SocketSetting
    spec: LaunchSpec
    plan_s: float = 0.0


def plan(source: ImageSource, overrides: Overrides | None = None, *, gpu_visible: bool | None = None,
         run_id: str | None = None, labels: Mapping[str, str] | None = None,
         extra_env: Mapping[str, str] | None = None) -> Plan:
    """Resolve a certification run of the image of ``source``.
    Raises EnvbuildError: (exit 64) a bad ``--socket-ifname`` or value out of range (before the image is read); (exit
    2) not an envbuild image, nccl without GPUs; (exit 3) no such image, the engine failed."""
    t0 = time.monotonic()
    overrides = overrides or Overrides()
    check_socket_ifname(overrides.socket_ifname)
    image = source.read()
    sock = socket_settings(image.env, overrides.socket_ifname)
    visible = source.gpu_visible() if gpu_visible is None else gpu_visible
    s = resolve(image.lock, overrides, gpu_visible=visible, recipe_backend=image.labels.get("envbuild.backend"))
    spec = LaunchSpec(image=image.ref, nodes=s.nodes, gpus_per_node=s.gpus_per_node, backend=s.backend,
                      port=s.port, shm_size=s.shm_size, timeout_s=s.timeout_s, bench_args=s.bench_args(),
                      env=dict(extra_env or {}), run_id=run_id or engine.new_run_id(), labels=dict(labels or {}),
                      socket_ifname=overrides.socket_ifname)
    return Plan(source=source, image=image, settings=s, socket=sock, spec=spec, plan_s=time.monotonic() - t0)


def run(p: Plan, *, images_dir: str | os.PathLike[str] = Path("images"), launcher: Launcher | None = None,
        console: Any = None, host: Mapping[str, Any] | None = None,
        judged: Callable[[LaunchResult, Verdict], None] | None = None) -> tuple[Certificate, Path]:
    """Launch, check and judge plan ``p``; write the certificate (also when it fails).
    Raises EnvbuildError: (exit 2/3) what the launcher raises when it cannot launch at all; also exit 64."""
    t0 = time.monotonic()
    launcher = launcher or p.source.default_launcher()
    if launcher is None:
        raise UsageError("no launcher: an image known from its lock alone needs one (--launcher)",
                         field="launcher")
    threading.Thread(target=report.prewarm, name="envbuild-report-prewarm", daemon=True).start()
    launch = _launch(launcher, p, console)
    check_results(launch, p.spec)
    verdict = judge(p.settings, launch, None if p.image.reference == "probe" else p.image.lock, p.socket)
    if judged is not None:
        judged(launch, verdict)
    if launch.phases:  # the rest of the wall time: reading the image, checking, judging
        other = p.plan_s + time.monotonic() - t0 - sum(sec for _, sec in launch.phases)
        launch.phases.append(("other", round(max(0.0, other), 2)))
    cert = build_certificate(image=p.image, settings=p.settings, launch=launch, verdict=verdict,
                             run_id=p.spec.run_id, host={**p.source.host(), **dict(host or {})}, sock=p.socket)
    path = write_certificate(cert, images_dir)
    _beside(cert, launch, path, console)
    return cert, path


def logs_path(cert_path: str | os.PathLike[str]) -> Path:
    """The node logs of the certificate at ``cert_path``: the same name, ``.logs.jsonl``."""
    return Path(cert_path).with_suffix(".logs.jsonl")


def _beside(cert: Certificate, launch: LaunchResult, path: Path, console: Any) -> None:
    """The HTML report (:func:`.report.write_beside`) and the nodes' log lines (JSON lines of
    ``log`` events, mode 0600: what the image prints) next to the certificate; a failure to write
    either is one warning line on ``console`` (None: stderr), the certificate stays."""
    _, warning = report.write_beside(cert, path)
    warnings = [warning] if warning else []
    try:
        write_atomic(logs_path(path), b"".join(msgspec.json.encode(e) + b"\n" for e in launch.log_events), 0o600)
    except EnvbuildError as e:
        warnings.append(f"node logs not written: {e} (the certificate {one_line(path, 300)} is kept)")
    for w in warnings:
        if console is None:
            print(f"warning: {w}", file=sys.stderr, flush=True)
        else:
            console.print(f"warning: {w}", style="yellow", markup=False, highlight=False, soft_wrap=True)


def _launch(launcher: Launcher, p: Plan, console: Any) -> LaunchResult:
    """Run the launcher, with a status line on ``console`` (None: quiet)."""
    s, spec = p.settings, p.spec
    head = (f"certify {spec.image}: run {spec.run_id}, {s.nodes} node(s) x {s.nproc_per_node} rank(s), "
            f"backend {s.backend}" + (f" (recipe: {s.recipe_backend})" if s.backend != s.recipe_backend else ""))
    if console is None:
        return launcher.run(spec)
    console.print(head, markup=False, highlight=False, soft_wrap=True)
    if not console.is_terminal:
        return launcher.run(spec, on_progress=plain_lines(console))
    with console.status(head) as status:
        return launcher.run(spec, on_progress=lambda msg: status.update(msg))


def plain_lines(console: Any) -> Callable[[str], None]:
    """Progress without a terminal: a ``HH:MM:SS +S s`` line when a message changes in more than its running seconds (a
    phase, a node, a rank result), as it happens; every message with ``console.every_line`` (``--verbose``)."""
    import re

    t0, last = time.monotonic(), [""]

    def line(msg: str) -> None:
        key = re.sub(r"\d+ s( of [\d.]+ s)?", "", msg)
        if key != last[0] or getattr(console, "every_line", False):
            last[0] = key
            stamp = f"{time.strftime('%H:%M:%S')} +{time.monotonic() - t0:.1f} s"
            console.print(f"{stamp} {msg}", markup=False, highlight=False, soft_wrap=True)
    return line
