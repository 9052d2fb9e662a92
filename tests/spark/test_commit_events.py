"""Commits found by storage events (`commitEvents`, `publish --commit-events`): the payloads
of S3, GCS and Azure read as the commits they announce (format/storage_events.py), on
recorded payloads (tests/support/fixtures/storage_events: moto's as its server sends them, the
others in the structure each store documents); the database stream's schedule with hints
(lost, repeated, late and reordered ones too) and without (events not heard); the
receivers: an SQS queue S3 notifies on the S3 server (moto), a local database's
file-system events, and a queue that cannot be reached (status and the metrics say so)."""

import contextlib
import io
import itertools
import json
import random
import re
import socket
import time
import uuid
from pathlib import Path

import lancedb
import numpy as np
import pyarrow as pa
import pytest
from pyspark.sql.streaming.datasource import ReadAllAvailable

from lance_cdf.cli.status_command import _discovery_line
from lance_cdf.errors import LanceCdfError
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
from lance_cdf.ops.clientconfig import sqs_client_arguments
from lance_cdf.ops.commit_hints import CommitHints
from lance_cdf.spark.source.database_stream import DatabaseReader
from lance_cdf.spark.source.idle_polls import DUE_SLACK, IdlePolls

pytest_plugins = ["tests.support.s3_services"]
STABLE = {"new_table_enable_stable_row_ids": "true"}
PAYLOADS = Path(__file__).resolve().parents[1] / "support" / "fixtures" / "storage_events"


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


# -- the schedule: hints and the safety net (spark/source/idle_polls.py) -----------------
@pytest.mark.unit
def test_with_events_heard_quiet_tables_wait_the_safety_net_and_a_hint_brings_one_now():
    polls = IdlePolls(ceiling=10.0, events_ceiling=300.0)
    polls.hear(True, 0.0)
    names = [f"t{i}" for i in range(200)]
    looks: dict[str, list[float]] = {n: [] for n in names}
    for t in range(0, 1200):
        now = float(t)
        if t == 700:
            polls.hint("t7", now)
        for name in names:
            if polls.due(name, now):
                polls.looked(name, t == 0, now)
                looks[name].append(now)
    assert 700.0 in looks["t7"]  # the trigger the hint came at
    for name in names:  # after the first look: the safety net, once per 300 s at most
        late = [t for t in looks[name] if t >= 300 and t != 700.0]
        assert 3 <= len(late) <= 4, (name, looks[name])
        assert all(b - a >= 300 - DUE_SLACK for a, b in itertools.pairwise(late)), looks[name]


@pytest.mark.unit
def test_hints_that_find_nothing_leave_the_safety_net_spread():
    """200 tables hinted at once (a look's own reads, a replayed queue) that find nothing
    new keep their safety-net looks where they were: spread over the triggers, not all in
    one (oracle: without the kept phase, all 200 fall on one trigger per ceiling)."""
    polls = IdlePolls(ceiling=10.0, events_ceiling=300.0)
    polls.hear(True, 0.0)
    names = [f"t{i}" for i in range(200)]
    per_trigger = []
    for t in range(0, 1500):
        now = float(t)
        if t in (400, 401, 900):
            for name in names:
                polls.hint(name, now)
        due = [n for n in names if polls.due(n, now)]
        for name in due:
            polls.looked(name, t == 0, now)
        per_trigger.append(len(due))
    assert per_trigger[400] == per_trigger[900] == 200  # each hint: a look at once
    late = per_trigger[902:]
    assert sum(late) <= 200 * (len(late) / 300 + 1) and max(late) <= 45, max(late)


@pytest.mark.unit
def test_events_not_heard_bring_every_table_back_within_the_listing_ceiling():
    polls = IdlePolls(ceiling=10.0, events_ceiling=900.0)
    polls.hear(True, 0.0)
    names = [f"t{i}" for i in range(50)]
    for name in names:
        polls.due(name, 0.0)
        polls.looked(name, True, 0.0)
    for t in (1.0, 2.0):
        for name in names:
            if polls.due(name, t):
                polls.looked(name, False, t)
    # waiting the safety net (each its phase: a fraction of it fixed by its name)
    assert all(s.capped == 900.0 for s in polls.tables.values())
    assert sum(s.due > 110 for s in polls.tables.values()) >= 40
    polls.hear(False, 100.0)
    assert all(s.due <= 110 for s in polls.tables.values())
    polls.hear(True, 105.0)  # heard again: each keeps its next look, then the safety net
    assert all(s.due <= 110 for s in polls.tables.values())


