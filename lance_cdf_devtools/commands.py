"""The `lance-cdf` command lines the tests, the demo and the benchmarks start: one builder,
so a flag every run needs is written once."""

from __future__ import annotations

import os
import sys


def lance_cdf(*args: str) -> list[str]:
    """`lance-cdf ARGS` run by this interpreter."""
    return [sys.executable, "-m", "lance_cdf.cli", *args]


def publish(
    bootstrap: str,
    registry: str,
    checkpoint: str | os.PathLike[str],
    *,
    table: str | None = None,
    topic: str | None = None,
    database: str | None = None,
    prefix: str | None = None,
    extra: tuple[str, ...] | list[str] = (),
) -> list[str]:
    """`lance-cdf publish` of one table (`table`, `topic`) or a database (`database`,
    `prefix`) to a broker and registry, with its checkpoint; `extra` flags last."""
    if (table is None) == (database is None):
        raise ValueError("publish: give a table or a database")
    source = (
        ["--table", table, "--topic", topic or ""]
        if table is not None
        else ["--database", database or "", "--topic-prefix", prefix or ""]
    )
    return lance_cdf(
        "publish",
        *source,
        *("--bootstrap-servers", bootstrap, "--schema-registry", registry),
        *("--checkpoint", str(checkpoint)),
        *extra,
    )


def spark_env(**more: str) -> dict[str, str]:
    """The environment a publisher runs in: Spark's Python workers on this interpreter."""
    return {
        **os.environ,
        "PYSPARK_PYTHON": sys.executable,
        "PYSPARK_DRIVER_PYTHON": sys.executable,
        **more,
    }
