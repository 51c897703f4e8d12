"""The published JSON Schemas of the nodes stage (node report, verify result)."""

from __future__ import annotations

from typing import Any

from builder.core.documents import NodeReport

from .verify.result import VerifyResult

SCHEMA_BASE = "https://envbuild.dev/schemas/"


def schemas() -> dict[str, tuple[type[Any], str, str]]:
    """``{file stem: (model, $id, title)}`` for :func:`builder.core.model.json_schema`."""
    return {
        "node-report": (NodeReport, f"{SCHEMA_BASE}node-report.schema.json", "envbuild node report (envbuild.probe/1)"),
        "verify-result": (VerifyResult, f"{SCHEMA_BASE}verify-result.schema.json",
                          "envbuild verify result (envbuild.verify/1)"),
    }
