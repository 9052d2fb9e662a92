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
from typing import TYPE_CHECKING, TypeVar, cast

from pyspark.sql.functions import udtf
from pyspark.sql.udtf import AnalyzeArgument, AnalyzeResult

from lance_cdf.core.feed import ChangeFeed, read_changes
from lance_cdf.errors import LanceCdfError
from lance_cdf.spark.source.types import arrow_target, spark_schema, to_spark

if TYPE_CHECKING:
    from pyspark.sql import SparkSession
    from pyspark.sql.udtf import UserDefinedTableFunction

NAME = "lance_table_changes"
_T = TypeVar("_T", str, int)  # the types of a constant argument


@dataclass
class _Analyzed(AnalyzeResult):
    """What analyze found, handed to every instance: the range and its columns."""

    start: int = 0
    end: int = 0


def _optional(arg: AnalyzeArgument | None, what: str, kind: type[_T]) -> _T | None:
    if arg is None or (arg.isConstantExpression and arg.value is None):
        return None
    return _constant(arg, what, kind)


def _constant(arg: AnalyzeArgument | None, what: str, kind: type[_T]) -> _T:
    if arg is None:
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
    def analyze(
        path: AnalyzeArgument, start: AnalyzeArgument, end: AnalyzeArgument | None = None
    ) -> _Analyzed:
        uri = _constant(path, "path", str)
        first = _constant(start, "start (a version >= 1)", int)
        last = _optional(end, "end (a version)", int)
        feed = ChangeFeed(uri)
        if last is None:
            last = feed.latest_version()
        first, last = feed.resolve_range(first, last)
        schema = spark_schema(feed.user_schema(first, last))
        return _Analyzed(schema=schema, start=first, end=last)

    def eval(self, path: str, start: int, end: int | None = None) -> Iterator[tuple[object, ...]]:
        target = arrow_target(self.analyzed.schema)
        for batch in read_changes(path, self.analyzed.start, self.analyzed.end):
            columns = [c.to_pylist() for c in to_spark(batch, target).columns]
            yield from zip(*columns, strict=True)


def register(spark: SparkSession) -> None:
    """`lance_table_changes` in this session's SQL."""
    # pyspark annotates udtf() without overloads: given a class it returns the UDTF, not
    # the decorator its Union also allows
    function = cast("UserDefinedTableFunction", udtf(LanceTableChanges, useArrow=True))
    spark.udtf.register(NAME, function)
