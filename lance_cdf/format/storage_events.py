"""Storage notifications read as the commits they announce: the one place a store's event
payload is mapped to a table and a version.

A Lance commit creates one object, its manifest `<table>/_versions/<name>.manifest`
(`versions.parse_manifest_name` reads the name: `{version}.manifest`, or the V2
scheme's reversed-u64 name). Object stores announce new objects to a queue:

  * S3: `ObjectCreated:*` event notifications to SQS, as S3 sends them (`{"Records":
    [...]}`, keys URL-encoded), wrapped in an SNS notification (an SNS topic fanned out to
    SQS without raw delivery), or from EventBridge (`detail-type` "Object Created", keys
    as they are); the `s3:TestEvent` S3 sends when a notification is configured names no
    object (`s3_objects`).
  * Google Cloud Storage: Pub/Sub notifications (`OBJECT_FINALIZE`, payload format
    `JSON_API_V1` or none), the message as a pull or push delivers it (`gcs_objects`).
  * Azure Blob Storage / ADLS Gen2: Event Grid `Microsoft.Storage.BlobCreated` (and
    `BlobRenamed`, a hierarchical namespace's renames), in the Event Grid or the
    CloudEvents schema, one event or a list, as JSON or as a Storage Queue's base64 text
    (`azure_objects`).

Each gives the `StoredObject`s the payload says were created; `commit_of` tells whether an
object is a commit of a table under a database's root, and which (`TableCommit`); a local
filesystem's events give paths, read by `commit_at`. Payloads that name nothing else
(other event types, test events, other buckets) give nothing: a notification is a hint
that a table may have a new version, never the version itself (the database stream lists
the table to know: `DatabaseReader`).
"""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote, unquote_plus, urlparse

from lance_cdf.format.versions import VERSIONS_DIR, parse_manifest_name

S3_CREATED = "ObjectCreated:"  # S3's eventName prefix (`ObjectCreated:Put`, `...:Copy`, ...)
GCS_FINALIZE = "OBJECT_FINALIZE"  # a Pub/Sub notification's eventType for a new object
AZURE_CREATED = ("Microsoft.Storage.BlobCreated", "Microsoft.Storage.BlobRenamed")
_AZURE_BLOB = "/blobServices/default/containers/"  # an Event Grid subject's lead


@dataclass(frozen=True)
class StoredObject:
    """An object of a store: its bucket (an Azure container) and its key, decoded."""

    bucket: str
    key: str


@dataclass(frozen=True)
class TableCommit:
    """A commit a new object is: the table's directory relative to the database's root
    (`sales.lance`, `6e1f2a_sales$orders`; `__manifest` is the namespace's own table) and
    the version it made."""

    table_dir: str
    version: int


# -- S3 --------------------------------------------------------------------------------
def s3_objects(body: str | bytes) -> list[StoredObject]:
    """The objects an SQS message from S3 says were created (see the module's doc)."""
    document = _json(body)
    if not isinstance(document, dict):
        return []
    if document.get("Type") == "Notification" and isinstance(document.get("Message"), str):
        return s3_objects(document["Message"])  # SNS -> SQS without raw delivery
    if document.get("source") == "aws.s3" and document.get("detail-type") == "Object Created":
        detail = document.get("detail") or {}
        bucket, key = (detail.get("bucket") or {}).get("name"), (detail.get("object") or {})
        found = _object(bucket, key.get("key"))
        return [found] if found is not None else []
    out = []
    for record in document.get("Records") or []:
        if not isinstance(record, dict) or not str(record.get("eventName", "")).startswith(
            S3_CREATED
        ):
            continue
        s3 = record.get("s3") or {}
        key = (s3.get("object") or {}).get("key")
        bucket = (s3.get("bucket") or {}).get("name")
        found = _object(bucket, unquote_plus(key) if isinstance(key, str) else None)
        if found is not None:
            out.append(found)
    return out


