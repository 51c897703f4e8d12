"""Write the published JSON Schemas, ``schemas/<name>.schema.json``, from the models (``make golden``).

Each stage's model module names its documents in ``schemas()`` (file stem -> model, ``$id``,
title); the files are written as one set, only those that changed. A unit test fails when
a file is stale (``tests/test_recipe.py``).
"""

from __future__ import annotations

import sys
from pathlib import Path

from builder.core.files import write_set
from builder.core.model import SchemaEntries, schema_files
from builder.recipe.model import schemas as recipe_schemas

ROOT = Path(__file__).resolve().parent.parent
FOLDER = ROOT / "schemas"


def entries() -> SchemaEntries:
    """Every published schema, by file stem."""
    return {**recipe_schemas()}


def main() -> int:
    written = write_set(FOLDER, schema_files(entries()))
    for name in written:
        print(f"wrote {FOLDER.relative_to(ROOT) / name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
