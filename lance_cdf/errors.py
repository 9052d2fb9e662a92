"""The one exception type lance-cdf raises for bad input, and its flavours.

Every message names the problem and what to do about it.
"""

from __future__ import annotations

from typing import ClassVar

# Advice that several messages give, for pylance and LanceDB users alike.
CLEANUP = "cleanup (pylance's cleanup_old_versions, LanceDB's optimize(cleanup_older_than=...))"
KEEP_VERSIONS = (
    "pylance: cleanup_old_versions(older_than=...) with a longer age; LanceDB: "
    "table.optimize(cleanup_older_than=timedelta(...)) with a longer age"
)
STABLE_ROW_IDS_HOWTO = (
    "Create the table with them — pylance: lance.write_dataset(data, uri, "
    "enable_stable_row_ids=True); LanceDB: the storage option "
    "new_table_enable_stable_row_ids='true', per table in db.create_table(name, data, "
    "storage_options={'new_table_enable_stable_row_ids': 'true'}) (a child namespace ignores "
    "the option given to lancedb.connect) — and move an existing table's rows into such a "
    "new table (e.g. db.create_table(new_name, db.open_table(name).to_arrow(), "
    "storage_options=...)), then read changes from that one."
)


class LanceCdfError(Exception):
    """Base class of every error lance-cdf raises on purpose: catch it to handle them all.
    The message is one line naming the cause and the fix.

    `retriable` says whether the same request may succeed later without anyone changing
    anything (a broker, registry or store that does not answer): a service retries such
    an error with backoff; any other is a refusal or bad input, and retrying it cannot
    help. A permanent error never derives from a retriable one."""

    retriable: ClassVar[bool] = False


class TableNotFoundError(LanceCdfError):
    """The path holds no Lance table (raised by `read_changes`, `ChangeFeed`, the Spark
    source at `load()` and the CLI)."""


class StableRowIdsRequiredError(LanceCdfError):
    """The table was created without stable row IDs; the message says how to create one
    with them (pylance and LanceDB)."""


class VersionNotFoundError(LanceCdfError):
    """A requested version does not exist (not yet written, or cleaned up); the message
    names the versions still present where that helps."""


class CorruptFileError(LanceCdfError):
    """A manifest, row-ID or deletion file could not be decoded."""


class UnsupportedTableFeatureError(LanceCdfError):
    """A version needs a Lance reader feature this lance-cdf does not read."""


class UnsupportedStorageError(LanceCdfError):
    """A URI scheme this build cannot read."""


class StorageAccessError(LanceCdfError):
    """An object store could not be reached or refused the request."""

    retriable = True


class UndecidableChangeError(LanceCdfError):
    """Whether a row changed cannot be told: the writer recorded no versions and the
    values cannot be compared."""


class ReplicateError(LanceCdfError):
    """A record could not be applied and there is no dead-letter topic to set it aside."""


class ConsumerFatalError(ReplicateError):
    """librdkafka made the replicator's consumer unusable (a fatal error: a static group
    member fenced, FENCED_INSTANCE_ID); a new consumer may take over from the replica's
    position."""


class RegistryError(ReplicateError):
    """The schema registry gave no answer about a record's schema: never a reason to set
    the record aside (its two kinds below)."""


class RegistryUnavailableError(RegistryError):
    """The schema registry did not answer for longer than the replicator waits: an
    outage."""

    retriable = True


class PublishError(LanceCdfError):
    """Kafka or the schema registry refused or lost records."""


class ReplicaError(LanceCdfError):
    """The replica table cannot take the changes as they are (its state or the records')."""


class DuplicateKeysError(ReplicaError):
    """A key is held, or written, more than once where it must be unique."""


class FastPathDeclined(LanceCdfError):
    """A vectorised encoder or decoder does not handle this input; the caller uses the
    library's (fastavro's) path for it. Never reaches a user: every raise has a catch."""


class AvroEncodeDeclined(FastPathDeclined):
    """The vectorised Avro encoder declines a batch (`lance_cdf.avro.encode`)."""


class AvroDecodeDeclined(FastPathDeclined):
    """The vectorised Avro decoder declines a schema (`lance_cdf.avro.decode`)."""


