"""``envbuild certify``, ``make`` and ``k8s render``: certification runs of an image where
``--launcher`` says (local Docker containers, one Slurm batch job, a Kubernetes Indexed Job);
``envbuild report``: (re)draw the HTML report of a certificate."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from builder.cli import output
from builder.cli.checks import check_launcher_args, slurm_options
from builder.cli.documents import Certify, Make, Render, Report, build_document, check_document
from builder.cli.output import console, count_warnings, out, publish, put, warn
from builder.core.errors import ExitCode, UsageError

if TYPE_CHECKING:

    from builder.certify.settings import Overrides
    from builder.core.certificate import Certificate
    from builder.image.engine import Engine
    from builder.launchers.base import Launcher
    from builder.launchers.k8s import K8sOptions, Placement
    from builder.recipe.model import Lock


def _overrides(args: argparse.Namespace) -> Overrides:
    """The :class:`~builder.certify.settings.Overrides` of the certification options."""
    from builder.certify.settings import Overrides

    return Overrides(nodes=args.nodes, gpus_per_node=args.gpus_per_node, backend=args.backend, port=args.port,
                     timeout_s=args.timeout, min_busbw_gbps=args.min_busbw, socket_ifname=args.socket_ifname,
                     profiles=args.profile, sizes=args.sizes, iters=args.iters, warmup=args.warmup,
                     dtypes=args.dtype, min_scaling_efficiency=args.min_scaling_efficiency)


def _launcher(args: argparse.Namespace, client: Engine, recipe_name: str) -> Launcher | None:
    """The ``--launcher`` (None: local); Slurm's run folder and k8s manifests in ``--slurm-dir`` or certificates/."""
    check_launcher_args(args)
    kind = getattr(args, "launcher", None) or "local"
    if kind == "local":
        return None
    if kind == "k8s":
        from builder.core.paths import image_dir
        from builder.launchers.k8s import K8sLauncher, K8sOptions

        return K8sLauncher(K8sOptions(), manifests_dir=str(image_dir(args.images_dir, recipe_name).certificates))
    from builder.launchers import slurm

    base = Path(args.slurm_dir) if args.slurm_dir else slurm.default_slurm_dir(args.images_dir, recipe_name)
    return slurm.SlurmLauncher(base, slurm_options(args), client=client)


def _certify(args: argparse.Namespace, image: str) -> tuple[int, Certify]:
    """Certify ``image`` and print the verdict (also when the certificate is unwritten: then exit 3); the exit code."""
    from builder.certify import run
    from builder.certify.source import EngineImage
    from builder.image import engine

    recipe = None
    if getattr(args, "recipe_lock", None):  # certify --recipe RECIPE: its lock is the reference
        from builder.certify.source import recipe_lock

        recipe = recipe_lock(args.images_dir, args.recipe_lock)
    client = engine.connect()
    kind = getattr(args, "launcher", None) or "local"
    # on a cluster the nodes have the GPUs, not this host's engine: the scheduler decides
    p = run.plan(EngineImage(client, image, recipe=recipe), _overrides(args),
                 gpu_visible=True if kind != "local" else None)
    launcher = _launcher(args, client, p.image.recipe or p.image.labels.get("envbuild.recipe")
                         or (p.image.lock.recipe if p.image.lock else "unknown"))
    judged: list[Any] = []
    cert, path = _run(p, args, launcher, judged=lambda launch, verdict: judged.extend((launch, verdict)))
    bisection = None
    if getattr(args, "bisect", False) and not cert.verdict.passed and p.settings.nodes > 1:
        bisection = _bisect(p, judged, launcher or p.source.default_launcher(), path)
    job_id = getattr(launcher, "job_id", None)  # a Slurm launcher's batch job
    if job_id:
        out().print(f"slurm: job {job_id}; script, logs and results in {getattr(launcher, 'folder', None)}",
                    markup=False, soft_wrap=True)
    out().print(f"certificate: {path}", markup=False, soft_wrap=True)
    code, report = _verdict_code(cert, path)
    return code, Certify(certificate_path=str(path), report=report, bisection=bisection, certificate=cert)


def _run(p: Any, args: argparse.Namespace, launcher: Launcher | None, **kw: Any) -> tuple[Certificate, Path]:
    """Run plan ``p`` and print its table, also when the certificate cannot be written (then raise)."""
    from builder.certify import certificate, run, table

    try:
        cert, path = run.run(p, images_dir=Path(args.images_dir), launcher=launcher, **kw,
                             console=None if output.mode[0] == "quiet" else console())
    except certificate.CertificateNotWritten as e:
        table.print_table(e.certificate, out(), written=False)
        raise
    table.print_table(cert, out(), path=path)
    _publish(args, cert)
    return cert, path


