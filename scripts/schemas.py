"""Write the published JSON Schemas, ``schemas/<name>.schema.json``, from the models (``make golden``).

The one generator of ``schemas/``: each stage's model module names its documents in
``schemas()`` (file stem -> model, ``$id``, title) and :func:`files` gathers them all (recipe,
lock, resolved, certify-settings, certificate, rank-result, node-report, verify-result,
attestation, the ``--json`` documents of the commands, and the audit report, whose file keeps
its sorted keys). The files are written as
one set, only those that changed; a file in ``schemas/`` that no model gives is an error (exit 2),
not deleted. The unit test ``tests/unit/test_schemas.py`` fails when a file is stale, and
the other schema tests compare against :func:`files`.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

if __package__ in (None, ""):  # run as a script: the repository root holds builder/
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from builder.core.files import changed_files, write_set  # noqa: E402
from builder.core.model import SchemaEntries, schema_files  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
FOLDER = ROOT / "schemas"


def entries() -> SchemaEntries:
    """Every published schema written through :func:`builder.core.model.schema_files`, by file stem."""
    from builder.cli.documents import schemas as command_schemas
    from builder.core.certificate import schemas as certify_schemas
    from builder.core.documents import schemas as launcher_schemas
    from builder.core.events import schemas as event_schemas
    from builder.nodes.schemas import schemas as node_schemas
    from builder.publish.attest import schemas as attestation_schemas
    from builder.recipe.model import schemas as recipe_schemas

    return {**recipe_schemas(), **certify_schemas(), **launcher_schemas(), **node_schemas(),
            **attestation_schemas(), **event_schemas(), **command_schemas()}


def files() -> dict[str, bytes]:
    """``{"<stem>.schema.json": bytes}`` of every file of ``schemas/``, as the models give them now."""
    from builder.audit import model as audit_model

    out = schema_files(entries())
    out["audit.schema.json"] = (json.dumps(audit_model.schema(), indent=2, sort_keys=True) + "\n").encode()
    return dict(sorted(out.items()))


def stale(folder: Path = FOLDER) -> list[str]:
    """Names of the files under ``folder`` that differ from :func:`files` (or are missing)."""
    return changed_files(folder, files())


def unknown(folder: Path = FOLDER) -> list[str]:
    """Names of ``*.schema.json`` files under ``folder`` that no model gives."""
    return sorted(p.name for p in folder.glob("*.schema.json") if p.name not in files())


def main() -> int:
    extra = unknown()
    if extra:
        print(f"error: schemas/: no model gives {', '.join(extra)}; remove it or add its model", file=sys.stderr)
        return 2
    written = write_set(FOLDER, files())
    for name in written:
        print(f"wrote {FOLDER.relative_to(ROOT) / name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