@pytest.mark.unit
@pytest.mark.parametrize("seed", range(5))
def test_commits_no_event_named_are_counted_where_the_events_miss_them(seed):
    """Tables whose commits are never announced (a notification filter leaving them out),
    tables whose events are sometimes lost, and tables always announced: what the safety
    net finds of quiet tables without a hint is counted (oracle: the commits each look
    finds, and whether a hint came for one of them), and no announced table is named."""
    rng = random.Random(seed)
    polls = IdlePolls(ceiling=10.0, events_ceiling=60.0)
    polls.hear(True, 0.0)
    names = [f"t{i}" for i in range(30)]
    never, lossy = set(names[:5]), set(names[5:10])
    pending: dict[str, int] = dict.fromkeys(names, 0)  # commits since the table's last look
    hinted: dict[str, bool] = dict.fromkeys(names, False)
    quiet: dict[str, bool] = dict.fromkeys(names, False)
    want = 0
    for t in range(3000):
        now = float(t)
        for name in names:
            if t > 5 and rng.random() < 0.004:  # a commit
                pending[name] += 1
                if name not in never and not (name in lossy and rng.random() < 0.5):
                    polls.hint(name, now)
                    hinted[name] = True
        for name in names:
            if polls.due(name, now):
                changed = t == 0 or pending[name] > 0
                if changed and t > 0 and quiet[name] and not hinted[name]:
                    want += 1
                assert polls.looked(name, changed, now) == (
                    changed and t > 0 and quiet[name] and not hinted[name]
                )
                quiet[name] = not changed
                pending[name], hinted[name] = 0, False
    assert polls.unannounced == want > 0
    assert never <= polls.unannounced_tables <= never | lossy


# -- the database stream with commit events ----------------------------------------------
class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class NoReceiver:
    """In place of a receiver: the test fills the inbox itself."""

    def stop(self) -> None:
        pass


def rows(lo: int, hi: int) -> pa.Table:
    return pa.table({"id": np.arange(lo, hi), "s": [f"a{i}" for i in range(lo, hi)]})


def make_tables(root: str, n: int, opts: dict[str, str] | None = None) -> dict:
    db = lancedb.connect(root, storage_options=opts or {})
    so = {**(opts or {}), **STABLE}
    return {f"t{i}": db.create_table(f"t{i}", rows(0, 5), storage_options=so) for i in range(n)}


def reader(root: str, opts: dict[str, str] | None = None, **options: str) -> DatabaseReader:
    storage = {f"storage.{k}": v for k, v in (opts or {}).items()}
    base = {"database": root, "writerSlots": "1", "keyHash": "id", "kafkaPartitions": "1"}
    r = DatabaseReader({**base, **storage, **options})
    r.clock = FakeClock()
    return r


class Stream:
    """A database stream's driver side, triggered by hand every simulated second."""

    def __init__(self, r: DatabaseReader):
        self.r = r
        self.offset = r.initialOffset()
        self.seen: dict[str, list[int]] = {n: [self.version(n)] for n in self.offset["tables"]}

    def version(self, name: str) -> int:
        return int(self.offset["tables"][name]["version"])

    def trigger(self, pause: float = 0.0) -> None:
        if pause:
            time.sleep(pause)  # (real time: a receiver's thread delivers meanwhile)
        self.r.clock.now += 1.0
        self.offset = self.r.latestOffset(self.offset, ReadAllAvailable())
        for name in self.offset["tables"]:
            self.seen.setdefault(name, []).append(self.version(name))

    def until(self, what, triggers: int, pause: float = 0.05) -> int:
        """Triggers until `what()`; how many it took (fails past `triggers`)."""
        for n in range(1, triggers + 1):
            self.trigger(pause)
            if what():
                return n
        raise AssertionError(f"not within {triggers} triggers")


def heard(r: DatabaseReader, within: float = 20.0) -> None:
    deadline = time.monotonic() + within
    while not (r.hints is not None and r.hints.heard()):
        assert time.monotonic() < deadline, r.hints.why_not() if r.hints else "no receiver"
        time.sleep(0.05)


def latest(table) -> int:
    return int(table.version)


