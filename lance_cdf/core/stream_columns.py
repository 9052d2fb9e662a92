"""The names of the columns lance-cdf's Spark stream adds to the events (and the Kafka sink
reads back). Names only, no dependency: Spark's commit and writer-creation processes need
them without loading pyarrow or numpy (see `LanceCdfKafkaSink`)."""

# The columns the lance-cdf source adds with option keyHash: the key's hash (`key_hash`), and
# each event's order within its version's group (deletes, updates, inserts): the slice it was
# read in (high bits) and its position there.
KEY_HASH = "_key_hash"
EVENT_ORDER = "_event_order"
ORDER_BITS = 40
# The Kafka partition of each event when the stream routes records itself (`runner.route`):
# an int column the Kafka sink reads and leaves out of the records.
PARTITION_COLUMN = "_kafka_partition"
# The columns of a stream read with option writerSlots (`WorkItem`): a writer
# slot, the events planned (first slot), its work item (JSON data: the source partitions
# to read and how to route them, no option of the source) and the Arrow schema of the
# columns read; the Kafka sink's writer task reads its share of events with them
# (`SlotWork`).
WORK_SLOT = "_writer_slot"
WORK_EVENTS = "_events"
WORK_COLUMN = "_work"
WORK_SCHEMA = "_read_schema"
