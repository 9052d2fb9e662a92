"""A replicator's progress since start (`Replicator.counters`, updated after every batch),
and the sum over a database replicator's tables."""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass
class Counters:
    """Progress since start; `Replicator.counters` is updated after every batch."""

    batches: int = 0
    records: int = 0
    upserts: int = 0
    deletes: int = 0
    tombstones: int = 0
    skipped: int = 0
    dead_letters: int = 0
    source_version: int = 0
    lag: int = 0
    delivery_failures: int = 0  # offset commits and dead-letter writes that failed
    registry_retries: int = 0  # schema fetches asked again while the registry was down
    # consumers renewed after a fatal consumer error (consumers.Renewals)
    consumer_restarts: int = 0
    last_error: float = 0.0  # unix time of the last of those (0: none)
    started: float = field(default_factory=time.time)
    # where the time went (seconds since start): waiting for / fetching records,
    # decoding them to final row states, the Lance apply (lookup, write, commit),
    # the Kafka offset commit, replica upkeep (index delta, compaction)
    poll_s: float = 0.0
    decode_s: float = 0.0
    apply_s: float = 0.0
    offset_commit_s: float = 0.0
    upkeep_s: float = 0.0
    fresh_upserts: int = 0  # upserts written without a key lookup (new source rows)
    # records held at the stop whose version's END never came (`Unfinished`)
    unfinished_records: int = 0
    # the replica's secondary indexes (`IndexKeeper`): built or rebuilt from the source's
    # definition or --index, optimize_indices runs, and definitions not built now
    index_builds: int = 0
    index_optimizes: int = 0
    indexes_unbuilt: int = 0

    def failed(self) -> None:
        self.delivery_failures += 1
        self.last_error = time.time()

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


# the counts a database replicator sums over its tables
_SUMMED = (
    "batches",
    "records",
    "upserts",
    "deletes",
    "tombstones",
    "skipped",
    "dead_letters",
    "delivery_failures",
    "registry_retries",
    "index_builds",
    "index_optimizes",
    "indexes_unbuilt",
    "consumer_restarts",
)


def add_counters(total: Counters, c: Counters) -> None:
    """`c`'s counts added to `total` (its last error: the later of the two)."""
    for name in _SUMMED:
        setattr(total, name, getattr(total, name) + getattr(c, name))
    total.last_error = max(total.last_error, c.last_error)