def test_lost_repeated_late_and_reordered_hints_lose_and_repeat_no_version(tmp_path):
    """Hints are only hints: commits whose events are lost are found by the safety net,
    repeated and stale hints find nothing new, late and reordered ones only move a look;
    each table's offsets go up one by one to its latest version, none skipped back."""
    root = str(tmp_path / "db")
    tables = make_tables(root, 3)
    r = reader(root, commitEvents="files", commitEventsPollMax="60")
    r.receiver, r.hints = NoReceiver(), CommitHints("test", stale_after=1e9)
    r.hints.answered()
    stream = Stream(r)
    stream.until(lambda: r.polls.events, 3, pause=0)
    late: list[str] = []
    for step in range(24):
        name = f"t{step % 3}"
        tables[name].add(rows(100 + step, 101 + step))
        kind = step % 4
        if kind == 1:  # repeated, and a stale one for a table that did not commit
            r.hints.add([f"{name}.lance", f"{name}.lance", f"t{(step + 1) % 3}.lance"])
        elif kind == 2:  # late: delivered after later ones (reordered)
            late.append(f"{name}.lance")
        elif kind == 3:
            r.hints.add([f"{name}.lance"])
            if late:
                r.hints.add(late[::-1])
                late.clear()
        # kind 0: lost
        stream.trigger()
        if kind in (1, 3):  # a hint on time: seen at the trigger it came at
            assert stream.version(name) == latest(tables[name]), (step, stream.seen)
    for _ in range(70):  # the safety net finds what no hint announced
        stream.trigger()
    for name, table in tables.items():
        versions = stream.seen[name]
        assert versions[-1] == latest(table), (name, versions)
        assert versions == sorted(versions), versions


def test_switching_between_events_and_listing(tmp_path):
    """Not heard: every table within the listing ceiling, and the report says why; heard
    again: a hinted commit at once, an unhinted one within the safety net."""
    root = str(tmp_path / "db")
    report = tmp_path / "report.json"
    tables = make_tables(root, 3)
    r = reader(
        root,
        commitEvents="files",
        commitEventsPollMax="120",
        idlePollMax="5",
        report=str(report),
    )
    r.receiver, r.hints = NoReceiver(), CommitHints("test", stale_after=1e9)
    r.hints.answered()
    stream = Stream(r)
    for _ in range(30):
        stream.trigger()
    assert json.loads(report.read_text())["discovery"]["mode"] == "events"
    r.hints.failed("queue unreachable: test")
    tables["t1"].add(rows(50, 51))  # no hint: found by listing within the ceiling
    took = stream.until(lambda: stream.version("t1") == latest(tables["t1"]), 7, pause=0)
    assert not r.polls.events and took <= 6
    discovery = json.loads(report.read_text())["discovery"]
    assert discovery == {
        "mode": "listing",
        "events": "test",
        "why": "queue unreachable: test",
        "hints": 0,
        "unannounced": 0,
        "unannounced_tables": [],
    }
    r.hints.answered()
    stream.trigger()
    assert r.polls.events
    for _ in range(10):
        stream.trigger()
    tables["t2"].add(rows(60, 61))
    r.hints.add(["t2.lance"])
    stream.trigger()
    assert stream.version("t2") == latest(tables["t2"])
    tables["t0"].add(rows(70, 71))  # its event lost: the safety net
    stream.until(lambda: stream.version("t0") == latest(tables["t0"]), 125, pause=0)
    assert all(v == sorted(v) for v in stream.seen.values())
    # ... and says so: t1's commit was found while events were not heard, t2's was named
    discovery = json.loads(report.read_text())["discovery"]
    assert (discovery["unannounced"], discovery["unannounced_tables"]) == (1, ["t0"])
    line = _discovery_line(discovery)
    assert "1 commit(s) found by listing that no event named (tables t0)" in line, line


# -- receivers ---------------------------------------------------------------------------
def test_a_local_database_s_commits_found_by_file_system_events(tmp_path):
    """`files`: a commit to a quiet table is seen at the next trigger, a new table taken
    up, and quiet tables are not looked at meanwhile."""
    root = str(tmp_path / "db")
    tables = make_tables(root, 5)
    r = reader(root, commitEvents="files", commitEventsPollMax="600")
    stream = Stream(r)
    heard(r)
    for _ in range(20):
        stream.trigger()
    looks = r.polls.looks
    for _ in range(60):
        stream.trigger()
    assert r.polls.looks - looks <= 5  # (a first safety-net look, spread over 600 s)
    tables["t2"].add(rows(10, 12))
    stream.until(lambda: stream.version("t2") == latest(tables["t2"]), 20)
    lancedb.connect(root).create_table("late", rows(0, 3), storage_options=STABLE)
    stream.until(lambda: "late" in stream.offset["tables"], 20)
    r.stop()


