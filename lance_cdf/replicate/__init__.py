"""Replication: a Kafka consumer that decodes batches of change records (replicator.py)
and applies each batch's final row states to a Lance table (replica.py), exactly once in
effect."""
