"""The ``envbuild`` command: the only module that knows every stage.

Commands: ``check``, ``audit``, ``render``, ``build``, ``certify``, ``make`` (check -> render -> build
-> certify), ``probe``, ``verify``, ``doctor``, ``base``, ``lock``, ``push``, ``pull``, ``k8s render``. Errors from any stage are :class:`EnvbuildError` values
printed as one line each (no traceback) with the exit code of the shared table
(``builder/core/errors.py``); usage errors exit 64, found before anything is contacted
(:func:`_check_args`); SIGINT/SIGTERM exit 130 after cleanup; an unexpected exception (a
bug) exits 70 with its traceback, every line escaped.
``certify`` and ``make`` run the ranks where ``--launcher`` says: local Docker containers
(default), one Slurm batch job (:mod:`builder.launchers.slurm`) or a Kubernetes Indexed Job.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import sys
from pathlib import Path

from builder.core import inputs
from builder.core.paths import image_dir
from builder.recipe import fields, load, rules
from builder.recipe.spec import Spec
from builder.core.errors import EnvbuildError, ExitCode, ManyErrors, Unreachable
from builder.core.inputs import escape, has_control, one_line, show

from .term import LazyConsole, level_line, plain_line

INTERRUPTED = 130
#: rich consoles, made on first use (the check path never imports rich: builder.cli.term).
console = LazyConsole(stderr=True)
out = LazyConsole()


class UsageError(Exception):
    """A command-line usage error (exit 64)."""


#: Exit code of an unexpected exception (a bug in envbuild): ``EX_SOFTWARE`` of sysexits.h,
#: as 64 is its ``EX_USAGE``; never 1, which means "done with warnings only".
INTERNAL_ERROR = 70
#: Longest path accepted on the command line (characters; Linux ``PATH_MAX``).
MAX_PATH_CHARS = 4096
#: Largest CA bundle read (``--ca-cert``, ``--registry-ca``), in bytes.
MAX_CA_BYTES = 16 << 20
_INT_TEXT = re.compile(r"[+-]?[0-9]{1,30}")
_FLOAT_TEXT = re.compile(r"[+-]?(?:[0-9]{1,30}(?:\.[0-9]{0,30})?|\.[0-9]{1,30})(?:[eE][+-]?[0-9]{1,3})?")


def _int_in(lo: int, hi: int):
    """argparse type: a decimal integer in ``lo..hi``, matched whole (no blanks, no
    ``_``, at most 30 digits; else a usage error, exit 64)."""
    def parse(text: str) -> int:
        value = int(text) if _INT_TEXT.fullmatch(text) else None
        if value is None or not lo <= value <= hi:
            raise argparse.ArgumentTypeError(f"{show(text)} is not an integer in {lo}..{hi}")
        return value
    return parse


def _float_in(lo: float, hi: float, *, lo_open: bool = False):
    """argparse type: a decimal number in ``lo..hi`` (``(lo..hi]`` with ``lo_open``),
    matched whole: ``nan``, ``inf``, ``1_0`` and blanks are refused (exit 64)."""
    def parse(text: str) -> float:
        value = float(text) if _FLOAT_TEXT.fullmatch(text) else float("nan")
        ok = value == value and (value > lo if lo_open else value >= lo) and value <= hi
        if not ok:
            bounds = f"{'(' if lo_open else '['}{lo:.10g}..{hi:.10g}]"
            raise argparse.ArgumentTypeError(f"{show(text)} is not a number in {bounds}")
        return value
    return parse


_SUITE = re.compile(r"[a-z][a-z0-9-]{0,31}")
#: Kubernetes names: an RFC 1123 label (namespaces) and subdomain (object names); source:
#: https://kubernetes.io/docs/concepts/overview/working-with-objects/names/
_K8S_LABEL = re.compile(r"[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?")
_K8S_SUBDOMAIN = re.compile(r"[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?(?:\.[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?)*")
_LABEL = re.compile(r"[A-Za-z0-9][A-Za-z0-9._/-]{0,254}(?:=.{0,1000})?", re.S)
_ENV_ITEM = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,127}=.{0,4096}", re.S)


def _image_ref(text: str) -> str:
    """argparse type: an image reference (:mod:`builder.oci.reference`) or image ID."""
    from builder.oci import reference

    if not (reference.is_valid(text) or reference.IMAGE_ID.fullmatch(text)):
        raise argparse.ArgumentTypeError(f"{show(text)} is not an image reference (lower-case name[:tag][@sha256:digest]) or image ID")
    return text


def _pattern(regex: re.Pattern, what: str, limit: int = 255, check=None):
    """argparse type: a value ``regex`` matches whole (``fullmatch``), of at most ``limit``
    characters, without control characters; ``check(text)`` may refuse it too (False)."""
    def parse(text: str) -> str:
        if len(text) > limit or has_control(text) or not regex.fullmatch(text) or (check and not check(text)):
            raise argparse.ArgumentTypeError(f"{show(text)} is not {what}")
        return text
    return parse


def _text(what: str, limit: int = 255):
    """argparse type: 1..``limit`` characters of one line (no control characters)."""
    return _pattern(re.compile(r".+", re.S), what, limit)


def _path(what: str = "a path", *, no_dash: bool = False):
    """argparse type: a path of 1..:data:`MAX_PATH_CHARS` characters without control
    characters (a newline in a file name given on a command line is an error, not a name);
    with ``no_dash`` also not starting with ``-`` (it is handed to another program)."""
    def parse(text: str) -> str:
        if not text or len(text) > MAX_PATH_CHARS or has_control(text) or (no_dash and text.startswith("-")):
            extra = ", not starting with -" if no_dash else ""
            raise argparse.ArgumentTypeError(
                f"{show(text)} is not {what} (1-{MAX_PATH_CHARS} characters without control characters{extra})")
        return text
    return parse


def _slurm_value(checker: str):
    """argparse type: a value :mod:`builder.launchers.slurm` ``checker`` accepts (the one
    place that knows what a batch script can carry; imported only when the option is given)."""
    def parse(text: str) -> str:
        from builder.launchers import slurm

        try:
            getattr(slurm, checker)(text)
        except EnvbuildError as e:
            raise argparse.ArgumentTypeError(f"{show(text)} {e.message}") from None
        return text
    return parse


def _registry_component(what: str, *, path: bool = False):
    """argparse type: a repository name component (a recipe) or path (``--namespace``) of
    the reference grammar (:data:`builder.oci.reference.COMPONENT`, ``PATH``)."""
    def parse(text: str) -> str:
        from builder.oci import reference

        regex = reference.PATH if path else reference.COMPONENT
        if len(text) > 255 or not regex.fullmatch(text):
            raise argparse.ArgumentTypeError(f"{show(text)} is not {what}")
        return text
    return parse


def _registry_arg(text: str) -> str:
    """argparse type: a registry ``HOST[:PORT]`` (:func:`builder.oci.reference.is_host`)."""
    from builder.oci import reference

    if len(text) > 255 or has_control(text) or not reference.is_host(text):
        raise argparse.ArgumentTypeError(f"{show(text)} is not a registry HOST[:PORT]")
    return text


_suite_arg = _pattern(_SUITE, "a Debian suite name such as bookworm")
_size_arg = _pattern(fields.SHM_SIZE, "a size such as 256m or 1g", limit=20)
_label_arg = _pattern(_LABEL, "a label KEY[=VALUE]", limit=1256)
_env_arg = _pattern(_ENV_ITEM, "NAME=VALUE", limit=4300)
_RECIPE = _path("a recipe name or path")
MAX_NODES = 1024
MAX_TIMEOUT_S = 7 * 24 * 3600


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # argparse exits 2 by default: the table says 64
        raise UsageError(f"{self.prog}: {message}")


def _load_spec(name: str, recipes_dir: str) -> Spec:
    """The recipe ``name`` (or path) checked: schema errors and rule findings together in
    one :class:`~builder.recipe.spec.Spec` (the rules run on the fields that validated).
    Raises what :func:`builder.recipe.load.find` and :func:`builder.recipe.load.parse` raise
    (unreadable file: 3; malformed YAML: 2)."""
    return rules.check(load.parse(load.find(name, recipes_dir)))


def _print_findings(spec: Spec) -> None:
    """Every schema error, then every finding of ``spec``, one escaped line each on stderr
    (schema errors capped as :class:`~builder.core.errors.ManyErrors` caps them)."""
    if spec.schema_errors:
        for line in str(ManyErrors(list(spec.schema_errors))).splitlines():
            level_line("error", line)
    for f in spec.findings:
        level_line(f.level, f.line(spec.path))


def cmd_check(args) -> int:
    """``envbuild check RECIPE``: 0 compatible, 1 warnings only, 2 errors (schema or rules)."""
    spec = _load_spec(args.recipe, args.recipes_dir)
    _print_findings(spec)
    if spec.failed:
        return ExitCode.CHECK_FAILED
    plain_line(f"{inputs.escape(spec.path)}: ok: torch {spec.torch_local}, python {spec.recipe.python}, "
               f"cuda {spec.cuda or 'none'}, nccl {spec.nccl or 'none'}")
    return ExitCode.WARNINGS if spec.warnings else ExitCode.OK


_DRIVER_ARG = _pattern(re.compile(r"[0-9]{1,6}(?:\.[0-9]{1,6}){0,3}"), "a driver version such as 570.124.06", limit=40)
_BUILD_ARG = _pattern(re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,127}=[^\x00]{0,4096}", re.S), "NAME=VALUE", limit=4300)


def cmd_audit(args) -> int:
    """``envbuild audit FILE... [--json] [--to-recipe OUT.yaml] [--driver V] [--build-arg N=V]``:
    audit Dockerfiles and Apptainer/Singularity definitions with the recipe rules
    (:mod:`builder.audit`). 0 clean, 1 warnings, 2 errors, 3 malformed or unreadable (the
    worst file); ``--to-recipe`` refused: 2."""
    from builder.audit import run, torecipe

    if args.to_recipe is not None:
        target = Path(args.to_recipe)
        if len(args.files) != 1:
            raise UsageError("envbuild audit: --to-recipe takes exactly one FILE")
        if target.suffix not in load.SUFFIXES or not (len(target.stem) <= fields.MAX_RECIPE_NAME
                                                       and fields.RECIPE_NAME.fullmatch(target.stem)):
            raise UsageError(f"envbuild audit: --to-recipe: {show(args.to_recipe)} is not a recipe file name "
                             "(<name>.yaml, <name> lower-case [a-z0-9] joined by '.', '_' or '-')")
    build_args = dict(item.split("=", 1) for item in args.build_arg)
    report, done = run.audit(args.files, driver=args.driver, build_args=build_args)
    if args.json:
        sys.stdout.write(report.to_json().decode())
    else:
        for result in report.files:
            for f in result.findings:
                level_line(f.level, f.text())
            if result.stack is not None:
                plain_line(run.summary(result))
    code = report.exit_code
    if args.to_recipe is not None:
        try:
            written = torecipe.write(done[0], args.to_recipe, args.driver)
        except EnvbuildError as e:
            _say(f"error: {escape(str(e), 1000)}")
            return max(code, int(e.exit_code))
        _say(f"wrote {escape(str(written), 1000)}: check it with `envbuild check {escape(str(written), 1000)}`")
    return code


def _render(args, spec: Spec) -> int:
    from builder.render import rendered as render
    from builder.render import write as render_write

    rendered = render.render_for(rules.require_ok(spec), args.images_dir)
    if getattr(args, "check_only", False):
        stale = render_write.stale(rendered, args.images_dir)
        if stale:
            for name in stale:
                path = image_dir(args.images_dir, spec.name).file(name)
                console.print(f"{path}: stale; run `envbuild render {spec.name}`", soft_wrap=True, markup=False)
            return ExitCode.CHECK_FAILED
        out.print(f"{image_dir(args.images_dir, spec.name).folder}: up to date", markup=False)
        return ExitCode.OK
    where, written = render_write.write(rendered, args.images_dir)
    for name in rendered.files:
        out.print(f"{'wrote' if name in written else 'up to date'} {where / name}", markup=False)
    return ExitCode.OK


def cmd_render(args) -> int:
    """``envbuild render RECIPE [--check]``: write (or check for drift) the rendered files.
    A recipe with errors is reported (schema errors and rule errors together) and not rendered."""
    if args.all == (args.recipe is not None):
        raise UsageError("envbuild render: give either a RECIPE or --all")
    names = (sorted({p.stem for s in load.SUFFIXES for p in Path(args.recipes_dir).glob(f"*{s}")})
             if args.all else [args.recipe])
    if not names:
        raise EnvbuildError("no recipes (*.yaml) here", file=str(args.recipes_dir))
    worst = ExitCode.OK
    for name in names:
        spec = _load_spec(name, args.recipes_dir)
        if spec.failed:
            rules.require_ok(spec)  # raises every schema and rule error, one line each
        _print_findings(spec)
        worst = max(worst, _render(args, spec), ExitCode.WARNINGS if spec.warnings else ExitCode.OK)
    return worst


def _site(args):
    from builder.image.site import SiteOptions

    # pip's configuration is read only when a build runs (a no-change build does not need it)
    return SiteOptions.detect(ca_cert=args.ca_cert, wheels=args.wheels, base=args.base, no_detect=args.no_site_detect,
                              deferred=True)


def _build(args, spec: Spec):
    from builder.image import build

    options = build.BuildOptions(recipe=spec.name, images_dir=Path(args.images_dir), site=_site(args),
                                 base_mode=args.base_mode)
    result = build.build(options, console=console)
    for note in result.notes:
        console.print(f"note: {note}", markup=False, soft_wrap=True)
    verb = "reused" if result.reused else "built"
    how = " (recorded for this image ID)" if result.probe_cached else ""
    out.print(f"{verb} {result.tag} ({result.image_id[:19]}); base {result.base_used}; probe matches the lock{how}",
              soft_wrap=True)
    return result


def cmd_build(args) -> int:
    """``envbuild build RECIPE``: build the rendered Dockerfile, then check the probe against the lock."""
    from builder.render import rendered as render
    from builder.render import write as render_write

    spec = rules.require_ok(_load_spec(args.recipe, args.recipes_dir))
    rendered = render.render_for(spec, args.images_dir)
    stale = render_write.stale(rendered, args.images_dir)
    if stale:
        raise EnvbuildError(f"rendered files are stale ({', '.join(stale)}); run `envbuild render {spec.name}`",
                            file=str(image_dir(args.images_dir, spec.name).folder))
    _build(args, spec)
    return ExitCode.OK


#: Slurm options of certify/make: (attribute, flag); each needs ``--launcher slurm``.
_SLURM_FLAGS = (("partition", "--partition"), ("time_limit", "--time-limit"),
                ("container_runtime", "--container-runtime"), ("container_image", "--container-image"),
                ("slurm_dir", "--slurm-dir"), ("slurm_nodes", "--slurm-nodes"), ("sbatch_arg", "--sbatch-arg"),
                ("pending_timeout", "--pending-timeout"))


def _slurm_options(args):
    """The :class:`~builder.launchers.slurm.SlurmOptions` of ``--launcher slurm`` (each value
    checked whole by slurm.py).

    Raises:
        EnvbuildError: (exit 64) a value the batch script cannot carry.
    """
    from builder.launchers import slurm

    return slurm.SlurmOptions(
        runtime=args.container_runtime or slurm.DEFAULT_RUNTIME, partition=args.partition,
        time_limit=args.time_limit, slurm_nodes=args.slurm_nodes, container_image=args.container_image,
        sbatch_args=tuple(args.sbatch_arg or ()), socket_ifname=args.socket_ifname,
        pending_timeout_s=slurm.DEFAULT_PENDING_TIMEOUT_S if args.pending_timeout is None else args.pending_timeout)


def _check_launcher_args(args) -> None:
    """The launcher options of certify/make, before the engine is contacted: Slurm options
    only with ``--launcher slurm``; their values (:func:`_slurm_options`); ``--slurm-nodes``
    against ``--nodes`` when both are given; the run folder's path (``--slurm-dir``, else
    the absolute ``--images-dir`` it goes under).

    Raises:
        UsageError, EnvbuildError: (exit 64).
    """
    kind = getattr(args, "launcher", None) or "local"
    given = [flag for attr, flag in _SLURM_FLAGS if getattr(args, attr, None) not in (None, [])]
    if kind != "slurm" and given:
        raise UsageError(f"envbuild {args.command}: {', '.join(given)} go(es) with --launcher slurm")
    if kind != "slurm":
        return
    from builder.launchers import slurm

    _slurm_options(args)
    if args.slurm_nodes is not None and getattr(args, "nodes", None) is not None:
        slurm.check_slurm_nodes(args.slurm_nodes, args.nodes)
    slurm.check_slurm_dir(os.path.abspath(args.slurm_dir or args.images_dir))


def _overrides(args):
    """The :class:`~builder.certify.settings.Overrides` of the certification options."""
    from builder.certify.settings import Overrides

    return Overrides(nodes=args.nodes, gpus_per_node=args.gpus_per_node, backend=args.backend, port=args.port,
                     timeout_s=args.timeout, min_busbw_gbps=args.min_busbw, socket_ifname=args.socket_ifname)


def _launcher(args, client, recipe_name: str):
    """The launcher of ``--launcher``: None for local (certify's default, on the image's
    engine); a :class:`~builder.launchers.slurm.SlurmLauncher` whose run folder goes under
    ``--slurm-dir`` (default ``images/<recipe>/certificates/``); the Kubernetes launcher
    with its default options (``envbuild k8s render --apply`` has all of them). The
    arguments were checked by :func:`_check_launcher_args` (again here: cheap, local)."""
    _check_launcher_args(args)
    kind = getattr(args, "launcher", None) or "local"
    if kind == "local":
        return None
    if kind == "k8s":
        from builder.launchers.k8s.launcher import K8sLauncher
        from builder.launchers.k8s.options import K8sOptions

        return K8sLauncher(K8sOptions())
    from builder.launchers import slurm

    base = Path(args.slurm_dir) if args.slurm_dir else slurm.default_slurm_dir(args.images_dir, recipe_name)
    return slurm.SlurmLauncher(base, _slurm_options(args), client=client)


def _certify(args, image: str) -> int:
    """Certify ``image`` as the options say; print the verdict (also when the certificate
    cannot be written: then exit 3 after it, naming the file)."""
    from builder.certify import certificate, run, table
    from builder.certify.source import EngineImage
    from builder.image import engine

    _check_launcher_args(args)
    client = engine.connect()
    kind = getattr(args, "launcher", None) or "local"
    # on a cluster the nodes have the GPUs, not this host's engine: the scheduler decides
    p = run.plan(EngineImage(client, image), _overrides(args), gpu_visible=True if kind != "local" else None)
    launcher = _launcher(args, client, p.image.labels.get("envbuild.recipe") or p.image.lock.get("recipe") or "unknown")
    try:
        cert, path = run.run(p, images_dir=Path(args.images_dir), console=console, launcher=launcher)
    except certificate.CertificateNotWritten as e:
        table.print_table(e.certificate, out, written=False)
        raise
    table.print_table(cert, out, path=path)
    if getattr(launcher, "job_id", None):
        out.print(f"slurm: job {launcher.job_id}; script, logs and results in {launcher.folder}",
                  markup=False, soft_wrap=True)
    out.print(f"certificate: {path}", markup=False, soft_wrap=True)
    return ExitCode.OK if cert.verdict.passed else ExitCode(cert.verdict.exit_code)


def cmd_certify(args) -> int:
    """``envbuild certify IMAGE``: run the probe and benchmarks on N container nodes; write a certificate."""
    return _certify(args, args.image)


def cmd_make(args) -> int:
    """``envbuild make [RECIPE]``: check -> render -> build -> certify, stopping at the first failure."""
    _check_launcher_args(args)
    spec = _load_spec(args.recipe, args.recipes_dir)
    _print_findings(spec)
    if spec.failed:
        return ExitCode.CHECK_FAILED  # every error is printed above
    _render(argparse.Namespace(images_dir=args.images_dir, check_only=False), spec)
    result = _build(args, spec)
    return _certify(args, result.tag)


def cmd_probe(args) -> int:
    """``envbuild probe``: print this host's node report (the in-image probe, run on the host)."""
    from builder.agent import probe

    out.print_json(json.dumps(probe.collect()))
    return ExitCode.OK


