"""The manifest files of a run, each read back and compared with its object. Strings are plain only where every YAML 1.1
reader reads back the same string (Kubernetes reads ``on``, ``y``, ``1e3`` as other types), else double-quoted."""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from builder.core.errors import EnvbuildError, Unreachable
from builder.core.files import make_folder, write_atomic

from ..base import LaunchSpec
from . import gate, objects
from .options import DEFAULT_OPTIONS, TRAINJOB_API, K8sOptions

#: The first lines of every file.
HEADER = ("envbuild run {run_id}, rendered by `envbuild k8s render`.",
          "Apply the folder with `kubectl apply -f DIR`; remove it with `kubectl delete -f DIR`.")
GATE_HEADER = ("envbuild node gate for lock {label}, rendered by `envbuild k8s gate`.",
               "Apply the folder with `kubectl apply -f DIR`; remove it with `kubectl delete -f DIR`.")


@dataclass(frozen=True)
class Manifest:
    """One manifest file: its name, the comment lines after :data:`HEADER`, its object."""

    file: str
    comment: Callable[[Any], list[str]]  # of a RenderContext, or a GateContext for the gate's files
    build: Callable[[Any], dict[str, Any]]


MANIFESTS: dict[str, Manifest] = {m.file: m for m in (
    Manifest("configmap.yaml", lambda ctx: [
        "envbuild's in-image code (every file of builder/agent/, as builder/agent/payload.py ships it),",
        f"mounted read-only at {objects.CODE_MOUNT} in every node; keys cannot contain '/', the volume's items",
        "give the paths.",
    ], objects.configmap),
    Manifest("service.yaml", lambda ctx: [
        f"Headless Service: gives node 0 the DNS name {ctx.master_addr} (the rendezvous address).",
    ], objects.service),
    Manifest("job.yaml", lambda ctx: [
        f"Indexed Job: {ctx.spec.nodes} pod(s), one per node; pod i runs torchrun with --node-rank i.",
    ], objects.job),
    Manifest("trainjob.yaml", lambda ctx: [
        f"Kubeflow Trainer v2 TrainJob ({TRAINJOB_API}, Trainer v2.1 field names): the runtime",
        f"{ctx.options.runtime} sets PET_NNODES, PET_NPROC_PER_NODE, PET_NODE_RANK, PET_MASTER_ADDR and",
        "PET_MASTER_PORT (29400), which torchrun reads; the security context comes from the runtime.",
    ], objects.trainjob),
    Manifest("gate-namespace.yaml", lambda ctx: [
        f"envbuild's own namespace (rendered only for {gate.NAMESPACE}): Pod Security admission enforces the",
        "level the DaemonSet needs (its annotation envbuild.dev/pod-security says which, and why).",
    ], gate.namespace),
    Manifest("gate-serviceaccount.yaml", lambda ctx: [
        "The identity of the gate pods.",
    ], gate.service_account),
    Manifest("gate-clusterrole.yaml", lambda ctx: [
        "May read and patch nodes (the gate's label and taint) and patch their status (its condition), nothing",
        "else; a ClusterRole, since Nodes are cluster-scoped (a namespaced Role cannot name them).",
    ], gate.cluster_role),
    Manifest("gate-clusterrolebinding.yaml", lambda ctx: [
        f"Binds the ClusterRole to the ServiceAccount {gate.NAME} in namespace {ctx.gate.namespace}.",
    ], gate.cluster_role_binding),
    Manifest("gate-configmap.yaml", lambda ctx: [
        f"envbuild's in-image code and {gate.SPEC_KEY} (what each node must match, from the certificate),",
        f"mounted read-only at {objects.CODE_MOUNT}; named by their hash, so a new certificate rolls the pods.",
    ], gate.configmap),
    Manifest("gate-daemonset.yaml", lambda ctx: [
        f"One gate pod per node: a passing node is labelled {gate.LABEL}={ctx.gate.label_value}, a failing",
        f"one tainted {gate.TAINT}=<reason>:NoSchedule and given the condition {gate.CONDITION}=True;",
        f"checked again every {ctx.gate.interval_s} s.",
    ], gate.daemonset),
)}
#: The files of each mode, in the order they are applied.
MODES = {"job": ("configmap.yaml", "service.yaml", "job.yaml"), "kubeflow": ("configmap.yaml", "trainjob.yaml"),
         "gate": ("gate-namespace.yaml", "gate-serviceaccount.yaml", "gate-clusterrole.yaml",
                  "gate-clusterrolebinding.yaml", "gate-configmap.yaml", "gate-daemonset.yaml")}

