"""Vectorized Avro decoding: many binary bodies written with one schema -> Arrow columns.

All bodies sit in one numpy uint8 buffer, each with its start and end offset, and a
cursor array holds one read position per record. The decoder walks the *schema*, not
the records: for each field it decodes that field for all records at once with numpy
gathers and advances every cursor. Per field type:

* int / long: zigzag varints, assembled 7 bits at a time over the records whose value
  is not finished yet (most varints are 1-3 bytes, so the rounds shrink fast);
* float / double / boolean: fixed-width gathers, viewed little-endian;
* string / bytes: a length varint, then one Arrow take of the byte ranges (the ranges
  of all records are the even elements of one BinaryArray laid over the whole buffer);
* ["null", T]: the branch index, then T for only the records whose branch is T;
* record: its fields in order; array: block rounds (count, or -count and a byte size,
  ... until a 0 count), items of fixed width gathered as whole byte ranges per block,
  other items one item round at a time (vectorized over the records).

Bad input does not stop the batch: every record carries an error code (0 = fine), set
when a read runs past the record's end, a union index or a length is out of range, a
string is not UTF-8, an int does not fit, or bytes are left over at the end; bad
records are decoded no further than their own bytes, and the caller sets them aside.

Schemas with anything else (maps, enums, fixed, decimals, arrays of records or arrays,
other unions) are not decodable here: `can_decode` is False and callers use fastavro.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa

from lance_cdf.avro.schema import ARROW_TYPE, FIXED_SIZE, AvroSchema, AvroType, arrow_type
from lance_cdf.avro.wire import split_many
from lance_cdf.errors import AvroDecodeDeclined

# error codes of a record (0 = decoded fine); the first error of a record is kept
OK, TRUNCATED, BAD_UNION, BAD_LENGTH, BAD_VARINT, BAD_UTF8, INT_RANGE, TRAILING, WIRE = range(9)
REASONS = {
    TRUNCATED: "the record's bytes end before its schema does",
    BAD_UNION: "union branch index out of range",
    BAD_LENGTH: "string, bytes or array length out of range",
    BAD_VARINT: "varint longer than 10 bytes",
    BAD_UTF8: "string is not valid UTF-8",
    INT_RANGE: "value out of range for its type (32-bit int, date, time, timestamp)",
    TRAILING: "bytes left over after the record",
    WIRE: "not in the Confluent wire format (magic byte 0 + schema id)",
}
PAD = 16  # zero bytes after the last body: varint reads never leave the buffer
_U64_7F = np.uint64(0x7F)


def _fail(err: np.ndarray, mask: np.ndarray, code: int) -> None:
    np.copyto(err, np.int8(code), where=mask & (err == 0))


def _check_end(pos: np.ndarray, end: np.ndarray, err: np.ndarray) -> None:
    """Flag reads past the record's end and keep the cursors inside the record."""
    over = pos > end
    if over.any():
        _fail(err, over, TRUNCATED)
        np.minimum(pos, end, out=pos)


@dataclass
class Frames:
    """Many byte strings in one buffer: record i is buf[start[i]:end[i]]."""

    buf: np.ndarray  # uint8, PAD zero bytes at the end
    data: pa.Buffer  # the same bytes, for Arrow
    start: np.ndarray  # int64
    end: np.ndarray  # int64

    @classmethod
    def of(cls, bodies: list[bytes]) -> Frames:
        joined = b"".join([*bodies, bytes(PAD)])
        lengths = np.fromiter(map(len, bodies), np.int64, len(bodies))
        end = np.cumsum(lengths)
        return cls(np.frombuffer(joined, np.uint8), pa.py_buffer(joined), end - lengths, end)

    def confluent(self) -> tuple[np.ndarray, np.ndarray]:
        """(schema id, error code) of Confluent wire-format records (magic byte 0, a
        big-endian schema id); moves `start` past the 5-byte header."""
        sid, ok, self.start = split_many(self.buf, self.start, self.end)
        return sid, np.where(ok, OK, WIRE).astype(np.int8)


