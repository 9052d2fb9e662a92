"""Staying up while taking tables up (ops/takeup.py, spark/source/database_stream.py,
spark/sink/kafka_sink.py), with injected faults and without Spark or a broker: a table
whose take-up fails is set aside alone and tried again with a growing pause, the others go
on; a followed table set aside keeps its offset and resumes exactly (the events equal
`read_changes`, the oracle); a writer task retries a table's publish after a transient
fault and fails at once on a refusal; causes are named in words."""

import json

import numpy as np
import pyarrow as pa
import pytest
from confluent_kafka import KafkaError, KafkaException
from pyspark.sql.streaming.datasource import ReadAllAvailable

import lance_cdf
from lance_cdf.errors import (
    KafkaAuthorizationError,
    KafkaUnavailableError,
    StableRowIdsRequiredError,
    in_words,
)
from lance_cdf.ops import takeup
from lance_cdf.ops.takeup import AsideTables, TakeUpSettings, is_transient, read_writer_retries
from lance_cdf.spark.sink import database_sink, kafka_sink
from lance_cdf.spark.sink.database_sink import TableWork, table_works
from lance_cdf.spark.sink.sink_options import SinkOptions
from lance_cdf.spark.source.database_stream import DatabaseReader

lancedb = pytest.importorskip("lancedb")
STABLE = {"new_table_enable_stable_row_ids": "true"}
NO_PAUSE = TakeUpSettings(first_s=0.0, longest_s=0.0, writer_backoff_s=(0.0,), writer_budget_s=60)


def rows(lo, hi):
    ids = np.arange(lo, hi)
    return pa.table({"id": ids, "s": [f"a{i}" for i in ids]})


def reader(root, report=None):
    options = {"database": root, "keyHash": "id", "writerSlots": "2", "kafkaPartitions": "3"}
    if report:
        options["report"] = report
    r = DatabaseReader({**options, "startingVersion": "1", "idlePollMax": "0"})
    r.aside = AsideTables(NO_PAUSE)
    return r


def events(r, start, end, root):
    batches = [b for p in r.partitions(start, end) for b in r.read(p)]
    out = {}
    for name, work in table_works(iter(batches), root, {}).items():
        got = pa.Table.from_batches([b for w in work.works for b in w.events()])
        out[name] = sorted(
            zip(got["_commit_version"].to_pylist(), got["id"].to_pylist(), strict=True)
        )
    return out


def oracle(uri, first=1):
    t = lance_cdf.read_changes(uri.removeprefix("file://"), first).read_all()
    return sorted(zip(t["_commit_version"].to_pylist(), t["id"].to_pylist(), strict=True))


class Faults:
    """Makes the readers of the tables named fail `count` times (as a throttling object
    store does), in their initial offset or their latest offset."""

    def __init__(self, monkeypatch, where):
        self.left: dict[str, int] = {}
        self.raised = 0
        real = DatabaseReader._make_reader
        faults = self

        def make(self_, name, resolved):
            made = real(self_, name, resolved)
            original = getattr(made, where)

            def failing(*args):
                if faults.left.get(name, 0) > 0:
                    faults.left[name] -= 1
                    faults.raised += 1
                    raise OSError(f"503 Slow Down reading {name}")
                return original(*args)

            setattr(made, where, failing)
            return made

        monkeypatch.setattr(DatabaseReader, "_make_reader", make)


def test_a_table_that_fails_to_be_taken_up_is_set_aside_and_retried(tmp_path, monkeypatch):
    root = str(tmp_path / "db")
    db = lancedb.connect(root)
    good = db.create_table("good", rows(0, 10), storage_options=STABLE)
    flaky = db.create_table("flaky", rows(0, 10), storage_options=STABLE)
    faults = Faults(monkeypatch, "initialOffset")
    faults.left["flaky"] = 3
    report = tmp_path / "ck" / "database-tables.json"
    r = reader(root, str(report))
    o0 = r.initialOffset()
    # the failing table is set aside alone, named with its cause in words; the other goes on
    assert sorted(o0["tables"]) == ["good"] and list(r.aside.tables) == ["flaky"]
    shown = json.loads(report.read_text())
    assert "503 Slow Down" in shown["aside"]["flaky"]["cause"]
    assert "OSError" not in shown["aside"]["flaky"]["cause"]
    assert shown["set_asides"] == 1
    good.add(rows(10, 12))
    flaky.add(rows(10, 13))
    offsets = [o0]
    for _ in range(3):  # tried again each trigger (no pause here): fails twice more, then in
        offsets.append(r.latestOffset(offsets[-1], ReadAllAvailable()))
    assert faults.raised == 3 and r.aside.tables == {}
    assert sorted(offsets[-1]["tables"]) == ["flaky", "good"]
    assert json.loads(report.read_text())["aside"] == {}
    # taken up late, it begins where the start said (startingVersion 1): nothing is lost
    final = r.latestOffset(offsets[-1], ReadAllAvailable())
    got: dict[str, list] = {}
    for a, b in zip([*offsets, final], [*offsets[1:], final], strict=False):
        for name, evs in events(r, a, b, root).items():
            got.setdefault(name, []).extend(evs)
    assert {n: sorted(v) for n, v in got.items()} == {
        "good": oracle(good.uri),
        "flaky": oracle(flaky.uri),
    }


