"""The vectorized Avro decoder against fastavro: same Arrow values, bad records flagged."""

import datetime as dt
import io
import math
import random
import struct

import fastavro
import numpy as np
import pyarrow as pa
import pytest

from lance_cdf.avro.decode import (
    BAD_UNION,
    BAD_VARINT,
    OK,
    TRAILING,
    TRUNCATED,
    WIRE,
    BatchDecoder,
    Frames,
    can_decode,
    decode_bodies,
)
from lance_cdf.avro.schema import change_records, envelope_schema
from lance_cdf.errors import AvroDecodeDeclined, FastPathDeclined

UTC = dt.UTC
COLUMNS = pa.schema(
    [
        pa.field("id", pa.int64(), nullable=False),
        ("i8", pa.int8()),
        ("i32", pa.int32()),
        ("u32", pa.uint32()),
        ("i64", pa.int64()),
        ("f32", pa.float32()),
        ("f64", pa.float64()),
        ("flag", pa.bool_()),
        pa.field("flag_nn", pa.bool_(), nullable=False),
        ("s", pa.string()),
        pa.field("s_nn", pa.string(), nullable=False),
        ("bin", pa.binary()),
        ("d", pa.date32()),
        ("ts", pa.timestamp("us", tz="UTC")),
        ("lts", pa.timestamp("us")),
        ("t", pa.time64("us")),
        ("lst", pa.list_(pa.int64())),
        ("lst_s", pa.list_(pa.string())),
        ("lst_b", pa.list_(pa.bool_())),
        ("lst_nn", pa.list_(pa.field("item", pa.float64(), nullable=False))),
        ("vec", pa.list_(pa.float32(), 768)),
        ("vec_nn", pa.list_(pa.field("item", pa.float32(), nullable=False), 16)),
        ("st", pa.struct([("a", pa.int64()), ("b", pa.string()), ("c", pa.list_(pa.int32()))])),
    ]
)
SPECIAL_F = [0.0, -0.0, math.nan, math.inf, -math.inf, 1e-300, 1.5]
WORDS = ["", "a", "é", "日本語", "🦀 emoji", "x" * 300, "\x00nul"]


def _maybe(rng, value, p=0.2):
    return None if rng.random() < p else value


def random_rows(rng: random.Random, ids: list[int]) -> pa.Table:
    n = len(ids)

    def col(fn, nullable=True):
        return [(_maybe(rng, fn()) if nullable else fn()) for _ in range(n)]

    def vec(dim, null_items):
        v = [rng.choice([rng.uniform(-1, 1), *SPECIAL_F]) for _ in range(dim)]
        if null_items and rng.random() < 0.2:
            v[rng.randrange(dim)] = None
        return v

    def f32():
        return float(np.float32(rng.choice([rng.uniform(-1e6, 1e6), *SPECIAL_F])))

    def small_list(fn):
        return [fn() for _ in range(rng.choice([0, 0, 1, 2, 5, 40]))]

    data = {
        "id": ids,
        "i8": col(lambda: rng.randint(-128, 127)),
        "i32": col(lambda: rng.choice([-(2**31), 2**31 - 1, 0, rng.randint(-999, 999)])),
        "u32": col(lambda: rng.choice([0, 2**32 - 1, rng.randrange(2**32)])),
        "i64": col(lambda: rng.choice([-(2**63), 2**63 - 1, 0, -1, rng.randint(-(2**40), 2**40)])),
        "f32": col(f32),
        "f64": col(lambda: rng.choice([rng.uniform(-1e300, 1e300), *SPECIAL_F])),
        "flag": col(lambda: rng.random() < 0.5),
        "flag_nn": col(lambda: rng.random() < 0.5, False),
        "s": col(lambda: rng.choice(WORDS)),
        "s_nn": col(lambda: rng.choice(WORDS), False),
        "bin": col(lambda: bytes(rng.randrange(256) for _ in range(rng.choice([0, 1, 9])))),
        "d": col(lambda: dt.date(1970, 1, 1) + dt.timedelta(days=rng.randint(-9999, 99999))),
        "ts": col(
            lambda: (
                dt.datetime(1970, 1, 1, tzinfo=UTC)
                + dt.timedelta(microseconds=rng.randint(-(2**50), 2**50))
            )
        ),
        "lts": col(
            lambda: dt.datetime(2000, 1, 1) + dt.timedelta(microseconds=rng.randint(0, 2**50))
        ),
        "t": col(lambda: dt.time(rng.randrange(24), rng.randrange(60), 0, rng.randrange(10**6))),
        "lst": col(lambda: small_list(lambda: _maybe(rng, rng.randint(-(2**63), 2**63 - 1)))),
        "lst_s": col(lambda: small_list(lambda: _maybe(rng, rng.choice(WORDS)))),
        "lst_b": col(lambda: small_list(lambda: _maybe(rng, rng.random() < 0.5))),
        "lst_nn": col(lambda: small_list(lambda: rng.choice([rng.random(), *SPECIAL_F]))),
        "vec": col(lambda: vec(768, True)),
        "vec_nn": col(lambda: [f32() for _ in range(16)]),
        "st": col(
            lambda: {
                "a": _maybe(rng, rng.randint(-5, 5)),
                "b": _maybe(rng, rng.choice(WORDS)),
                "c": _maybe(rng, small_list(lambda: rng.randint(-9, 9))),
            }
        ),
    }
    return pa.table(data, schema=COLUMNS)


