"""The change feed: manifests diffed into a plan (plan), the changed rows read (rows),
turned into insert / update / delete events (events, modes, candidates, snapshot) and served
by `ChangeFeed` / `read_changes` (feed). Knows nothing about Spark or Kafka."""