def _node_sources(args, allow_empty: bool = False):
    """The node sources of ``verify``/``doctor``, every value checked (exit 64) before
    anything is contacted (:meth:`builder.nodes.sources.Sources.check`)."""
    from builder.nodes.sources import Sources

    src = Sources(files=args.reports, images=args.image, containers=args.container, labels=args.label,
                  nodes=args.nodes, hosts=[h for item in args.hosts for h in item],
                  ssh_config=args.ssh_config, ssh_options=args.ssh_option,
                  connect_timeout_s=args.connect_timeout, slurm=args.slurm, partition=args.partition,
                  srun_args=args.srun_arg, timeout_s=args.node_timeout, python=args.python)
    if src.empty and not allow_empty:
        raise UsageError(f"envbuild {args.command}: give report files, --image/--container/--label, --hosts or --slurm")
    if args.nodes is not None and not (src.uses_containers or src.slurm):
        raise UsageError(f"envbuild {args.command}: --nodes goes with --image/--container/--label or --slurm")
    try:
        return src.check()
    except EnvbuildError as e:
        raise UsageError(f"envbuild {args.command}: {e}") from None


def cmd_verify(args) -> int:
    """``envbuild verify``: gather node reports and compare them; 0 match, 1 warnings, 2 differ, 3 not checked."""
    from builder.nodes import sources
    from builder.nodes import verify

    result = verify.verify(sources.gather(_node_sources(args)))
    if args.json:
        sys.stdout.write(json.dumps(result.to_dict(), indent=2) + "\n")
    else:
        verify.render(result, out)
    return result.exit_code


