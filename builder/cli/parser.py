"""The argument parser of ``envbuild``; usage errors raise UsageError (exit 64, not argparse's 2).
A command's arguments are added when it is parsed, so ``--help`` and one command stay fast."""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable, Sequence
from typing import Any, NoReturn

from builder.cli import argtypes as t
from builder.cli import output
from builder.core.errors import UsageError

#: Adds a command's arguments to its parser.
Fill = Callable[[argparse.ArgumentParser], None]


class _Parser(argparse.ArgumentParser):
    """An argument parser whose errors are :class:`UsageError` and whose arguments are added by
    ``fill`` when it first parses (or :meth:`filled` is called)."""

    def __init__(self, *args: Any, fill: Fill | None = None, command: str = "", **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._fill, self._command = fill, command

    def filled(self) -> _Parser:
        """This parser with its arguments added (once), ``--json`` where the command has a document."""
        if self._fill is not None:
            fill, self._fill = self._fill, None
            fill(self)
            if self._command in output.JSON_SCHEMAS:
                self.add_argument("--json", action="store_true", help="print one JSON document on stdout instead "
                                  f"(schemas/{output.JSON_SCHEMAS[self._command]}.schema.json); exit code unchanged")
        return self

    def parse_known_args(self, args: Sequence[str] | None = None,  # type: ignore[override]
                         namespace: argparse.Namespace | None = None) -> tuple[argparse.Namespace, list[str]]:
        self.filled()
        return super().parse_known_args(args, namespace)

    def error(self, message: str) -> NoReturn:  # argparse exits 2 by default: the table says 64
        raise UsageError(f"{self.prog}: {message}")


def build_parser() -> argparse.ArgumentParser:
    """The argument parser (usage errors raise :class:`UsageError`, exit 64)."""
    from importlib.metadata import version

    p = _Parser(prog="envbuild", description="Reproducible, certified PyTorch images for multi-node clusters. "
                "Site settings: envbuild config.")
    p.add_argument("--version", action="version", version=f"envbuild {version('envbuild')}")
    p.add_argument("--progress", choices=("auto", "tty", "plain", "quiet"), default="auto",
                   help="auto: live on a terminal, else plain timestamped lines (default)")
    p.add_argument("-q", "--quiet", dest="progress", action="store_const", const="quiet", help="--progress quiet")
    p.add_argument("-v", "--verbose", action="store_true", help="plain progress: every status line")
    p.add_argument("--recipes-dir", default="recipes", type=t.path("a folder"),
                   help="where recipes live (default: recipes)")
    p.add_argument("--images-dir", default="images", type=t.path("a folder"),
                   help="where rendered files and certificates go (default: images)")
    sub = p.add_subparsers(dest="command", required=True, parser_class=_Parser)
    for name, summary, fill in COMMANDS:
        sub.add_parser(name, help=summary, fill=fill, command=name)
    if "_ARGCOMPLETE" in os.environ:  # the shell's completion function runs envbuild
        complete(p)
    return p


def complete(p: argparse.ArgumentParser) -> None:
    """Shell completion: every command's arguments added first (argcomplete reads them before it parses); exits."""
    import argcomplete

    def fill(q: argparse.ArgumentParser) -> None:
        for action in q._actions:
            if isinstance(action, argparse._SubParsersAction):
                for sub in action.choices.values():
                    fill(sub.filled())

    fill(p)
    argcomplete.autocomplete(p)


def _recipes(prefix: str, parsed_args: argparse.Namespace, **_: Any) -> list[str]:
    """argcomplete's completer of a recipe argument: the names under ``--recipes-dir``."""
    from builder.recipe.load import names

    return [n for n in names(getattr(parsed_args, "recipes_dir", None) or "recipes") if n.startswith(prefix)]


def _recipe(p: argparse.ArgumentParser, *flags: str, **kw: Any) -> None:
    """A recipe argument (name or path), completed with the recipe names."""
    p.add_argument(*(flags or ("recipe",)), type=t.recipe, **kw).completer = _recipes  # type: ignore[attr-defined]


# ------------------------------------------------------------------ recipe: check, audit, render, lock
def _check(c: argparse.ArgumentParser) -> None:
    _recipe(c, help="a name under --recipes-dir or a path to a YAML file")


def _audit(au: argparse.ArgumentParser) -> None:
    au.add_argument("files", nargs="+", metavar="FILE", type=t.path("a file"),
                    help="Dockerfile, Containerfile or definition file")
    au.add_argument("--to-recipe", metavar="OUT.yaml", type=t.path("a file name", no_dash=True),
                    help="write the recipe of the same stack (one FILE without errors)")
    au.add_argument("--driver", metavar="VERSION", type=t.driver,
                    help="the cluster's NVIDIA driver: check the floors of the wheel's CUDA")
    au.add_argument("--build-arg", action="append", default=[], metavar="NAME=VALUE", type=t.build_arg,
                    help="a build argument, as docker build --build-arg (or apptainer build --build-arg)")
    au.add_argument("--context", metavar="DIR", type=t.path("a folder"),
                    help="the build context COPY and %%files read from (default: each FILE's folder)")


def _render(r: argparse.ArgumentParser) -> None:
    _recipe(r, nargs="?")
    r.add_argument("--all", action="store_true", help="every recipe under --recipes-dir")
    r.add_argument("--check", dest="check_only", action="store_true",
                   help="fail (exit 2) if the committed files are stale")


def _lock(lk: argparse.ArgumentParser) -> None:
    _recipe(lk)
    lk.add_argument("--no-base", action="store_true", help="do not resolve the base image digest")
    lk.add_argument("--no-pip", action="store_true", help="do not resolve pip requirements")
    lk.add_argument("--no-apt", action="store_true", help="do not resolve apt versions")
    add_site_options(lk)


# ------------------------------------------------------------------ image: build, base bootstrap
def _build(b: argparse.ArgumentParser) -> None:
    _recipe(b)
    add_site_options(b)


def _rebuild(r: argparse.ArgumentParser) -> None:
    r.add_argument("recipe", type=t.registry_component("a recipe name (lower-case letters, digits, ._-)"))
    r.add_argument("--compare", action="store_true", help="compare the installed files with the recipe's certified "
                   "image (else the current build of its lock): exit 0 equal, 2 not, 3 cannot check")
    r.add_argument("--against", metavar="IMAGE", type=t.image_ref, help="compare with this image instead")
    r.add_argument("--keep", action="store_true", help="keep the rebuilt image after --compare (default: removed)")
    r.add_argument("--rebuilt", metavar="IMAGE", type=t.image_ref, help="compare this image (an earlier rebuild) "
                   "instead of building")
    add_site_options(r)


def _base(ba: argparse.ArgumentParser) -> None:
    bsub = ba.add_subparsers(dest="base_command", required=True, parser_class=_Parser)
    bb = bsub.add_parser("bootstrap", help="debootstrap a Debian base image under its own name")
    bb.add_argument("--suite", default="bookworm", type=t.suite, help="Debian suite to debootstrap (default bookworm)")
    bb.add_argument("--stands-for", default="debian:bookworm-slim", type=t.image_ref,
                    help="the official image this base stands in for (recorded in a label)")


def add_site_options(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("site options (enter at build time; the rendered files do not change)")
    g.add_argument("--ca-cert", metavar="FILE", type=t.path("a file"),
                   help="CA bundle handed to pip in the build (default: from pip's configuration)")
    g.add_argument("--wheels", metavar="DIR", type=t.path("a folder"),
                   help="local wheel folder for pip --find-links (default: from pip's configuration)")
    g.add_argument("--base", metavar="IMAGE", type=t.image_ref, help="base image override (e.g. a site mirror)")
    g.add_argument("--base-mode", choices=("auto", "pull", "bootstrap", "local"), default="auto",
                   help="auto: use the base if present or pullable, else bootstrap a Debian base locally (default)")
    g.add_argument("--no-site-detect", action="store_true", help="do not read pip's configuration")


# ------------------------------------------------------------------ certify: certify, make, report, k8s render
def _certify(ce: argparse.ArgumentParser) -> None:
    ce.add_argument("image", type=t.image_ref,
                    help="image reference or ID: built by envbuild (its lock is the reference) or any image "
                         "with python3 >= 3.8 and torch (the probe's stack is)")
    add_certify_options(ce)
    _recipe(ce, "--recipe", dest="recipe_lock", metavar="RECIPE",
                    help="compare the image with this recipe's lock (images/RECIPE/envbuild.lock.json) instead")
    add_launcher_options(ce)


def _make(m: argparse.ArgumentParser) -> None:
    _recipe(m, nargs="?", default="cpu-torch2")
    add_site_options(m)
    add_certify_options(m)
    add_launcher_options(m)


def _report(rp: argparse.ArgumentParser) -> None:
    rp.add_argument("certificate", metavar="CERT.json", type=t.path("a file"),
                    help="a certificate JSON written by certify, make or k8s render --apply")
    rp.add_argument("--out", metavar="FILE", type=t.path("a file name"),
                    help="where to write the HTML report (default: next to the certificate, .html; - for stdout)")


def _k8s(k: argparse.ArgumentParser) -> None:
    ksub = k.add_subparsers(dest="k8s_command", required=True, parser_class=_Parser)
    r = ksub.add_parser("render", help="write an Indexed Job + headless Service (or a Kubeflow TrainJob) to --out")
    r.add_argument("source", metavar="IMAGE_OR_RECIPE", type=t.text("an image or recipe name", 1000),
                   help="an image on this engine (REPO@sha256:...; settings from its labels) or a recipe name "
                        "(settings from images/RECIPE/envbuild.lock.json; needs --image)")
    r.add_argument("--out", required=True, metavar="DIR", type=t.path("a folder"),
                   help="folder for the manifests (created; - for one YAML stream on stdout)")
    r.add_argument("--image", metavar="REPO@sha256:DIGEST", type=t.image_ref,
                   help="with a recipe name: the image the pods run, by digest")
    r.add_argument("--allow-tag", action="store_true",
                   help="accept an image reference without digest (development clusters)")
    r.add_argument("--kubeflow", action="store_true", help="render a Kubeflow Trainer v2 TrainJob "
                   "(trainer.kubeflow.org/v1alpha1) instead of Job + Service")
    r.add_argument("--runtime", default="torch-distributed",
                   type=t.pattern(t.K8S_SUBDOMAIN, "a Kubernetes object name (RFC 1123 subdomain)", 253),
                   help="the TrainJob's ClusterTrainingRuntime (default torch-distributed)")
    r.add_argument("--run-id", metavar="ID", type=t.text("a run id", 40),
                   help="names the objects envbuild-ID (default: random); fixes the output")
    r.add_argument("--ttl", type=t.int_in(0, 2**31 - 1), default=3600, metavar="S",
                   help="ttlSecondsAfterFinished of the Job (default 3600)")
    r.add_argument("--spread", choices=("preferred", "required", "none"), default="preferred",
                   help="pod anti-affinity on kubernetes.io/hostname (default preferred; required: one node per host)")
    r.add_argument("--ifname", dest="socket_ifname", type=t.socket_ifname,
                   help=argparse.SUPPRESS)  # old name of --socket-ifname
    r.add_argument("--env", action="append", default=[], metavar="NAME=VALUE", type=t.env_item,
                   help="extra environment of every pod (repeatable)")
    r.add_argument("--apply", action="store_true",
                   help="create the objects with the kubernetes client, wait, collect the results from the pod logs, "
                        "delete everything and write the certificate")
    r.add_argument("--kubeconfig", metavar="FILE", type=t.path("a file"),
                   help="default: $KUBECONFIG, ~/.kube/config, or in-cluster")
    r.add_argument("--context", type=t.text("a kubeconfig context"),
                   help="kubeconfig context (default: the current one)")
    r.add_argument("--namespace", type=t.pattern(t.K8S_LABEL, "a Kubernetes namespace (RFC 1123 label)", 63),
                   help="namespace of the objects (written into them; default: the context's namespace, else default)")
    r.add_argument("--rdma", metavar="RESOURCE=N", type=t.text("an extended resource", 320),
                   help="test the RDMA fabric: request N of the site's device resource (e.g. "
                        "rdma/rdma_shared_device_a=1, nvidia.com/hostdev=1), add IPC_LOCK, run as root "
                        "(Pod Security level privileged; docs/kubernetes.md)")
    r.add_argument("--rdma-network", metavar="host|NET[,NET]", type=t.text("a network list", 600),
                   help="with --rdma: hostNetwork, or secondary networks (Multus k8s.v1.cni.cncf.io/networks)")
    add_placement_options(r)
    add_certify_options(r)
    ksub.add_parser("gate", help="write the DaemonSet (+ RBAC) that labels certified nodes and taints the others",
                    fill=_k8s_gate)


def add_placement_options(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("placement (docs/kubernetes.md; defaults: builder/launchers/k8s/options.py)")
    g.add_argument("--requests", metavar="cpu=Q,memory=Q", type=t.k8s_pairs, default={},
                   help="container requests per pod (default per rank: cpu=1,memory=2Gi; gate cpu=50m,memory=256Mi)")
    g.add_argument("--limits", metavar="cpu=Q,memory=Q", type=t.k8s_pairs, default={},
                   help="container limits per pod; none removes one (default per rank: memory=8Gi; gate memory=1Gi)")
    g.add_argument("--node-selector", action="append", default=[], metavar="KEY=VALUE", type=t.node_selector,
                   help="only nodes with this label (repeatable)")
    g.add_argument("--toleration", action="append", default=[], metavar="KEY[=VALUE][:EFFECT]",
                   type=t.text("a toleration", 400),
                   help="tolerate a taint; * for every key (repeatable; the gate's default: *:NoSchedule, *:NoExecute)")
    g.add_argument("--node-affinity", action="append", default=[], metavar="KEY[=V1,V2]",
                   type=t.text("a node affinity", 2400),
                   help="required node label (In the values, or Exists; repeatable)")
    g.add_argument("--priority-class", metavar="NAME", type=t.text("a PriorityClass", 253),
                   help="priorityClassName of the pods")


def add_ops_options(p: argparse.ArgumentParser) -> None:
    """Metrics and logs of ``certify``, ``gate`` and ``doctor`` (docs/operating.md)."""
    g = p.add_argument_group("metrics and logs")
    g.add_argument("--metrics-file", metavar="FILE.prom", type=t.path("a file"),
                   help="write Prometheus text exposition here (node_exporter's textfile collector)")
    g.add_argument("--log-json", metavar="FILE", type=t.path("a file"),
                   help="append the run's events as JSON lines (default $ENVBUILD_LOG_JSON)")
    g.add_argument("--syslog", metavar="HOST:PORT", type=t.host_port,
                   help="send the run's events as RFC 5424 lines over UDP")


def add_certify_options(p: argparse.ArgumentParser) -> None:
    add_ops_options(p)
    g = p.add_argument_group("certification (defaults from the image's envbuild.* labels)")
    g.add_argument("--nodes", type=t.int_in(1, t.MAX_NODES),
                   help="simulated nodes (containers); default from the recipe (2)")
    g.add_argument("--gpus-per-node", type=t.int_in(0, 64), help="GPUs per node container (0 on CPU)")
    g.add_argument("--backend", choices=("gloo", "nccl"),
                   help="override the recipe's backend (recorded in the certificate)")
    g.add_argument("--port", type=t.int_in(1, 65535), help="rendezvous port on the first node (default 29500)")
    g.add_argument("--timeout", type=t.int_in(1, t.MAX_TIMEOUT_S), help="seconds before hung ranks are killed")
    g.add_argument("--min-busbw", type=t.float_in(0, 1e6, lo_open=True), metavar="GBPS",
                   help="busbw floor in GB/s at the gate size; gates also on gloo")
    g.add_argument("--socket-ifname", metavar="IF", type=t.socket_ifname,
                   help="set GLOO_SOCKET_IFNAME and NCCL_SOCKET_IFNAME on every node (NCCL syntax: "
                        "eth0, ^lo,docker, =ib0); default: the image's own settings, else unset "
                        "(the libraries choose); the certificate records which was used")
    g.add_argument("--profile", type=t.profiles, metavar="P[,P]",
                   help="parallelism profiles: comma list of ddp, fsdp, tp, pipeline, moe, or all (their "
                        "collectives and training checks; default from the recipe, else ddp)")
    g.add_argument("--sizes", type=t.sizes, metavar="MIN:MAX|LIST",
                   help="message sizes, e.g. 1K:64M (doubling) or 8,1K,4M (default from the recipe)")
    g.add_argument("--iters", type=t.int_in(1, 100000), help="timed iterations per size (default from the recipe)")
    g.add_argument("--warmup", type=t.int_in(0, 100000), help="untimed iterations per size (default from the recipe)")
    g.add_argument("--dtype", type=t.dtypes, metavar="T[,T]",
                   help="element types of the profile collectives: float32, bfloat16, float16, float64 "
                        "(default float32, plus bfloat16 on nccl)")
    g.add_argument("--min-scaling-efficiency", type=t.float_in(0, 1, lo_open=True), metavar="E",
                   help="fail when throughput(N) / (N x throughput(1)) is below E (default: reported, not gated)")
    g.add_argument("--bisect", action="store_true",
                   help="when the run fails on 2 or more nodes, find the bad node(s) by bisection (local "
                        "launcher; docs/bisect.md); written beside the certificate as .bisect.json")


def add_launcher_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--launcher", choices=("local", "slurm", "k8s"), default="local",
                   help="where the ranks run: local (containers on this Docker engine; default), slurm "
                        "(one sbatch job), k8s (an Indexed Job; more options: envbuild k8s render --apply)")
    g = p.add_argument_group("Slurm (--launcher slurm; docs/slurm.md)")
    g.add_argument("--partition", metavar="P", type=t.slurm_value("check_partition"),
                   help="sbatch --partition (default: the cluster's default)")
    g.add_argument("--time-limit", metavar="TIME", type=t.slurm_value("parse_time_limit"),
                   help="sbatch --time, e.g. 10 (minutes) or 1:00:00 "
                   "(default: --timeout rounded up to minutes)")
    g.add_argument("--container-runtime", choices=("docker", "pyxis", "apptainer", "none"),
                   help="how each node runs the image: docker run (default: the image is in each node's engine), "
                        "pyxis (srun --container-image), apptainer (apptainer exec), none (python3 on the "
                        "node's PATH, its own libraries, checked against IMAGE's lock)")
    g.add_argument("--container-image", metavar="REF", type=t.slurm_value("check_container_image"),
                   help="what the nodes run (default: IMAGE; apptainer: "
                   "docker-daemon:IMAGE); pyxis: an enroot URI or a .sqsh path, apptainer: a .sif path")
    g.add_argument("--slurm-dir", metavar="DIR", type=t.path("a folder"),
                   help="run folders go to DIR/slurm-<run>/ (script, logs, results; "
                   "on a filesystem every node sees); default images/RECIPE/certificates")
    g.add_argument("--slurm-nodes", type=t.int_in(1, t.MAX_NODES), metavar="M",
                   help="Slurm nodes the --nodes envbuild nodes share "
                   "(default: one each; 1 runs them all on one machine)")
    g.add_argument("--sbatch-arg", action="append", metavar="ARG", type=t.slurm_value("check_sbatch_arg"),
                   help="extra #SBATCH option, e.g. --account=X (repeatable; docs/slurm.md lists those passed on)")
    g.add_argument("--pending-timeout", type=t.float_in(0, t.MAX_TIMEOUT_S, lo_open=True), metavar="S",
                   help="seconds the job may wait in the queue (default 600)")


# ------------------------------------------------------------------ nodes: probe, verify, doctor, gate
def _probe(pr: argparse.ArgumentParser) -> None:
    pr.add_argument("--host", action="store_true", help="probe the host (outside containers); the default")


def _verify(ve: argparse.ArgumentParser) -> None:
    add_node_sources(ve)
    ve.add_argument("--against", metavar="REF", type=t.text("a certificate, node report or image", 4096),
                    help="compare every node with this certificate (its rank probes), node report or image (probed)")
    ve.add_argument("--max-age", type=t.duration, default=30 * 86400.0, metavar="D",
                    help="with --against CERT: warn when the certificate is older (default 30d)")
    ve.add_argument("--all", dest="all_rows", action="store_true",
                    help="a row for every node (default: one line per group of equal nodes)")


def _gate(g: argparse.ArgumentParser) -> None:
    """``envbuild gate --against CERT [--image IMAGE] [--drain]``."""
    g.add_argument("--against", required=True, metavar="CERT", type=t.path("a certificate"),
                   help="the certificate (or a node report) this node must match")
    g.add_argument("--image", metavar="IMAGE", type=t.image_ref, help="the image jobs run here: probe it too")
    g.add_argument("--drain", action="store_true", help="Slurm: drain this node when it fails (scontrol update)")
    g.add_argument("--epilog", action="store_true", help="Slurm Epilog: also what the job left (GPU processes, "
                   "memory, new XIDs and ECC errors since the Prolog's history record); writes no history")
    g.add_argument("--resume", action="store_true", help="Slurm: resume this node when it passes; else drain it "
                   "again with the reason")
    g.add_argument("--node", metavar="NAME", type=t.text("a Slurm node name", 128),
                   help="the Slurm node name (default $SLURMD_NODENAME, else the host name)")
    g.add_argument("--history", metavar="DIR", type=t.path("a folder"),
                   help="append the report here (default /var/lib/envbuild/gate as root, "
                        "else $XDG_STATE_HOME/envbuild/gate)")
    g.add_argument("--no-history", action="store_true", help="write no history file")
    g.add_argument("--max-age", type=t.duration, default=30 * 86400.0, metavar="D",
                   help="warn when the certificate is older (default 30d)")
    g.add_argument("--checks", metavar="A,B", type=t.text("a list of checks", 1000),
                   help="local checks: shm, gpu-uuid, gpu-processes, interface, stale-containers, gpu-health "
                        "(default all)")
    add_health_options(g, "the certificate's gpus_per_node")
    g.add_argument("--min-shm", default="256m", metavar="SIZE", type=t.size, help="smallest /dev/shm (default 256m)")
    g.add_argument("--stale-after", type=t.duration, default=3600.0, metavar="D",
                   help="an envbuild container running longer is stale (default 1h)")
    g.add_argument("--stale-label", action="append", default=[], metavar="KEY[=VALUE]", type=t.label,
                   help="look for stale containers only among those with this label too (repeatable)")
    add_ops_options(g)


def _k8s_gate(g: argparse.ArgumentParser) -> None:
    """``envbuild k8s gate CERT --image REPO@sha256:... --out DIR``."""
    g.add_argument("certificate", metavar="CERT", type=t.path("a certificate"), help="the certificate nodes must match")
    g.add_argument("--image", required=True, metavar="REPO@sha256:DIGEST", type=t.image_ref,
                   help="the certified image, by digest (the gate runs in it)")
    g.add_argument("--out", required=True, metavar="DIR", type=t.path("a folder"),
                   help="folder for the manifests (- for stdout)")
    g.add_argument("--namespace", default="envbuild-system",
                   type=t.pattern(t.K8S_LABEL, "a Kubernetes namespace (RFC 1123 label)", 63),
                   help="namespace of the ServiceAccount, ConfigMap and DaemonSet (default: envbuild-system, "
                        "rendered as a Namespace)")
    g.add_argument("--interval", type=t.int_in(10, 86400), default=600, metavar="S",
                   help="seconds between checks on each node (default 600)")
    g.add_argument("--max-age", type=t.duration, default=30 * 86400.0, metavar="D",
                   help="the pods warn when the certificate is older (default 30d)")
    g.add_argument("--allow-tag", action="store_true", help="accept an image without digest (development clusters)")
    add_placement_options(g)


def _doctor(do: argparse.ArgumentParser) -> None:
    """``envbuild doctor``: the node sources and the preflight options."""
    add_node_sources(do)
    do.add_argument("--checks", metavar="A,B", type=t.text("a list of checks", 1000),
                    help="run only these checks: nodes, port, interface, shm, gpu-uuid, "
                    "gpu-processes, gpu-health, stale-containers, straggler (default all)")
    add_health_options(do, "not checked")
    add_ops_options(do)
    do.add_argument("--port", type=t.int_in(1, 65535), default=29500,
                    help="rendezvous port checked on the master (default 29500)")
    do.add_argument("--master", metavar="NODE", type=t.text("a node name"),
                    help="the master node (default: the first node)")
    do.add_argument("--backend", choices=("gloo", "nccl"), help="default: nccl when every node has GPUs, else gloo")
    do.add_argument("--min-shm", default="256m", metavar="SIZE", type=t.size,
                    help="smallest /dev/shm accepted (default 256m)")
    do.add_argument("--straggler-ratio", type=t.float_in(1, 100, lo_open=True), default=1.5, metavar="R",
                    help="a node slower than R x the median is a straggler (default 1.5)")
    do.add_argument("--fix", action="store_true", help="remove stale envbuild containers (nothing else)")
    do.add_argument("--stale-after", type=t.float_in(0, 365 * 86400), default=3600, metavar="S",
                    help="a running envbuild container older than S seconds is stale (default 3600; 0: every "
                         "running one, including a certification in progress)")
    do.add_argument("--stale-label", action="append", default=[], metavar="KEY[=VALUE]", type=t.label,
                    help="look for stale containers only among those with this label too (repeatable)")


def add_health_options(p: argparse.ArgumentParser, gpus_default: str) -> None:
    """The ``gpu-health`` check's options of ``doctor`` and ``gate``."""
    p.add_argument("--gpus", type=t.int_in(0, 1024), metavar="N",
                   help=f"gpu-health: GPUs each node must have (default: {gpus_default})")
    p.add_argument("--gpu-thresholds", metavar="FILE", type=t.path("a threshold file"),
                   help="gpu-health: YAML/JSON overriding the thresholds (keys defaults, skus; docs/operating.md)")


def add_node_sources(p: argparse.ArgumentParser) -> None:
    """The node sources of ``verify`` and ``doctor``, each value checked by
    :mod:`builder.nodes.sources` (:func:`builder.cli.argtypes.node_source`)."""
    source = t.node_source
    p.add_argument("reports", nargs="*", metavar="REPORT",
                   help="node report files (envbuild probe --host > node.json), directories of *.json, "
                        "@LIST (a file of paths, one a line) or - (that list on stdin)")
    g = p.add_argument_group("nodes (any mix of sources)")
    g.add_argument("--image", action="append", default=[], metavar="IMAGE", type=t.image_ref,
                   help="running containers of IMAGE on this engine that envbuild started (repeatable)")
    g.add_argument("--any-container", action="store_true", help="--image: also containers envbuild did not start")
    g.add_argument("--container", action="append", default=[], metavar="NAME", type=source("check_container"),
                   help="this running container (repeatable)")
    g.add_argument("--label", action="append", default=[], metavar="KEY[=VALUE]", type=source("check_label"),
                   help="running containers with this label (repeatable; with --image: all must match)")
    g.add_argument("--nodes", type=t.int_in(1, t.MAX_NODES), metavar="N",
                   help="containers: exactly N must run; --slurm: srun --nodes=N")
    g.add_argument("--hosts", action="append", default=[], metavar="A,B,C", type=source("check_host", split=True),
                   help="hosts over ssh, [user@]host[:port]")
    g.add_argument("--ssh-config", metavar="FILE", type=source("check_path", "--ssh-config"),
                   help="ssh -F FILE")
    g.add_argument("--ssh-option", action="append", default=[], metavar="KEY=VALUE", type=source("check_ssh_option"),
                   help="ssh -o KEY=VALUE (repeatable; connection, authentication and host-key keys only)")
    g.add_argument("--connect-timeout", type=t.int_in(1, 3600), default=5, metavar="S",
                   help="ssh ConnectTimeout; doctor: TCP connect limit (default 5)")
    g.add_argument("--slurm", action="store_true", help="one srun --ntasks-per-node=1 step gathers every node")
    g.add_argument("--partition", metavar="P", type=source("check_partition"), help="srun --partition")
    g.add_argument("--srun-arg", action="append", default=[], metavar="--NAME[=VALUE]", type=source("check_srun_arg"),
                   help="extra srun option (repeatable; resources, placement and accounting options only)")
    g.add_argument("--timeout", dest="node_timeout", type=t.float_in(0, 86400, lo_open=True), default=120, metavar="S",
                   help="seconds per node (default 120)")
    g.add_argument("--python", default="python3", type=source("check_python"),
                   help="interpreter on the nodes, a name or path (default python3)")


def _shell(c: argparse.ArgumentParser) -> None:
    c.add_argument("shell", choices=("bash", "zsh", "fish"))


# ------------------------------------------------------------------ publish: push, pull
def _push(pu: argparse.ArgumentParser) -> None:
    pu.add_argument("recipe", type=t.registry_component("a recipe name (lower-case letters, digits, ._-)"))
    pu.add_argument("--registry", required=True, metavar="HOST[:PORT]", type=t.registry, help="the registry")
    pu.add_argument("--image", metavar="REF", type=t.image_ref,
                    help="the local image (default: the newest certified one of RECIPE)")
    pu.add_argument("--sign-key", metavar="FILE", type=t.path("a file"),
                    help="sign the certificate (DSSE) with this PEM private key "
                    "(Ed25519 or ECDSA; default: $ENVBUILD_SIGN_KEY)")
    pu.add_argument("--no-fs-hash", action="store_true", help="do not record the filesystem content hash")
    add_registry_options(pu)


def _pull(pl: argparse.ArgumentParser) -> None:
    pl.add_argument("target", metavar="RECIPE|REF", type=t.text("a recipe name or image reference", 1000),
                    help="recipe name (HOST/NAMESPACE/RECIPE:certified) or image reference")
    pl.add_argument("--registry", metavar="HOST[:PORT]", type=t.registry, help="the registry (unless REF names one)")
    pl.add_argument("--verify-key", metavar="FILE", type=t.path("a file"),
                    help="require a certificate signed by this PEM public key "
                    "(default: $ENVBUILD_VERIFY_KEY)")
    pl.add_argument("--allow-uncertified-hw", action="store_true",
                    help="driver or GPUs the certificate does not cover: warn (exit 1) instead of refusing")
    pl.add_argument("--format", choices=("docker", "sif"), default="docker",
                    help="docker: pull into the engine (default); sif: apptainer pull by digest")
    pl.add_argument("--output", metavar="FILE", type=t.path("a file name", no_dash=True),
                    help="SIF file for --format sif (default RECIPE_LOCK.sif)")
    pl.add_argument("--print-only", action="store_true", help="--format sif: print the command, do not run it")
    add_registry_options(pl)


def add_registry_options(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("registry (credentials come from your Docker config: docker login HOST)")
    g.add_argument("--namespace", default="envbuild", type=t.registry_component("a repository path", path=True),
                   help="repository prefix: HOST/NAMESPACE/RECIPE (default: envbuild)")
    g.add_argument("--plain-http", action="store_true",
                   help="plain HTTP (default: HTTPS; loopback registries fall back to HTTP)")
    g.add_argument("--registry-ca", metavar="FILE", type=t.path("a file"),
                   help="CA bundle of the registry's TLS certificate")


#: The commands: (name, one-line help, the function adding its arguments), in ``--help`` order.
COMMANDS: tuple[tuple[str, str, Fill], ...] = (
    ("check", "validate a recipe and its version compatibility (offline)", _check),
    ("audit", "audit Dockerfiles and Apptainer/Singularity definitions with the recipe rules (offline)", _audit),
    ("render", "render Dockerfile, Singularity.def and lock under images/RECIPE/", _render),
    ("build", "build the image with the Docker engine and check it against the lock", _build),
    ("rebuild", "build the image again without cache; --compare: are its installed files the same", _rebuild),
    ("certify", "certify an image on N container nodes", _certify),
    ("make", "check, render, build and certify (default recipe: cpu-torch2)", _make),
    ("report", "draw the HTML report of a certificate again (verdict, stack, ranks, plots)", _report),
    ("probe", "print this host's node report as JSON", _probe),
    ("verify", "compare node reports: which node differs in what (exit 0/1/2/3)", _verify),
    ("doctor", "preflight checks: ports, interfaces, shm, GPUs, stale containers, stragglers", _doctor),
    ("gate", "check this node against its certificate at job start (exit 0/1/2/3; Slurm Prolog)", _gate),
    ("push", "publish a certified image and its certificate to a registry, by digest", _push),
    ("pull", "pull a certified image by digest after checking its certificate and this node", _pull),
    ("lock", "resolve base digest, pip hashes and apt versions into images/RECIPE/", _lock),
    ("k8s", "Kubernetes: render (and --apply) the manifests that certify an image on a cluster", _k8s),
    ("base", "base images", _base),
    ("config", "show the site settings (envbuild.toml, ENVBUILD_*) and where each came from", lambda c: None),
    ("completion", "print the shell completion script (argcomplete): eval \"$(envbuild completion bash)\"",
     _shell),
)
