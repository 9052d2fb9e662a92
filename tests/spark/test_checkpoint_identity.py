"""A stream's offsets know their table and start (spark/source/identity.py): a checkpoint given
another table, or another --starting-version, is refused; a moved table is accepted. Driver
side without a Spark session; the last test runs `lance-cdf publish` against the real broker."""

import json
import os
import shutil
import subprocess
import sys
import uuid

import lance
import numpy as np
import pyarrow as pa
import pytest
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadMaxFiles

from lance_cdf.errors import CheckpointMismatchError, VersionNotFoundError
from lance_cdf.spark.source.readers import LanceCdfStreamReader
from lance_cdf.spark.source.resolution import resolve
from lance_cdf.spark.source.types import spark_schema


def history(uri, versions=15):
    """A table of `versions` versions: a write, then appends and updates."""
    lance.write_dataset(pa.table({"id": np.arange(10)}), uri, enable_stable_row_ids=True)
    for v in range(2, versions + 1):
        if v % 2:
            lance.dataset(uri).update({"id": "id + 100"}, where=f"id = {v % 10}")
        else:
            lance.write_dataset(pa.table({"id": np.arange(3) + 1000 * v}), uri, mode="append")
    return uri


def reader(uri, **options):
    resolved = resolve({"path": uri, **{k: str(v) for k, v in options.items()}}, streaming=True)
    return LanceCdfStreamReader(resolved, spark_schema(resolved.user_schema))


def first_batch(uri, versions):
    """The end offset of a stream's first micro-batch of `versions` versions from version 1."""
    r = reader(uri, startingVersion=1)
    return stored(r.latestOffset(r.initialOffset(), ReadMaxFiles(versions)))


def stored(offset):
    return json.loads(json.dumps(offset))  # what a checkpoint keeps and gives back


def test_offsets_carry_the_table_and_start_and_are_stable(tmp_path):
    uri = history(str(tmp_path / "a.lance"))
    r = reader(uri, startingVersion=1)
    start = r.initialOffset()
    assert start == {"version": 0, "from": "1"}  # version 0 has no commit to name
    end = r.latestOffset(start, ReadMaxFiles(8))
    assert end["version"] == 8 and end["from"] == "1"
    assert end["table"]["uri"] == uri and len(end["table"]["commit"]) == 16
    # the same version gives the same offset (Spark compares them as JSON)
    again = reader(uri, startingVersion=1)
    assert again.latestOffset(start, ReadMaxFiles(8)) == end
    done = r.latestOffset(stored(r.latestOffset(end, ReadAllAvailable())), ReadAllAvailable())
    assert done["version"] == 15 and r.latestOffset(stored(done), ReadAllAvailable()) == done


def test_another_tables_checkpoint_is_refused_naming_both(tmp_path):
    a = history(str(tmp_path / "a.lance"))
    c = history(str(tmp_path / "c.lance"))
    at8 = first_batch(a, 8)
    for entry, fix in (("spark", "new checkpointLocation"), ("publish", "--checkpoint a new")):
        other = reader(c, entryPoint=entry)
        with pytest.raises(CheckpointMismatchError) as err:
            other.latestOffset(at8, ReadAllAvailable())
        message = str(err.value)
        assert f"follows table {a}, not {c}" in message and fix in message, message
        assert "\n" not in message
        # a restart replays the planned micro-batch: checked there too
        with pytest.raises(CheckpointMismatchError):
            other.partitions(at8, stored({**at8, "version": 9}))


def test_a_moved_or_copied_table_is_accepted(tmp_path):
    a = history(str(tmp_path / "a.lance"))
    at8 = first_batch(a, 8)
    moved = str(tmp_path / "elsewhere" / "moved.lance")
    os.makedirs(os.path.dirname(moved))
    shutil.move(a, moved)
    r = reader(moved)
    end = r.latestOffset(at8, ReadAllAvailable())
    assert end["version"] == 15 and end["table"]["uri"] == moved and end["from"] == "1"
    assert [p.segments[0][0] for p in r.partitions(at8, stored(end))][0] == 9
    copy = str(tmp_path / "copy.lance")
    shutil.copytree(moved, copy)
    assert reader(copy).latestOffset(at8, ReadAllAvailable())["version"] == 15