def cmd_doctor(args) -> int:
    """``envbuild doctor``: preflight checks on the nodes; worst of pass/skip 0, warn 1, fail 2, unknown 3
    (also 3 when nothing could be checked). Usage errors (64) come before anything is contacted."""
    from builder.nodes import doctor
    from builder.nodes import sources
    from builder.core.inputs import escape

    checks = tuple(c.strip() for c in args.checks.split(",") if c.strip()) if args.checks else doctor.ALL_CHECKS
    unknown = [c for c in checks if c not in doctor.ALL_CHECKS]
    if unknown:
        raise UsageError(f"envbuild doctor: --checks: unknown {', '.join(escape(c, 60) for c in unknown[:5])}; "
                         f"choose from {', '.join(doctor.ALL_CHECKS)}")
    try:
        min_shm = doctor.parse_size(args.min_shm)
        labels = tuple(sources.check_label(label) for label in args.stale_label)
    except EnvbuildError as e:
        raise UsageError(f"envbuild doctor: {e}") from None
    opts = doctor.Options(checks=checks, port=args.port, master=args.master, connect_timeout_s=args.connect_timeout,
                          min_shm_bytes=min_shm, straggler_ratio=args.straggler_ratio,
                          backend=args.backend, fix=args.fix, stale_after_s=args.stale_after, labels=labels)
    # without nodes only stale-containers can check anything: asking for nothing else is a usage error
    src = _node_sources(args, allow_empty="stale-containers" in checks)
    result = doctor.doctor([] if src.empty else sources.gather(src), opts)
    if args.json:
        sys.stdout.write(json.dumps(result.to_json(), indent=2) + "\n")
    else:
        doctor.render(result, out)
    return result.exit_code


