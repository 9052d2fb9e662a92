"""lance-cdf: a row-level change data feed for Lance tables.

The public names:

- `read_changes(uri, start_version, end_version, ...)`: the changes of a version range as a
  `pyarrow.RecordBatchReader` (`lance_cdf.core.feed.read_changes`);
- `ChangeFeed(uri)`: a table held open for many calls: plans and events per commit
  (`lance_cdf.core.feed.ChangeFeed`);
- `LanceCdfError`: the base class of every error lance-cdf raises on purpose (the others
  are in `lance_cdf.errors`);
- `keep_freed_memory()`: opt in, once per process, to glibc keeping freed decode buffers
  (`lance_cdf.ops.malloc`);
- `list_tables(root)`, `resolve_table(root, name)`, `TableRef`: the tables of a LanceDB
  database / Lance directory namespace by name (`lance_cdf.format.namespace`);
- `plan_version(...)`: what one commit changed, before any row is read
  (`lance_cdf.core.plan`);
- `PipelineMetrics`: the Prometheus endpoint `publish` and `replicate` serve
  (`lance_cdf.ops.metrics`).

The Spark source and sink are in `lance_cdf.spark`, the replicator in
`lance_cdf.replicate`.
"""

from typing import TYPE_CHECKING

from lance_cdf.errors import LanceCdfError

if TYPE_CHECKING:  # loaded lazily by __getattr__; named here for type checkers
    from lance_cdf.core.feed import ChangeFeed, read_changes
    from lance_cdf.core.plan import plan_version
    from lance_cdf.format.namespace import TableRef, list_tables, resolve_table
    from lance_cdf.ops.malloc import keep_freed_memory
    from lance_cdf.ops.metrics import PipelineMetrics

__version__ = "0.1.0"

__all__ = [
    "ChangeFeed",
    "LanceCdfError",
    "PipelineMetrics",
    "TableRef",
    "__version__",
    "keep_freed_memory",
    "list_tables",
    "plan_version",
    "read_changes",
    "resolve_table",
]


def __getattr__(name: str) -> object:
    """`ChangeFeed` and `read_changes` load the change-feed core on first use, so a process
    that imports one part (a Spark worker of the Kafka sink) does not pay for the rest."""
    if name in ("ChangeFeed", "read_changes"):
        from lance_cdf.core import feed

        return getattr(feed, name)
    if name == "keep_freed_memory":
        from lance_cdf.ops import malloc

        return malloc.keep_freed_memory
    if name == "plan_version":
        from lance_cdf.core import plan

        return plan.plan_version
    if name == "PipelineMetrics":
        from lance_cdf.ops import metrics

        return metrics.PipelineMetrics
    if name in ("TableRef", "list_tables", "resolve_table"):
        from lance_cdf.format import namespace

        return getattr(namespace, name)
    raise AttributeError(f"module 'lance_cdf' has no attribute {name!r}")