# -- primitive reads (all records of `pos` at once) -------------------------------------
_STOPS = np.uint64(0x8080808080808080)
_LOW7 = np.uint64(0x7F7F7F7F7F7F7F7F)
_PACK = [  # (keep mask, move mask, shift): 8 x 7-bit groups -> one 56-bit value
    (np.uint64(0x007F007F007F007F), np.uint64(0x7F007F007F007F00), np.uint64(1)),
    (np.uint64(0x00003FFF00003FFF), np.uint64(0x3FFF00003FFF0000), np.uint64(2)),
    (np.uint64(0x000000000FFFFFFF), np.uint64(0x0FFFFFFF00000000), np.uint64(4)),
]


def _at_every_byte(buf: np.ndarray, dtype: str) -> np.ndarray:
    """A view of `buf` with an (unaligned) `dtype` value starting at every byte: one
    fancy index then gathers values at any positions."""
    width = np.dtype(dtype).itemsize
    return np.ndarray((buf.size - width + 1,), dtype, buf, 0, (1,))


def _varint(buf: np.ndarray, pos: np.ndarray, err: np.ndarray) -> np.ndarray:
    """Unsigned varints at `pos` (uint64); advances `pos`. The first byte for all;
    values that go on: 8 bytes read as one little-endian word, the end found from the
    continuation bits, the 7-bit groups packed with shifts; the few longer than 8
    bytes (values of 57-64 bits) byte by byte."""
    b = buf[pos]
    val: np.ndarray = (b & 0x7F).astype(np.uint64)
    more = np.flatnonzero(b & 0x80)
    pos += 1
    if not more.size:
        return val
    word = _at_every_byte(buf, "<u8")[pos[more] - 1]
    stop = ~word & _STOPS  # the high bit of every byte that ends a varint
    low = stop & (~stop + np.uint64(1))  # the first of them
    _, exponent = np.frexp(low.astype(np.float64))  # low = 2**(exponent - 1)
    length = exponent.astype(np.int64) // 8  # (bit index + 1) // 8
    w = word & ((low << np.uint64(1)) - np.uint64(1)) & _LOW7
    for keep, move, shift in _PACK:
        w = (w & keep) | ((w & move) >> shift)
    val[more] = w
    pos[more] += length - 1
    long = np.flatnonzero(stop == 0)  # no end within 8 bytes
    if long.size:
        idx = more[long]
        p = pos[idx] + 8
        pos[idx] = p
        acc = w[long]
        bits, go = 56, np.arange(idx.size)
        while go.size:
            if bits >= 70:
                bad = np.zeros(pos.size, bool)
                bad[idx[go]] = True
                _fail(err, bad, BAD_VARINT)
                break
            byte = buf[p[go]]
            acc[go] |= (byte & _U64_7F) << np.uint64(bits)
            p[go] += 1
            go = go[(byte & 0x80) != 0]
            bits += 7
        val[idx], pos[idx] = acc, p
    return val


def _long(ctx: Frames, pos: np.ndarray, end: np.ndarray, err: np.ndarray) -> np.ndarray:
    """Zigzag longs (int64); advances `pos`, checks the end."""
    v = _varint(ctx.buf, pos, err)
    _check_end(pos, end, err)
    return (v >> np.uint64(1)).astype(np.int64) ^ -(v & np.uint64(1)).astype(np.int64)


def _fixed(
    ctx: Frames, pos: np.ndarray, end: np.ndarray, err: np.ndarray, dtype: np.dtype[np.generic]
) -> np.ndarray:
    """A `dtype` value (little-endian float or double) at each cursor; advances `pos`."""
    out: np.ndarray = _at_every_byte(ctx.buf, dtype.str)[pos]
    pos += dtype.itemsize
    _check_end(pos, end, err)
    return out


