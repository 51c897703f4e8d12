"""Kubernetes launcher: a certification run as an Indexed Job with a headless Service (built-in
kinds; Kubernetes docs "Job with Pod-to-Pod Communication") or a Kubeflow TrainJob, and the
node gate DaemonSet. ``kubernetes`` is imported lazily."""

from .api import find_kubeconfig
from .gate import GateSpec, gate_context
from .launcher import K8sLauncher
from .manifests import render_gate_manifests, render_manifests, write_manifests
from .options import K8sOptions, Placement, check_options, check_run_id, require_digest

__all__ = ["GateSpec", "K8sLauncher", "K8sOptions", "Placement", "check_options", "check_run_id", "find_kubeconfig",
           "gate_context", "render_gate_manifests", "render_manifests", "require_digest", "write_manifests"]
