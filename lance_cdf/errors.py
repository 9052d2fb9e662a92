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