GUIDE = Path(__file__).resolve().parents[2] / "docs" / "guides" / "database.md"
GUIDE_QUEUE = "arn:aws:sqs:eu-west-1:111122223333:lake-db-commits"  # the guide's example


def guide_json(holding: str) -> dict:
    """The guide's JSON block that holds `holding` (the setup a user copies)."""
    blocks = re.findall(r"^```json\n(.*?)^```", GUIDE.read_text(), flags=re.S | re.M)
    (block,) = [b for b in blocks if holding in b]
    return json.loads(block)


@pytest.fixture
def notified_bucket(s3_server):
    """A bucket of its own on the S3 server whose manifests S3 notifies to an SQS queue
    of the same server (moto delivers them in server mode), set up with the queue policy
    and the notification configuration of the guide (docs/guides/database.md), the
    account, region and names replaced: (bucket, queue URL)."""
    import boto3

    bucket = f"events-{uuid.uuid4().hex[:12]}"
    s3_server.create_bucket(bucket)
    opts = s3_server.storage_options()
    placeholder = f"{s3_server.endpoint}/123456789012/{bucket}"
    sqs = boto3.client("sqs", **sqs_client_arguments(placeholder, opts))
    queue = sqs.create_queue(QueueName=bucket)["QueueUrl"]
    arn = sqs.get_queue_attributes(QueueUrl=queue, AttributeNames=["QueueArn"])
    arn = arn["Attributes"]["QueueArn"]

    def ours(doc: dict) -> dict:
        text = (
            json.dumps(doc)
            .replace(GUIDE_QUEUE, arn)
            .replace("arn:aws:s3:::lake", f"arn:aws:s3:::{bucket}")
        )
        return json.loads(text.replace("111122223333", "123456789012"))

    sqs.set_queue_attributes(QueueUrl=queue, Attributes=ours(guide_json('"Policy"')))
    s3 = boto3.client("s3", **sqs_client_arguments(placeholder, opts))
    s3.put_bucket_notification_configuration(
        Bucket=bucket, NotificationConfiguration=ours(guide_json("QueueConfigurations"))
    )
    return bucket, queue


def test_commits_on_s3_found_by_the_queue_the_bucket_notifies(s3_server, notified_bucket):
    """End to end on the S3 server: a commit's notification reaches the queue, the
    receiver hints its table, the next trigger publishes it; quiet tables cost the store
    no request meanwhile."""
    bucket, queue = notified_bucket
    opts = s3_server.storage_options()
    root = f"s3://{bucket}/db"
    tables = make_tables(root, 5, opts)
    r = reader(root, opts, commitEvents=queue, commitEventsPollMax="600")
    stream = Stream(r)
    heard(r)
    for _ in range(20):
        stream.trigger()
    s3_server.request_counts_by_table(reset=True)
    for _ in range(60):
        stream.trigger()
    counts = s3_server.request_counts_by_table()
    per_table = {n: sum(counts.get(f"{bucket}/db/{n}.lance", {}).values()) for n in tables}
    assert sum(per_table.values()) <= 5, per_table  # (a first safety-net look at most)
    tables["t3"].add(rows(10, 12))
    took = stream.until(lambda: stream.version("t3") == latest(tables["t3"]), 40)
    assert took <= 20
    db = lancedb.connect(root, storage_options=opts)
    db.create_table("late", rows(0, 3), storage_options={**opts, **STABLE})
    stream.until(lambda: "late" in stream.offset["tables"], 40)
    assert r.hints is not None and r.hints.hints >= 2
    r.stop()