def _publish(args: argparse.Namespace, cert: Certificate) -> None:
    """The run's metrics and events: its phases, each rank's result, each failure and warning."""
    import time

    from builder.core.events import event
    from builder.core.metrics import certificate_samples

    run = cert.run_id
    evs = [event("phase", f"{p.name}: {p.seconds:g} s", run=run) for p in cert.phases]
    evs += [event("rank-result", "reported" if r.reported else f"no result: {r.problem or 'no report'}",
                  "info" if r.reported else "error", run, r.hostname or f"node{r.node}", int(k))
            for k, r in cert.ranks.items() if k.isdigit()]
    evs += [event("finding", f, "error", run) for f in cert.verdict.failures]
    evs += [event("finding", w, "warning", run) for w in cert.verdict.warnings]
    evs.append(event("run-end", f"certify {cert.image.ref}: {'passed' if cert.verdict.passed else 'failed'}",
                     "info" if cert.verdict.passed else "error", run))
    publish(args, certificate_samples(cert, time.time()), evs)


def _bisect(p: Any, judged: list[Any], launcher: Any, cert_path: Path) -> str:
    """``certify --bisect``: the bad nodes of the failed run, printed and written beside the certificate."""
    from builder.certify import bisect

    doc = bisect.bisect(p, judged[0], judged[1], launcher)
    for line in bisect.lines(doc):
        put(line)
    written = str(bisect.write_bisection(doc, cert_path))
    put(f"bisection: {written}")
    return written


def _verdict_code(cert: Certificate, cert_path: Path) -> tuple[int, str | None]:
    """``report: PATH`` when the run drew the HTML report (that unique name is this run's; else a warning says why); the
    verdict's exit code, warnings counted (:func:`builder.cli.output.exit_code`), the report path or None."""
    from builder.certify.report import report_path

    html = report_path(cert_path)
    if html.is_file():
        out().print(f"report: {html}", markup=False, highlight=False, soft_wrap=True)
    else:
        count_warnings()
    count_warnings(len(cert.verdict.warnings))
    code = ExitCode.OK if cert.verdict.passed else ExitCode(cert.verdict.exit_code)
    return code, str(html) if html.is_file() else None


def cmd_certify(args: argparse.Namespace) -> int:
    """``envbuild certify IMAGE``: run the probe and benchmarks on N container nodes; write a certificate."""
    code, doc = _certify(args, args.image)
    output.emit(doc)
    return code


def cmd_make(args: argparse.Namespace) -> int:
    """``envbuild make [RECIPE]``: check -> render -> build -> certify, stopping at the first failure."""
    from builder.cli.commands.image import build_spec
    from builder.cli.commands.recipe import load_spec, print_findings, render_spec

    spec = load_spec(args.recipe, args.recipes_dir)
    print_findings(spec)
    if spec.failed:
        output.emit(Make(check=check_document(spec)))
        return ExitCode.CHECK_FAILED  # every error is printed above
    files = render_spec(argparse.Namespace(images_dir=args.images_dir, check_only=False), spec)
    result = build_spec(args, spec)
    code, doc = _certify(args, result.tag)
    output.emit(Make(check=check_document(spec), render=Render(files=files),  # type: ignore[arg-type]
                     build=build_document(spec.name, result), certify=doc))
    return code


def _k8s_source(args: argparse.Namespace) -> tuple[str, Lock, dict[str, str], str | None, dict[str, str]]:
    """``(image ref, lock, labels, image id, env)`` of a recipe (its lock, ``--image``) or of a local image."""
    import re

    from builder.certify.source import recipe_lock
    from builder.core.paths import image_dir
    from builder.launchers.k8s import require_digest
    from builder.recipe.lock import lock_hash

    name = args.source
    if re.fullmatch(r"[a-z0-9][a-z0-9._-]*", name) and image_dir(args.images_dir, name).lock.is_file():
        if not args.image:
            raise UsageError(
                f"envbuild k8s render: recipe {name} needs --image REPO@sha256:DIGEST (the image the pods run)")
        ref = require_digest(args.image, args.allow_tag)
        lock = recipe_lock(args.images_dir, name)[1]
        labels = {"envbuild.recipe": lock.recipe, "envbuild.lock-hash": lock_hash(lock),
                  "envbuild.backend": lock.certify.backend}  # type: ignore[attr-defined]
        return ref, lock, labels, None, dict(lock.env)
    if args.image:
        raise UsageError(f"envbuild k8s render: --image goes with a recipe name; {name!r} is read as an image")
    from builder.certify.source import read_image
    from builder.image import engine
    from builder.oci import reference

    reference.parse(name, field="image")
    client = engine.connect()
    labels, lock = read_image(client, name)
    img = client.image(name)
    ref = require_digest(name, args.allow_tag, candidates=list(img.repo_digests))
    return ref, lock, labels, img.id, img.env()


