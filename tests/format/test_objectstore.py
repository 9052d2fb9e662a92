"""Tables on object storage: option translation, the obstore-backed filesystem against
the local one on byte-identical copies, clear errors, and request counts that follow the
changed fragments rather than the table."""

import json
import os
import uuid

import lance
import obstore
import pyarrow as pa
import pytest
from obstore.store import from_url

import lance_cdf
from lance_cdf.core.feed import ChangeFeed
from lance_cdf.errors import StorageAccessError, TableNotFoundError, UnsupportedStorageError
from lance_cdf.format.objectstore import ObjectStoreFileSystem, store_arguments
from lance_cdf.format.table import TableLog
from tests.support.s3_services import BUCKET


def test_lance_option_names_are_translated_to_the_client():
    args = store_arguments(
        "s3://b/t.lance",
        {
            "aws_endpoint": "http://h:1",
            "AWS_REGION": "eu-west-1",
            "access_key_id": "k",
            "allow_http": "true",
            "timeout": "5s",
            "client_max_retries": "2",
            "client_retry_timeout": "7",
            "block_size": "4096",  # Lance-only tuning knob: no meaning for this client
        },
    )
    assert args["config"] == {
        "aws_endpoint": "http://h:1",
        "aws_region": "eu-west-1",
        "aws_access_key_id": "k",
    }
    assert args["client_options"] == {"allow_http": "true", "timeout": "5s"}
    assert args["retry_config"]["max_retries"] == 2
    assert args["retry_config"]["retry_timeout"].total_seconds() == 7
    gcs = store_arguments("gs://b/t", {"service_account": "x", "google_bucket": "b"})
    assert gcs["config"] == {"google_service_account": "x", "google_bucket": "b"}
    az = store_arguments("az://c/t", {"account_name": "a", "azure_storage_account_key": "k"})
    assert az["config"] == {"azure_account_name": "a", "azure_storage_account_key": "k"}


def test_unknown_scheme_is_refused():
    with pytest.raises(UnsupportedStorageError, match="unknown URI scheme 'ftp'"):
        lance_cdf.read_changes("ftp://host/t.lance", 1)


def _upload(local_dir: str, uri: str, storage_options: dict) -> None:
    """Copy a local table byte for byte with obstore's own put (no lance-cdf code)."""
    store = from_url(uri, **store_arguments(uri, storage_options))
    for base, _, files in os.walk(local_dir):
        for name in files:
            full = os.path.join(base, name)
            with open(full, "rb") as f:
                obstore.put(store, os.path.relpath(full, local_dir), f.read())


def _make_table(uri: str, storage_options=None, fragments: int = 4, rows_per_file: int = 50):
    data = pa.table({"id": range(fragments * rows_per_file), "v": ["a"] * (fragments * 50)})
    ds = lance.write_dataset(
        data,
        uri,
        enable_stable_row_ids=True,
        max_rows_per_file=rows_per_file,
        storage_options=storage_options,
    )
    ds.delete("id % 7 = 3")
    ds.update({"v": "'b'"}, where="id < 20")
    ds.delete("id % 2 = 0 AND id >= 150")
    return ds


def test_object_store_filesystem_reads_what_the_local_one_reads(tmp_path, s3_server, s3_uri):
    local = str(tmp_path / "t.lance")
    _make_table(local)
    so = s3_server.storage_options()
    _upload(local, s3_uri, so)
    here, there = TableLog(local), TableLog(s3_uri, so)
    assert isinstance(there.fs, ObjectStoreFileSystem)
    assert there.versions == here.versions == [1, 2, 3, 4]
    assert sorted(there.fs.list_dir("_deletions")) == sorted(here.fs.list_dir("_deletions"))
    for v in here.versions:
        a, b = here.manifest(v), there.manifest(v)
        assert a.whole_proto() == b.whole_proto() and a.operation == b.operation
        for fa, fb in zip(a.fragments, b.fragments, strict=True):
            assert (here.row_ids(fa).to_numpy() == there.row_ids(fb).to_numpy()).all()
            assert (
                here.last_updated_versions(fa).to_numpy()
                == there.last_updated_versions(fb).to_numpy()
            ).all()
            assert here.deletions(fa).bitmap == there.deletions(fb).bitmap
    assert there.fs.read_range("_versions/" + os.listdir(f"{local}/_versions")[0], 3, 9) == (
        here.fs.read_range("_versions/" + os.listdir(f"{local}/_versions")[0], 3, 9)
    )
    expected = lance_cdf.read_changes(local, 1).read_all()
    got = lance_cdf.read_changes(s3_uri, 1, storage_options=so).read_all()
    assert got.drop(["_commit_timestamp"]) == expected.drop(["_commit_timestamp"])
    assert got.num_rows > 0


def test_missing_bucket_missing_table_unreachable_endpoint_bad_key(s3_server, s3_uri):
    so = s3_server.storage_options()
    with pytest.raises(StorageAccessError, match="bucket 'no-such-bucket' .* does not exist"):
        lance_cdf.read_changes("s3://no-such-bucket/t.lance", 1, storage_options=so)
    with pytest.raises(TableNotFoundError, match="no Lance table"):
        lance_cdf.read_changes(s3_uri, 1, storage_options=so)
    dead = dict(so, aws_endpoint="http://127.0.0.1:9", client_max_retries="0")
    with pytest.raises(StorageAccessError, match=r"cannot reach http://127.0.0.1:9 .*aws_endpoint"):
        lance_cdf.read_changes(s3_uri, 1, storage_options=dead)
    with pytest.raises(StorageAccessError, match="'aws_endpont' is not valid"):
        lance_cdf.read_changes(s3_uri, 1, storage_options=dict(so, aws_endpont="x"))


