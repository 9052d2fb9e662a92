"""The vectorised Avro encoder writes exactly the bytes fastavro writes."""

import datetime as dt
import decimal
import io

import fastavro
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest

from lance_cdf.avro import encode as encoder
from lance_cdf.avro.encode import RecordShape, can_encode, encode_changes
from lance_cdf.avro.schema import change_records, envelope_schema, key_schema
from lance_cdf.errors import AvroEncodeDeclined

NOW_MS = 1_767_225_600_123
OPS = {1: "Append", 2: "Update", 3: "Delete"}
I64 = np.iinfo(np.int64)


def test_assemble_joins_parts_record_by_record():
    """Padded parts (a broadcast constant cut to per-record lengths) and a Var part (a
    null record contributes nothing) concatenated record by record."""
    const = encoder.Padded(np.broadcast_to(np.array([7, 8], np.uint8), (2, 2)), np.array([1, 2]))
    var = encoder.Var(np.array([0, 1, 3], np.int64), pa.py_buffer(b"xyz"), np.array([1, 0], bool))
    fixed = encoder.Padded(np.array([[1], [2]], np.uint8))
    out = encoder.assemble([const, var, fixed, encoder.Padded(np.zeros((2, 0), np.uint8))], 2)
    assert out.to_pylist() == [b"\x07x\x01", b"\x07\x08\x02"]
    assert encoder.assemble([], 3).to_pylist() == [b""] * 3


def _mask(rng, n, p=0.2):
    return rng.random(n) < p


def _ints(rng, n, dtype, extremes=True):
    info = np.iinfo(dtype)
    lo, hi = max(int(info.min), -(2**62)), min(int(info.max), 2**62)
    v = rng.integers(lo, hi, n, dtype=np.int64, endpoint=True)
    # small magnitudes too, so every varint width shows up
    v = np.where(rng.random(n) < 0.5, v >> rng.integers(0, 62, n), v)
    if extremes and n >= 4:
        v[:4] = [int(info.min), int(info.max), 0, -1 if info.min < 0 else 1]
    if dtype == np.uint64:
        v = np.abs(v)
    return v.astype(dtype)


def _floats(rng, n, dtype):
    with np.errstate(over="ignore"):  # float16 / float32 overflow to inf: wanted
        v = (rng.standard_normal(n) * 10.0 ** rng.integers(-30, 30, n)).astype(dtype)
    special = np.array([np.nan, np.inf, -np.inf, -0.0, 0.0], dtype)
    k = min(n, len(special))
    v[:k] = special[:k]
    return v


def _strings(rng, n):
    alphabet = ["a", "é", "ß", "中", "😀", "x", " ", "\u0000"]
    return ["".join(rng.choice(alphabet, rng.integers(0, 12))) for _ in range(n)]  # test data only


