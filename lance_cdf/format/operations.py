"""The operations of Lance commits, by the names pylance gives them (a transaction's
operation; `Manifest.operation`). Names only, no dependency."""

from __future__ import annotations

from enum import StrEnum


class Operation(StrEnum):
    """A commit's operation; a member equals (and is written as) pylance's name."""

    APPEND = "Append"
    DELETE = "Delete"
    OVERWRITE = "Overwrite"
    CREATE_INDEX = "CreateIndex"
    REWRITE = "Rewrite"
    MERGE = "Merge"
    RESTORE = "Restore"
    RESERVE_FRAGMENTS = "ReserveFragments"
    UPDATE = "Update"
    PROJECT = "Project"
    UPDATE_CONFIG = "UpdateConfig"
    DATA_REPLACEMENT = "DataReplacement"
    UPDATE_MEM_WAL_STATE = "UpdateMemWalState"
    CLONE = "Clone"
    UPDATE_BASES = "UpdateBases"
    UNKNOWN = "Unknown"  # not recorded (a transaction file cleaned up, or none written)
