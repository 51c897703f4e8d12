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

    from builder.launchers.base import Launcher
    from builder.launchers.k8s.options import K8sOptions


def _launcher(args: argparse.Namespace, client: docker.DockerClient, image: str) -> tuple[Launcher | None, str | None]:
    """``(launcher, run id)`` for ``--launcher``: ``(None, None)`` for local (certify's
    default); a :class:`~builder.launchers.slurm.SlurmLauncher` whose run folder goes under
    ``--slurm-dir`` (default ``images/<recipe>/certificates/``); the Kubernetes launcher
    with its default options (``envbuild k8s render --apply`` has all of them). The
    arguments were checked by :func:`~builder.cli.checks.check_launcher_args` (again here:
    cheap, local)."""
    check_launcher_args(args)
    kind = getattr(args, "launcher", None) or "local"
    if kind == "local":
        return None, None
    from builder.certify import certify
    from builder.image import engine

    run_id = engine.new_run_id()
    if kind == "k8s":
        from builder.launchers.k8s.launcher import K8sLauncher
        from builder.launchers.k8s.options import K8sOptions

        return K8sLauncher(K8sOptions()), run_id
    from builder.launchers import slurm

    labels, lock = certify.read_image(client, image)
    recipe_name = labels.get("envbuild.recipe") or lock.get("recipe") or "unknown"
    base = Path(args.slurm_dir) if args.slurm_dir else slurm.default_slurm_dir(args.images_dir, recipe_name)
    return slurm.SlurmLauncher(base, slurm_options(args), client=client), run_id


def _certify(args: argparse.Namespace, image: str) -> int:
    """Certify ``image`` as the options say; print the verdict (also when the certificate
    cannot be written: then exit 3 after it, naming the file)."""
    from builder.certify import certify
    from builder.image import engine

    check_launcher_args(args)
    client = engine.connect()
    launcher, run_id = _launcher(args, client, image)
    try:
        cert, path = certify.certify(
            client,
            image,
            nodes=args.nodes,
            gpus_per_node=args.gpus_per_node,
            backend=args.backend,
            port=args.port,
            timeout_s=args.timeout,
            min_busbw_gbps=args.min_busbw,
            images_dir=Path(args.images_dir),
            console=console(),
            launcher=launcher,
            run_id=run_id,
            # on a cluster the nodes have the GPUs, not this host's engine: the scheduler decides
            gpu_visible=True if launcher is not None else None,
            socket_ifname=args.socket_ifname,
        )
    except certify.CertificateNotWritten as e:
        certify.print_table(e.certificate, out(), written=False)
        raise
    certify.print_table(cert, out(), path=path)
    job_id = getattr(launcher, "job_id", None)  # a Slurm launcher's batch job
    if job_id:
        out().print(f"slurm: job {job_id}; script, logs and results in {getattr(launcher, 'folder', None)}",
                    markup=False, soft_wrap=True)
    out().print(f"certificate: {path}", markup=False, soft_wrap=True)
    return ExitCode.OK if cert["verdict"]["passed"] else ExitCode(cert["verdict"]["exit_code"])


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
    from builder.certify import certify
    from builder.image import engine
    from builder.oci import reference

    reference.parse(name, field="image")
    client = engine.connect()
    labels, lock = certify.read_image(client, name)
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
    import socket

    from builder.certify import certify
    from builder.image import engine
    from builder.launchers.base import LaunchSpec
    from builder.launchers.k8s.kubeconfig import find_kubeconfig
    from builder.launchers.k8s.launcher import K8sLauncher
    from builder.launchers.k8s.manifests import render_manifests, write_manifests

    opts, env = _k8s_options(args)
    ref, lock, labels, image_id, image_env = _k8s_source(args)
    s = certify.resolve_settings(
        lock, gpu_visible=True, nodes=args.nodes, gpus_per_node=args.gpus_per_node, backend=args.backend,
        port=args.port, timeout_s=args.timeout, min_busbw_gbps=args.min_busbw,
        recipe_backend=labels.get("envbuild.backend"))
    for w in s.warnings:
        console().print(f"warning: {w}", soft_wrap=True, markup=False)
    run_id = args.run_id or engine.new_run_id()
    recipe_name = labels.get("envbuild.recipe") or lock.get("recipe")
    spec = LaunchSpec(image=ref, nodes=s.nodes, gpus_per_node=s.gpus_per_node, backend=s.backend, port=s.port,
                      shm_size=s.shm_size, timeout_s=s.timeout_s, bench_args=s.bench_args(), env=env, run_id=run_id,
                      labels={"envbuild.recipe": recipe_name} if recipe_name else {}, socket_ifname=args.socket_ifname)
    annotations = {k: labels[k] for k in ("envbuild.lock-hash",) if labels.get(k)}
    opts = dataclasses.replace(opts, annotations=annotations)
    for path in write_manifests(render_manifests(spec, opts), args.out):
        out().print(f"wrote {path}", markup=False, highlight=False, soft_wrap=True)
    if not args.apply:
        out().print(f"run {run_id}: apply with `kubectl apply -f {args.out}`",
                    markup=False, highlight=False, soft_wrap=True)
        return ExitCode.OK
    launcher = K8sLauncher(opts, kubeconfig=args.kubeconfig or find_kubeconfig(manifests=str(args.out)),
                           context=args.context, namespace=args.namespace)
    head = f"k8s run {run_id}: {s.nodes} pod(s) x {s.nproc_per_node} rank(s), backend {s.backend}, image {ref}"
    console().print(head, markup=False, highlight=False, soft_wrap=True)
    with console().status(head) as status:
        launch = launcher.run(spec, on_progress=lambda msg: status.update(msg))
    sock = certify.socket_settings(image_env, args.socket_ifname)
    certify.check_results(launch, spec)
    verdict = certify.judge(s, launch, lock, sock)
    cert = certify.build_certificate(
        image_ref=ref, image_id=image_id, repo_digests=[ref] if "@" in ref else [], labels=labels, lock=lock,
        settings=s, launch=launch, verdict=verdict, run_id=run_id, sock=sock,
        host={"hostname": socket.gethostname(), "launcher": "k8s", "namespace": launcher.api.namespace})
    try:
        path = certify.write_certificate(cert, Path(args.images_dir))
    except certify.CertificateNotWritten:
        certify.print_table(cert, out(), written=False)
        raise
    certify.print_table(cert, out(), path=path)
    out().print(f"certificate: {path}", markup=False, highlight=False, soft_wrap=True)
    return ExitCode.OK if verdict["passed"] else ExitCode(verdict["exit_code"])
