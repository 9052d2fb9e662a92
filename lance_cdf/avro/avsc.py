"""The record schemas lance-cdf writes, as files: the project's schemas/ directory (the
change events' envelope, source and key; the transaction topic's key and value), linked
into the package as avro/schemas. Loaded as JSON data, without pyarrow: Spark's commit
process writes transaction records with them."""

from __future__ import annotations

import json
from importlib import resources
from typing import Any

# importlib.resources also reads them from a --py-files zip
SCHEMAS = resources.files("lance_cdf.avro") / "schemas"


def load_avsc(name: str) -> dict[str, Any]:
    """schemas/`name`.avsc as JSON data, its keys in the file's order (the order a
    registered schema's text has)."""
    schema: dict[str, Any] = json.loads((SCHEMAS / f"{name}.avsc").read_text())
    return schema
