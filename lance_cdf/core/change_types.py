"""The change types of change events (the `_change_type` column) as one enum. Names only,
no dependency: the Avro envelope (lance_cdf.avro) maps them to Debezium's ops without
loading the change feed."""

from __future__ import annotations

from enum import StrEnum


class ChangeType(StrEnum):
    """An event's `_change_type`; a member equals (and is written as) its string."""

    INSERT = "insert"
    UPDATE_PRE = "update_preimage"
    UPDATE_POST = "update_postimage"
    DELETE = "delete"
    SNAPSHOT = "snapshot"  # a row of the table as it stood at the snapshot version


# the change types of a commit's events (a snapshot read's rows are SNAPSHOT)
CHANGE_TYPES = (ChangeType.INSERT, ChangeType.UPDATE_PRE, ChangeType.UPDATE_POST, ChangeType.DELETE)
