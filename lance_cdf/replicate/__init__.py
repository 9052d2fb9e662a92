"""Replication: Kafka change records applied to a Lance replica, exactly once in effect.
`Replicator` follows one topic into one replica, `DatabaseReplicator` every table topic
of a database; both are told by `ReplicateSettings` and run the one poll loop
(`poll_loop.run_polls`).

The public names: `Replicator`, `DatabaseReplicator`, their settings `ReplicateSettings`
(made of `KafkaSettings`, `BatchSettings`, `ReplicaSettings`, `DatabaseSettings`) and the
progress they report, `Counters`. Each loads its part on first use.
"""

from typing import TYPE_CHECKING

if TYPE_CHECKING:  # loaded lazily by __getattr__; named here for type checkers
    from lance_cdf.replicate.counters import Counters
    from lance_cdf.replicate.database_replicator import DatabaseReplicator
    from lance_cdf.replicate.replicate_settings import (
        BatchSettings,
        DatabaseSettings,
        KafkaSettings,
        ReplicaSettings,
        ReplicateSettings,
    )
    from lance_cdf.replicate.replicator import Replicator

__all__ = [
    "BatchSettings",
    "Counters",
    "DatabaseReplicator",
    "DatabaseSettings",
    "KafkaSettings",
    "ReplicaSettings",
    "ReplicateSettings",
    "Replicator",
]

# public name -> the module that defines it
_LAZY = {
    "Counters": "lance_cdf.replicate.counters",
    "DatabaseReplicator": "lance_cdf.replicate.database_replicator",
    "Replicator": "lance_cdf.replicate.replicator",
    **{
        name: "lance_cdf.replicate.replicate_settings"
        for name in (
            "BatchSettings",
            "DatabaseSettings",
            "KafkaSettings",
            "ReplicaSettings",
            "ReplicateSettings",
        )
    },
}


def __getattr__(name: str) -> object:
    import importlib

    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'lance_cdf.replicate' has no attribute {name!r}")
