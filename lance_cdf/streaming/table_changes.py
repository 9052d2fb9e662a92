"""`lance_table_changes(path, start [, end])`: the change feed as a SQL table-valued
function (a Python UDTF), in the spirit of Delta's `table_changes`.

    SELECT * FROM lance_table_changes('/data/t.lance', 3, 7)

The same events, columns and order as `read_changes(path, start, end)`. `analyze`
(on the driver, at planning) fixes the columns from the table; `eval` reads the
range in one task. PySpark 4.3's Arrow-native UDTFs cannot declare their schema
from their arguments (SPARK-53286), so rows leave Python as tuples, converted a
column at a time; for large ranges `spark.read.format("lance-cdf")` (or a view
`USING lance-cdf`) reads in parallel, Arrow all the way.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from pyspark.sql.functions import udtf
from pyspark.sql.udtf import AnalyzeArgument, AnalyzeResult

from lance_cdf.errors import LanceCdfError
from lance_cdf.feed import ChangeFeed, read_changes
from lance_cdf.streaming.types import arrow_target, spark_schema, to_spark

NAME = "lance_table_changes"


@dataclass
class _Analyzed(AnalyzeResult):
    """What analyze found, handed to every instance: the range and its columns."""

    start: int = 0
    end: int = 0


def _constant(arg: AnalyzeArgument | None, what: str, kind: type, optional: bool = False):
    if arg is None or (optional and arg.isConstantExpression and arg.value is None):
        if optional:
            return None
        raise LanceCdfError(f"{NAME}(path, start [, end]): {what} is missing")
    if arg.isTable or not arg.isConstantExpression or arg.value is None:
        raise LanceCdfError(
            f"{NAME}(path, start [, end]): {what} must be a constant, e.g. "
            f"{NAME}('/data/t.lance', 3, 7)"
        )
    try:
        return kind(arg.value)
    except (TypeError, ValueError):
        raise LanceCdfError(f"{NAME}: {what} must be {kind.__name__}, got {arg.value!r}") from None


class LanceTableChanges:
    """The UDTF class (registered by `register`)."""

    def __init__(self, analyzed: _Analyzed):
        self.analyzed = analyzed

    @staticmethod
    def analyze(path, start, end=None) -> _Analyzed:
        uri = _constant(path, "path", str)
        first = _constant(start, "start (a version >= 1)", int)
        last = _constant(end, "end (a version)", int, optional=True)
        feed = ChangeFeed(uri)
        if last is None:
            last = feed.latest_version()
        first, last = feed.resolve_range(first, last)
        schema = spark_schema(feed.user_schema(first, last))
        return _Analyzed(schema=schema, start=first, end=last)

    def eval(self, path: str, start, end=None) -> Iterator[tuple]:
        target = arrow_target(self.analyzed.schema)
        for batch in read_changes(path, self.analyzed.start, self.analyzed.end):
            columns = [c.to_pylist() for c in to_spark(batch, target).columns]
            yield from zip(*columns, strict=True)


def register(spark) -> None:
    """`lance_table_changes` in this session's SQL."""
    spark.udtf.register(NAME, udtf(LanceTableChanges, useArrow=True))