def random_events(rng: random.Random, n: int) -> pa.Table:
    """Change events of every kind: insert, update (pre + post image), delete, snapshot."""
    parts, version = [], 1
    ids = iter(range(10**9))
    while sum(len(p) for p in parts) < n:
        kind = rng.choice(["insert", "update", "delete", "snapshot"])
        rows = random_rows(rng, [next(ids)])
        kinds = [kind]
        if kind == "update":
            rows = pa.concat_tables([rows, random_rows(rng, [rows["id"][0].as_py()])])
            kinds = ["update_preimage", "update_postimage"]
        version += rng.random() < 0.3
        rowid = rng.randrange(2**40)
        rows = rows.append_column("_rowid", pa.array([rowid] * len(kinds), pa.uint64()))
        rows = rows.append_column("_change_type", pa.array(kinds))
        rows = rows.append_column("_commit_version", pa.array([version] * len(kinds), pa.int64()))
        stamp = dt.datetime(2026, 1, 1, tzinfo=UTC) + dt.timedelta(milliseconds=version)
        rows = rows.append_column("_commit_timestamp", pa.array([stamp] * len(kinds)))
        parts.append(rows)
    return pa.concat_tables(parts)


def encode(schema: dict, records: list[dict]) -> list[bytes]:
    parsed = fastavro.parse_schema(schema)
    out = []
    for r in records:
        buf = io.BytesIO()
        fastavro.schemaless_writer(buf, parsed, r)
        out.append(buf.getvalue())
    return out


def reference(schema: dict, bodies: list[bytes], arrow_type: pa.DataType) -> list:
    """fastavro per record + pa.array: today's replicator path."""
    parsed = fastavro.parse_schema(schema)
    rows = [fastavro.schemaless_reader(io.BytesIO(b), parsed, None) for b in bodies]
    return pa.array(rows, arrow_type).to_pylist()


def norm(x):
    """Python values with NaN comparable (NaN == NaN)."""
    if isinstance(x, float) and math.isnan(x):
        return "NaN"
    if isinstance(x, dict):
        return {k: norm(v) for k, v in x.items()}
    if isinstance(x, list):
        return [norm(v) for v in x]
    return x


