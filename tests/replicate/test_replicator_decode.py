"""The replicator's vectorized batch path against its fastavro path, without Kafka:
same upserts, deletes, dead letters for random batches (several partitions, schema
versions, poison records, tombstones)."""

import io
import json
import random
import struct

import fastavro
import numpy as np
import pyarrow as pa
import pytest
from confluent_kafka.schema_registry.error import SchemaRegistryError

from lance_cdf.avro.schema import change_records, envelope_schema
from lance_cdf.errors import ConsumerFatalError, RegistryRefusedError, ReplicateError
from lance_cdf.replicate.applier import batch_positions
from lance_cdf.replicate.consumers import MAX_RENEWALS, DeadLetters, Renewals, read_renewals
from lance_cdf.replicate.counters import Counters
from lance_cdf.replicate.final_states import FinalStatesDecoder
from lance_cdf.replicate.replica import SOURCE_ROWID
from lance_cdf.replicate.replica_identity import ReplicaIdentity
from lance_cdf.replicate.writer_schemas import SchemaDecoder
from tests.avro.test_avro_decode import COLUMNS, random_events


class Msg:
    def __init__(self, value, partition, offset):
        self._v, self._p, self._o = value, partition, offset

    def value(self):
        return self._v

    def key(self):
        return b"k"

    def partition(self):
        return self._p

    def offset(self):
        return self._o


class Registry:
    def __init__(self, schemas):
        self.schemas = schemas

    def get_schema(self, sid):
        if sid not in self.schemas:
            raise KeyError(f"schema {sid} not found")

        class S:
            schema_str = json.dumps(self.schemas[sid])

        return S()


class DeadLetterProducer:
    def __init__(self):
        self.got = []

    def produce(self, topic, key, value, headers):
        self.got.append((value, dict(headers)))

    def flush(self, timeout):
        return 0


class Decoding(FinalStatesDecoder):
    """A replicator's decoding of topic "t" into replica "r.lance" (the first source table
    seen is followed), with a dead-letter producer that keeps what it got (`dlq.got`);
    every upsert looked up (no fresh bounds: the replica is not consulted here)."""

    def __init__(self, schemas, key=None, dlq=True):
        self.counters = Counters()
        self.dlq = DeadLetterProducer() if dlq else None
        letters = DeadLetters("t", "t.dlq" if dlq else None, self.dlq, self.counters)
        super().__init__(
            "t",
            list(key) if key else [SOURCE_ROWID],
            SchemaDecoder(Registry(schemas)),
            letters,
            ReplicaIdentity("t", "r.lance"),
        )


def replicator(schemas, key=None, dlq=True):
    return Decoding(schemas, key, dlq)


def wire(sid, schema, value):
    buf = io.BytesIO()
    fastavro.schemaless_writer(buf, fastavro.parse_schema(schema), value)
    return b"\x00" + struct.pack(">I", sid) + buf.getvalue()


# the newer schema adds nullable columns (as add_column does) and widens i32 to long
NEWER = pa.schema([f if f.name == "id" else f.with_nullable(True) for f in COLUMNS])
OLDER = pa.schema(
    [pa.field("id", pa.int64(), nullable=False), ("s", pa.string()), ("i32", pa.int32())]
)


