"""Certify an image: THE certification run, for every caller (``envbuild certify``, ``make``,
``k8s render --apply``, the benchmarks).

:func:`plan` resolves what runs before anything starts: the image's facts from its source
(:mod:`.source`: through the engine only where an engine is the source), the settings
(:func:`~builder.certify.settings.resolve`: the lock's, overridden), the socket setting and
the :class:`~builder.launchers.base.LaunchSpec`. :func:`run` launches the plan through a
launcher (default: the source's, the local Docker one for an engine image), checks every
rank result against the run, judges (:func:`~builder.certify.verdict.judge`), builds the
certificate and writes it (:mod:`.certificate`), for failing verdicts as well, with its HTML
report next to it (:mod:`.report`: ``<certificate stem>.html``; a report that cannot be drawn
is one warning line, never a lost certificate)::

    p = plan(EngineImage(client, "envbuild/cpu-torch2:abc"), Overrides(nodes=2))
    cert, path = run(p, images_dir="images", console=console)

Everything the launch creates carries ``envbuild=1`` and ``envbuild.run=<run id>`` plus the
``labels`` of the plan and, for tests and CI, the labels in ``$ENVBUILD_EXTRA_LABELS``
(``key=value,...``; :func:`builder.launchers.base.labels_for`).

The nccl backend is binding: it is refused (exit 2, nothing started) when no GPU is
visible (``gpus_per_node`` 0, or an engine without an NVIDIA runtime) unless the backend
is overridden to gloo; the certificate records the backend used and the recipe's.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from builder.core.errors import EnvbuildError, ExitCode
from builder.image import engine
from builder.launchers.base import Launcher, LaunchResult, LaunchSpec, check_socket_ifname

from . import report
from .certificate import build_certificate, write_certificate
from .model import Certificate
from .settings import Overrides, RunSettings, SocketSetting, resolve, socket_settings
from .source import ImageFacts, ImageSource
from .verdict import check_results, judge


@dataclass(frozen=True)
class Plan:
    """A certification run, resolved; nothing started yet.

    Attributes:
        source: where the image's facts came from (its launcher and host are the defaults).
        image: the image's facts.
        settings: the resolved settings.
        socket: the socket interface setting the nodes run with.
        spec: what the launcher starts.
    """

    source: ImageSource
    image: ImageFacts
    settings: RunSettings
    socket: SocketSetting
    spec: LaunchSpec


def plan(source: ImageSource, overrides: Overrides | None = None, *, gpu_visible: bool | None = None,
         run_id: str | None = None, labels: Mapping[str, str] | None = None,
         extra_env: Mapping[str, str] | None = None) -> Plan:
    """Resolve a certification run of the image of ``source`` (module doc).

    Args:
        overrides: what the command line overrides (None, and None fields: the lock's).
        gpu_visible: whether the nodes can have GPUs (default: the source's answer; a
            cluster's scheduler decides: pass True).
        run_id: the run id (default: :func:`builder.image.engine.new_run_id`).
        labels: extra labels on everything the launch creates (tests add their session).
        extra_env: extra environment for every node. TEST-ONLY (e.g.
            ``{"ENVBUILD_BENCH_FAULT": "allreduce-corrupt@1"}``) on the command line.

    Raises:
        EnvbuildError: (exit 64) a bad ``--socket-ifname`` or value out of range (before
            the image is read); (exit 2) no such image, not an envbuild image, nccl
            without GPUs; (exit 3) the engine failed.
    """
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
    return Plan(source=source, image=image, settings=s, socket=sock, spec=spec)


def run(p: Plan, *, images_dir: str | os.PathLike[str] = Path("images"), launcher: Launcher | None = None,
        console: Any = None, host: Mapping[str, Any] | None = None) -> tuple[Certificate, Path]:
    """Run plan ``p``: launch, check and judge, write the certificate (also when it fails).

    Args:
        images_dir: where ``<recipe>/certificates/`` lives.
        launcher: the launcher (default: the source's; an :class:`ImageFacts` source has none).
        console: a rich Console for progress (None: quiet).
        host: what the certificate records of where it ran, on top of the source's (e.g.
            ``{"launcher": "k8s", "namespace": "default"}``).

    Returns:
        ``(certificate, path written)``; the report is ``report.report_path(path)`` when it
        could be drawn.

    Raises:
        EnvbuildError: (exit 2/3) what the launcher raises when it cannot launch at all;
            (exit 64) no launcher for a source that has none.
        CertificateNotWritten: (exit 3) the run was judged but its certificate could not
            be written; the error carries the certificate.
        KeyboardInterrupt: after the launcher removed everything it started.
    """
    launcher = launcher or p.source.default_launcher()
    if launcher is None:
        raise EnvbuildError("no launcher: an image known from its lock alone needs one (--launcher)",
                            field="launcher", exit_code=ExitCode.USAGE)
    launch = _launch(launcher, p, console)
    check_results(launch, p.spec)
    verdict = judge(p.settings, launch, None if p.image.reference == "probe" else p.image.lock, p.socket)
    cert = build_certificate(image=p.image, settings=p.settings, launch=launch, verdict=verdict,
                             run_id=p.spec.run_id, host={**p.source.host(), **dict(host or {})}, sock=p.socket)
    path = write_certificate(cert, images_dir)
    _report_beside(cert, path, console)
    return cert, path


def _report_beside(cert: Certificate, path: Path, console: Any) -> None:
    """The HTML report next to the certificate (:func:`.report.write_beside`); a failure to
    draw it is one warning line on ``console`` (None: stderr), the certificate stays."""
    _, warning = report.write_beside(cert.to_dict(), path)
    if warning is None:
        return
    if console is None:
        print(f"warning: {warning}", file=sys.stderr, flush=True)
    else:
        console.print(f"warning: {warning}", style="yellow", markup=False, highlight=False, soft_wrap=True)


def _launch(launcher: Launcher, p: Plan, console: Any) -> LaunchResult:
    """Run the launcher, with a status line on ``console`` (None: quiet)."""
    s, spec = p.settings, p.spec
    head = (f"certify {spec.image}: run {spec.run_id}, {s.nodes} node(s) x {s.nproc_per_node} rank(s), "
            f"backend {s.backend}" + (f" (recipe: {s.recipe_backend})" if s.backend != s.recipe_backend else ""))
    if console is None:
        return launcher.run(spec)
    console.print(head, markup=False, highlight=False, soft_wrap=True)
    with console.status(head) as status:
        return launcher.run(spec, on_progress=lambda msg: status.update(msg))
