"""Replication: Kafka change records applied to a Lance replica, exactly once in effect.
`Replicator` (replicator.py) follows one topic into one replica, `DatabaseReplicator`
(database_replicator.py) every table topic of a database; both are told by
`ReplicateSettings` (replicate_settings.py) and run the one poll loop (poll_loop.py)."""
