"""This node against a certificate, at pull: the NVIDIA driver floor and the GPU models."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from packaging.version import InvalidVersion, Version


def node_report() -> dict[str, Any]:
    from builder.agent import probe

    return probe.collect()


def _gpu_names(cert: Mapping[str, Any]) -> set[str]:
    return {str(g["name"]) for doc in (cert.get("probe") or {}).values() for g in (doc or {}).get("gpus") or []
            if isinstance(g, dict) and g.get("name")}


def _version(text: Any) -> Version | None:
    try:
        return Version(str(text))
    except (InvalidVersion, TypeError):
        return None


def _below(driver: Any, floor: str) -> bool:
    have, need = _version(driver), _version(floor)
    return have is None or need is None or have < need


def check_hardware(cert: Mapping[str, Any], host: Mapping[str, Any]) -> list[str]:
    """Reasons this node is not covered by the certificate ([] = covered). A driver below the image's floor (the lock's
    ``driver.min``, else the label), or for CUDA images a GPU model no rank of the certification ran on."""
    lock = cert.get("lock") or {}
    labels = (cert.get("image") or {}).get("labels") or {}
    floor = (lock.get("driver") or {}).get("min") or labels.get("envbuild.driver.min")
    floor = None if floor in (None, "none") else str(floor)
    issues = []
    driver = host.get("driver")
    if floor:
        if not driver:
            issues.append(f"the image needs an NVIDIA driver >= {floor}; this node has none")
        elif _below(driver, floor):
            issues.append(f"driver {driver} is below the image's floor {floor}")
    host_gpus = [str(g.get("name")) for g in host.get("gpus") or [] if isinstance(g, dict)]
    if lock.get("cuda") and host_gpus:
        covered = _gpu_names(cert)
        if not covered:
            used = (cert.get("backend") or {}).get("used")
            issues.append(f"the certificate covers no GPU (certified with {used} on CPUs); this node has "
                          f"{', '.join(sorted(set(host_gpus)))}")
        else:
            missing = sorted({g for g in host_gpus if g not in covered})
            if missing:
                issues.append(f"GPU {', '.join(missing)} is not covered by the certificate "
                              f"({', '.join(sorted(covered))})")
    return issues