def random_columns(rng: np.random.Generator, n: int) -> pa.Table:
    """Every supported Arrow type, with nulls; arrays are built longer and sliced."""
    pad = 3
    m = n + 2 * pad

    def arr(values, type_, nulls=True):
        a = pa.array(values, type_, mask=_mask(rng, m) if nulls else None)
        return a.slice(pad, n)  # non-zero offsets

    strings = _strings(rng, m)
    lists = [
        None
        if rng.random() < 0.15
        else [int(x) for x in _ints(rng, rng.integers(0, 5), np.int32, False)]
        for _ in range(m)
    ]
    flist = [
        None
        if rng.random() < 0.15
        else [
            None if rng.random() < 0.2 else float(x)
            for x in rng.standard_normal(rng.integers(0, 4))
        ]
        for _ in range(m)
    ]
    slist = [
        None if rng.random() < 0.15 else list(_strings(rng, rng.integers(0, 3))) for _ in range(m)
    ]
    vec = pa.FixedSizeListArray.from_arrays(
        pa.array(_floats(rng, m * 768, np.float32)), 768, mask=pa.array(_mask(rng, m))
    ).slice(pad, n)
    small_vals = _floats(rng, m * 4, np.float32).astype(object)
    small_vals[_mask(rng, m * 4)] = None
    small = pa.FixedSizeListArray.from_arrays(pa.array(list(small_vals), pa.float32()), 4)
    struct_t = pa.struct(
        [
            pa.field("a", pa.int64()),
            pa.field("b", pa.string()),
            pa.field("c", pa.struct([pa.field("d", pa.bool_(), nullable=False)])),
            pa.field("e", pa.list_(pa.int16())),
        ]
    )
    structs = [
        None
        if rng.random() < 0.2
        else {
            "a": int(rng.integers(-(2**40), 2**40)),
            "b": strings[i] if i % 3 else None,
            "c": {"d": bool(i % 2)},
            "e": [i, -i] if i % 4 else None,
        }
        for i in range(m)
    ]
    lstruct = [
        None if rng.random() < 0.2 else [{"x": int(i), "y": float(i) / 3}] * (i % 3)
        for i in range(m)
    ]
    day = 86_400_000
    cols = {
        "i8": arr(_ints(rng, m, np.int8), pa.int8()),
        "i16": arr(_ints(rng, m, np.int16), pa.int16()),
        "i32": arr(_ints(rng, m, np.int32), pa.int32()),
        "i64": arr(_ints(rng, m, np.int64), pa.int64()),
        "i64_extreme": arr(np.array([I64.min, I64.max] * (m // 2) + [0] * (m % 2)), pa.int64()),
        "u8": arr(_ints(rng, m, np.uint8), pa.uint8()),
        "u16": arr(_ints(rng, m, np.uint16), pa.uint16()),
        "u32": arr(_ints(rng, m, np.uint32), pa.uint32()),
        "u64": arr(np.abs(_ints(rng, m, np.int64)).astype(np.uint64), pa.uint64()),
        "f16": arr(_floats(rng, m, np.float16), pa.float16()),
        "f32": arr(_floats(rng, m, np.float32), pa.float32()),
        "f64": arr(_floats(rng, m, np.float64), pa.float64()),
        "b": arr(rng.random(m) < 0.5, pa.bool_()),
        "s": arr(strings, pa.string()),
        "ls": arr(strings[::-1], pa.large_string()),
        "bin": arr([s.encode()[:5] for s in strings], pa.binary()),
        "lbin": arr([s.encode() for s in strings], pa.large_binary()),
        "fixed": arr(
            [bytes(rng.integers(0, 256, 3, dtype=np.uint8)) for _ in range(m)], pa.binary(3)
        ),
        "d32": arr(rng.integers(-700_000, 2_900_000, m).astype(np.int32), pa.date32()),
        "d64": arr(rng.integers(-700_000, 2_900_000, m) * day, pa.date64()),
        "ts_s": arr(rng.integers(-(2**34), 2**37, m), pa.timestamp("s")),
        "ts_ms_tz": arr(rng.integers(-(2**44), 2**47, m), pa.timestamp("ms", tz="UTC")),
        "ts_us": arr(rng.integers(-(2**54), 2**57, m), pa.timestamp("us")),
        "ts_us_ny": arr(
            rng.integers(-(2**54), 2**57, m), pa.timestamp("us", tz="America/New_York")
        ),
        "t32s": arr(rng.integers(0, 86_400, m).astype(np.int32), pa.time32("s")),
        "t32ms": arr(rng.integers(0, 86_400_000, m).astype(np.int32), pa.time32("ms")),
        "t64us": arr(rng.integers(0, 86_400_000_000, m), pa.time64("us")),
        "lst": pa.array(lists, pa.list_(pa.int32())).slice(pad, n),
        "llst": pa.array(flist, pa.large_list(pa.float64())).slice(pad, n),
        "slst": pa.array(slist, pa.list_(pa.string())).slice(pad, n),
        "vec": vec,
        "small": small.slice(pad, n),
        "st": pa.array(structs, struct_t).slice(pad, n),
        "lstruct": pa.array(
            lstruct, pa.list_(pa.struct([("x", pa.int64()), ("y", pa.float64())]))
        ).slice(pad, n),
        "req": arr(np.arange(m) - m // 2, pa.int64(), nulls=False),
        "req_s": arr(strings, pa.string(), nulls=False),
    }
    fields = [pa.field(k, v.type, nullable=not k.startswith("req")) for k, v in cols.items()]
    return pa.Table.from_arrays(list(cols.values()), schema=pa.schema(fields))


def random_events(rng, n, kinds=None, rowid_type=None, ts_type=None):
    """`n` event rows of random change types; updates are pre/post pairs."""
    seq = []
    choices = kinds or ["insert", "update", "delete", "snapshot"]
    while len(seq) < n:
        k = choices[rng.integers(len(choices))]
        if k == "update":
            seq += ["update_preimage", "update_postimage"] if len(seq) + 2 <= n else ["insert"]
        else:
            seq.append(k)
    user = random_columns(rng, n)
    version = np.sort(rng.integers(1, 4, n))
    ts_us = 1_700_000_000_000_000 + version * 1_234_567 + rng.integers(-999, 999, n)
    ts = (
        pa.array(ts_us, pa.timestamp("us", tz="UTC"))
        if ts_type is None
        else pa.array(ts_us // 1000, ts_type)
    )
    meta = {
        "_rowid": pa.array(rng.permutation(n) * 1_000_003, rowid_type or pa.uint64()),
        "_change_type": pa.array(seq),
        "_commit_version": pa.array(version, pa.int64()),
        "_commit_timestamp": ts,
    }
    for name, col in meta.items():
        user = user.append_column(name, col)
    return user


def fastavro_bodies(events, user_schema, key_columns):
    records = change_records(events, user_schema.names, OPS, "tbl", key_columns, "0.9", NOW_MS)
    value = fastavro.parse_schema(envelope_schema(user_schema, "tbl"))
    key = fastavro.parse_schema(key_schema(user_schema, key_columns, "tbl"))

    def write(schema, record):
        buf = io.BytesIO()
        fastavro.schemaless_writer(buf, schema, record)
        return buf.getvalue()

    return (
        [write(key, k) for k, _, _ in records],
        [write(value, v) for _, v, _ in records],
        [m["tombstone"] for _, _, m in records],
    )


def check_identical(events, user_schema, key_columns):
    keys, values, tombstones = fastavro_bodies(events, user_schema, key_columns)
    out = encode_changes(events, RecordShape(user_schema, "tbl", key_columns, "0.9"), OPS, NOW_MS)
    got_values = out.values.to_pylist()
    assert len(got_values) == len(values)
    for i, (got, want) in enumerate(zip(got_values, values, strict=True)):
        assert got == want, f"value of record {i} differs"
    assert out.keys.to_pylist() == keys
    assert out.tombstone.tolist() == tombstones
    return len(values)


def user_schema_of(events):
    return pa.schema([f for f in events.schema if not f.name.startswith("_")])


@pytest.mark.parametrize("seed", range(6))
def test_random_batches_are_byte_identical(seed):
    rng = np.random.default_rng(seed)
    events = random_events(rng, 40, rowid_type=pa.uint64() if seed % 2 else pa.int64())
    schema = user_schema_of(events)
    assert can_encode(schema)
    key_columns = [None, ["i64"], ["s", "req", "st"]][seed % 3]
    assert check_identical(events, schema, key_columns) > 0
    # slices of the whole table (offsets in every column, pairs cut at the edges)
    assert check_identical(events.slice(7, 25), schema, key_columns) >= 0
    # several chunks per column
    chunked = pa.concat_tables([events.slice(0, 13), events.slice(13)])
    check_identical(chunked, schema, key_columns)


@pytest.mark.parametrize("kinds", [["insert"], ["snapshot"], ["delete"], ["update"]])
def test_single_kind_batches(kinds):
    rng = np.random.default_rng(42)
    events = random_events(rng, 30, kinds=kinds)
    schema = user_schema_of(events)
    check_identical(events, schema, None)
    check_identical(events, schema, ["i32", "s"])


def test_update_pairs_and_orphans():
    """A postimage without its preimage has no before; a trailing preimage is dropped."""
    rng = np.random.default_rng(1)
    events = random_events(rng, 6, kinds=["insert"])
    kinds = [
        "update_postimage",
        "update_preimage",
        "update_preimage",
        "update_postimage",
        "delete",
        "update_preimage",
    ]
    events = events.set_column(
        events.schema.get_field_index("_change_type"), "_change_type", pa.array(kinds)
    )
    assert check_identical(events, user_schema_of(events), None) == 3


def test_commit_timestamp_as_int64_millis_and_empty_batches():
    rng = np.random.default_rng(3)
    events = random_events(rng, 12, ts_type=pa.int64())
    schema = user_schema_of(events)
    check_identical(events, schema, None)
    assert check_identical(events.slice(0, 0), schema, ["s"]) == 0


def test_narrow_and_vector_tables():
    n = 1000
    ids = np.arange(n) * 7919 - 3000
    narrow = pa.table(
        {
            "id": ids,
            "name": pa.array([f"n{i}" for i in ids]),
            "score": ids * 0.5,
            "ts": ids * 1000,
            "flag": ids % 2 == 0,
        }
    )
    vec = pa.table(
        {
            "id": np.arange(n),
            "vec": pa.FixedSizeListArray.from_arrays(
                pa.array(np.random.default_rng(0).random(n * 768, dtype=np.float32)), 768
            ),
        }
    )
    for user in (narrow, vec):
        events = user.append_column("_rowid", pa.array(np.arange(n), pa.uint64()))
        events = events.append_column("_change_type", pa.array(["insert"] * n))
        events = events.append_column("_commit_version", pa.array([1] * n, pa.int64()))
        events = events.append_column(
            "_commit_timestamp", pa.array([dt.datetime(2026, 1, 1, tzinfo=dt.UTC)] * n)
        )
        check_identical(events, user.schema, None)


def test_signalling_nan_float32_matches():
    bits = np.array([0x7F800001, 0xFF800123, 0x7FC00000, 0x7FA00000], np.uint32)
    user = pa.table({"f": pa.array(bits.view(np.float32), pa.float32())})
    events = user.append_column("_rowid", pa.array(np.arange(4), pa.uint64()))
    events = events.append_column("_change_type", pa.array(["insert"] * 4))
    events = events.append_column("_commit_version", pa.array([1] * 4, pa.int64()))
    events = events.append_column(
        "_commit_timestamp", pa.array([dt.datetime(2026, 1, 1, tzinfo=dt.UTC)] * 4)
    )
    check_identical(events, user.schema, None)


@pytest.mark.parametrize(
    "column",
    [
        pa.array([decimal.Decimal("1.5"), None], pa.decimal128(5, 2)),
        pa.array([[("k", 1.0)], None], pa.map_(pa.string(), pa.float64())),
        pa.array(["a", "b"]).dictionary_encode(),
        pa.array([1, 2], pa.timestamp("ns")),
        pa.array([1, 2], pa.time64("ns")),
        pa.array(
            [[{"k": [("a", 1)]}], None],
            pa.list_(pa.struct([("k", pa.map_(pa.string(), pa.int8()))])),
        ),
    ],
)
def test_unsupported_types_use_the_fastavro_path(column):
    schema = pa.schema([("id", pa.int64()), ("x", column.type)])
    assert not can_encode(schema)
    ts = pa.array([0, 0], pa.timestamp("us", tz="UTC"))
    events = pa.table(
        {
            "id": [1, 2],
            "x": column,
            "_rowid": pa.array([0, 1], pa.uint64()),
            "_change_type": ["insert", "insert"],
            "_commit_version": [1, 1],
            "_commit_timestamp": ts,
        }
    )
    with pytest.raises(AvroEncodeDeclined):
        encode_changes(events, RecordShape(schema, "t", None, "0.9"), OPS, NOW_MS)


def test_values_fastavro_rejects_are_unsupported():
    """Out-of-range uint64 and nulls in a required column: the fastavro path decides."""
    base = {
        "_change_type": ["insert"],
        "_commit_version": [1],
        "_commit_timestamp": pa.array([0], pa.timestamp("us", tz="UTC")),
    }
    big = pa.table(
        {"u": pa.array([2**63], pa.uint64()), "_rowid": pa.array([0], pa.uint64()), **base}
    )
    with pytest.raises(AvroEncodeDeclined):
        encode_changes(big, RecordShape(big.select(["u"]).schema, "t", None, "0.9"), OPS, NOW_MS)
    schema = pa.schema([pa.field("r", pa.int64(), nullable=False)])
    nulls = pa.table(
        {"r": pa.array([None], pa.int64()), "_rowid": pa.array([0], pa.uint64()), **base}
    )
    with pytest.raises(AvroEncodeDeclined):
        encode_changes(nulls, RecordShape(schema, "t", None, "0.9"), OPS, NOW_MS)
    naive = pa.table({"r": [1], "_rowid": pa.array([0], pa.uint64()), **base})
    naive = naive.set_column(4, "_commit_timestamp", pa.array([0], pa.timestamp("us")))
    with pytest.raises(AvroEncodeDeclined):  # fastavro converts naive datetimes in local time
        encode_changes(
            naive, RecordShape(naive.select(["r"]).schema, "t", None, "0.9"), OPS, NOW_MS
        )


class _FakeProducer:
    def __init__(self):
        self.sent = []

    # confluent-kafka's Producer.produce, positional order included
    def produce(
        self,
        topic,
        value=None,
        key=None,
        partition=-1,
        callback=None,
        on_delivery=None,
        timestamp=0,
        headers=None,
    ):
        self.sent.append((key, value, partition, headers))

    def flush(self, timeout):
        return 0


def test_publisher_sends_the_same_records_on_both_paths(monkeypatch):
    from lance_cdf.kafka import publisher as kafka
    from lance_cdf.kafka.publisher import KafkaChangePublisher

    monkeypatch.setattr(kafka.time, "time", lambda: NOW_MS / 1000)

    rng = np.random.default_rng(7)
    events = random_events(rng, 30)
    schema = user_schema_of(events)
    sent = {}
    for vectorised in (True, False):
        for key_columns in (None, ["s", "i64"]):
            pub = KafkaChangePublisher(
                "127.0.0.1:1", "topic", "http://127.0.0.1:1", schema, "tbl", key_columns
            )
            pub.key_writer.header = b"\x00\x00\x00\x00\x07"
            pub.value_writer.header = b"\x00\x00\x00\x01\x02"
            pub.producer = _FakeProducer()
            pub.topic_ready = True  # (no broker: the fake producer's topic needs no making)
            pub.vectorised = vectorised
            n = pub.publish(events, OPS)
            assert n == len(pub.producer.sent)
            sent[vectorised, bool(key_columns)] = pub.producer.sent
            assert all(k.startswith(b"\x00\x00\x00\x00\x07") for k, *_ in pub.producer.sent)
            assert any(v is None for _, v, *_ in pub.producer.sent)  # tombstones
    assert sent[True, False] == sent[False, False]
    assert sent[True, True] == sent[False, True]


@pytest.mark.parametrize("seed", range(3))
def test_transaction_block_is_byte_identical_and_decodes(seed):
    """With `_total_order` (spark/sink/work.py numbers the records) each value ends with the
    `transaction` block; without it, with null (as before the field existed)."""
    rng = np.random.default_rng(seed)
    events = random_events(rng, 40)
    schema = user_schema_of(events)
    records = pc.invert(pc.equal(events["_change_type"], "update_preimage")).to_numpy(
        zero_copy_only=False
    )
    total = np.where(records, np.cumsum(records) * 3 + 1, 0)  # any positive number per record
    numbered = events.append_column("_total_order", pa.array(total, pa.int64()))
    assert check_identical(numbered, schema, ["i64"]) == int(records.sum())
    out = encode_changes(numbered, RecordShape(schema, "tbl", None, "0.9"), OPS, NOW_MS)
    parsed = fastavro.parse_schema(envelope_schema(schema, "tbl"))
    versions = numbered["_commit_version"].to_numpy()[records]
    for body, order, version in zip(out.values.to_pylist(), total[records], versions, strict=True):
        block = fastavro.schemaless_reader(io.BytesIO(body), parsed, parsed)["transaction"]
        assert block == {
            "id": f"lancecdf.tbl:{version}",
            "total_order": order,
            "data_collection_order": order,
        }
    plain = encode_changes(events, RecordShape(schema, "tbl", None, "0.9"), OPS, NOW_MS)
    body = plain.values.to_pylist()[0]
    assert fastavro.schemaless_reader(io.BytesIO(body), parsed, parsed)["transaction"] is None