# -- Google Cloud Storage ---------------------------------------------------------------
def gcs_objects(message: Mapping[str, Any]) -> list[StoredObject]:
    """The object a Pub/Sub message from a Cloud Storage notification says was created:
    `message` as a pull response's `receivedMessages[].message` or a push request's
    `message` has it (`attributes`, base64 `data`)."""
    attributes = message.get("attributes") or {}
    if attributes.get("eventType") != GCS_FINALIZE:
        return []
    found = _object(attributes.get("bucketId"), attributes.get("objectId"))
    if found is None:  # (attributes are always sent; the JSON_API_V1 payload as a fallback)
        data = _json(_base64(message.get("data") or ""))
        if isinstance(data, dict):
            found = _object(data.get("bucket"), data.get("name"))
    return [found] if found is not None else []


# -- Azure ------------------------------------------------------------------------------
def azure_objects(body: str | bytes) -> list[StoredObject]:
    """The blobs an Event Grid delivery says were created or renamed into place (see the
    module's doc)."""
    document = _json(body)
    if document is None:
        document = _json(_base64(body))  # a Storage Queue message's base64 text
    events = document if isinstance(document, list) else [document]
    return [found for event in events for found in _azure_event(event)]


def _azure_event(event: object) -> Iterator[StoredObject]:
    if not isinstance(event, dict):
        return
    kind = event.get("eventType") or event.get("type")
    data = event.get("data") or {}
    if kind == AZURE_CREATED[1]:  # a rename: the blob at its destination
        url = urlparse(str(data.get("destinationUrl") or ""))
        container, _, key = url.path.lstrip("/").partition("/")
        found = _object(container, unquote(key))
    elif kind == AZURE_CREATED[0]:
        subject = str(event.get("subject") or "")
        if not subject.startswith(_AZURE_BLOB):
            return
        container, _, rest = subject[len(_AZURE_BLOB) :].partition("/")
        found = _object(container, rest.removeprefix("blobs/"))
    else:
        return
    if found is not None:
        yield found


# -- objects -> commits -----------------------------------------------------------------
def root_location(root: str) -> StoredObject:
    """A database root URI (`s3://bucket/db`, `gs://...`, `az://container/db`,
    `abfss://container@account.dfs.core.windows.net/db`) as its bucket and key prefix."""
    parsed = urlparse(root)
    return StoredObject(parsed.netloc.split("@", 1)[0], parsed.path.strip("/"))


def commit_of(root: StoredObject, obj: StoredObject) -> TableCommit | None:
    """The commit `obj` is, of a table under the database at `root` (`root_location`), or
    None: another bucket, outside the root, or not a manifest under a table's `_versions/`."""
    if obj.bucket != root.bucket:
        return None
    if root.key:
        if not obj.key.startswith(root.key + "/"):
            return None
        return commit_at(obj.key[len(root.key) + 1 :])
    return commit_at(obj.key)


def commit_at(relative: str) -> TableCommit | None:
    """The commit a path relative to the database's root is (`t.lance/_versions/3.manifest`
    -> `t.lance`, 3), or None."""
    table_dir, sep, name = relative.strip("/").rpartition(f"/{VERSIONS_DIR}/")
    parsed = parse_manifest_name(name) if sep and table_dir and "/" not in name else None
    return TableCommit(table_dir, parsed[0]) if parsed is not None else None


def _object(bucket: object, key: object) -> StoredObject | None:
    """An object from a payload's bucket and decoded key, None if either is missing."""
    if not isinstance(bucket, str) or not isinstance(key, str) or not bucket or not key:
        return None
    return StoredObject(bucket, key)


def _json(body: str | bytes) -> Any:
    """A payload's JSON, None if it is not JSON."""
    try:
        return json.loads(body)
    except (ValueError, TypeError):
        return None


def _base64(text: str | bytes) -> bytes:
    """Base64 text decoded (b"" if it is not base64)."""
    try:
        return base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError, TypeError):
        return b""


__all__ = [
    "StoredObject",
    "TableCommit",
    "azure_objects",
    "commit_at",
    "commit_of",
    "gcs_objects",
    "root_location",
    "s3_objects",
]
