"""Compare node reports: which node differs in what, and how bad that is.

Rules (each with its source), applied to every node with a valid report:

========================  ======================================================  =====
rule                      fields                                                   level
========================  ======================================================  =====
must-match                ``torch.version``, ``torch.cuda``, ``nccl.loaded``        fail
                          (the NCCL x.y.z each rank loads), ``torch.cudnn``,
                          ``python.version``, ``image.digest``
floor                     ``driver`` >= the minimum of the CUDA torch was built     fail
                          for (``cuda_driver`` in ``builder/recipe/data/compat.yaml``:
                          below the minor-version-compatibility floor fails,
                          below the GA driver warns)
interface                 ``NCCL_SOCKET_IFNAME`` / ``GLOO_SOCKET_IFNAME`` that       fail
                          match no interface of the node
should-match              ``driver.branch``, ``kernel``, ``os``, ``glibc``,          warn
                          ``torch.nccl_compiled``, ``gpu.models``, ``image.id``,
                          every ``NCCL_*``/``GLOO_*``/``TORCH_*`` variable
nccl-copies               several libnccl files or ``nvidia-nccl-*`` packages on     warn
                          one node (torch loads one, the system may load another)
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

Exit codes in the style of Meta GCM health checks, worst wins: 0 all match, 1 warnings
only, 2 a must-match, floor or interface rule broken, 3 a node could not be checked.
"""

from __future__ import annotations

from ..report import Node
from .interfaces import InterfacePick, gloo_interface, nccl_interface, ordered_interfaces, usable_addresses
from .render import cell, render
from .result import FAIL, UNKNOWN, WARN, Finding, NodeSummary, VerifyResult, exit_code, node_summary
from .rules import (
    MUST_MATCH,
    SHOULD_MATCH,
    compare,
    driver_floor_findings,
    env_findings,
    missing_interface_findings,
    nccl_copies_findings,
    probe_error_findings,
    unreachable_findings,
)

__all__ = ["FAIL", "WARN", "UNKNOWN", "Finding", "InterfacePick", "NodeSummary", "VerifyResult", "cell",
           "exit_code", "gloo_interface", "nccl_interface", "node_summary", "ordered_interfaces", "render",
           "usable_addresses", "verify"]


def verify(nodes: list[Node], floors: dict[str, dict] | None = None) -> VerifyResult:
    """Compare ``nodes`` by every rule in the module docstring.

    Args:
        nodes: gathered nodes (:mod:`builder.nodes.sources`); those with ``error`` are
            reported as unknown and left out of the comparison.
        floors: driver floors per CUDA version (default: the bundled facts).

    Returns:
        The ``envbuild.verify/1`` document (:class:`VerifyResult`); ``exit_code`` 0/1/2/3.
    """
    findings: list[Finding] = []
    for rule in MUST_MATCH:
        findings += compare(nodes, rule, "must-match")
    findings += driver_floor_findings(nodes, floors)
    findings += missing_interface_findings(nodes)
    for rule in SHOULD_MATCH:
        findings += compare(nodes, rule, "should-match")
    findings += env_findings(nodes)
    findings += nccl_copies_findings(nodes)
    findings += probe_error_findings(nodes)
    findings += unreachable_findings(nodes)
    order = {FAIL: 0, WARN: 1, UNKNOWN: 2}
    findings.sort(key=lambda f: order[f.level])  # stable: rule order kept within a level
    return VerifyResult(schema="envbuild.verify/1", exit_code=int(exit_code(findings)),
                        nodes=[node_summary(n) for n in nodes], findings=findings)