def test_a_followed_table_set_aside_keeps_its_offset(tmp_path, monkeypatch):
    root = str(tmp_path / "db")
    db = lancedb.connect(root)
    a = db.create_table("a", rows(0, 10), storage_options=STABLE)
    b = db.create_table("b", rows(0, 10), storage_options=STABLE)
    faults = Faults(monkeypatch, "latestOffset")
    r = reader(root)
    o0 = r.initialOffset()
    a.add(rows(10, 20))
    b.add(rows(10, 20))
    faults.left["b"] = 2
    o1 = r.latestOffset(o0, ReadAllAvailable())
    # b failed: kept exactly where it was, a moved on
    assert o1["tables"]["b"] == o0["tables"]["b"] and o1["tables"]["a"] != o0["tables"]["a"]
    assert "b" in r.aside.tables and r.aside.tables["b"].attempts == 1
    o2 = r.latestOffset(o1, ReadAllAvailable())
    assert r.aside.tables["b"].attempts == 2 and o2["tables"]["b"] == o0["tables"]["b"]
    o3 = r.latestOffset(o2, ReadAllAvailable())
    assert r.aside.tables == {} and r.aside.retries == 1
    got = events(r, o0, o1, root)
    got_b = events(r, o2, o3, root)
    assert got == {"a": oracle(a.uri)} and got_b == {"b": oracle(b.uri)}


def test_a_set_aside_table_waits_its_pause_and_the_pause_grows(tmp_path, monkeypatch):
    settings = TakeUpSettings(first_s=2.0, longest_s=10.0)
    assert [settings.pause(n) for n in (1, 2, 3, 4, 5)] == [2.0, 4.0, 8.0, 10.0, 10.0]
    clock = [1000.0]
    monkeypatch.setattr(takeup.time, "monotonic", lambda: clock[0])
    aside = AsideTables(settings)
    aside.fail("t", OSError("throttled"))
    assert not aside.due("t") and aside.due("other")
    clock[0] += 2.0
    assert aside.due("t")
    aside.fail("t", OSError("throttled"))
    clock[0] += 3.0
    assert not aside.due("t")
    aside.succeeded("t")
    assert aside.due("t") and aside.set_asides == 1 and aside.retries == 1


def test_a_table_without_stable_row_ids_is_left_out_not_retried(tmp_path):
    root = str(tmp_path / "db")
    db = lancedb.connect(root)
    db.create_table("legacy", rows(0, 5))
    r = reader(root)
    assert r.initialOffset()["tables"] == {}
    assert "stable row IDs" in r.skipped["legacy"] and r.aside.tables == {}


def test_faults_are_told_from_refusals():
    assert is_transient(OSError("connection reset"))
    assert is_transient(KafkaUnavailableError("no answer"))
    assert is_transient(KafkaException(KafkaError(KafkaError._TRANSPORT)))
    assert is_transient(KafkaException(KafkaError(KafkaError.UNKNOWN_TOPIC_OR_PART)))
    wrapped = ValueError("could not publish")
    wrapped.__cause__ = TimeoutError("timed out")
    assert is_transient(wrapped)
    assert not is_transient(KafkaException(KafkaError(KafkaError.TOPIC_AUTHORIZATION_FAILED)))
    assert not is_transient(KafkaAuthorizationError("denied"))
    assert not is_transient(StableRowIdsRequiredError("no stable row ids"))
    assert not is_transient(ValueError("bad value"))


def test_causes_are_words_not_exception_classes():
    assert in_words(KeyError("items")) == "'items' was not found"
    missing = FileNotFoundError(2, "No such file or directory", "/db/t.lance/_versions/3")
    assert in_words(missing) == "a file it needs is missing (/db/t.lance/_versions/3)"
    assert in_words(TimeoutError()) == "no answer in time"
    assert in_words(RuntimeError("")).startswith("an unexpected error")
    for exc in (KeyError("x"), OSError("x"), ValueError("x"), ConnectionError("x")):
        assert type(exc).__name__ not in in_words(exc)