class WorkItemError(LanceCdfError):
    """A Kafka sink's work item is not one lance-cdf's source wrote."""


# client settings: secrets from files and the environment
class ClientConfigError(LanceCdfError):
    """A client settings file, KEY=VALUE flag or ${env:NAME} reference cannot be read."""


# the replicator: one writer per target, a replica that knows whose it is
class LeaseHeldError(LanceCdfError):
    """Another live writer holds the target's lease (`lance_cdf.ops.lease`)."""

    # what the holder said it does (its lease's `command`), when there is one
    holder_command: str | None = None


class LeaseLostError(LanceCdfError):
    """This writer's lease was taken over by another writer: it must stop writing."""


class ForeignReplicaError(ReplicaError):
    """The replica follows another topic or source table than the records offered to it."""


class RegistryRefusedError(RegistryError):
    """The schema registry refused a schema fetch for a reason that is not the record's
    (a wrong URL, missing credentials)."""


class ReplicaPositionError(ReplicaError):
    """The replica's own position cannot be trusted to resume from: it is missing or empty
    while the consumer group has moved on, or the topic no longer holds the history it
    needs."""


# -- the publisher: checkpoints know their table; Kafka outages --


class CheckpointMismatchError(LanceCdfError):
    """A checkpoint is of another table, or was started from another version than the one
    given now."""


class KafkaUnavailableError(PublishError):
    """The broker did not answer for longer than the publisher rides out an outage. The
    message says for how long and why, not what to do: a head start that ends on it leaves
    the outage to the query; publish, stopped by it, says to rerun."""

    retriable = True


# tables addressed by name in a LanceDB database or Lance directory namespace
class DatabaseNotFoundError(TableNotFoundError):
    """The database (namespace root) directory does not exist."""


class TableNameError(TableNotFoundError):
    """No table, or more than one, of a database has the name given."""


# -- transaction metadata and whole-version replicas --
class TransactionMetadataError(LanceCdfError):
    """The transaction topic cannot be used as lance-cdf's (wrong shape, or it disagrees
    with the change topic's records)."""


# -- authorization: a Kafka ACL denies the client a topic or its group --
class KafkaAuthorizationError(LanceCdfError):
    """The broker's authorizer refused the client (publish or replicate) an operation it
    needs on a topic or a consumer group; the message names which and the setting."""


# -- a whole database as one Spark stream of events --
class DatabaseSchemaError(LanceCdfError):
    """The tables of a database event stream do not fit one schema: a column of one type in
    one table and another in another, or a table (taken up later, or changed) with columns
    the stream's schema, fixed at its start, lacks."""


class NoVersionSinceError(LanceCdfError):
    """A batch read's startingTimestamp is after the table's latest commit (a database read
    reads nothing of that table; a one-table read refuses)."""


def in_words(exc: BaseException) -> str:
    """What went wrong, in words, on one line: a lance-cdf error's own message; for any
    other exception a description of its kind and its first line, never the name of an
    internal exception class (a `KeyError: 'items'` says nothing to an operator)."""
    text = str(exc).strip()
    first = text.splitlines()[0].rstrip(".") if text else ""
    if isinstance(exc, LanceCdfError):
        return first or "an error without a message"
    if isinstance(exc, KeyError):
        key = exc.args[0] if exc.args else None
        return f"{key!r} was not found" if key is not None else "an entry was not found"
    if isinstance(exc, FileNotFoundError):
        name = exc.filename or first
        return f"a file it needs is missing ({name})" if name else "a file it needs is missing"
    if isinstance(exc, PermissionError):
        return f"access was denied ({exc.strerror or first})" if first else "access was denied"
    if isinstance(exc, TimeoutError):
        return f"no answer in time ({first})" if first else "no answer in time"
    if isinstance(exc, ConnectionError):
        return f"the connection failed ({first})" if first else "the connection failed"
    if isinstance(exc, OSError):
        why = exc.strerror or first
        return f"reading or writing failed ({why})" if why else "reading or writing failed"
    if isinstance(exc, MemoryError):
        return "the process ran out of memory"
    return first or "an unexpected error without a message (the log has its details)"
