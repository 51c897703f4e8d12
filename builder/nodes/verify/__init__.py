"""Compare node reports: which node differs in what, and how bad that is.

Rules (each with its source), applied to every node with a valid report:

========================  ======================================================  =====
rule                      fields                                                   level
========================  ======================================================  =====
must-match                ``torch.version``, ``torch.cuda``, ``nccl.loaded``        fail
                          (the NCCL x.y.z each rank loads), ``torch.cudnn``,
                          ``python.version``, ``image.digest``,
                          ``nccl.net_plugin`` (the network plugin NCCL loads:
                          file, name, API, SHA-256), ``NCCL_NET``,
                          ``NCCL_NET_PLUGIN``, ``NCCL_IB_DISABLE``
floor                     ``driver`` >= the minimum of the CUDA torch was built     fail
                          for (``cuda_driver`` in ``builder/recipe/data/compat.yaml``:
                          below the minor-version-compatibility floor fails,
                          below the GA driver warns); against a reference also
                          the image's ``NVIDIA_REQUIRE_CUDA`` (:mod:`.floor`)
interface                 ``NCCL_SOCKET_IFNAME`` / ``GLOO_SOCKET_IFNAME`` that       fail
                          match no interface of the node
should-match              ``driver.branch``, ``kernel``, ``os``, ``glibc``,          warn
                          ``torch.nccl_compiled``, ``gpu.models``, ``image.id``,
                          every other ``NCCL_*``/``GLOO_*``/``TORCH_*`` variable,
                          ``LD_LIBRARY_PATH``
nccl-copies               several libnccl files or ``nvidia-nccl-*`` packages on     warn
                          one node (torch loads one, the system may load another)
cuda-runtime-copies       several ``libcudart`` mapped in one process                warn
validity                  (``--against CERT``) a failed certificate; one older       fail/warn
                          than ``--max-age`` or of unknown age (warn)
probe-errors              the probe met problems on a node                           warn
informational             hostname, addresses, image reference, driver, /dev/shm    (shown)
unreachable / invalid     a node that could not be checked                          unknown
========================  ======================================================  =====

Sources: NVIDIA/nccl ``src/init.cc`` ("Mismatched NCCL version detected" from 2.23.4) and
NVIDIA/nccl#1267, #1328 (mixed NCCL before that); pytorch#116977 (compiled vs loaded NCCL);
NVIDIA CUDA release notes Table 3 and the minor-version-compatibility guide (driver
floors); Google cluster-health-scanner ``configcheck`` (driver, CUDA, NCCL, NCCL env and
container diffed against a golden config); NCCL ``src/misc/socket.cc`` (interface
selection, ``NCCL_SOCKET_IFNAME`` syntax); PyTorch ``ProcessGroupGloo`` (GLOO_SOCKET_IFNAME).

Against a reference (``--against``, :mod:`.against`) every node is compared with it
instead of with the others, each finding naming the reference's value; the image's
fields only between reports of the same scope (host or in-image).

Exit codes in the style of Meta GCM health checks, worst wins: 0 all match, 1 warnings
only, 2 a must-match, floor or interface rule broken, 3 a node could not be checked.
"""

from __future__ import annotations

import datetime
from collections.abc import Callable
from typing import TYPE_CHECKING

from ..report import Node
from .against import DEFAULT_MAX_AGE_S, compare_to, scope_notes, validity_findings
from .drift import drift, split_history
from .floor import CudaRequirement, driver_floor_findings
from .interfaces import InterfacePick, gloo_interface, nccl_interface, ordered_interfaces, usable_addresses
from .render import cell, render
from .result import FAIL, UNKNOWN, WARN, Finding, NodeSummary, VerifyResult, exit_code, node_summary
from .rules import (
    MUST_MATCH,
    SHOULD_MATCH,
    TORCHRUN_ENV,
    Rule,
    compare,
    cuda_runtime_findings,
    env_names,
    env_rule,
    missing_interface_findings,
    nccl_copies_findings,
    probe_error_findings,
    unreachable_findings,
)

if TYPE_CHECKING:
    from ..reference import Reference

__all__ = ["DEFAULT_MAX_AGE_S", "FAIL", "WARN", "UNKNOWN", "CudaRequirement", "Finding", "InterfacePick",
           "NodeSummary", "VerifyResult", "cell", "exit_code", "gloo_interface", "nccl_interface", "node_summary",
           "ordered_interfaces", "render", "split_history", "usable_addresses", "verify"]


def _env_findings(nodes: list[Node], cmp: Callable[[Rule, str], list[Finding]],
                  reference: Reference | None) -> list[Finding]:
    reports = [n.report for n in nodes if n.ok and n.report is not None]
    out: list[Finding] = []
    for var in env_names(reports + ([reference.report] if reference else []), TORCHRUN_ENV if reference else ()):
        rule = env_rule(var)
        out += cmp(rule, "must-match" if rule.level == FAIL else "should-match")
    return out


def verify(nodes: list[Node], floors: dict[str, dict] | None = None, reference: Reference | None = None,
           max_age_s: float = DEFAULT_MAX_AGE_S, now: datetime.datetime | None = None) -> VerifyResult:
    """Compare ``nodes`` by every rule in the module docstring: with each other, or with
    ``reference`` (``--against``: every node against it, also a single node).

    Args:
        nodes: gathered nodes (:mod:`builder.nodes.sources`); those with ``error`` are
            reported as unknown and left out of the comparison. Against a reference, the
            report files of one host's history (:func:`.drift.split_history`) count as
            one node, its latest report, with its drift.
        floors: driver floors per CUDA version (default: the bundled facts).
        reference: what to compare with (:mod:`builder.nodes.reference`); its CUDA
            requirement is the driver floor of every node, its validity is checked
            (``max_age_s``, as of ``now``).

    Returns:
        The ``envbuild.verify/1`` document (:class:`VerifyResult`); ``exit_code`` 0/1/2/3.
    """
    histories: dict[str, list[Node]] = {}
    if reference is not None:
        nodes, histories = split_history(nodes)
        cmp = lambda rule, kind: compare_to(nodes, reference, rule, kind)  # noqa: E731
    else:
        cmp = lambda rule, kind: compare(nodes, rule, kind)  # noqa: E731
    findings: list[Finding] = validity_findings(reference, max_age_s, now) if reference else []
    for rule in MUST_MATCH:
        findings += cmp(rule, "must-match")
    findings += driver_floor_findings(nodes, floors, reference.requirement if reference else None)
    findings += missing_interface_findings(nodes)
    for rule in SHOULD_MATCH:
        findings += cmp(rule, "should-match")
    findings += _env_findings(nodes, cmp, reference)
    findings += nccl_copies_findings(nodes) + cuda_runtime_findings(nodes)
    findings += probe_error_findings(nodes) + unreachable_findings(nodes)
    order = {FAIL: 0, WARN: 1, UNKNOWN: 2}
    findings.sort(key=lambda f: order[f.level])  # stable: rule order kept within a level
    return VerifyResult(schema="envbuild.verify/1", exit_code=int(exit_code(findings)),
                        nodes=[node_summary(n) for n in nodes], findings=findings,
                        reference=reference.summary(now) if reference else None,
                        drift=drift(histories, reference) if reference else [],
                        notes=scope_notes(nodes, reference) if reference else [])
