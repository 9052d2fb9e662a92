"""Commits found by storage events (`commitEvents`, `publish --commit-events`): the payloads
of S3, GCS and Azure read as the commits they announce (format/storage_events.py), on
recorded payloads (tests/fixtures/storage_events: moto's as its server sends them, the
others in the structure each store documents)."""

import json
from pathlib import Path

import pytest

from lance_cdf.format.storage_events import (
    StoredObject,
    TableCommit,
    azure_objects,
    commit_at,
    commit_of,
    gcs_objects,
    root_location,
    s3_objects,
)

PAYLOADS = Path(__file__).parent / "fixtures" / "storage_events"


def payload(name: str) -> str:
    return (PAYLOADS / name).read_text()


def commits(root: str, objects: list[StoredObject]) -> list[TableCommit | None]:
    return [commit_of(root_location(root), o) for o in objects]


@pytest.mark.unit
def test_s3_notifications_as_sqs_receives_them():
    # moto's (keys quote_plus-encoded, slashes too), and the test event it sends first
    moto = s3_objects(payload("s3_moto_put.json"))
    assert moto == [
        StoredObject("lake", "db/sales$orders x.lance/_versions/18446744073709551612.manifest")
    ]
    assert commits("s3://lake/db", moto) == [TableCommit("sales$orders x.lance", 3)]
    assert s3_objects(payload("s3_moto_test_event.json")) == []
    # AWS's documented structure: created objects only (a data file is no commit, a delete
    # no object), `$` and spaces decoded, a namespaced table's directory without `.lance`
    documented = s3_objects(payload("s3_documented.json"))
    assert [o.key for o in documented] == [
        "db/orders.lance/_versions/18446744073709551608.manifest",
        "db/orders.lance/data/0a1b2c3d-4e5f.lance",
        "db/8c2d9e01_sales$daily totals/_versions/12.manifest",
    ]
    assert commits("s3://lake/db/", documented) == [
        TableCommit("orders.lance", 7),
        None,
        TableCommit("8c2d9e01_sales$daily totals", 12),
    ]


@pytest.mark.unit
def test_s3_notifications_through_sns_and_eventbridge():
    sns = s3_objects(payload("s3_sns_wrapped.json"))
    bridge = s3_objects(payload("s3_eventbridge.json"))
    expected = [StoredObject("lake", "db/orders.lance/_versions/18446744073709551608.manifest")]
    assert sns == bridge == expected


@pytest.mark.unit
def test_gcs_pubsub_notifications():
    finalize = json.loads(payload("gcs_pubsub_finalize.json"))
    found = gcs_objects(finalize)
    assert commits("gs://lake/db", found) == [TableCommit("orders.lance", 7)]
    # the payload alone (attributes without the object's names) gives the same object
    bare = {**finalize, "attributes": {"eventType": "OBJECT_FINALIZE"}}
    assert gcs_objects(bare) == found
    assert gcs_objects(json.loads(payload("gcs_pubsub_delete.json"))) == []


@pytest.mark.unit
def test_azure_event_grid_deliveries():
    grid = azure_objects(payload("azure_eventgrid.json"))
    assert commits("az://lake/db", grid) == [
        TableCommit("orders.lance", 7),
        TableCommit("sales$daily totals", 8),  # a rename into place, URL-decoded
    ]
    account = "abfss://lake@lakeacct.dfs.core.windows.net/db"
    assert commits(account, grid) == commits("az://lake/db", grid)
    cloud = azure_objects(payload("azure_cloudevent.json"))
    assert commits("az://lake/db", cloud) == [TableCommit("orders.lance", 5)]
    # a Storage Queue holds the event as base64 text
    queued = azure_objects(payload("azure_queue_message.txt").strip())
    assert queued == grid[:1]


@pytest.mark.unit
def test_what_is_no_commit_of_the_database():
    manifest = "db/t.lance/_versions/4.manifest"
    root = root_location("s3://lake/db")
    assert commit_of(root, StoredObject("lake", manifest)) == TableCommit("t.lance", 4)
    assert commit_of(root, StoredObject("other", manifest)) is None  # another bucket
    assert commit_of(root, StoredObject("lake", "dbx/t.lance/_versions/4.manifest")) is None
    assert commit_of(root_location("s3://lake"), StoredObject("lake", manifest)) == TableCommit(
        "db/t.lance", 4
    )
    for relative in (
        "t.lance/_versions/4.manifest.tmp",
        "t.lance/_versions/.tmp_4.manifest_x",
        "t.lance/_versions/4.txn",
        "t.lance/_transactions/4-abc.txn",
        "_versions/4.manifest",  # the root itself: no table of the database
        "t.lance/_versions/sub/4.manifest",
        "t.lance/data/_versions.lance",
    ):
        assert commit_at(relative) is None, relative
    # the namespace's own table (a new or dropped namespaced table) is a commit too
    assert commit_at("__manifest/_versions/18446744073709551614.manifest") == TableCommit(
        "__manifest", 1
    )


@pytest.mark.unit
def test_garbage_is_no_object():
    for body in ("", "not json", "[]", "null", '{"Records": [null, {"eventName": 3}]}'):
        assert s3_objects(body) == [] and azure_objects(body) == [], body
    assert (
        gcs_objects({}) == []
        and gcs_objects({"attributes": {"eventType": "OBJECT_FINALIZE"}}) == []
    )