def cmd_base(args) -> int:
    """``envbuild base bootstrap``: make a local Debian base image with debootstrap (air-gapped sites)."""
    from builder.image import bootstrap
    from builder.image import engine

    client = engine.connect()
    ref = bootstrap.bootstrap_debian(client, suite=args.suite, stands_for=args.stands_for)
    out.print(f"base image {ref} (stands in for {args.stands_for})")
    return ExitCode.OK


def _registry_opts(args) -> dict:
    return {"plain_http": True if args.plain_http else None, "ca_cert": args.registry_ca}


#: Input files of the command line: (attribute, option, what, byte limit). Each is read
#: (bounded, regular files only) before anything is contacted; one that cannot be is exit 3.
_INPUT_FILES = (("sign_key", "--sign-key", "signing key", 1 << 20),
                ("verify_key", "--verify-key", "public key", 1 << 20),
                ("registry_ca", "--registry-ca", "CA bundle", MAX_CA_BYTES),
                ("ca_cert", "--ca-cert", "CA bundle", MAX_CA_BYTES))


def _check_input_files(args) -> None:
    """Every input file option given can be read (:func:`builder.core.inputs.read_regular`):
    missing, not a regular file (a FIFO, ``/dev/zero``, a directory) or too large is
    :class:`Unreachable` (exit 3) naming the file; ``--wheels`` must be a directory.

    Raises:
        Unreachable: (exit 3).
    """
    from builder.core.inputs import read_regular

    for attr, flag, what, limit in _INPUT_FILES:
        path = getattr(args, attr, None)
        if path is not None:
            read_regular(path, limit, f"{what} ({flag})")
    wheels = getattr(args, "wheels", None)
    if wheels is not None and not os.path.isdir(wheels):
        raise Unreachable("no such folder (--wheels)" if not os.path.exists(wheels)
                          else "is not a folder (--wheels)", file=wheels)


def _check_args(args) -> None:
    """Every check of the command line that needs nothing outside this process, run after
    parsing and before the command contacts the engine, a registry or Slurm: option
    combinations and values (exit 64), then the input files (exit 3).

    Raises:
        UsageError, EnvbuildError: (exit 64); Unreachable: (exit 3) an unreadable input file.
    """
    if args.command in ("certify", "make"):
        _check_launcher_args(args)
    if args.command == "pull":
        if args.format != "sif":
            given = [flag for flag, value in (("--output", args.output), ("--print-only", args.print_only)) if value]
            if given:
                raise UsageError(f"envbuild pull: {', '.join(given)} go(es) with --format sif")
        from builder.publish import naming

        naming.parse_target(args.target, args.registry, args.namespace)
    if args.command == "k8s" and getattr(args, "run_id", None):
        from builder.launchers.k8s.naming import check_run_id

        check_run_id(args.run_id)
    _check_input_files(args)


def cmd_push(args) -> int:
    """``envbuild push RECIPE --registry HOST[:PORT]``: publish the certified image and its
    certificate (an in-toto attestation referring to the image); 2 refused, 3 unreachable."""
    import os

    from builder.image import engine
    from builder.publish import attest, push

    key_path = args.sign_key or os.environ.get(attest.ENV_SIGN_KEY)
    key = attest.load_private_key(key_path) if key_path else None
    client = engine.connect()
    result = push.push(client, args.recipe, args.registry, images_dir=args.images_dir, image=args.image,
                           namespace=args.namespace, sign_key=key, fs_hash=not args.no_fs_hash,
                           on_progress=lambda m: console.print(m, markup=False, soft_wrap=True),
                           **_registry_opts(args))
    for w in result.warnings:
        console.print(f"warning: {w}", style="yellow", markup=False, soft_wrap=True)
    out.print(f"pushed {result.repository}@{result.digest}", markup=False, soft_wrap=True)
    out.print(f"  tags: {', '.join(result.tags)}; image {result.image_id}", markup=False, soft_wrap=True)
    out.print(f"  certificate {result.certificate_path} -> attestation {result.attestation} "
              f"({'signed by ' + result.signed_by if result.signed_by else 'unsigned'}; found by {result.referrers})",
              markup=False, soft_wrap=True)
    if result.filesystem:
        out.print(f"  filesystem content {result.filesystem['method']} sha256:{result.filesystem['sha256']}",
                  markup=False, soft_wrap=True)
    return ExitCode.WARNINGS if result.warnings else ExitCode.OK