def test_a_different_start_on_an_existing_checkpoint_is_refused(tmp_path):
    a = history(str(tmp_path / "a.lance"))
    at8 = first_batch(a, 8)
    # the same start, or none: resumes at 9
    assert reader(a, startingVersion=1).latestOffset(at8, ReadAllAvailable())["version"] == 15
    assert reader(a).latestOffset(at8, ReadAllAvailable())["version"] == 15
    with pytest.raises(CheckpointMismatchError) as err:
        reader(a, startingVersion=3, entryPoint="publish").latestOffset(at8, ReadAllAvailable())
    assert str(err.value) == (
        "the checkpoint was started with --starting-version 1 and has delivered through "
        "version 8; --starting-version 3 applies to a new checkpoint only. Leave it out (or "
        "give the same) to resume, or give --checkpoint a new, empty directory to start from 3."
    )
    with pytest.raises(CheckpointMismatchError, match="startingVersion=earliest applies"):
        reader(a, startingVersion="earliest").latestOffset(at8, ReadAllAvailable())


def test_an_offset_without_identity_is_accepted(tmp_path):
    """Offsets written before (no table, no start) go on; the next ones carry both."""
    a = history(str(tmp_path / "a.lance"))
    end = reader(a, startingVersion=5).latestOffset({"version": 8}, ReadAllAvailable())
    assert end["version"] == 15 and "table" in end and "from" not in end


def test_cleanup_advice_names_only_what_the_entry_point_has(tmp_path):
    a = history(str(tmp_path / "a.lance"))
    at3 = first_batch(a, 3)
    for v in (3, 4, 5):  # versions the stream has not read yet
        os.remove(_manifest(a, v))
    with pytest.raises(VersionNotFoundError) as spark:
        reader(a).latestOffset(at3, ReadAllAvailable())
    with pytest.raises(VersionNotFoundError) as publish:
        reader(a, entryPoint="publish").latestOffset(at3, ReadAllAvailable())
    assert "failOnDataLoss=false" in str(spark.value)
    text = str(publish.value)
    assert "failOnDataLoss" not in text and "checkpointLocation" not in text, text
    assert "--snapshot" in text and "new --topic" in text and "version(s) 4..6" in text, text


def _manifest(uri, version):
    return os.path.join(uri, "_versions", f"{18446744073709551615 - version:020}.manifest")


def _publish(table, checkpoint, topic, kafka_broker, schema_registry, *extra):
    args = [
        "publish",
        "--table",
        table,
        "--bootstrap-servers",
        kafka_broker.bootstrap_servers,
        "--topic",
        topic,
        "--schema-registry",
        schema_registry.url,
        "--checkpoint",
        checkpoint,
        "--available-now",
        *extra,
    ]
    return subprocess.run(
        [sys.executable, "-m", "lance_cdf.cli", *args],
        capture_output=True,
        text=True,
        env={**os.environ, "PYSPARK_PYTHON": sys.executable},
        timeout=300,
    )


def _records(bootstrap, topic):
    from confluent_kafka import Consumer, TopicPartition

    c = Consumer({"bootstrap.servers": bootstrap, "group.id": uuid.uuid4().hex})
    try:
        meta = c.list_topics(topic, timeout=30).topics[topic]
        if meta.error is not None:
            return 0
        return sum(
            hi - lo
            for lo, hi in (
                c.get_watermark_offsets(TopicPartition(topic, p), timeout=30)
                for p in meta.partitions
            )
        )
    finally:
        c.close()


def test_publish_refuses_another_tables_checkpoint_in_one_line(
    tmp_path, kafka_broker, schema_registry
):
    """A checkpoint belongs to one table: C published with A's checkpoint and
    --starting-version 1 once sent versions 9-15 of C and exited 0. Now: exit 2, one line
    naming both tables, nothing sent; a different --starting-version on A's own checkpoint
    is refused too, the same one resumes."""
    a = history(str(tmp_path / "a.lance"), versions=8)
    c = history(str(tmp_path / "c.lance"), versions=15)
    ck, topic = str(tmp_path / "ck-a"), f"ident-{uuid.uuid4().hex[:8]}"
    first = _publish(a, ck, topic, kafka_broker, schema_registry, "--starting-version", "1")
    assert first.returncode == 0, first.stderr[-3000:]
    held = _records(kafka_broker.bootstrap_servers, topic)
    assert held > 0

    other = f"ident-c-{uuid.uuid4().hex[:8]}"
    foreign = _publish(c, ck, other, kafka_broker, schema_registry, "--starting-version", "1")
    assert foreign.returncode == 2
    assert foreign.stderr.strip().splitlines() == [
        f"lance-cdf: error: checkpoint {ck} follows table {a}, not {c}: their version 8 is "
        f"another commit. To publish {c}, give --checkpoint a new, empty directory; a table "
        "that was moved or copied is accepted."
    ], foreign.stderr[-3000:]
    assert _records(kafka_broker.bootstrap_servers, other) == 0

    moved = _publish(a, ck, topic, kafka_broker, schema_registry, "--starting-version", "3")
    assert moved.returncode == 2 and len(moved.stderr.strip().splitlines()) == 1, moved.stderr
    assert "was started with --starting-version 1" in moved.stderr

    lance.write_dataset(pa.table({"id": [7777]}), a, mode="append")  # version 9
    again = _publish(a, ck, topic, kafka_broker, schema_registry, "--starting-version", "1")
    assert again.returncode == 0, again.stderr[-3000:]
    assert _records(kafka_broker.bootstrap_servers, topic) == held + 1  # version 9 only


