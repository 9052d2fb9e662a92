"""Where a benchmark's raw results go: `--out PATH` (JSON, the Benchmarks page cites it)."""

from __future__ import annotations

import json
from typing import Any


def write_result(path: str | None, doc: Any, indent: int = 2) -> None:
    """`doc` as JSON at `path` (None: nowhere, the bench printed it)."""
    if path:
        with open(path, "w") as f:
            json.dump(doc, f, indent=indent)
