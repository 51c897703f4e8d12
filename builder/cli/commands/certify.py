"""``envbuild certify``, ``make`` and ``k8s render``: certification runs of an image where
``--launcher`` says (local Docker containers, one Slurm batch job, a Kubernetes Indexed Job)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING, Any

from builder.cli.checks import UsageError, check_launcher_args, slurm_options
from builder.cli.output import console, out
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
                     timeout_s=args.timeout, min_busbw_gbps=args.min_busbw, socket_ifname=args.socket_ifname)


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
    client = engine.connect()
    kind = getattr(args, "launcher", None) or "local"
    # on a cluster the nodes have the GPUs, not this host's engine: the scheduler decides
    p = run.plan(EngineImage(client, image), _overrides(args), gpu_visible=True if kind != "local" else None)
    launcher = _launcher(args, client, p.image.labels.get("envbuild.recipe") or p.image.lock.get("recipe") or "unknown")
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
    return ExitCode.OK if cert.verdict.passed else ExitCode(cert.verdict.exit_code)


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
    return ExitCode.OK if cert.verdict.passed else ExitCode(cert.verdict.exit_code)