def cmd_pull(args) -> int:
    """``envbuild pull RECIPE|REF --registry HOST``: pull the certified image by digest after
    checking its certificate and this node; 2 refused, 3 unreachable."""
    import os

    from builder.image import engine
    from builder.publish import attest, pull

    key_path = args.verify_key or os.environ.get(attest.ENV_VERIFY_KEY)
    key = attest.load_public_key(key_path) if key_path else None
    client = engine.connect() if args.format == "docker" else None
    result = pull.pull(client, args.target, args.registry, namespace=args.namespace, public_key=key,
                           key_name=str(key_path) if key_path else "the key",
                           allow_uncertified_hw=args.allow_uncertified_hw, fmt=args.format,
                           sif_output=args.output, run_apptainer=not args.print_only,
                           on_progress=lambda m: console.print(m, markup=False, soft_wrap=True),
                           **_registry_opts(args))
    att = result.attestation
    cert = att.certificate
    for w in result.warnings:
        console.print(f"warning: uncertified hardware: {w}", style="yellow", markup=False, soft_wrap=True)
    sig = (f"signature verified ({att.signer})" if att.signer else
           "signed, signature not checked (no public key configured)" if att.signed else "unsigned")
    out.print(f"certified {result.reference}: recipe {cert.get('recipe')}, lock {cert.get('lock_hash')}, "
              f"verdict passed at {cert.get('finished_at')}; {sig}; certificate {att.manifest} ({att.found_by})",
              markup=False, soft_wrap=True)
    if result.sif_command is not None:
        command = " ".join(result.sif_command)
        out.print(f"ran: {command}" if result.sif_ran else command, markup=False, soft_wrap=True)
    else:
        out.print(f"pulled {result.reference} as {', '.join(result.local_tags)} (image {result.image_id})",
                  markup=False, soft_wrap=True)
    return ExitCode.WARNINGS if result.warnings else ExitCode.OK


def cmd_lock(args) -> int:
    """``envbuild lock RECIPE``: resolve the base digest, pip hashes and apt versions into
    ``images/RECIPE/envbuild.resolved.json`` and render again; 1 when something stayed open."""
    from builder.image import engine
    from builder.oci.client import RegistryClient
    from builder.resolve import lock

    spec = rules.require_ok(_load_spec(args.recipe, args.recipes_dir))
    client = None
    if not (args.no_base and args.no_apt):
        try:
            client = engine.connect()
        except EnvbuildError as e:
            console.print(f"warning: {e}", style="yellow", markup=False, soft_wrap=True)
    result = lock.lock(spec, args.images_dir, _site(args), client, base=not args.no_base, pip=not args.no_pip,
                       apt=not args.no_apt, base_mode=args.base_mode, registry=RegistryClient,
                       say=lambda m: console.print(m, markup=False, soft_wrap=True))
    doc = result.resolved
    out.print(f"wrote {result.path}", markup=False)
    for path in result.written:
        out.print(f"wrote {path}", markup=False)
    out.print(f"  base {doc.base.ref} -> {doc.base.digest or 'unresolved'}; "
              f"pip {len(doc.pip)} package(s) with hashes; apt {len(doc.apt)} pin(s)", markup=False, soft_wrap=True)
    for note in result.unresolved:
        console.print(f"warning: {note}", style="yellow", markup=False, soft_wrap=True)
    return ExitCode.WARNINGS if result.unresolved else ExitCode.OK


def _k8s_source(args):
    """``(image ref, lock, labels, image id, image env)`` of ``envbuild k8s render``: a
    recipe name (its ``images/<recipe>/envbuild.lock.json``, the image from ``--image``;
    the environment is the recipe's ``env``) or an image on this engine (its labels and
    config ``Env``). Usage errors come before the engine is contacted."""
    import re

    from builder.launchers.k8s import naming, source

    name = args.source
    if re.fullmatch(r"[a-z0-9][a-z0-9._-]*", name) and image_dir(args.images_dir, name).lock.is_file():
        if not args.image:
            raise UsageError(f"envbuild k8s render: recipe {name} needs --image REPO@sha256:DIGEST (the image the pods run)")
        ref = naming.require_digest(args.image, args.allow_tag)
        lock, labels = source.lock_from_file(args.images_dir, name)
        env = lock.get("env") if isinstance(lock.get("env"), dict) else {}
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


def _k8s_options(args):
    """The K8sOptions of the command line, checked (exit 64) before anything is contacted."""
    from builder.launchers.k8s.naming import check_run_id
    from builder.launchers.k8s.options import K8sOptions, check_options

    if args.apply and args.kubeflow:
        raise UsageError("envbuild k8s render: --apply runs the Indexed Job; apply a TrainJob with kubectl apply -f DIR")
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


def cmd_k8s_render(args) -> int:
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
        console.print(f"warning: {w}", soft_wrap=True, markup=False)
    annotations = {k: labels[k] for k in ("envbuild.lock-hash",) if labels.get(k)}
    opts = dataclasses.replace(opts, annotations=annotations)
    for path in write_manifests(render_manifests(p.spec, opts), args.out):
        out.print(f"wrote {path}", markup=False, highlight=False, soft_wrap=True)
    if not args.apply:
        out.print(f"run {p.spec.run_id}: apply with `kubectl apply -f {args.out}`", markup=False, highlight=False,
                  soft_wrap=True)
        return ExitCode.OK
    launcher = K8sLauncher(opts, kubeconfig=args.kubeconfig or find_kubeconfig(manifests=str(args.out)),
                           context=args.context, namespace=args.namespace)
    try:
        cert, path = run.run(p, images_dir=Path(args.images_dir), console=console, launcher=launcher,
                             host={"launcher": "k8s", "namespace": launcher.api.namespace})
    except certificate.CertificateNotWritten as e:
        table.print_table(e.certificate, out, written=False)
        raise
    table.print_table(cert, out, path=path)
    out.print(f"certificate: {path}", markup=False, highlight=False, soft_wrap=True)
    return ExitCode.OK if cert.verdict.passed else ExitCode(cert.verdict.exit_code)


def _add_k8s(sub) -> None:
    k = sub.add_parser("k8s", help="Kubernetes: render (and --apply) the manifests that certify an image on a cluster")
    ksub = k.add_subparsers(dest="k8s_command", required=True, parser_class=_Parser)
    r = ksub.add_parser("render", help="write an Indexed Job + headless Service (or a Kubeflow TrainJob) to --out")
    r.add_argument("source", metavar="IMAGE_OR_RECIPE", type=_text("an image or recipe name", 1000),
                   help="an image on this engine (REPO@sha256:...; settings from its labels) or a recipe name "
                        "(settings from images/RECIPE/envbuild.lock.json; needs --image)")
    r.add_argument("--out", required=True, metavar="DIR", type=_path("a folder"), help="folder for the manifests (created)")
    r.add_argument("--image", metavar="REPO@sha256:DIGEST", type=_image_ref, help="with a recipe name: the image the pods run, by digest")
    r.add_argument("--allow-tag", action="store_true", help="accept an image reference without digest (development clusters)")
    r.add_argument("--kubeflow", action="store_true",
                   help="render a Kubeflow Trainer v2 TrainJob (trainer.kubeflow.org/v1alpha1) instead of Job + Service")
    r.add_argument("--runtime", default="torch-distributed",
                   type=_pattern(_K8S_SUBDOMAIN, "a Kubernetes object name (RFC 1123 subdomain)", 253), help="the TrainJob's ClusterTrainingRuntime (default torch-distributed)")
    r.add_argument("--run-id", metavar="ID", type=_text("a run id", 40), help="names the objects envbuild-ID (default: random); fixes the output")
    r.add_argument("--ttl", type=_int_in(0, 2**31 - 1), default=3600, metavar="S", help="ttlSecondsAfterFinished of the Job (default 3600)")
    r.add_argument("--spread", choices=("preferred", "required", "none"), default="preferred",
                   help="pod anti-affinity on kubernetes.io/hostname (default preferred; required: one node per host)")
    r.add_argument("--ifname", dest="socket_ifname", type=_socket_ifname_arg, help=argparse.SUPPRESS)  # old name of --socket-ifname
    r.add_argument("--env", action="append", default=[], metavar="NAME=VALUE", type=_env_arg, help="extra environment of every pod (repeatable)")
    r.add_argument("--apply", action="store_true",
                   help="create the objects with the kubernetes client, wait, collect the results from the pod logs, "
                        "delete everything and write the certificate")
    r.add_argument("--kubeconfig", metavar="FILE", type=_path("a file"), help="default: $KUBECONFIG, ~/.kube/config, or in-cluster")
    r.add_argument("--context", type=_text("a kubeconfig context"), help="kubeconfig context (default: the current one)")
    r.add_argument("--namespace", type=_pattern(_K8S_LABEL, "a Kubernetes namespace (RFC 1123 label)", 63),
                   help="default: the context's namespace, else default")
    _add_certify(r)
    r.set_defaults(func=cmd_k8s_render)