@pytest.fixture(scope="module")
def change_batch():
    rng = random.Random(1)
    events = random_events(rng, 400)
    schema = envelope_schema(COLUMNS, "t")
    records = change_records(events, COLUMNS.names, {}, "tbl", None, "0.1", 1234)
    return schema, [v for _, v, _ in records]


def test_every_type_matches_fastavro(change_batch):
    schema, values = change_batch
    assert {v["op"] for v in values} == {"c", "u", "d", "r"}
    bodies = encode(schema, values)
    decoded, err = decode_bodies(schema, bodies)
    assert (err == OK).all()
    assert decoded.type == BatchDecoder(schema).arrow
    assert norm(decoded.to_pylist()) == norm(reference(schema, bodies, decoded.type))
    # the row image has the replicator's row schema (fixed-size vectors kept)
    after = decoded.type.field("after").type
    assert after.field("vec").type == pa.list_(pa.float32(), 768)
    assert after.field("vec_nn").type.value_field.nullable is False


def test_all_null_and_all_present_images():
    schema = envelope_schema(pa.schema([("x", pa.int64()), ("v", pa.list_(pa.float32(), 3))]), "t")
    src = {
        "version": "v",
        "connector": "c",
        "name": "lancecdf",
        "ts_ms": 0,
        "snapshot": "false",
        "db": "/t.lance",
        "table": "t",
        "commit_version": 1,
        "commit_timestamp": 0,
        "operation": "Append",
        "rowid": 0,
    }
    values = [
        {
            "before": None,
            "after": {"x": i, "v": [1.0, 2.0, 3.0]},
            "op": "c",
            "source": src,
            "ts_ms": 0,
        }
        for i in range(5)
    ]
    bodies = encode(schema, values)
    decoded, err = decode_bodies(schema, bodies)
    assert (err == OK).all()
    assert decoded.to_pylist() == reference(schema, bodies, decoded.type)
    empty, err = decode_bodies(schema, [])
    assert len(empty) == 0 and err.size == 0


# -- arrays written in several blocks (fastavro writes one) ------------------------------
def zz(v: int) -> bytes:
    u = (v << 1) ^ (v >> 63)
    out = bytearray()
    while True:
        b = u & 0x7F
        u >>= 7
        if u:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


BLOCKS_SCHEMA = {
    "type": "record",
    "name": "B",
    "fields": [
        {"name": "a", "type": {"type": "array", "items": "long"}},
        {
            "name": "v",
            "type": ["null", {"type": "array", "items": ["null", "float"], "arrow.fixedSize": 3}],
        },
        {"name": "s", "type": {"type": "array", "items": "string"}},
        {"name": "d", "type": {"type": "array", "items": "double"}},
        {"name": "tail", "type": "string"},
    ],
}


def blocks(items: list[bytes], split: list[int], sized: list[bool]) -> bytes:
    """An Avro array of encoded items in blocks of the sizes `split` (negative count +
    byte size where `sized`), then the 0 terminator."""
    out, i = bytearray(), 0
    for size, with_bytes in zip(split, sized, strict=True):
        chunk = b"".join(items[i : i + size])
        i += size
        out += zz(-size) + zz(len(chunk)) if with_bytes else zz(size)
        out += chunk
    assert i == len(items)
    return bytes(out) + zz(0)


def float_item(x):
    return zz(0) if x is None else zz(1) + struct.pack("<f", x)