def test_missing_credentials_are_named(s3_server, s3_uri, monkeypatch):
    for var in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE"):
        monkeypatch.delenv(var, raising=False)
    so = {k: v for k, v in s3_server.storage_options().items() if "access_key" not in k}
    # where the client looks for credentials when none are given: nothing listens there
    so.update(aws_metadata_endpoint="http://127.0.0.1:9", client_max_retries="0")
    with pytest.raises(StorageAccessError, match="no credentials .*aws_access_key_id"):
        lance_cdf.read_changes(s3_uri, 1, storage_options=so)


def _update_one_fragment_of(fragments: int, s3_server) -> dict[str, int]:
    """Requests lance-cdf's client and the server see to plan a commit that updates
    rows in one fragment of a table with `fragments` fragments."""
    so = s3_server.storage_options()
    uri = f"s3://{BUCKET}/{uuid.uuid4().hex}/t.lance"
    ds = lance.write_dataset(
        pa.table({"id": range(fragments * 40)}),
        uri,
        enable_stable_row_ids=True,
        max_rows_per_file=40,
        storage_options=so,
    )
    ds.update({"id": "id + 100000"}, where="id < 3")
    ds.delete("id = 10")
    feed = ChangeFeed(uri, so)
    feed.table.fs.reset_counts()
    s3_server.reset_counts()
    changes = feed.plan(3)
    assert changes.summary()["deleted"] == 1
    return {
        "client": feed.table.fs.request_count(),
        "server": sum(s3_server.request_counts().values()),
    }


def test_planning_a_commit_costs_requests_per_changed_fragment_not_per_table(s3_server):
    small, large = _update_one_fragment_of(3, s3_server), _update_one_fragment_of(60, s3_server)
    assert small == large
    assert 0 < large["client"] <= 6


def test_latest_version_is_one_list_and_manifests_are_read_once_per_query(s3_server, s3_uri):
    so = s3_server.storage_options()
    _make_table(s3_uri, so)
    feed = ChangeFeed(s3_uri, so)  # lists _versions/, reads the latest manifest
    fs = feed.table.fs
    before = fs.requests.copy()
    assert feed.latest_version() == 4
    assert fs.requests - before == {"list": 1}
    # the steps read_changes takes, over every version
    start, end = feed.resolve_range(1)
    schema = feed.user_schema(start, end)
    for changes in feed.plans(start, end):
        assert list(feed.events(changes, schema))
    manifests = {p: n for p, n in fs.paths.items() if p.endswith(".manifest")}
    assert len(manifests) == 4 and set(manifests.values()) == {1}


def test_cli_reads_a_table_on_object_storage(s3_server, s3_uri, capsys):
    from lance_cdf.cli import main

    so = s3_server.storage_options()
    _make_table(s3_uri, so)
    flags = [a for k, v in so.items() for a in ("--storage-option", f"{k}={v}")]
    assert main(["changes", s3_uri, "--from", "2", "--format", "jsonl", *flags]) == 0
    got = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    want = lance_cdf.read_changes(s3_uri, 2, storage_options=so).read_all()
    assert [(e["_commit_version"], e["_change_type"], e["_rowid"]) for e in got] == list(
        zip(
            want["_commit_version"].to_pylist(),
            want["_change_type"].to_pylist(),
            want["_rowid"].to_pylist(),
            strict=True,
        )
    )
    assert main(["changes", "s3://no-such-bucket/t.lance", "--from", "1", *flags]) == 2
    assert "bucket 'no-such-bucket'" in capsys.readouterr().err


def test_status_reads_a_replica_on_object_storage_with_its_storage_options(
    s3_server, s3_uri, capsys, monkeypatch
):
    """`status --replica s3://...` once used no storage option ("Failed to resolve
    region"); now --storage-option (or --replica-storage-option) reaches it, and a
    secret given through ${env:NAME} shows nowhere in the output."""
    from lance_cdf.cli import main
    from lance_cdf.replicate.replica import OFFSETS_PROPERTY, SOURCE_VERSION_PROPERTY

    so = s3_server.storage_options()
    _make_table(s3_uri, so)
    replica = s3_uri.replace(".lance", "-replica.lance")
    lance.write_dataset(
        pa.table({"id": [1]}),
        replica,
        storage_options=so,
        transaction_properties={OFFSETS_PROPERTY: "{}", SOURCE_VERSION_PROPERTY: "3"},
    )
    monkeypatch.setenv("T_S3_SECRET", so.pop("aws_secret_access_key"))
    flags = [a for k, v in so.items() for a in ("--storage-option", f"{k}={v}")]
    flags += ["--storage-option", "aws_secret_access_key=${env:T_S3_SECRET}"]
    assert main(["status", "--table", s3_uri, "--replica", replica, "--json", *flags]) == 0
    out = capsys.readouterr().out
    report = json.loads(out)
    assert report["replica_version"] == 3 and report["replica_lag"] == report["latest_version"] - 3
    replica_flags = [f.replace("--storage-option", "--replica-storage-option") for f in flags]
    assert (
        main(["status", "--table", s3_uri, "--replica", replica, "--json", *flags, *replica_flags])
        == 0
    )
    assert json.loads(capsys.readouterr().out)["replica_version"] == 3
    assert os.environ["T_S3_SECRET"] not in out
