"""``envbuild certify``, ``make`` and ``k8s render``: certification runs of an image where
``--launcher`` says (local Docker containers, one Slurm batch job, a Kubernetes Indexed Job);
``envbuild report``: (re)draw the HTML report of a certificate."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING, Any

from builder.cli.checks import UsageError, check_launcher_args, slurm_options
from builder.cli.output import console, out, put
from builder.core.errors import ExitCode

if TYPE_CHECKING:
    import docker

    from builder.certify.settings import Overrides
    from builder.launchers.base import Launcher
    from builder.launchers.k8s.options import K8sOptions


def _overrides(args: argparse.Namespace) -> Overrides:
    """The :class:`~builder.certify.settings.Overrides` of the certification options."""
    from builder.certify.settings import Overrides

    return Overrides(nodes=args.nodes, gpus_per_node=args.gpus_per_node, backend=args.backend, port=args.port,
                     timeout_s=args.timeout, min_busbw_gbps=args.min_busbw, socket_ifname=args.socket_ifname,
                     profiles=args.profile, sizes=args.sizes, iters=args.iters, warmup=args.warmup,
                     dtypes=args.dtype, min_scaling_efficiency=args.min_scaling_efficiency)


def _launcher(args: argparse.Namespace, client: docker.DockerClient, recipe_name: str) -> Launcher | None:
    """The launcher of ``--launcher``: None for local (certify's default, on the image's
    engine); a :class:`~builder.launchers.slurm.SlurmLauncher` whose run folder goes under
    ``--slurm-dir`` (default ``images/<recipe>/certificates/``); the Kubernetes launcher
    with its default options (``envbuild k8s render --apply`` has all of them). The
    arguments were checked by :func:`~builder.cli.checks.check_launcher_args` (again here:
    cheap, local)."""
    check_launcher_args(args)
    kind = getattr(args, "launcher", None) or "local"
    if kind == "local":
        return None
    if kind == "k8s":
        from builder.launchers.k8s.launcher import K8sLauncher
        from builder.launchers.k8s.options import K8sOptions

        return K8sLauncher(K8sOptions())
    from builder.launchers import slurm

    base = Path(args.slurm_dir) if args.slurm_dir else slurm.default_slurm_dir(args.images_dir, recipe_name)
    return slurm.SlurmLauncher(base, slurm_options(args), client=client)


def _certify(args: argparse.Namespace, image: str) -> int:
    """Certify ``image`` as the options say; print the verdict (also when the certificate
    cannot be written: then exit 3 after it, naming the file)."""
    from builder.certify import certificate, run, table
    from builder.certify.source import EngineImage
    from builder.image import engine

    check_launcher_args(args)
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
                         or p.image.lock.get("recipe") or "unknown")
    try:
        cert, path = run.run(p, images_dir=Path(args.images_dir), console=console(), launcher=launcher)
    except certificate.CertificateNotWritten as e:
        table.print_table(e.certificate, out(), written=False)
        raise
    table.print_table(cert, out(), path=path)
    job_id = getattr(launcher, "job_id", None)  # a Slurm launcher's batch job
    if job_id:
        out().print(f"slurm: job {job_id}; script, logs and results in {getattr(launcher, 'folder', None)}",
                    markup=False, soft_wrap=True)
    out().print(f"certificate: {path}", markup=False, soft_wrap=True)
    _print_report(path)
    return ExitCode.OK if cert.verdict.passed else ExitCode(cert.verdict.exit_code)


def _print_report(cert_path: Path) -> None:
    """``report: PATH`` when the run drew the certificate's HTML report (names are unique per
    run: a report of that name is this run's)."""
    from builder.certify.report import report_path

    html = report_path(cert_path)
    if html.is_file():
        out().print(f"report: {html}", markup=False, highlight=False, soft_wrap=True)


def cmd_certify(args: argparse.Namespace) -> int:
    """``envbuild certify IMAGE``: run the probe and benchmarks on N container nodes; write a certificate."""
    return _certify(args, args.image)


def cmd_make(args: argparse.Namespace) -> int:
    """``envbuild make [RECIPE]``: check -> render -> build -> certify, stopping at the first failure."""
    from builder.cli.commands.image import build_spec
    from builder.cli.commands.recipe import load_spec, print_findings, render_spec

    check_launcher_args(args)
    spec = load_spec(args.recipe, args.recipes_dir)
    print_findings(spec)
    if spec.failed:
        return ExitCode.CHECK_FAILED  # every error is printed above
    render_spec(argparse.Namespace(images_dir=args.images_dir, check_only=False), spec)
    result = build_spec(args, spec)
    return _certify(args, result.tag)


def _k8s_source(args: argparse.Namespace) -> tuple[str, dict[str, Any], dict[str, str], str | None, dict[str, str]]:
    """``(image ref, lock, labels, image id, image env)`` of ``envbuild k8s render``: a
    recipe name (its ``images/<recipe>/envbuild.lock.json``, the image from ``--image``;
    the environment is the recipe's ``env``) or an image on this engine (its labels and
    config ``Env``). Usage errors come before the engine is contacted."""
    import re

    from builder.core.paths import image_dir
    from builder.launchers.k8s import naming, source

    name = args.source
    if re.fullmatch(r"[a-z0-9][a-z0-9._-]*", name) and image_dir(args.images_dir, name).lock.is_file():
        if not args.image:
            raise UsageError(
                f"envbuild k8s render: recipe {name} needs --image REPO@sha256:DIGEST (the image the pods run)")
        ref = naming.require_digest(args.image, args.allow_tag)
        lock, labels = source.lock_from_file(args.images_dir, name)
        env: dict[Any, Any] = lock["env"] if isinstance(lock.get("env"), dict) else {}
        return ref, lock, labels, None, {str(k): str(v) for k, v in env.items()}
    if args.image:
        raise UsageError(f"envbuild k8s render: --image goes with a recipe name; {name!r} is read as an image")
    from builder.certify.source import read_image
    from builder.image import engine
    from builder.oci import reference

    reference.parse(name, field="image")
    client = engine.connect()
    labels, lock = read_image(client, name)
    img = client.images.get(name)
    ref = naming.require_digest(name, args.allow_tag, candidates=list(img.attrs.get("RepoDigests") or []))
    return ref, lock, labels, img.id, engine.image_env(client, name)