def test_an_unreachable_queue_falls_back_to_listing_and_says_so(s3_server, s3_uri, tmp_path):
    from lance_cdf.cli import main
    from lance_cdf.spark.publish.query_progress import QueryFollower
    from lance_cdf.spark.source.checkpoint import REPORT_FILE

    opts = s3_server.storage_options()
    root = s3_uri.rsplit("/", 1)[0] + "/db"
    tables = make_tables(root, 2, opts)
    checkpoint = tmp_path / "ck"
    checkpoint.mkdir()
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    queue = f"http://127.0.0.1:{port}/123456789012/nothing"
    r = reader(
        root, opts, commitEvents=queue, idlePollMax="3", report=str(checkpoint / REPORT_FILE)
    )
    stream = Stream(r)
    deadline = time.monotonic() + 20
    while "queue unreachable" not in str(r.hints.why_not() if r.hints else ""):
        assert time.monotonic() < deadline
        time.sleep(0.05)
    for _ in range(10):
        stream.trigger()
    tables["t1"].add(rows(10, 11))
    assert stream.until(lambda: stream.version("t1") == latest(tables["t1"]), 5, pause=0) <= 4
    discovery = json.loads((checkpoint / REPORT_FILE).read_text())["discovery"]
    assert discovery["mode"] == "listing" and discovery["why"].startswith("queue unreachable")
    args = ["status", "--database", root, "--checkpoint", str(checkpoint)]
    args += [f"--storage-option={k}={v}" for k, v in opts.items()]
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert main(args) == 0
    (line,) = [x for x in out.getvalue().splitlines() if x.startswith("discovery")]
    assert f"127.0.0.1:{port}" in line and "not heard (queue unreachable" in line, line
    progress = QueryFollower(None, checkpoint=str(checkpoint)).progress()  # type: ignore[arg-type]
    assert progress.events_heard == 0 and progress.commit_hints == 0
    r.stop()


# -- settings ----------------------------------------------------------------------------
@pytest.mark.unit
def test_commit_events_settings_are_checked_before_anything_starts(tmp_path):
    from lance_cdf.cli import build_parser
    from lance_cdf.cli.publish_command import publish_settings
    from lance_cdf.spark.publish.runner import _database_options
    from lance_cdf.spark.sink.sink_options import SinkOptions

    def settings(*flags: str):
        args = ["publish", "--bootstrap-servers", "b", "--schema-registry", "r"]
        args += ["--checkpoint", str(tmp_path / "ck"), *flags]
        return publish_settings(build_parser().parse_args(args))

    queue = "https://sqs.eu-west-1.amazonaws.com/111122223333/lake-commits"
    s3 = ("--database", "s3://lake/db", "--topic-prefix", "p")
    chosen = settings(*s3, "--commit-events", queue, "--commit-events-poll-max", "600")
    assert chosen.trigger_interval == "500 milliseconds"
    assert settings(*s3).trigger_interval == "1 second"
    source: dict[str, str] = {"path": "unused"}
    assert chosen.database is not None
    sink = SinkOptions("b", "r", table="t", topic="x")
    _database_options(chosen.database, source, sink, str(tmp_path))
    assert source["commitEvents"] == queue and source["commitEventsPollMax"] == "600"
    local = ("--database", str(tmp_path), "--topic-prefix", "p")
    assert settings(*local, "--commit-events", "files").database.commit_events == "files"
    for flags, words in (
        ((*local, "--commit-events", queue), "not on S3"),
        ((*s3, "--commit-events", "files"), "object storage"),
        ((*s3, "--commit-events", "https://example.com/q"), "URL of the SQS queue"),
        (("--table", "t", "--topic", "x", "--commit-events", "files"), "--database"),
    ):
        with pytest.raises(LanceCdfError, match=words):
            settings(*flags)


@pytest.mark.unit
def test_the_sqs_client_takes_the_database_s_connection_settings():
    opts = {
        "aws_access_key_id": "AK",
        "secret_access_key": "SK",  # (object_store's short name)
        "aws_region": "us-west-2",
        "aws_endpoint": "http://127.0.0.1:9000",
        "allow_http": "true",
    }
    local = sqs_client_arguments("http://127.0.0.1:9000/123456789012/q", opts)
    assert local == {
        "aws_access_key_id": "AK",
        "aws_secret_access_key": "SK",
        "region_name": "us-west-2",
        "endpoint_url": "http://127.0.0.1:9000",
    }
    aws = sqs_client_arguments("https://sqs.eu-west-1.amazonaws.com/111122223333/q", {})
    assert aws == {
        "region_name": "eu-west-1",
        "endpoint_url": "https://sqs.eu-west-1.amazonaws.com",
    }