def random_blocked(rng: random.Random):
    def split(n):
        parts = []
        while n:
            k = rng.randint(1, n)
            parts.append(k)
            n -= k
        return parts

    a = [rng.randint(-(2**63), 2**63 - 1) for _ in range(rng.choice([0, 1, 3, 7]))]
    v = rng.choice([None, [1.5, None, -2.0], [0.25, 0.5, 0.75]])
    s = [rng.choice(WORDS) for _ in range(rng.choice([0, 2, 4]))]
    d = [rng.random() for _ in range(rng.choice([0, 1, 6]))]
    body = bytearray()
    for items in ([zz(x) for x in a],):
        sp = split(len(items))
        body += blocks(items, sp, [rng.random() < 0.5 for _ in sp])
    if v is None:
        body += zz(0)
    else:
        sp = split(3)
        body += zz(1) + blocks([float_item(x) for x in v], sp, [rng.random() < 0.5 for _ in sp])
    items = [zz(len(w.encode())) + w.encode() for w in s]
    sp = split(len(items))
    body += blocks(items, sp, [rng.random() < 0.5 for _ in sp])
    items = [struct.pack("<d", x) for x in d]
    sp = split(len(items))
    body += blocks(items, sp, [rng.random() < 0.5 for _ in sp])
    body += zz(3) + b"end"
    return bytes(body), {"a": a, "v": v, "s": s, "d": d, "tail": "end"}


def test_arrays_in_several_blocks():
    rng = random.Random(7)
    made = [random_blocked(rng) for _ in range(300)]
    bodies = [b for b, _ in made]
    decoded, err = decode_bodies(BLOCKS_SCHEMA, bodies)
    assert (err == OK).all()
    expected = [r for _, r in made]
    assert decoded.to_pylist() == pa.array(expected, decoded.type).to_pylist()
    # fastavro reads the same bytes the same way
    assert decoded.to_pylist() == reference(BLOCKS_SCHEMA, bodies, decoded.type)


def test_wrong_vector_length_is_bad():
    body_ok = zz(0) + zz(1) + blocks([float_item(1.0)] * 3, [3], [False]) + zz(0) + zz(0)
    body_short = zz(0) + zz(1) + blocks([float_item(1.0)] * 2, [2], [False]) + zz(0) + zz(0)
    schema = {**BLOCKS_SCHEMA, "fields": BLOCKS_SCHEMA["fields"][:4]}
    decoded, err = decode_bodies(schema, [body_ok, body_short, body_ok])
    assert list(err != OK) == [False, True, False]
    assert decoded[0].as_py()["v"] == [1.0, 1.0, 1.0] == decoded[2].as_py()["v"]