def _ranges(ctx: Frames, starts: np.ndarray, lengths: np.ndarray) -> pa.BinaryArray:
    """The byte ranges buf[starts[i] : starts[i] + lengths[i]] as a BinaryArray (the
    ranges must be in buffer order and not overlap)."""
    n = starts.size
    if n == 0:
        return pa.array([], pa.binary())
    offsets = np.empty(2 * n, np.int64)
    offsets[0::2] = starts
    offsets[1::2] = starts + lengths
    if offsets[-1] < 2**31 and (n == 1 or bool((np.diff(offsets) >= 0).all())):
        # the records' ranges and the gaps between them, one BinaryArray over the buffer
        spread = pa.Array.from_buffers(
            pa.binary(), 2 * n - 1, [None, pa.py_buffer(offsets.astype(np.int32)), ctx.data]
        )
        return spread.take(pa.array(np.arange(0, 2 * n - 1, 2, dtype=np.int32)))
    out_offsets = np.zeros(n + 1, np.int64)
    np.cumsum(lengths, out=out_offsets[1:])
    index = np.repeat(starts - out_offsets[:-1], lengths) + np.arange(out_offsets[-1])
    data = ctx.buf[index]
    return pa.Array.from_buffers(
        pa.large_binary(), n, [None, pa.py_buffer(out_offsets), pa.py_buffer(data)]
    ).cast(pa.binary())


def _binary_values(arr: pa.Array) -> np.ndarray:
    """The data buffer of a fresh (offset 0) BinaryArray as uint8."""
    offsets = np.frombuffer(arr.buffers()[1], np.int32, len(arr) + 1)
    return (
        np.frombuffer(arr.buffers()[2], np.uint8, offsets[-1])
        if len(arr)
        else np.zeros(0, np.uint8)
    )


# -- schema nodes ----------------------------------------------------------------------
class _Node:
    arrow: pa.DataType
    width: int | None = None  # fixed byte width (float, double, boolean)
    min_size = 1  # fewest bytes one value takes

    def decode(self, ctx: Frames, pos: np.ndarray, end: np.ndarray, err: np.ndarray) -> pa.Array:
        raise NotImplementedError


class _FixedWidth(_Node):
    """A value of `width` bytes (float, double, boolean): an array's block of them is
    one byte range."""

    width: int
    dtype: np.dtype[np.generic]

    def values(self, raw: np.ndarray) -> pa.Array:
        raise NotImplementedError


class _Int(_Node):
    """int / long, and the logical types on them; values outside [lo, hi] are bad
    (dates and times as Python's datetime holds them, as fastavro reads them)."""

    def __init__(
        self,
        bits: int,
        arrow: pa.DataType,
        scale: int = 1,
        lo: int | None = None,
        hi: int | None = None,
    ):
        self.bits, self.arrow, self.scale = bits, arrow, scale
        self.lo = -(2 ** (bits - 1)) if lo is None else lo
        self.hi = 2 ** (bits - 1) - 1 if hi is None else hi

    def decode(self, ctx: Frames, pos: np.ndarray, end: np.ndarray, err: np.ndarray) -> pa.Array:
        v = _long(ctx, pos, end, err)
        if self.lo > -(2**63) or self.hi < 2**63 - 1:
            _fail(err, (v < self.lo) | (v > self.hi), INT_RANGE)
        if self.bits == 32:
            v = v.astype(np.int32)
        elif self.scale != 1:
            v = v * self.scale
        out = pa.array(v)
        if out.type == self.arrow:
            return out
        if pa.types.is_integer(self.arrow):  # int8/16, unsigned: out-of-range values are
            return out.cast(self.arrow, safe=False)  # flagged above (their records rejected)
        return out.view(self.arrow)


class _Float(_FixedWidth):
    def __init__(self, width: int):
        self.width = self.min_size = width
        self.dtype = np.dtype("<f4" if width == 4 else "<f8")
        self.arrow = pa.float32() if width == 4 else pa.float64()

    def values(self, raw: np.ndarray) -> pa.Array:
        return pa.array(np.ascontiguousarray(raw).view(self.dtype).reshape(-1))

    def decode(self, ctx: Frames, pos: np.ndarray, end: np.ndarray, err: np.ndarray) -> pa.Array:
        return pa.array(_fixed(ctx, pos, end, err, self.dtype))