def batch(seed, poison=True):
    """Messages of two schema versions (the older without most columns) over three
    partitions, with tombstones and (optionally) poison records."""
    rng = random.Random(seed)
    new = envelope_schema(NEWER, "t")
    old = envelope_schema(OLDER, "t")
    events = random_events(rng, 300)
    # reuse a few ids so that keys repeat across records
    events = events.set_column(0, "id", pa.array([i % 40 for i in events["id"].to_pylist()]))
    records = [v for _, v, _ in change_records(events, COLUMNS.names, {}, "t", None, "0", 0)]
    msgs, offsets = [], [0, 0, 0]
    for r in records:
        p = rng.randrange(3)
        if rng.random() < 0.3:
            for side in ("before", "after"):
                if r[side] is not None:
                    r = {**r, side: {c: r[side][c] for c in OLDER.names}}
            value = wire(7, old, r)
        else:
            value = wire(9, new, r)
        if poison and rng.random() < 0.05:
            value = rng.choice(
                [
                    value[: len(value) // 2],
                    b"garbage",
                    b"\x00\x00\x00\x00\x63" + value[5:],
                    value[:5] + b"\x06" + value[6:],
                ]
            )
        if rng.random() < 0.03:
            value = None  # tombstone
        msgs.append(Msg(value, p, offsets[p]))
        offsets[p] += 1
    return {7: old, 9: new}, msgs


def rows_of(table):
    return None if table is None else sorted(map(repr, table.to_pylist()))


@pytest.mark.parametrize("seed", [1, 2, 3])
@pytest.mark.parametrize("key", [None, ["id"]])
def test_vectorized_batch_equals_fastavro_batch(seed, key):
    schemas, msgs = batch(seed)
    fast, slow = replicator(schemas, key), replicator(schemas, key)
    got = fast.final_states_vectorized(msgs)
    want = slow.final_states_fastavro(msgs)
    assert got is not None
    assert got[2:] == want[2:]
    assert got[0].schema == want[0].schema
    assert rows_of(got[0]) == rows_of(want[0]) and rows_of(got[1]) == rows_of(want[1])
    assert got[0].num_rows > 0 and got[1].num_rows > 0
    # the same records go to the dead-letter topic, in the same order
    assert [v for v, _ in fast.dlq.got] == [v for v, _ in slow.dlq.got]
    assert len(fast.dlq.got) > 0
    assert fast.counters.dead_letters == slow.counters.dead_letters


def test_without_dead_letter_topic_the_first_bad_record_stops_the_batch():
    schemas, msgs = batch(4, poison=False)
    msgs[5] = Msg(b"not avro at all", msgs[5].partition(), msgs[5].offset())
    msgs[9] = Msg(b"\x00\x00\x00\x00\x07garbage", msgs[9].partition(), msgs[9].offset())
    where = f"partition {msgs[5].partition()} offset {msgs[5].offset()} "
    with pytest.raises(ReplicateError, match=where):
        replicator(schemas, dlq=False).final_states(msgs)


class RefusingRegistry(Registry):
    """Answers every id with one registry error."""

    def __init__(self, schemas, status, code):
        super().__init__(schemas)
        self.status, self.code = status, code

    def get_schema(self, sid):
        raise SchemaRegistryError(self.status, self.code, "refused")


@pytest.mark.parametrize("vectorized", [True, False])
def test_a_registry_refusal_is_no_dead_letter_an_unknown_id_is(vectorized):
    """A registry that refuses the request (401: credentials; 404 without "schema not
    found": a wrong URL) says nothing of the record: it stops the replicator, nothing is
    set aside. Only "schema not found" (SR code 40403) makes a record a dead letter."""
    schemas, msgs = batch(4, poison=False)
    for status, code in ((401, 40101), (403, -1), (404, -1)):
        rep = replicator(schemas)
        rep.schemas = SchemaDecoder(RefusingRegistry(schemas, status, code))
        decode = rep.final_states_vectorized if vectorized else rep.final_states_fastavro
        with pytest.raises(
            RegistryRefusedError,
            match=r"^the schema registry refused schema "
            r"id \d+ .*: not an answer about the record, so it is not set "
            r"aside. Check --schema-registry",
        ):
            decode(msgs)
        assert rep.dlq.got == []
    rep = replicator(schemas)
    rep.schemas = SchemaDecoder(RefusingRegistry(schemas, 404, 40403))
    decode = rep.final_states_vectorized if vectorized else rep.final_states_fastavro
    decode(msgs)
    assert len(rep.dlq.got) == sum(m.value() is not None for m in msgs)  # (tombstones: none)


def test_unsupported_schema_takes_the_fastavro_path():
    with_map = pa.schema([("id", pa.int64()), ("m", pa.map_(pa.string(), pa.int64()))])
    schema = envelope_schema(with_map, "t")
    src = {
        "version": "v",
        "connector": "c",
        "name": "lancecdf",
        "ts_ms": 0,
        "snapshot": "false",
        "db": "",
        "table": "t",
        "commit_version": 1,
        "commit_timestamp": 0,
        "operation": "Append",
        "rowid": 3,
    }
    value = {
        "before": None,
        "after": {"id": 1, "m": {"a": 1}},
        "op": "c",
        "source": src,
        "ts_ms": 0,
    }
    rep = replicator({1: schema})
    msgs = [Msg(wire(1, schema, value), 0, 0)]
    assert rep.final_states_vectorized(msgs) is None
    upserts, deletes, _, version, _ = rep.final_states(msgs)
    assert upserts.to_pylist() == [{"id": 1, "m": [("a", 1)], SOURCE_ROWID: 3}]
    assert version == 1 and not rep.dlq.got


def test_key_column_missing_from_the_schema_is_a_dead_letter():
    schemas, msgs = batch(5, poison=False)
    fast, slow = replicator(schemas, ["nope"]), replicator(schemas, ["nope"])
    assert fast.final_states_vectorized(msgs)[:2] == (None, None)
    slow.final_states_fastavro(msgs)
    assert [h["lance-cdf.error"] for _, h in fast.dlq.got] == [
        h["lance-cdf.error"] for _, h in slow.dlq.got
    ]


def test_bytes_left_over_are_a_dead_letter():
    """fastavro ignores bytes after the record; the vectorized path sets it aside."""
    schemas, msgs = batch(6, poison=False)
    last = msgs[-1]
    msgs[-1] = Msg(last.value() + b"\x00", last.partition(), last.offset())
    rep = replicator(schemas)
    rep.final_states_vectorized(msgs)
    assert [v for v, _ in rep.dlq.got] == [msgs[-1].value()]
    assert b"left over" in rep.dlq.got[0][1]["lance-cdf.error"]


def _previous_release_envelope(user_schema: pa.Schema) -> dict:
    """The value schema lance-cdf registered before records were named as Debezium
    names them: `io.lancecdf.<table>_Envelope` / `_Row`, `source.table` the URI,
    `source.snapshot` a boolean, no Debezium source fields."""
    env = json.loads(json.dumps(envelope_schema(user_schema, "t")))
    env["name"], env["namespace"] = "t_Envelope", "io.lancecdf"
    fields = {f["name"]: f for f in env["fields"]}
    row = fields["before"]["type"][1]
    row["name"], row["namespace"] = "t_Row", "io.lancecdf"
    fields["after"]["type"] = ["null", "io.lancecdf.t_Row"]
    fields["source"]["type"]["fields"] = [
        {"name": "connector", "type": "string"},
        {"name": "version", "type": "string"},
        {"name": "table", "type": "string"},
        {"name": "commit_version", "type": "long"},
        {"name": "commit_timestamp", "type": {"type": "long", "logicalType": "timestamp-millis"}},
        {"name": "operation", "type": "string"},
        {"name": "snapshot", "type": "boolean"},
        {"name": "rowid", "type": "long"},
    ]
    return env


@pytest.mark.parametrize("seed", [0, 1])
def test_records_of_the_previous_naming_and_the_new_one_replicate_alike(seed):
    """A topic that holds records of both namings (an existing topic whose subject was
    relaxed): the vectorized path reads both, and agrees with the fastavro path."""
    rng = random.Random(seed)
    schema = pa.schema([pa.field("id", pa.int64(), nullable=False), ("s", pa.string())])
    old, new = _previous_release_envelope(schema), envelope_schema(schema, "shop.t")
    fastavro.parse_schema(old)  # a valid schema of its own
    # 4 versions of 10 records, each row ID once per version (as in a real feed)
    events = pa.table(
        {
            "id": pa.array(range(40), pa.int64()),
            "s": [f"v{i}" for i in range(40)],
            "_rowid": pa.array([(i * 3 + seed) % 10 for i in range(40)], pa.uint64()),
            "_change_type": [rng.choice(["insert", "delete"]) for _ in range(40)],
            "_commit_version": pa.array([1 + i // 10 for i in range(40)], pa.int64()),
            "_commit_timestamp": pa.array([1_700_000_000_000 + i for i in range(40)], pa.int64()),
        }
    )
    records = change_records(events, ["id", "s"], {}, "shop.t", None, "0.1", 5)
    msgs = []
    for i, (_, value, _) in enumerate(records):
        if i < 20:  # the older half of the topic: the previous release's records
            src = value["source"]
            value = {
                **value,
                "source": {
                    "connector": "lance-cdf",
                    "version": "0.0.9",
                    "table": "/t.lance",
                    "commit_version": src["commit_version"],
                    "commit_timestamp": src["commit_timestamp"],
                    "operation": "Append",
                    "snapshot": False,
                    "rowid": src["rowid"],
                },
            }
            msgs.append(Msg(wire(1, old, value), 0, i))
        else:
            msgs.append(Msg(wire(2, new, value), 0, i))
    rep = replicator({1: old, 2: new})
    assert rep.schemas.batch_decoder(1) is not None and rep.schemas.batch_decoder(2) is not None
    vectorized = rep.final_states_vectorized(msgs)
    assert vectorized is not None
    slow = replicator({1: old, 2: new}).final_states(msgs)
    assert vectorized[0].sort_by(SOURCE_ROWID) == slow[0].sort_by(SOURCE_ROWID)
    assert sorted(vectorized[1].to_pylist(), key=str) == sorted(slow[1].to_pylist(), key=str)
    # the last state of each source row: its last record, whichever naming wrote it
    last = {}
    for _, value, _ in records:
        last[value["source"]["rowid"]] = value
    got = {row[SOURCE_ROWID]: {"id": row["id"], "s": row["s"]} for row in slow[0].to_pylist()}
    assert {r: got.get(r) for r, v in last.items() if v["op"] != "d"} == {
        r: v["after"] for r, v in last.items() if v["op"] != "d"
    }
    deleted = {row[SOURCE_ROWID] for row in slow[1].to_pylist()}
    assert {r for r, v in last.items() if v["op"] == "d"} <= deleted


@pytest.mark.parametrize("seed", [4, 5, 6])
def test_one_partition_batch_reads_positions_at_its_ends(seed):
    """A batch polled from one partition within one assignment: its keep mask and next
    offsets come from the offsets at its ends (and a binary search when it starts below
    the replica's position), its ranks order records as their offsets do; all equal to
    reading every record's offset, and so are the final states built from them."""
    rng = random.Random(seed)
    schemas, msgs = batch(seed, poison=False)
    offset, one = rng.randrange(1000), []
    for m in msgs:  # one partition; gaps where transaction markers sit
        one.append(Msg(m.value(), 2, offset))
        offset += rng.choice([1, 1, 1, 2, 3])
    first, last = one[0].offset(), one[-1].offset()
    held_choices = [0, first, first + 1, last, last + 1, last + 5, rng.randrange(first, last)]
    for held in held_choices:
        fast, slow = replicator(schemas), replicator(schemas)
        applied = {2: held, 0: 7}
        parts, ranks, keep, nxt = batch_positions(one, applied, one_partition=2)
        s_parts, offsets, s_keep, s_nxt = batch_positions(one, applied)
        assert (parts == s_parts).all() and (keep == s_keep).all() and nxt == s_nxt
        assert (np.argsort(ranks, kind="stable") == np.argsort(offsets, kind="stable")).all()
        assert keep.sum() == sum(m.offset() >= held for m in one)
        if keep.any():
            kept = [m for m, k in zip(one, keep, strict=True) if k]
            got = fast.final_states_vectorized(kept, parts[keep], ranks[keep])
            want = slow.final_states_vectorized(kept, s_parts[keep], offsets[keep])
            assert got[2:4] == want[2:4]
            assert rows_of(got[0]) == rows_of(want[0]) and rows_of(got[1]) == rows_of(want[1])


@pytest.mark.unit
def test_renewals_are_counted_kept_for_status_and_bounded(tmp_path):
    """Each renewal after a fatal consumer error is counted and kept for `status`; past
    MAX_RENEWALS within the window the error stops the replicator, saying why."""
    target = str(tmp_path / "replica.lance")
    assert read_renewals(target) is None
    counters = Counters()
    renewals = Renewals(target, counters)
    fenced = ConsumerFatalError("the Kafka consumer failed: fenced")
    for _ in range(MAX_RENEWALS):
        renewals.allow(fenced)
    assert counters.consumer_restarts == MAX_RENEWALS
    kept = read_renewals(target)
    assert kept is not None and kept["restarts"] == MAX_RENEWALS and "fenced" in kept["error"]
    with pytest.raises(ConsumerFatalError, match="same group.instance.id"):
        renewals.allow(fenced)
    assert counters.consumer_restarts == MAX_RENEWALS