_PLAIN_SAFE = re.compile(r"(?:[A-Za-z_/]|-+[A-Za-z])[A-Za-z0-9_./-]*")
_YAML11_SPECIAL = re.compile(r"y|n|yes|no|on|off|true|false|null|nan|inf", re.I)


class _Dumper(yaml.SafeDumper):
    """``yaml.SafeDumper`` with envbuild's string styles and :class:`~.objects.FileMode` in octal."""


def _represent_str(dumper: yaml.SafeDumper, value: str) -> yaml.ScalarNode:
    if "\n" in value:
        style = "|"  # PyYAML falls back to double quotes for text a block cannot carry
    elif _PLAIN_SAFE.fullmatch(value) and not _YAML11_SPECIAL.fullmatch(value):
        style = None
    else:
        style = '"'
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


def _represent_mode(dumper: yaml.SafeDumper, value: objects.FileMode) -> yaml.ScalarNode:
    return dumper.represent_scalar("tag:yaml.org,2002:int", f"0{int(value):o}")


_Dumper.add_representer(str, _represent_str)
_Dumper.add_representer(objects.FileMode, _represent_mode)


def dump(obj: Mapping[str, Any], comments: Sequence[str] = ()) -> str:
    """``obj`` as YAML after ``# `` comments; EnvbuildError (2): a comment line break, not read back."""
    if any("\n" in c or "\r" in c for c in comments):
        raise EnvbuildError("a manifest comment holds a line break", field="comment", value=list(comments))
    body = yaml.dump(obj, Dumper=_Dumper, sort_keys=False, default_flow_style=False, allow_unicode=True,
                     width=1 << 30, indent=2)
    if yaml.safe_load(body) != obj:
        raise EnvbuildError("does not read back as the object it was written from", field="manifest",
                            value=f"{obj.get('kind')} {(obj.get('metadata') or {}).get('name')}")
    return "".join(f"# {c}\n" for c in comments) + body


def render_manifests(spec: LaunchSpec, options: K8sOptions = DEFAULT_OPTIONS, code: Mapping[str, str] | None = None,
                     environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """EnvbuildError: (2) a tag-only image, code over a ConfigMap; (64) bad values, labels, run id, env."""
    ctx = objects.render_context(spec, options, code, environ)
    out = {}
    for name in MODES["kubeflow" if options.kubeflow else "job"]:
        m = MANIFESTS[name]
        header = [line.format(run_id=spec.run_id) for line in HEADER]
        out[name] = dump(m.build(ctx), header + m.comment(ctx))
    return out


def render_gate_manifests(spec: gate.GateSpec) -> dict[str, str]:
    """The gate's ``{file name: YAML text}`` in apply order; raises as :func:`.gate.gate_context`."""
    ctx = gate.gate_context(spec)
    out = {}
    for name in MODES["gate"]:
        if name == "gate-namespace.yaml" and spec.namespace != gate.NAMESPACE:
            continue
        m = MANIFESTS[name]
        header = [line.format(label=spec.label_value) for line in GATE_HEADER]
        out[name] = dump(m.build(ctx), header + m.comment(ctx))
    return out


def write_manifests(files: Mapping[str, str], out_dir: str | os.PathLike[str]) -> list[Path]:
    """Write ``files`` into ``out_dir`` (``-``: stdout), removing older manifests (``kubectl apply -f DIR``); exit 3."""
    if str(out_dir) == "-":
        sys.stdout.write("".join(f"---\n{text}" for text in files.values()))
        sys.stdout.flush()
        return []
    out = make_folder(out_dir)
    for stale in sorted(set(MANIFESTS) - set(files)):
        try:
            (out / stale).unlink(missing_ok=True)
        except OSError as e:
            raise Unreachable(f"cannot remove: {e.strerror or e}", file=str(out / stale)) from None
    return [write_atomic(out / name, text.encode("utf-8")) for name, text in files.items()]


def load_objects(files: Mapping[str, str]) -> list[dict[str, Any]]:
    """Parse rendered files into their objects (``yaml.safe_load_all``), in file order."""
    objs: list[dict[str, Any]] = []
    for text in files.values():
        objs.extend(o for o in yaml.safe_load_all(text) if o)
    return objs