class _Bool(_FixedWidth):
    arrow = pa.bool_()
    width = 1
    dtype: np.dtype[np.generic] = np.dtype("u1")

    def values(self, raw: np.ndarray) -> pa.Array:
        return pa.array(raw.reshape(-1) != 0)

    def decode(self, ctx: Frames, pos: np.ndarray, end: np.ndarray, err: np.ndarray) -> pa.Array:
        b = ctx.buf[pos]
        pos += 1
        _check_end(pos, end, err)
        return self.values(b)


class _Bytes(_Node):
    def __init__(self, string: bool):
        self.string = string
        self.arrow = pa.string() if string else pa.binary()

    def decode(self, ctx: Frames, pos: np.ndarray, end: np.ndarray, err: np.ndarray) -> pa.Array:
        length = _long(ctx, pos, end, err)
        bad = (length < 0) | (length > end - pos)
        if bad.any():
            _fail(err, bad, BAD_LENGTH)
            length[bad] = 0
        out = _ranges(ctx, pos, length)
        pos += length
        return _utf8(out, err) if self.string else out


def _utf8(arr: pa.Array, err: np.ndarray) -> pa.Array:
    try:
        return arr.cast(pa.string())
    except pa.ArrowInvalid:
        pass
    # rare: find the records whose string is not UTF-8 (only the non-ASCII ones)
    values = arr.to_pylist()
    bad = np.zeros(len(values), bool)
    for i, v in enumerate(values):
        try:
            v.decode()
        except UnicodeDecodeError:
            bad[i] = True
    _fail(err, bad, BAD_UTF8)
    return pa.array(
        [None if b else v.decode() for v, b in zip(values, bad, strict=True)], pa.string()
    )


def _expand(sub: pa.Array, present: np.ndarray, where: np.ndarray) -> pa.Array:
    """`sub` (the values of the records `where`) spread over all records, null elsewhere."""
    index = np.zeros(present.size, np.int32)
    index[where] = np.arange(where.size, dtype=np.int32)
    return sub.take(pa.array(index, mask=~present))


class _Union(_Node):
    """["null", T] (either order)."""

    def __init__(self, null_index: int, inner: _Node):
        self.null_index, self.inner, self.arrow = null_index, inner, inner.arrow
        self.tag = 2 * (1 - null_index)  # the zigzag byte of the value branch's index

    def decode(self, ctx: Frames, pos: np.ndarray, end: np.ndarray, err: np.ndarray) -> pa.Array:
        index = _long(ctx, pos, end, err)
        bad = (index != 0) & (index != 1)
        if bad.any():
            _fail(err, bad, BAD_UNION)
        present = index == 1 - self.null_index
        where = np.flatnonzero(present)
        if where.size == pos.size:
            return self.inner.decode(ctx, pos, end, err)
        if where.size == 0:
            return pa.nulls(pos.size, self.arrow)
        p, e, r = pos[where], end[where], err[where]
        sub = self.inner.decode(ctx, p, e, r)
        pos[where], err[where] = p, r
        return _expand(sub, present, where)


class _Record(_Node):
    def __init__(self) -> None:
        self.fields: list[tuple[str, _Node, bool]] = []  # (name, node, nullable)

    def finish(self) -> None:
        self.arrow = pa.struct(
            [pa.field(n, node.arrow, nullable) for n, node, nullable in self.fields]
        )

    def decode(self, ctx: Frames, pos: np.ndarray, end: np.ndarray, err: np.ndarray) -> pa.Array:
        children = [node.decode(ctx, pos, end, err) for _, node, _ in self.fields]
        return pa.StructArray.from_arrays(children, fields=list(self.arrow))


# Items of an array block: (values, their records, each record's first item index
# among its array's items, item count per record). A plain tuple: made per item round
_Chunk = tuple[pa.Array, np.ndarray, np.ndarray, np.ndarray]