class FakeWriter(kafka_sink.KafkaStreamWriter):
    """The sink's writer with its per-table publish replaced (what is retried is its
    caller's loop): the first `fail` calls raise `fault`."""

    def __init__(self, options, fault, fail):
        super().__init__(options)
        self.fault, self.fail, self.calls = fault, fail, 0

    def _write(self, iterator, options, name, table, storage):
        self.calls += 1
        if self.calls <= self.fail:
            raise self.fault
        return kafka_sink.Published(5, {})


def _writer(tmp_path, monkeypatch, fault, fail):
    monkeypatch.setattr(takeup, "DEFAULT", NO_PAUSE)
    monkeypatch.setattr(database_sink, "table_topic", lambda *args: 3)
    monkeypatch.setattr(database_sink, "is_gone", lambda *args: False)
    checkpoint = tmp_path / "ck"
    checkpoint.mkdir()
    options = {
        "database": str(tmp_path / "db"),
        "topic.prefix": "p",
        "kafka.bootstrap.servers": "127.0.0.1:1",
        "schema.registry.url": "http://127.0.0.1:1",
        "checkpointLocation": str(checkpoint),
    }
    writer = FakeWriter(SinkOptions.parse(options), fault, fail)
    return writer, str(checkpoint)


def test_a_writer_task_retries_a_table_after_a_transient_fault(tmp_path, monkeypatch):
    fault = KafkaException(KafkaError(KafkaError._TRANSPORT))
    writer, checkpoint = _writer(tmp_path, monkeypatch, fault, 3)
    done = writer._write_table(TableWork("t", "/db/t.lance"))
    assert done is not None and done.records == 5 and writer.calls == 4
    state = read_writer_retries(checkpoint)
    assert state is not None and state.retries == 3 and state.table == "t"


def test_a_writer_task_fails_at_once_on_a_refusal(tmp_path, monkeypatch):
    fault = KafkaAuthorizationError("the broker denies Write on topic p.t")
    writer, checkpoint = _writer(tmp_path, monkeypatch, fault, 1)
    with pytest.raises(KafkaAuthorizationError):
        writer._write_table(TableWork("t", "/db/t.lance"))
    assert writer.calls == 1 and read_writer_retries(checkpoint) is None


def test_a_writer_task_retries_a_failed_listing_of_the_database(tmp_path, monkeypatch):
    root = str(tmp_path / "db")
    db = lancedb.connect(root)
    t = db.create_table("t", rows(0, 3), storage_options=STABLE)
    monkeypatch.setattr(database_sink, "DEFAULT", NO_PAUSE)
    real, left = database_sink.list_tables, [2]

    def throttled(*args):
        if left[0]:
            left[0] -= 1
            raise OSError("503 Slow Down")
        return real(*args)

    monkeypatch.setattr(database_sink, "list_tables", throttled)
    assert database_sink.table_uri(root, "t", "no-such-digest", {}) == t.uri
    assert left == [0]
    left[0] = 1
    monkeypatch.setattr(database_sink, "is_transient", lambda exc: False)
    with pytest.raises(OSError):  # a fault that does not pass: raised at once
        database_sink.table_uri(root, "t", "no-such-digest", {})


def test_the_demo_shows_an_unknown_lag_until_it_is_known():
    from lance_cdf_demo.live_view import Snapshot, TableSnapshot, line

    waiting = TableSnapshot("items", 3, None, None, None, 0)
    assert waiting.lag_records is None and not waiting.caught_up
    shown = line(Snapshot(1.0, [waiting], 0.0, "-"), "start")
    assert "(lag -)" in shown and "(lag 0)" not in shown
    done = TableSnapshot("items", 3, 3, 3, 12, 12)
    assert done.lag_records == 0 and done.caught_up
    assert "(lag 0)" in line(Snapshot(1.0, [done], 0.0, "-"), "run")


def test_a_dropped_table_is_reported_in_words(tmp_path, caplog):
    root = str(tmp_path / "db")
    db = lancedb.connect(root)
    items = db.create_table("items", rows(0, 5), storage_options=STABLE)
    db.create_table("other", rows(0, 5), storage_options=STABLE)
    r = reader(root)
    o0 = r.initialOffset()
    items.add(rows(5, 9))
    o1 = r.latestOffset(o0, ReadAllAvailable())
    db.drop_table("items")  # dropped between planning and reading its micro-batch
    r.refs.pop("items")
    with caplog.at_level("WARNING"):
        assert "items" not in events(r, o0, o1, root)
        r.listed_at -= 60
        assert sorted(r.latestOffset(o1, ReadAllAvailable())["tables"]) == ["other"]
    lines = [rec.getMessage() for rec in caplog.records if "items" in rec.getMessage()]
    assert lines and all("dropped from the database" in line for line in lines), lines
    assert not any("Error" in line or "let go (" in line for line in lines), lines