# -- bad records -----------------------------------------------------------------------
def test_poison_records_are_flagged_and_the_rest_decoded(change_batch):
    schema, values = change_batch
    bodies = encode(schema, values[:60])
    rng = random.Random(3)
    bad = {
        3: bodies[3][: len(bodies[3]) // 2],  # truncated
        10: bytes(rng.randrange(256) for _ in range(40)),  # garbage
        11: b"",  # empty
        17: b"\x04" + bodies[17][1:],  # `before` union index 2
        20: bodies[20] + b"\x00",  # a byte too many
        25: b"\xff" * 30,  # a varint that never ends
        26: bodies[26][:-1],  # one byte short
    }
    mixed = [bad.get(i, b) for i, b in enumerate(bodies)]
    decoded, err = decode_bodies(schema, mixed)
    assert set(np.flatnonzero(err != OK)) == set(bad)
    assert err[17] == BAD_UNION and err[20] == TRAILING and err[3] == TRUNCATED
    good = [i for i in range(len(mixed)) if i not in bad]
    expected = reference(schema, [bodies[i] for i in good], decoded.type)
    assert norm([decoded[i].as_py() for i in good]) == norm(expected)


def fastavro_verdict(parsed, body, arrow_type):
    """fastavro's reading of one body: the Python value, or None when it cannot be
    read whole (an error, or bytes left over) or does not fit the Arrow type."""
    buf = io.BytesIO(body)
    try:
        rec = fastavro.schemaless_reader(buf, parsed, None)
        if buf.tell() != len(body):
            return None
        return pa.array([rec], arrow_type).to_pylist()[0]
    except Exception:
        return None


def test_mutated_bodies_agree_with_fastavro(change_batch):
    """Random byte flips, cuts and insertions: the batch never fails; a record the
    decoder accepts is what fastavro reads, and what fastavro cannot read is flagged."""
    schema, values = change_batch
    rng = random.Random(11)
    bodies = encode(schema, values[:200])
    mutated = []
    for b in bodies:
        b = bytearray(b)
        for _ in range(rng.choice([1, 1, 2, 5])):
            what, i = rng.random(), rng.randrange(len(b))
            if what < 0.5:
                b[i] = rng.randrange(256)
            elif what < 0.7:
                del b[i:]
            elif what < 0.85:
                b.insert(i, rng.randrange(256))
            elif b:
                del b[i]
            if not b:
                break
        mutated.append(bytes(b))
    decoded, err = decode_bodies(schema, mutated)
    parsed = fastavro.parse_schema(schema)
    flagged = 0
    for i, body in enumerate(mutated):
        want = fastavro_verdict(parsed, body, decoded.type)
        if err[i] != OK:
            flagged += 1
            # fastavro reads a negative union index as a Python list index (-1: the
            # last branch) and varints of any length; the decoder rejects both, as
            # the Avro spec does
            assert want is None or err[i] in (BAD_UNION, BAD_VARINT), (i, err[i])
        else:
            assert want is not None, i
            assert norm(decoded[i].as_py()) == norm(want), i
    assert flagged > len(mutated) // 2


def test_confluent_frames():
    schema = {"type": "record", "name": "K", "fields": [{"name": "x", "type": "long"}]}
    bodies = [
        b"\x00\x00\x00\x01\x02" + zz(5),
        b"\x01\x00\x00\x00\x02" + zz(6),
        b"\x00\x00",
        b"\x00\x00\x00\x01\x03" + zz(-7),
    ]
    frames = Frames.of(bodies)
    sid, err = frames.confluent()
    assert list(sid) == [258, -1, -1, 259] and list(err) == [OK, WIRE, WIRE, OK]
    decoded, err2 = BatchDecoder(schema).decode(frames, np.array([0, 3]))
    assert decoded.to_pylist() == [{"x": 5}, {"x": -7}] and list(err2) == [OK, OK]
    _, err3 = BatchDecoder(schema).decode(frames, err=err)
    assert list(err3 != OK) == [False, True, True, False]


@pytest.mark.parametrize(
    "avro",
    [
        {"type": "map", "values": "long"},
        {"type": "bytes", "logicalType": "decimal", "precision": 5, "scale": 2},
        {"type": "fixed", "name": "F", "size": 4},
        {"type": "enum", "name": "E", "symbols": ["A", "B"]},
        ["null", "long", "string"],
        ["long", "string"],
        {"type": "array", "items": {"type": "array", "items": "long"}},
        {
            "type": "array",
            "items": {"type": "record", "name": "R", "fields": [{"name": "a", "type": "long"}]},
        },
        {"type": "string", "logicalType": "uuid"},
        "null",
    ],
)
def test_can_decode_is_false_for_unsupported_types(avro):
    schema = {"type": "record", "name": "T", "fields": [{"name": "f", "type": avro}]}
    assert not can_decode(schema)


def test_an_unsupported_type_is_declined_as_a_fast_path_decline():
    """The decoder declines with lance_cdf.errors.AvroDecodeDeclined (a FastPathDeclined,
    which callers catch to use fastavro), naming the type."""
    schema = {
        "type": "record",
        "name": "T",
        "fields": [
            {"name": "f", "type": "float"},
            {"name": "m", "type": {"type": "map", "values": "long"}},
        ],
    }
    with pytest.raises(AvroDecodeDeclined, match="map") as caught:
        BatchDecoder(schema)
    assert isinstance(caught.value, FastPathDeclined)


def test_can_decode_supported_envelopes():
    assert can_decode(envelope_schema(COLUMNS, "t"))
    assert can_decode(BLOCKS_SCHEMA)
    with_map = pa.schema([("m", pa.map_(pa.string(), pa.int64()))])
    assert not can_decode(envelope_schema(with_map, "t"))