def _k8s_options(args: argparse.Namespace) -> tuple[K8sOptions, dict[str, str]]:
    """The K8sOptions of the command line, checked (exit 64) before anything is contacted."""
    from builder.launchers.k8s.naming import check_run_id
    from builder.launchers.k8s.options import K8sOptions, check_options

    if args.apply and args.kubeflow:
        raise UsageError(
            "envbuild k8s render: --apply runs the Indexed Job; apply a TrainJob with kubectl apply -f DIR")
    env = {}
    for item in args.env:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise UsageError(f"envbuild k8s render: --env wants NAME=VALUE, got {item!r}")
        env[key] = value
    opts = K8sOptions(kubeflow=args.kubeflow, runtime=args.runtime, allow_tag=args.allow_tag, ttl_s=args.ttl,
                      spread=args.spread, socket_ifname=args.socket_ifname)
    check_options(opts)
    if args.run_id:
        check_run_id(args.run_id)
    return opts, env


def cmd_k8s_render(args: argparse.Namespace) -> int:
    """``envbuild k8s render IMAGE_OR_RECIPE --out DIR [--apply]``: write the Kubernetes
    manifests of a certification run; with ``--apply`` run them and write the certificate."""
    import dataclasses

    from builder.certify import certificate, run, table
    from builder.certify.source import ImageFacts
    from builder.launchers.k8s.kubeconfig import find_kubeconfig
    from builder.launchers.k8s.launcher import K8sLauncher
    from builder.launchers.k8s.manifests import render_manifests, write_manifests

    opts, env = _k8s_options(args)
    ref, lock, labels, image_id, image_env = _k8s_source(args)
    recipe_name = labels.get("envbuild.recipe") or lock.get("recipe")
    facts = ImageFacts(ref, labels, lock, image_env, image_id, (ref,) if "@" in ref else ())
    p = run.plan(facts, _overrides(args), gpu_visible=True, run_id=args.run_id, extra_env=env,
                 labels={"envbuild.recipe": recipe_name} if recipe_name else {})
    for w in p.settings.warnings:
        console().print(f"warning: {w}", soft_wrap=True, markup=False)
    annotations = {k: labels[k] for k in ("envbuild.lock-hash",) if labels.get(k)}
    opts = dataclasses.replace(opts, annotations=annotations)
    for path in write_manifests(render_manifests(p.spec, opts), args.out):
        out().print(f"wrote {path}", markup=False, highlight=False, soft_wrap=True)
    if not args.apply:
        out().print(f"run {p.spec.run_id}: apply with `kubectl apply -f {args.out}`",
                    markup=False, highlight=False, soft_wrap=True)
        return ExitCode.OK
    launcher = K8sLauncher(opts, kubeconfig=args.kubeconfig or find_kubeconfig(manifests=str(args.out)),
                           context=args.context, namespace=args.namespace)
    try:
        cert, path = run.run(p, images_dir=Path(args.images_dir), console=console(), launcher=launcher,
                             host={"launcher": "k8s", "namespace": launcher.api.namespace})
    except certificate.CertificateNotWritten as e:
        table.print_table(e.certificate, out(), written=False)
        raise
    table.print_table(cert, out(), path=path)
    out().print(f"certificate: {path}", markup=False, highlight=False, soft_wrap=True)
    _print_report(path)
    return ExitCode.OK if cert.verdict.passed else ExitCode(cert.verdict.exit_code)


def cmd_report(args: argparse.Namespace) -> int:
    """``envbuild report CERT.json [--out FILE]``: draw the HTML report of a certificate again
    (default: next to it, the same name with ``.html``), as certify draws it.

    The certificate is read bounded (a regular file of at most 16 MiB:
    :data:`builder.core.inputs.MAX_REPORT_BYTES`) and checked whole against its model before
    anything is drawn. Exit 0 drawn (whatever the verdict it shows); 2 not valid JSON or not a
    certificate (every violation named); 3 unreadable (missing, a directory, a FIFO or device,
    too large) or the report cannot be written; 64 ``--out`` naming the certificate itself.
    """
    from builder.certify import report
    from builder.certify.model import load_certificate
    from builder.core.errors import Unreachable
    from builder.core.inputs import MAX_REPORT_BYTES, escape, read_json

    source = Path(args.certificate)
    target = Path(args.out) if args.out else report.report_path(source)
    if target.resolve() == source.resolve():
        raise UsageError(f"envbuild report: the report would replace the certificate {escape(source)}; give --out FILE")
    doc = read_json(source, MAX_REPORT_BYTES, "certificate", ExitCode.CHECK_FAILED)
    cert = load_certificate(doc, file=str(source))
    try:
        report.write_report(cert.to_dict(), target, source=source.name)
    except OSError as e:
        raise Unreachable(f"cannot write the report: {e.strerror or e}", file=str(target)) from None
    put(escape(f"report: {target}", None))
    return ExitCode.OK
