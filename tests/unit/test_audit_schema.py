"""schemas/audit.schema.json is the JSON Schema of the audit report model
(builder.audit.model.Report), kept current: regenerate with `make golden` (scripts/schemas.py,
the one schema generator) and review the diff."""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCHEMA = ROOT / "schemas" / "audit.schema.json"
sys.path.insert(0, str(ROOT))

from builder.audit import model  # noqa: E402
from scripts import schemas as generator  # noqa: E402


def _text() -> str:
    return generator.files()["audit.schema.json"].decode()


def test_the_committed_schema_is_the_model_s():
    assert SCHEMA.read_text() == _text(), "stale: run `make golden`"


def test_a_changed_model_makes_the_schema_stale(monkeypatch):
    monkeypatch.setattr(model, "SCHEMA_ID", "https://example.invalid/audit.schema.json")
    assert SCHEMA.read_text() != _text()

