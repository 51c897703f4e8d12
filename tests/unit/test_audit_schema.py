"""schemas/audit.schema.json is the JSON Schema of the audit report model
(builder.audit.model.Report), kept current: regenerate with
`python tests/test_audit_schema.py --regen` (or `make golden`) and review the diff."""

from __future__ import annotations

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCHEMA = ROOT / "schemas" / "audit.schema.json"
sys.path.insert(0, str(ROOT))

from builder.audit import model  # noqa: E402


def _text() -> str:
    return json.dumps(model.schema(), indent=2, sort_keys=True) + "\n"


def test_the_committed_schema_is_the_model_s():
    assert SCHEMA.read_text() == _text(), "stale: run `python tests/test_audit_schema.py --regen`"


def test_a_changed_model_makes_the_schema_stale(monkeypatch):
    monkeypatch.setattr(model, "SCHEMA_ID", "https://example.invalid/audit.schema.json")
    assert SCHEMA.read_text() != _text()


if __name__ == "__main__":
    if sys.argv[1:] == ["--regen"]:
        SCHEMA.write_text(_text())
        print(f"wrote {SCHEMA.relative_to(ROOT)}")