def _add_registry(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("registry (credentials come from your Docker config: docker login HOST)")
    g.add_argument("--namespace", default="envbuild", type=_registry_component("a repository path", path=True), help="repository prefix: HOST/NAMESPACE/RECIPE (default: envbuild)")
    g.add_argument("--plain-http", action="store_true", help="plain HTTP (default: HTTPS; loopback registries fall back to HTTP)")
    g.add_argument("--registry-ca", metavar="FILE", type=_path("a file"), help="CA bundle of the registry's TLS certificate")


def _add_site(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("site options (enter at build time; the rendered files do not change)")
    g.add_argument("--ca-cert", metavar="FILE", type=_path("a file"), help="CA bundle handed to pip in the build (default: from pip's configuration)")
    g.add_argument("--wheels", metavar="DIR", type=_path("a folder"), help="local wheel folder for pip --find-links (default: from pip's configuration)")
    g.add_argument("--base", metavar="IMAGE", type=_image_ref, help="base image override (e.g. a site mirror)")
    g.add_argument("--base-mode", choices=("auto", "pull", "bootstrap", "local"), default="auto",
                   help="auto: use the base if present or pullable, else bootstrap a Debian base locally (default)")
    g.add_argument("--no-site-detect", action="store_true", help="do not read pip's configuration")


def _socket_ifname_arg(text: str) -> str:
    """argparse type of ``--socket-ifname`` (:func:`builder.launchers.base.check_socket_ifname`)."""
    from builder.launchers.base import check_socket_ifname

    try:
        return check_socket_ifname(text)
    except EnvbuildError as e:
        raise argparse.ArgumentTypeError(f"{show(text)} {e.message}") from None


def _add_certify(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("certification (defaults from the image's envbuild.* labels)")
    g.add_argument("--nodes", type=_int_in(1, MAX_NODES), help="simulated nodes (containers); default from the recipe (2)")
    g.add_argument("--gpus-per-node", type=_int_in(0, 64), help="GPUs per node container (0 on CPU)")
    g.add_argument("--backend", choices=("gloo", "nccl"), help="override the recipe's backend (recorded in the certificate)")
    g.add_argument("--port", type=_int_in(1, 65535), help="rendezvous port on the first node (default 29500)")
    g.add_argument("--timeout", type=_int_in(1, MAX_TIMEOUT_S), help="seconds before hung ranks are killed")
    g.add_argument("--min-busbw", type=_float_in(0, 1e6, lo_open=True), metavar="GBPS", help="busbw floor in GB/s at the gate size; gates also on gloo")
    g.add_argument("--socket-ifname", metavar="IF", type=_socket_ifname_arg,
                   help="set GLOO_SOCKET_IFNAME and NCCL_SOCKET_IFNAME on every node (NCCL syntax: "
                        "eth0, ^lo,docker, =ib0); default: the image's own settings, else unset "
                        "(the libraries choose); the certificate records which was used")


def _add_launcher(p: argparse.ArgumentParser) -> None:
    p.add_argument("--launcher", choices=("local", "slurm", "k8s"), default="local",
                   help="where the ranks run: local (containers on this Docker engine; default), slurm "
                        "(one sbatch job), k8s (an Indexed Job; more options: envbuild k8s render --apply)")
    g = p.add_argument_group("Slurm (--launcher slurm; README: Running on a cluster)")
    g.add_argument("--partition", metavar="P", type=_slurm_value("check_partition"), help="sbatch --partition (default: the cluster's default)")
    g.add_argument("--time-limit", metavar="TIME", type=_slurm_value("parse_time_limit"), help="sbatch --time, e.g. 10 (minutes) or 1:00:00 "
                   "(default: --timeout rounded up to minutes)")
    g.add_argument("--container-runtime", choices=("docker", "pyxis", "apptainer"),
                   help="how each node runs the image: docker run (default: the image is in each node's engine), "
                        "pyxis (srun --container-image), apptainer (apptainer exec)")
    g.add_argument("--container-image", metavar="REF", type=_slurm_value("check_container_image"), help="what the nodes run (default: IMAGE; apptainer: "
                   "docker-daemon:IMAGE); pyxis: an enroot URI or a .sqsh path, apptainer: a .sif path")
    g.add_argument("--slurm-dir", metavar="DIR", type=_path("a folder"), help="run folders go to DIR/slurm-<run>/ (script, logs, results; "
                   "on a filesystem every node sees); default images/RECIPE/certificates")
    g.add_argument("--slurm-nodes", type=_int_in(1, MAX_NODES), metavar="M", help="Slurm nodes the --nodes envbuild nodes share "
                   "(default: one each; 1 runs them all on one machine)")
    g.add_argument("--sbatch-arg", action="append", metavar="ARG", type=_slurm_value("check_sbatch_arg"),
                   help="extra #SBATCH option, e.g. --account=X (repeatable; README lists those passed on)")
    g.add_argument("--pending-timeout", type=_float_in(0, MAX_TIMEOUT_S, lo_open=True), metavar="S", help="seconds the job may wait in the queue (default 600)")


def _add_node_sources(p: argparse.ArgumentParser) -> None:
    from builder.core.inputs import show

    def checked(name: str, split: bool = False, *extra: str):
        """argparse type: the :mod:`builder.nodes.sources` validator ``name`` (imported when a
        value is parsed: building the parser imports nothing of it) on the value, or on each
        item of a comma list (``split``); ``extra``: further arguments of the validator; a
        refused value is a usage error (exit 64)."""
        def parse(text: str):
            from builder.nodes import sources

            check = getattr(sources, name)
            try:
                return [check(h, *extra) for h in text.split(",") if h] if split else check(text, *extra)
            except EnvbuildError as e:
                raise argparse.ArgumentTypeError(f"{show(e.value)} {e.message}") from None
        return parse

    p.add_argument("reports", nargs="*", metavar="REPORT", help="node report files (envbuild probe --host > node.json)")
    g = p.add_argument_group("nodes (any mix of sources)")
    g.add_argument("--image", action="append", default=[], metavar="IMAGE", type=_image_ref, help="running containers of IMAGE on this engine (repeatable)")
    g.add_argument("--container", action="append", default=[], metavar="NAME", type=checked("check_container"),
                   help="this running container (repeatable)")
    g.add_argument("--label", action="append", default=[], metavar="KEY[=VALUE]", type=checked("check_label"),
                   help="running containers with this label (repeatable; with --image: all must match)")
    g.add_argument("--nodes", type=_int_in(1, MAX_NODES), metavar="N", help="containers: exactly N must run; --slurm: srun --nodes=N")
    g.add_argument("--hosts", action="append", default=[], metavar="A,B,C", type=checked("check_host", True),
                   help="hosts over ssh, [user@]host[:port]")
    g.add_argument("--ssh-config", metavar="FILE", type=checked("check_path", False, "--ssh-config"),
                   help="ssh -F FILE")
    g.add_argument("--ssh-option", action="append", default=[], metavar="KEY=VALUE", type=checked("check_ssh_option"),
                   help="ssh -o KEY=VALUE (repeatable; connection, authentication and host-key keys only)")
    g.add_argument("--connect-timeout", type=_int_in(1, 3600), default=5, metavar="S", help="ssh ConnectTimeout; doctor: TCP connect limit (default 5)")
    g.add_argument("--slurm", action="store_true", help="one srun --ntasks-per-node=1 step gathers every node")
    g.add_argument("--partition", metavar="P", type=checked("check_partition"), help="srun --partition")
    g.add_argument("--srun-arg", action="append", default=[], metavar="--NAME[=VALUE]", type=checked("check_srun_arg"),
                   help="extra srun option (repeatable; resources, placement and accounting options only)")
    g.add_argument("--timeout", dest="node_timeout", type=_float_in(0, 86400, lo_open=True), default=120, metavar="S", help="seconds per node (default 120)")
    g.add_argument("--python", default="python3", type=checked("check_python"),
                   help="interpreter on the nodes, a name or path (default python3)")
    p.add_argument("--json", action="store_true", help="print the result as JSON (for machines)")


def _add_doctor(sub) -> None:
    """``envbuild doctor``: the node sources and the preflight options."""
    do = sub.add_parser("doctor", help="preflight checks: ports, interfaces, shm, GPUs, stale containers, stragglers")
    _add_node_sources(do)
    do.add_argument("--checks", metavar="A,B", type=_text("a list of checks", 1000), help="run only these checks: nodes, port, interface, shm, gpu-uuid, "
                    "gpu-processes, stale-containers, straggler (default all)")
    do.add_argument("--port", type=_int_in(1, 65535), default=29500, help="rendezvous port checked on the master (default 29500)")
    do.add_argument("--master", metavar="NODE", type=_text("a node name"), help="the master node (default: the first node)")
    do.add_argument("--backend", choices=("gloo", "nccl"), help="default: nccl when every node has GPUs, else gloo")
    do.add_argument("--min-shm", default="256m", metavar="SIZE", type=_size_arg, help="smallest /dev/shm accepted (default 256m)")
    do.add_argument("--straggler-ratio", type=_float_in(1, 100, lo_open=True), default=1.5, metavar="R",
                    help="a node slower than R x the median is a straggler (default 1.5)")
    do.add_argument("--fix", action="store_true", help="remove stale envbuild containers (nothing else)")
    do.add_argument("--stale-after", type=_float_in(0, 365 * 86400), default=3600, metavar="S",
                    help="a running envbuild container older than S seconds is stale (default 3600; 0: every "
                         "running one, including a certification in progress)")
    do.add_argument("--stale-label", action="append", default=[], metavar="KEY[=VALUE]", type=_label_arg,
                    help="look for stale containers only among those with this label too (repeatable)")
    do.set_defaults(func=cmd_doctor)


def _add_publish(sub) -> None:
    """``envbuild push`` and ``envbuild pull``."""
    pu = sub.add_parser("push", help="publish a certified image and its certificate to a registry, by digest")
    pu.add_argument("recipe", type=_registry_component("a recipe name (lower-case letters, digits, ._-)"))
    pu.add_argument("--registry", required=True, metavar="HOST[:PORT]", type=_registry_arg, help="the registry")
    pu.add_argument("--image", metavar="REF", type=_image_ref, help="the local image (default: the newest certified one of RECIPE)")
    pu.add_argument("--sign-key", metavar="FILE", type=_path("a file"), help="sign the certificate (DSSE) with this PEM private key "
                    "(Ed25519 or ECDSA; default: $ENVBUILD_SIGN_KEY)")
    pu.add_argument("--no-fs-hash", action="store_true", help="do not record the filesystem content hash")
    _add_registry(pu)
    pu.set_defaults(func=cmd_push)

    pl = sub.add_parser("pull", help="pull a certified image by digest after checking its certificate and this node")
    pl.add_argument("target", metavar="RECIPE|REF", type=_text("a recipe name or image reference", 1000), help="recipe name (HOST/NAMESPACE/RECIPE:certified) or image reference")
    pl.add_argument("--registry", metavar="HOST[:PORT]", type=_registry_arg, help="the registry (unless REF names one)")
    pl.add_argument("--verify-key", metavar="FILE", type=_path("a file"), help="require a certificate signed by this PEM public key "
                    "(default: $ENVBUILD_VERIFY_KEY)")
    pl.add_argument("--allow-uncertified-hw", action="store_true",
                    help="driver or GPUs the certificate does not cover: warn (exit 1) instead of refusing")
    pl.add_argument("--format", choices=("docker", "sif"), default="docker",
                    help="docker: pull into the engine (default); sif: apptainer pull by digest")
    pl.add_argument("--output", metavar="FILE", type=_path("a file name", no_dash=True), help="SIF file for --format sif (default RECIPE_LOCK.sif)")
    pl.add_argument("--print-only", action="store_true", help="--format sif: print the command, do not run it")
    _add_registry(pl)
    pl.set_defaults(func=cmd_pull)


def _top_parser() -> tuple[argparse.ArgumentParser, argparse._SubParsersAction]:
    """The ``envbuild`` parser with its global options, and its (empty) subcommand action."""
    p = _Parser(prog="envbuild", description="Reproducible, certified PyTorch images for multi-node clusters.")
    p.add_argument("--recipes-dir", default="recipes", type=_path("a folder"), help="where recipes live (default: recipes)")
    p.add_argument("--images-dir", default="images", type=_path("a folder"), help="where rendered files and certificates go (default: images)")
    return p, p.add_subparsers(dest="command", required=True, parser_class=_Parser)


def _add_check(sub) -> None:
    c = sub.add_parser("check", help="validate a recipe and its version compatibility (offline)")
    c.add_argument("recipe", type=_RECIPE, help="a name under --recipes-dir or a path to a YAML file")
    c.set_defaults(func=cmd_check)


def check_parser() -> argparse.ArgumentParser:
    """The parser of ``envbuild [GLOBAL OPTIONS] check RECIPE`` alone: the same global options
    and ``check`` subcommand as :func:`parser`, without building the other commands' options
    (~20-30 ms: ``envbuild check`` starts within 3x of ``python -c "import yaml"``, issue 13)."""
    p, sub = _top_parser()
    _add_check(sub)
    return p


def _is_check(argv: list[str] | None) -> bool:
    """Whether ``argv`` (default ``sys.argv[1:]``) names the ``check`` command: its first word
    that is neither a global option nor its value is ``check`` (no ``-h`` before it)."""
    words = list(sys.argv[1:] if argv is None else argv)
    i = 0
    while i < len(words):
        w = words[i]
        if w in ("--recipes-dir", "--images-dir"):
            i += 2
        elif w.startswith(("--recipes-dir=", "--images-dir=")):
            i += 1
        else:
            return w == "check"
    return False


def parser() -> argparse.ArgumentParser:
    """The argument parser (usage errors raise :class:`UsageError`, exit 64)."""
    p, sub = _top_parser()
    _add_check(sub)

    au = sub.add_parser("audit", help="audit Dockerfiles and Apptainer/Singularity definitions with the recipe rules (offline)")
    au.add_argument("files", nargs="+", metavar="FILE", type=_path("a file"), help="Dockerfile, Containerfile or definition file")
    au.add_argument("--json", action="store_true", help="print the report as JSON (schemas/audit.schema.json)")
    au.add_argument("--to-recipe", metavar="OUT.yaml", type=_path("a file name", no_dash=True),
                    help="write the recipe of the same stack (one FILE without errors)")
    au.add_argument("--driver", metavar="VERSION", type=_DRIVER_ARG, help="the cluster's NVIDIA driver: check the floors of the wheel's CUDA")
    au.add_argument("--build-arg", action="append", default=[], metavar="NAME=VALUE", type=_BUILD_ARG,
                    help="a build argument, as docker build --build-arg (or apptainer build --build-arg)")
    au.set_defaults(func=cmd_audit)

    r = sub.add_parser("render", help="render Dockerfile, Singularity.def and lock under images/RECIPE/")
    r.add_argument("recipe", nargs="?", type=_RECIPE)
    r.add_argument("--all", action="store_true", help="every recipe under --recipes-dir")
    r.add_argument("--check", dest="check_only", action="store_true", help="fail (exit 2) if the committed files are stale")
    r.set_defaults(func=cmd_render)

    b = sub.add_parser("build", help="build the image with the Docker engine and check it against the lock")
    b.add_argument("recipe", type=_RECIPE)
    _add_site(b)
    b.set_defaults(func=cmd_build)

    ce = sub.add_parser("certify", help="certify an image on N container nodes")
    ce.add_argument("image", type=_image_ref, help="image reference or ID (built by envbuild: it carries the envbuild.* labels)")
    _add_certify(ce)
    _add_launcher(ce)
    ce.set_defaults(func=cmd_certify)

    m = sub.add_parser("make", help="check, render, build and certify (default recipe: cpu-torch2)")
    m.add_argument("recipe", nargs="?", default="cpu-torch2", type=_RECIPE)
    _add_site(m)
    _add_certify(m)
    _add_launcher(m)
    m.set_defaults(func=cmd_make)

    pr = sub.add_parser("probe", help="print this host's node report as JSON")
    pr.add_argument("--host", action="store_true", help="probe the host (outside containers); the default")
    pr.set_defaults(func=cmd_probe)

    ve = sub.add_parser("verify", help="compare node reports: which node differs in what (exit 0/1/2/3)")
    _add_node_sources(ve)
    ve.set_defaults(func=cmd_verify)

    _add_doctor(sub)

    _add_publish(sub)

    lk = sub.add_parser("lock", help="resolve base digest, pip hashes and apt versions into images/RECIPE/")
    lk.add_argument("recipe", type=_RECIPE)
    lk.add_argument("--no-base", action="store_true", help="do not resolve the base image digest")
    lk.add_argument("--no-pip", action="store_true", help="do not resolve pip requirements")
    lk.add_argument("--no-apt", action="store_true", help="do not resolve apt versions")
    _add_site(lk)
    lk.set_defaults(func=cmd_lock)

    _add_k8s(sub)

    ba = sub.add_parser("base", help="base images")
    bsub = ba.add_subparsers(dest="base_command", required=True, parser_class=_Parser)
    bb = bsub.add_parser("bootstrap", help="debootstrap a Debian base image under its own name")
    bb.add_argument("--suite", default="bookworm", type=_suite_arg, help="Debian suite to debootstrap (default bookworm)")
    bb.add_argument("--stands-for", default="debian:bookworm-slim", type=_image_ref,
                    help="the official image this base stands in for (recorded in a label)")
    bb.set_defaults(func=cmd_base)
    return p


def _is_service_error(exc: Exception) -> bool:
    """Errors from the Docker engine (docker SDK) or an HTTP service (requests)."""
    import docker.errors
    import requests

    return isinstance(exc, (docker.errors.DockerException, requests.RequestException))


def _raise_interrupt(signum, frame):
    raise KeyboardInterrupt(signal.Signals(signum).name)


def _say(line: str) -> None:
    """One line on stderr as it is (already escaped: no markup, no raw control character);
    without rich (:func:`builder.cli.term.plain_line`), so an error path imports no more than it needs."""
    plain_line(line, sys.stderr)


def _os_error_line(exc: OSError) -> str:
    """``error: FILE: reason`` of an OSError, the file names escaped."""
    names = [escape(n, 300) for n in (getattr(exc, "filename", None), getattr(exc, "filename2", None)) if n]
    where = "".join(f"{n}: " for n in names)
    return f"error: {where}{one_line(exc.strerror or exc, 300)}"


def _internal_error(exc: Exception) -> int:
    """An exception no stage expected (a bug): its traceback with every line escaped, then
    one ``error:`` line; exit :data:`INTERNAL_ERROR`."""
    import traceback

    for line in traceback.format_exception(type(exc), exc, exc.__traceback__):
        for part in line.rstrip("\n").split("\n"):
            _say(escape(part, 1000))
    _say(f"error: internal error (a bug in envbuild; please report it with the lines above): "
         f"{exc.__class__.__name__}: {one_line(str(exc))}")
    return INTERNAL_ERROR


def _run(argv: list[str] | None) -> int:
    """Parse, check the arguments (:func:`_check_args`), run the command; every error
    becomes escaped ``error:`` lines on stderr and an exit code."""
    try:
        try:
            args = (check_parser() if _is_check(argv) else parser()).parse_args(argv)
        except SystemExit as exc:  # --help: argparse printed it and exits by itself
            return exc.code if isinstance(exc.code, int) else ExitCode.OK
        _check_args(args)
        return args.func(args)
    except UsageError as exc:
        _say(escape(str(exc), 600))
        return ExitCode.USAGE
    except EnvbuildError as exc:
        for line in str(exc).splitlines():
            _say(f"error: {escape(line, 1000)}")
        return exc.exit_code
    except KeyboardInterrupt as exc:
        _say(f"interrupted ({escape(str(exc) or 'SIGINT', 40)}); everything envbuild started was removed")
        return INTERRUPTED
    except OSError as exc:  # a path the user gave cannot be read or written
        _say(_os_error_line(exc))
        return ExitCode.UNREACHABLE
    except Exception as exc:  # noqa: BLE001 - the engine or a registry answered unexpectedly: exit 3
        if not _is_service_error(exc):
            return _internal_error(exc)
        _say(f"error: {exc.__class__.__name__}: {one_line(str(exc))}")
        return ExitCode.UNREACHABLE


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``envbuild`` console script. Returns (and, without ``argv``,
    exits with) the exit code: the table of ``builder/core/errors.py``; 130 interrupted
    (SIGINT/SIGTERM); :data:`INTERNAL_ERROR` (70) for an unexpected exception."""
    signal.signal(signal.SIGTERM, _raise_interrupt)
    code = _run(argv)
    if argv is None:
        sys.exit(int(code))
    return int(code)


if __name__ == "__main__":  # pragma: no cover
    main()
