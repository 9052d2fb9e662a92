"""Human-readable rendering of change events for the terminal."""

from __future__ import annotations

from typing import TextIO

import pyarrow as pa
from rich.console import Console
from rich.table import Table

from lance_cdf.core.change_types import ChangeType
from lance_cdf.core.events import CHANGE_TYPE, COMMIT_VERSION, META_COLUMNS, ROWID

STYLES = {
    ChangeType.INSERT: "green",
    ChangeType.DELETE: "red",
    "update": "yellow",  # an update's two images, printed as one line
    ChangeType.SNAPSHOT: "cyan",
}
MAX_CELL = 40


def _cell(value: object) -> str:
    if isinstance(value, list) and len(value) > 4:
        text = "[" + ", ".join(_cell(v) for v in value[:3]) + f", … ({len(value)} items)]"
    elif isinstance(value, float):
        text = f"{value:.6g}"
    else:
        text = "null" if value is None else str(value)
    return text if len(text) <= MAX_CELL else text[: MAX_CELL - 1] + "…"


def render_changes(reader: pa.RecordBatchReader, out: TextIO, limit: int | None = None) -> int:
    """Print events as a table: one line per insert/delete, one per update
    (changed columns shown as before → after). Returns the rows printed."""
    columns = [n for n in reader.schema.names if n not in META_COLUMNS]
    table = Table(show_lines=False, header_style="bold")
    for name in ["version", "change", ROWID, *columns]:
        table.add_column(name, overflow="fold")
    pending_pre = None
    printed = 0
    for batch in reader:
        for row in batch.to_pylist():
            kind = row[CHANGE_TYPE]
            if kind == ChangeType.UPDATE_PRE:
                pending_pre = row
                continue
            if kind == ChangeType.UPDATE_POST:
                pre = pending_pre or {}
                cells = []
                for c in columns:
                    before, after = pre.get(c), row[c]
                    cells.append(
                        _cell(after) if before == after else f"{_cell(before)} → {_cell(after)}"
                    )
                label, pending_pre = "update", None
            else:
                cells, label = [_cell(row[c]) for c in columns], kind
            table.add_row(
                str(row[COMMIT_VERSION]), label, str(row[ROWID]), *cells, style=STYLES.get(label)
            )
            printed += 1
            if limit is not None and printed >= limit:
                break
    console = Console(file=out, soft_wrap=False)
    console.print(table)
    console.print(f"{printed} change(s)")
    return printed
