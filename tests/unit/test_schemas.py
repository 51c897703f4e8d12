"""schemas/ is what the one generator (scripts/schemas.py, part of `make golden`) writes from
the models: every file current, none that no model gives."""

from __future__ import annotations

import shutil
from pathlib import Path

from scripts import schemas as generator

ROOT = Path(__file__).resolve().parents[2]

PUBLISHED = ["attestation.schema.json", "audit.schema.json", "build.schema.json", "certificate.schema.json",
             "certify-settings.schema.json", "certify.schema.json", "check.schema.json", "doctor.schema.json",
             "error.schema.json", "gate.schema.json", "lock.schema.json", "log-event.schema.json",
             "make.schema.json", "node-report.schema.json", "pull.schema.json", "push.schema.json",
             "rank-result.schema.json", "rebuild.schema.json", "recipe.schema.json", "render.schema.json", "report.schema.json",
             "resolved.schema.json", "verify-result.schema.json"]


def test_every_published_schema_is_the_generators():
    assert sorted(generator.files()) == PUBLISHED
    assert sorted(p.name for p in (ROOT / "schemas").glob("*.json")) == PUBLISHED
    assert generator.stale() == [] and generator.unknown() == [], "run `make golden` and review the diff"


def test_a_stale_missing_or_unknown_schema_is_named(tmp_path):
    folder = tmp_path / "schemas"
    shutil.copytree(ROOT / "schemas", folder)
    path = folder / "rank-result.schema.json"
    path.write_text(path.read_text().replace('"minimum": 0', '"minimum": 1', 1))
    (folder / "audit.schema.json").unlink()
    (folder / "old.schema.json").write_text("{}\n")
    assert generator.stale(folder) == ["audit.schema.json", "rank-result.schema.json"]
    assert generator.unknown(folder) == ["old.schema.json"]