def _k8s_options(args: argparse.Namespace) -> tuple[K8sOptions, dict[str, str]]:
    """The K8sOptions of the command line, checked (exit 64) before anything is contacted."""
    from builder.launchers.k8s import K8sOptions, check_options

    if args.apply and args.kubeflow:
        raise UsageError(
            "envbuild k8s render: --apply runs the Indexed Job; apply a TrainJob with kubectl apply -f DIR")
    env = dict(item.split("=", 1) for item in args.env)  # NAME=VALUE, matched by argtypes.env_item
    opts = K8sOptions(kubeflow=args.kubeflow, runtime=args.runtime, allow_tag=args.allow_tag, ttl_s=args.ttl,
                      spread=args.spread, socket_ifname=args.socket_ifname, placement=placement(args),
                      namespace=args.namespace, rdma=args.rdma, rdma_network=args.rdma_network)
    check_options(opts)  # the run id: checks.check_args
    return opts, env


def placement(args: argparse.Namespace) -> Placement:
    """The :class:`~builder.launchers.k8s.Placement` of the placement options (unchecked)."""
    from builder.launchers.k8s import Placement

    return Placement(requests=args.requests, limits=args.limits, node_selector=dict(args.node_selector),
                     tolerations=tuple(args.toleration), node_affinity=tuple(args.node_affinity),
                     priority_class=args.priority_class)


def cmd_k8s_render(args: argparse.Namespace) -> int:
    """``envbuild k8s render IMAGE_OR_RECIPE --out DIR [--apply]``: write the manifests; ``--apply`` runs them too."""
    import dataclasses

    from builder.certify import run
    from builder.certify.source import ImageFacts
    from builder.launchers.k8s import K8sLauncher, find_kubeconfig, render_manifests, write_manifests

    opts, env = _k8s_options(args)
    ref, lock, labels, image_id, image_env = _k8s_source(args)
    recipe_name = labels.get("envbuild.recipe") or lock.recipe
    facts = ImageFacts(ref, labels, lock, image_env, image_id, (ref,) if "@" in ref else ())
    p = run.plan(facts, _overrides(args), gpu_visible=True, run_id=args.run_id, extra_env=env,
                 labels={"envbuild.recipe": recipe_name} if recipe_name else {})
    for w in p.settings.warnings:
        warn(w)
    annotations = {k: labels[k] for k in ("envbuild.lock-hash",) if labels.get(k)}
    opts = dataclasses.replace(opts, annotations=annotations)
    for path in write_manifests(render_manifests(p.spec, opts), args.out):
        out().print(f"wrote {path}", markup=False, highlight=False, soft_wrap=True)
    if not args.apply:
        (console() if args.out == "-" else out()).print(
            f"run {p.spec.run_id}: apply with `kubectl apply -f {args.out}`", markup=False, highlight=False,
            soft_wrap=True)
        return ExitCode.OK
    launcher = K8sLauncher(opts, kubeconfig=args.kubeconfig or find_kubeconfig(manifests=str(args.out)),
                           context=args.context)
    cert, path = _run(p, args, launcher, host={"launcher": "k8s", "namespace": launcher.api.namespace})
    out().print(f"certificate: {path}", markup=False, highlight=False, soft_wrap=True)
    return _verdict_code(cert, path)[0]


def cmd_report(args: argparse.Namespace) -> int:
    """``envbuild report CERT.json [--out FILE]``: redraw a certificate's HTML report (default: beside it)."""
    from builder.certify import report
    from builder.core.certificate import load_certificate
    from builder.core.inputs import MAX_REPORT_BYTES, escape, read_json

    source = Path(args.certificate)
    target = Path(args.out) if args.out else report.report_path(source)
    if args.out == "-" and args.json:
        raise UsageError("envbuild report: --json goes with a report file (--out FILE), not --out -")
    if args.out != "-" and target.resolve() == source.resolve():
        raise UsageError(f"envbuild report: the report would replace the certificate {escape(source)}; give --out FILE")
    doc = read_json(source, MAX_REPORT_BYTES, "certificate", ExitCode.CHECK_FAILED)
    cert = load_certificate(doc, file=str(source))
    if args.out == "-":
        sys.stdout.buffer.write(report.render_html(cert.to_dict(), source=source.name).encode("utf-8"))
        return ExitCode.OK
    report.write_report(cert.to_dict(), target, source=source.name)
    put(escape(f"report: {target}", None))
    output.emit(Report(certificate=str(source), report=str(target), passed=cert.verdict.passed))
    return ExitCode.OK
