"""The one exception type lance-cdf raises for bad input, and its flavours.

Every message names the problem and what to do about it.
"""

from __future__ import annotations


class LanceCdfError(Exception):
    """Base class of every error lance-cdf raises on purpose."""


class TableNotFoundError(LanceCdfError):
    """The path holds no Lance table."""


class StableRowIdsRequiredError(LanceCdfError):
    """The table was created without stable row IDs."""


class VersionNotFoundError(LanceCdfError):
    """A requested version does not exist (not yet written, or cleaned up)."""


class CorruptFileError(LanceCdfError):
    """A manifest, row-ID or deletion file could not be decoded."""


class UnsupportedStorageError(LanceCdfError):
    """A URI scheme this build cannot read."""


class StorageAccessError(LanceCdfError):
    """An object store could not be reached or refused the request."""


class UndecidableChangeError(LanceCdfError):
    """Whether a row changed cannot be told: the writer recorded no versions and the
    values cannot be compared."""


class ReplicateError(LanceCdfError):
    """A record could not be applied and there is no dead-letter topic to set it aside."""


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