def test_schema_change_advice_names_only_what_the_entry_point_has(tmp_path):
    """A schema change's advice names only what the entry point has: publish once advised
    mergeSchema=true, which it has no flag for."""
    a = history(str(tmp_path / "a.lance"), versions=3)
    spark, publish = reader(a), reader(a, entryPoint="publish")
    lance.dataset(a).add_columns({"twice": "id * 2"})
    lance.dataset(a).update({"twice": "0"}, where="id = 1")
    start = stored(spark.initialOffset())
    with pytest.raises(Exception) as s:
        spark.latestOffset(start, ReadAllAvailable())
    with pytest.raises(Exception) as p:
        publish.latestOffset(start, ReadAllAvailable())
    assert "set mergeSchema=true" in str(s.value)
    text = str(p.value)
    assert "new column(s) ['twice']" in text and "mergeSchema" not in text, text
    assert "Rerun lance-cdf publish (same --checkpoint)" in text, text


def test_a_publisher_killed_while_writing_its_first_offset_restarts(
    tmp_path, kafka_broker, schema_registry
):
    """A publisher SIGKILLed while Spark wrote `offsets/0` leaves the write's temporary
    file (and its checksum) in `offsets/`; Spark then refuses the checkpoint on every start
    (STATE_STORE_CHECKPOINT_LOCATION_NOT_EMPTY). The next publish removes what the
    unfinished write left, starts, and delivers through the latest version."""
    from lance_cdf.spark.source.checkpoint import committed_offset

    a = history(str(tmp_path / "a.lance"), versions=4)
    ck, topic = tmp_path / "ck", f"ident-k-{uuid.uuid4().hex[:8]}"
    (ck / "offsets").mkdir(parents=True)
    left = f"{uuid.uuid4()}"
    (ck / "offsets" / f".0.{left}.tmp").write_text("v1\n")
    (ck / "offsets" / f"..0.{left}.tmp.crc").write_bytes(b"")
    done = _publish(a, str(ck), topic, kafka_broker, schema_registry, "--starting-version", "1")
    assert done.returncode == 0, done.stderr[-3000:]
    assert os.listdir(ck / "offsets") and all(
        n.isdigit() or n.endswith(".crc") for n in os.listdir(ck / "offsets")
    )
    assert committed_offset(str(ck))["version"] == lance.dataset(a).version
    assert _records(kafka_broker.bootstrap_servers, topic) > 0


@pytest.mark.unit
def test_only_unfinished_writes_are_removed_from_a_checkpoint(tmp_path):
    from lance_cdf.spark.source.checkpoint import drop_unfinished_writes

    kept = {"offsets": ["0", ".0.crc", "1", ".1.crc"], "commits": ["0", ".0.crc"]}
    gone = {
        "offsets": [".2.7a1c-9f.tmp", "..2.7a1c-9f.tmp.crc"],
        "commits": [".1.0b2e4d.tmp"],
    }
    for log in kept:
        (tmp_path / log).mkdir()
        for name in kept[log] + gone[log]:
            (tmp_path / log / name).write_text("")
    removed = drop_unfinished_writes(f"file://{tmp_path}")
    assert sorted(removed) == sorted(f"{log}/{n}" for log in gone for n in gone[log])
    assert {log: sorted(os.listdir(tmp_path / log)) for log in kept} == {
        log: sorted(names) for log, names in kept.items()
    }
    assert drop_unfinished_writes("s3a://bucket/ck") == []