class _Array(_Node):
    def __init__(self, items: _Node, nullable_items: bool, size: int | None):
        self.items, self.size = items, size
        field = pa.field("item", items.arrow, nullable_items)
        self.arrow = pa.list_(field, size) if size else pa.list_(field)

    def decode(self, ctx: Frames, pos: np.ndarray, end: np.ndarray, err: np.ndarray) -> pa.Array:
        n = pos.size
        total = np.zeros(n, np.int64)
        chunks: list[_Chunk] = []
        active = np.arange(n)
        while active.size:  # one round per block
            p, e, r = pos[active], end[active], err[active]
            count = _long(ctx, p, e, r)
            sized = np.flatnonzero(count < 0)  # -count, then the block's byte size
            if sized.size:
                count[sized] = -count[sized]
                ps, rs = p[sized], r[sized]
                size = _long(ctx, ps, e[sized], rs)  # not needed: the items are read
                _fail(rs, size < 0, BAD_LENGTH)
                p[sized], r[sized] = ps, rs
            bad = (count < 0) | (count > (e - p) // self.items.min_size)
            _fail(r, bad, BAD_LENGTH)
            count[r != 0] = 0  # a bad record stops here
            go = np.flatnonzero(count > 0)
            if go.size:
                pg, rg, k = p[go], r[go], count[go]
                for values, local, seq, cnt in self._block(ctx, pg, e[go], rg, k):
                    recs = active[go[local]]
                    chunks.append((values, recs, total[recs] + seq, cnt))
                p[go], r[go] = pg, rg
                total[active[go]] += k
            pos[active], err[active] = p, r
            active = active[go]
        return self._assemble(chunks, total, err)

    def _block(
        self, ctx: Frames, pos: np.ndarray, end: np.ndarray, err: np.ndarray, count: np.ndarray
    ) -> list[_Chunk]:
        """Items of one block per record: [(values, records, first seq, count)]."""
        items = self.items
        m = pos.size
        everyone = np.arange(m)
        zero = np.zeros(m, np.int64)
        if isinstance(items, _FixedWidth):  # float, double, boolean: the block is one byte range
            nbytes = count * items.width
            raw = _binary_values(_ranges(ctx, pos, nbytes))
            pos += nbytes
            return [(items.values(raw.reshape(-1, items.width)), everyone, zero, count)]
        out: list[_Chunk] = []
        slow = everyone
        if isinstance(items, _Union) and isinstance(items.inner, _FixedWidth):
            inner = items.inner
            # ["null", float]: optimistically every item present, each (1 + width) bytes
            step = 1 + inner.width
            nbytes = count * step
            fits = nbytes <= end - pos
            fit = np.flatnonzero(fits)
            raw = _binary_values(_ranges(ctx, pos[fit], nbytes[fit]))
            packed = raw.view(np.dtype([("tag", "u1"), ("value", inner.dtype)]))
            wrong = np.zeros(fit.size, bool)
            odd = np.flatnonzero(packed["tag"] != items.tag)
            if odd.size:  # a null item (or a bad tag): those records take the slow path
                ends = np.cumsum(count[fit])
                wrong[np.searchsorted(ends, odd, side="right")] = True
                packed = packed[~np.repeat(wrong, count[fit])]
            fast = fit[~wrong]
            if fast.size:
                out.append((inner.values(packed["value"].copy()), fast, zero[fast], count[fast]))
                pos[fast] += nbytes[fast]
            slow = np.concatenate([np.flatnonzero(~fits), fit[wrong]])
            slow.sort()
        if slow.size:  # one item round at a time, all records of the round at once
            p, e, r, k = pos[slow], end[slow], err[slow], count[slow]
            for j in range(int(k.max())):
                act = np.flatnonzero(k > j)
                pa_, ra = p[act], r[act]
                values = items.decode(ctx, pa_, e[act], ra)
                p[act], r[act] = pa_, ra
                out.append((values, slow[act], np.full(act.size, j), np.ones(act.size, np.int64)))
            pos[slow], err[slow] = p, r
        return out

    def _assemble(self, chunks: list[_Chunk], total: np.ndarray, err: np.ndarray) -> pa.Array:
        n = total.size
        offsets = np.zeros(n + 1, np.int64)
        np.cumsum(total, out=offsets[1:])
        items_type = self.arrow.value_type
        if not chunks:
            values = pa.array([], items_type)
        elif len(chunks) == 1 and len(chunks[0][0]) == offsets[-1] and not chunks[0][2].any():
            values = chunks[0][0]  # one block round: already in record order
        else:
            dests = []
            for _, recs, seq, cnt in chunks:
                first = np.repeat(offsets[recs] + seq - np.cumsum(cnt) + cnt, cnt)
                dests.append(first + np.arange(int(cnt.sum())))
            dest = np.concatenate(dests)
            order = np.empty(dest.size, np.int64)
            order[dest] = np.arange(dest.size)
            values = pa.concat_arrays([c[0] for c in chunks]).take(pa.array(order))
        if self.size is None:
            return pa.ListArray.from_arrays(
                pa.array(offsets.astype(np.int32)), values, type=self.arrow
            )
        wrong = total != self.size
        if wrong.any():  # not this vector length: a bad record, null here
            _fail(err, wrong, BAD_LENGTH)
            index = (offsets[:-1, None] + np.arange(self.size)).reshape(-1)
            index = np.where(np.repeat(wrong, self.size), 0, index)
            values = values.take(pa.array(index, mask=np.repeat(wrong, self.size)))
        return pa.FixedSizeListArray.from_arrays(values, type=self.arrow)


# -- schema -> nodes -------------------------------------------------------------------
def _primitive(name: str) -> _Node:
    match name:
        case "int":
            return _Int(32, pa.int32())
        case "long":
            return _Int(64, pa.int64())
        case "float":
            return _Float(4)
        case "double":
            return _Float(8)
        case "boolean":
            return _Bool()
        case "string":
            return _Bytes(True)
        case "bytes":
            return _Bytes(False)
    raise AvroDecodeDeclined(f"Avro type {name!r}")


_DAY_US = 86_400 * 10**6
_MIN_DAY, _MAX_DAY = -719_162, 2_932_896  # 0001-01-01, 9999-12-31 (days since 1970)
_MIN_US, _MAX_US = _MIN_DAY * _DAY_US, (_MAX_DAY + 1) * _DAY_US - 1
_LOGICAL = {  # (base, logicalType) -> node, as avro.arrow_type maps them
    ("int", "date"): lambda: _Int(32, pa.date32(), lo=_MIN_DAY, hi=_MAX_DAY),
    ("long", "timestamp-micros"): lambda: _Int(
        64, pa.timestamp("us", tz="UTC"), lo=_MIN_US, hi=_MAX_US
    ),
    ("long", "timestamp-millis"): lambda: _Int(
        64, pa.timestamp("us", tz="UTC"), scale=1000, lo=_MIN_US // 1000, hi=_MAX_US // 1000
    ),
    ("long", "local-timestamp-micros"): lambda: _Int(
        64, pa.timestamp("us"), lo=_MIN_US, hi=_MAX_US
    ),
    ("long", "time-micros"): lambda: _Int(64, pa.time64("us"), lo=0, hi=_DAY_US - 1),
}
_PRIMITIVES = ("int", "long", "float", "double", "boolean", "string", "bytes")


def _compile(t: AvroType, namespace: str, names: dict[str, _Node]) -> tuple[_Node, bool]:
    """(node, nullable) of an Avro type."""
    if isinstance(t, str):
        if t in _PRIMITIVES:
            return _primitive(t), False
        ref = names.get(t) or names.get(f"{namespace}.{t}")
        if ref is None:
            raise AvroDecodeDeclined(f"Avro type {t!r}")
        return ref, False
    if isinstance(t, list):
        if len(t) == 2 and "null" in t:
            null_index = t.index("null")
            inner, _ = _compile(t[1 - null_index], namespace, names)
            if isinstance(inner, _Union):
                raise AvroDecodeDeclined("nested union")
            return _Union(null_index, inner), True
        raise AvroDecodeDeclined(f"union {t!r}")
    if not isinstance(t, dict):
        raise AvroDecodeDeclined(f"Avro type {t!r}")
    base: Any = t.get("type")  # JSON values (AvroSchema)
    logical: Any = t.get("logicalType")
    if isinstance(base, (list, dict)) and logical is None:
        return _compile(base, namespace, names)
    if logical is not None:
        if (base, logical) in _LOGICAL:
            return _LOGICAL[(base, logical)](), False
        raise AvroDecodeDeclined(f"logical type {logical!r}")
    if base in _PRIMITIVES and ARROW_TYPE in t:  # a narrower or unsigned Arrow type
        exact, _ = arrow_type(t)
        if pa.types.is_integer(exact) and base in ("int", "long"):
            bits = 32 if base == "int" else 64
            if pa.types.is_signed_integer(exact):
                lo, hi = -(2 ** (exact.bit_width - 1)), 2 ** (exact.bit_width - 1) - 1
            else:
                lo, hi = 0, min(2**exact.bit_width - 1, 2**63 - 1)
            return _Int(bits, exact, lo=lo, hi=hi), False
        raise AvroDecodeDeclined(f"Avro {base} with {ARROW_TYPE} {t[ARROW_TYPE]!r}")
    if base in _PRIMITIVES:
        return _primitive(base), False
    if base == "record":
        name = t["name"]
        space = t.get("namespace", namespace) if "." not in name else name.rsplit(".", 1)[0]
        full = name if "." in name else (f"{space}.{name}" if space else name)
        node = _Record()
        names[full] = node
        for f in t["fields"]:
            child, nullable = _compile(f["type"], space, names)
            node.fields.append((f["name"], child, nullable))
        node.finish()
        return node, False
    if base == "array":
        items, nullable = _compile(t["items"], namespace, names)
        inner = items.inner if isinstance(items, _Union) else items
        if not isinstance(inner, (_Int, _Float, _Bool, _Bytes)):
            raise AvroDecodeDeclined("array of non-primitive items")
        size = t.get(FIXED_SIZE)
        return _Array(items, nullable, int(size) if size else None), False
    raise AvroDecodeDeclined(f"Avro type {base!r}")


class BatchDecoder:
    """Decodes many bodies written with one Avro record schema (parsed JSON) at once."""

    def __init__(self, schema: AvroSchema):
        node, _ = _compile(schema, "", {})
        if not isinstance(node, _Record):
            raise AvroDecodeDeclined("the top-level type is not a record")
        self.node = node
        self.arrow: pa.StructType = node.arrow

    def decode(
        self, frames: Frames, rows: np.ndarray | None = None, err: np.ndarray | None = None
    ) -> tuple[pa.StructArray, np.ndarray]:
        """(one struct per record, error code per record) of the records `rows` of
        `frames` (all when None). Records with an error code hold unspecified values."""
        if rows is None:
            rows = np.arange(frames.start.size)
        pos, end = frames.start[rows].copy(), frames.end[rows]
        err = np.zeros(rows.size, np.int8) if err is None else err.astype(np.int8).copy()
        out = self.node.decode(frames, pos, end, err)
        _fail(err, pos != end, TRAILING)
        return out, err


def can_decode(schema: AvroSchema) -> bool:
    """True when `BatchDecoder` handles every type of `schema`."""
    try:
        BatchDecoder(schema)
    except (AvroDecodeDeclined, KeyError, TypeError, ValueError):
        return False
    return True


def decode_bodies(schema: AvroSchema, bodies: list[bytes]) -> tuple[pa.StructArray, np.ndarray]:
    """Convenience: decode schemaless Avro bodies (no wire header)."""
    return BatchDecoder(schema).decode(Frames.of(bodies))


def reasons(err: np.ndarray) -> list[str]:
    return [REASONS.get(int(e), "bad record") for e in err]


__all__ = [
    "AvroDecodeDeclined",
    "BatchDecoder",
    "Frames",
    "can_decode",
    "decode_bodies",
    "REASONS",
]
