"""The format layer against hand-made protobuf messages and real pylance files."""

import os
import shutil
import struct

import lance
import numpy as np
import pyarrow as pa
import pytest
from google.protobuf.message import DecodeError
from hypothesis import given, settings
from hypothesis import strategies as st
from pyroaring import BitMap

from lance_cdf.errors import CorruptFileError, TableNotFoundError
from lance_cdf.format import (
    LocalFileSystem,
    TableLog,
    deletions,
    list_versions,
    parse_manifest,
    rowids,
)
from lance_cdf.format import (
    manifest as manifest_mod,
)
from lance_cdf.format._proto import rowids_pb2, table_pb2
from lance_cdf.format.deletions import read_deletion_vector
from lance_cdf.format.manifest import FragmentInfo
from lance_cdf.format.rowids import RowIdSequence, VersionSequence, segment_values
from lance_cdf.format.table import UNKNOWN_VERSION

Seg = rowids_pb2.U64Segment
Arr = rowids_pb2.EncodedU64Array


def u16(base, offsets):
    return Arr(u16_array=Arr.U16Array(base=base, offsets=np.array(offsets, "<u2").tobytes()))


def u32(base, offsets):
    return Arr(u32_array=Arr.U32Array(base=base, offsets=np.array(offsets, "<u4").tobytes()))


def u64(values):
    return Arr(u64_array=Arr.U64Array(values=np.array(values, "<u8").tobytes()))


SEGMENTS = [
    (Seg(range=Seg.Range(start=100, end=105)), [100, 101, 102, 103, 104]),
    (
        Seg(range_with_holes=Seg.RangeWithHoles(start=100, end=105, holes=u16(100, [2]))),
        [100, 101, 103, 104],
    ),
    (
        Seg(range_with_holes=Seg.RangeWithHoles(start=7, end=12, holes=u64([7, 11]))),
        [8, 9, 10],
    ),
    # bit i % 8 of byte i // 8 (least significant bit first), as Lance writes it
    (
        Seg(
            range_with_bitmap=Seg.RangeWithBitmap(
                start=10, end=20, bitmap=bytes([0b10000101, 0b10])
            )
        ),
        [10, 12, 17, 19],
    ),
    (Seg(sorted_array=u16(1000, [0, 5, 70000 - 65536 + 1])), [1000, 1005, 5465]),
    (Seg(sorted_array=u32(2**40, [1, 2**31])), [2**40 + 1, 2**40 + 2**31]),
    (Seg(array=u64([9, 2**63 + 5, 3])), [9, 2**63 + 5, 3]),
    (Seg(array=u32(50, [4, 0, 1])), [54, 50, 51]),
]


@pytest.mark.parametrize("segment,expected", SEGMENTS)
def test_every_segment_encoding(segment, expected):
    assert segment_values(segment).tolist() == expected
    seq = RowIdSequence.from_bytes(rowids_pb2.RowIdSequence(segments=[segment]).SerializeToString())
    assert len(seq) == len(expected)
    assert seq.to_numpy().dtype == np.uint64
    idx = np.arange(len(expected))[::-1]
    assert seq.values_at(idx).tolist() == [expected[i] for i in idx]


def test_multi_segment_sequence_offsets():
    segs = [s for s, _ in SEGMENTS]
    flat = [v for _, vals in SEGMENTS for v in vals]
    seq = RowIdSequence.from_bytes(rowids_pb2.RowIdSequence(segments=segs).SerializeToString())
    assert seq.to_numpy().tolist() == flat
    idx = np.array([0, 5, len(flat) - 1, 9])
    assert seq.values_at(idx).tolist() == [flat[i] for i in idx]
    ranges = RowIdSequence(
        [
            Seg(range=Seg.Range(start=0, end=10**9)),
            Seg(range=Seg.Range(start=5 * 10**9, end=6 * 10**9)),
        ]
    )
    # arithmetic path: no billion-element array is built
    assert ranges.values_at(np.array([10**9 - 1, 10**9, 2 * 10**9 - 1])).tolist() == [
        10**9 - 1,
        5 * 10**9,
        6 * 10**9 - 1,
    ]


def _protobuf_decoded(data: bytes) -> np.ndarray:
    """The oracle: the sequence read through the protobuf objects, segment by segment."""
    msg = rowids_pb2.RowIdSequence.FromString(data)
    parts = [segment_values(s) for s in msg.segments]
    return np.concatenate(parts) if parts else np.zeros(0, np.uint64)


def test_the_c_readers_are_built():
    """The install builds lance_cdf/format/_decode.c (setup.py) wherever a C compiler is
    present, as on every machine this suite runs on: the tests below then test it, not
    the protobuf fallback."""
    assert rowids._native is not None and manifest_mod._native is not None


@pytest.mark.parametrize("seed", range(6))
def test_range_sequences_decode_in_bulk_as_protobuf_does(seed):
    """Sequences of Range segments (what pylance writes for a scattered merge_insert: one
    single-row range per row) are read from the bytes in bulk; random ones, starts of 0
    (a field proto3 leaves out), empty and huge ranges, must read as the parser reads them,
    and anything else (other segments, extra fields) must still decode right."""
    rng = np.random.default_rng(seed)
    bulk = 0
    for _ in range(40):
        n = int(rng.choice([rng.integers(0, 60), rng.integers(60, 250)]))
        starts = rng.choice([0, 1, 127, 128, 2**14, 2**35, 2**63], n) + rng.integers(0, 300, n)
        lengths = rng.choice([0, 1, 1, 1, 2, 200, 5000], n)
        segs = [
            Seg(range=Seg.Range(start=int(a), end=int(a + w)))
            for a, w in zip(starts, lengths, strict=True)
        ]
        if seed % 2 and n:
            segs.insert(int(rng.integers(0, n)), SEGMENTS[int(rng.integers(1, len(SEGMENTS)))][0])
        data = rowids_pb2.RowIdSequence(segments=segs).SerializeToString()
        expected = _protobuf_decoded(data)
        seq = RowIdSequence.from_bytes(data)
        in_bulk = not seed % 2 or n == 0
        assert (seq.segments is None) == in_bulk
        bulk += in_bulk
        assert len(seq) == sum(segment_values(s).size for s in segs)
        assert np.array_equal(seq.to_numpy(), expected)
        if len(expected):
            idx = rng.integers(0, len(expected), 50)
            assert np.array_equal(RowIdSequence.from_bytes(data).values_at(idx), expected[idx])
    assert bulk or seed % 2
    # an unknown field inside a range (a newer writer) is left to the parser
    odd = rowids_pb2.RowIdSequence(
        segments=[Seg(range=Seg.Range(start=5, end=8))]
    ).SerializeToString()
    odd = odd[:1] + bytes([odd[1] + 2]) + odd[2:3] + bytes([odd[3] + 2]) + odd[4:] + b"\x18\x01"
    seq = RowIdSequence.from_bytes(odd)
    assert seq.segments is not None and seq.to_numpy().tolist() == [5, 6, 7]


def _damaged(data: bytes, rng, inserted: list[int]) -> bytes:
    """`data` with one random change: a byte changed, one of `inserted` put in, the tail
    cut off; or, one time in four, left whole."""
    bad = bytearray(data)
    what, at = rng.integers(4), int(rng.integers(len(bad)))
    if what == 0:
        bad[at] = int(rng.integers(256))
    elif what == 1:
        bad.insert(at, int(rng.choice(inserted)))
    elif what == 2:
        bad = bad[:at]
    return bytes(bad)


def _ranges_of(data: bytes) -> list[tuple[int, int]] | None:
    """The oracle: protobuf's parse as (start, end) pairs; None if not all Range segments
    or not a RowIdSequence at all."""
    try:
        segments = rowids_pb2.RowIdSequence.FromString(data).segments
    except DecodeError:
        return None
    if not all(s.WhichOneof("segment") == "range" for s in segments):
        return None
    return [(s.range.start, s.range.end) for s in segments]


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 2**64 - 1), st.integers(0, 2**64 - 1)), max_size=40))
def test_range_decoder_reads_any_ranges_as_protobuf_does(pairs):
    """Any Range-only sequence protobuf writes (starts and ends anywhere in uint64, empty
    ranges, zeros proto3 leaves out) is read, to protobuf's ranges."""
    segs = [Seg(range=Seg.Range(start=min(a, b), end=max(a, b))) for a, b in pairs]
    data = rowids_pb2.RowIdSequence(segments=segs).SerializeToString()
    got = rowids._range_segments(data)
    assert got is not None
    assert list(zip(got[0].tolist(), got[1].tolist(), strict=True)) == _ranges_of(data)


@settings(max_examples=500, deadline=None)
@given(
    st.lists(st.tuples(st.integers(0, 2**40), st.integers(0, 3)), min_size=1, max_size=8),
    st.lists(
        st.tuples(st.integers(0, 200), st.sampled_from([0, 1, 2]), st.integers(0, 255)), max_size=3
    ),
)
def test_range_decoder_reads_edited_bytes_as_protobuf_or_declines(pairs, edits):
    """A Range-only sequence with bytes changed, inserted or cut off at random: the hand
    decoder declines (None), or reads exactly what protobuf parses from the same bytes,
    all Range segments."""
    segs = [Seg(range=Seg.Range(start=a, end=a + w)) for a, w in pairs]
    data = bytearray(rowids_pb2.RowIdSequence(segments=segs).SerializeToString())
    for at, how, byte in edits:
        at %= len(data) + 1
        if how == 0 and at < len(data):
            data[at] = byte
        elif how == 1:
            data.insert(at, byte)
        elif how == 2:
            del data[at:]
    got = rowids._range_segments(bytes(data))
    if got is not None:
        expected = _ranges_of(bytes(data))
        assert list(zip(got[0].tolist(), got[1].tolist(), strict=True)) == expected


def test_range_decoder_declines_layouts_it_does_not_know():
    """None (protobuf reads it) for everything but Range segments holding start and end
    once each: the other segment kinds, first or later; an unknown field; a repeated
    start (legal protobuf: the last one wins); end < start; truncated bytes."""
    ranged = Seg(range=Seg.Range(start=5, end=8))
    for other, _ in SEGMENTS[1:]:
        for segs in ([other], [ranged, other], [other, ranged]):
            data = rowids_pb2.RowIdSequence(segments=segs).SerializeToString()
            assert rowids._range_segments(data) is None, segs
            assert np.array_equal(
                RowIdSequence.from_bytes(data).to_numpy(), _protobuf_decoded(data)
            )
    # segment (0a len) > range (0a len) > start=5 (08 05), end=8 (10 08), then more
    unknown = bytes.fromhex("0a080a06080510081801")
    repeated = bytes.fromhex("0a080a06080510080807")
    backwards = bytes.fromhex("0a060a0408091008")
    whole = rowids_pb2.RowIdSequence(segments=[ranged, ranged]).SerializeToString()
    assert _ranges_of(unknown) == [(5, 8)] and _ranges_of(repeated) == [(7, 8)]
    for data in (unknown, repeated, backwards, whole[:-1], whole[:3], whole + b"\x0a"):
        assert rowids._range_segments(data) is None, data.hex()
    assert RowIdSequence.from_bytes(repeated).to_numpy().tolist() == [7]
    assert rowids._range_segments(whole) is not None
    empty = rowids._range_segments(b"")
    assert empty is not None and empty[0].size == 0 and len(RowIdSequence.from_bytes(b"")) == 0


@pytest.mark.parametrize("seed", range(3))
def test_range_decoder_reads_damaged_bytes_as_protobuf_or_declines(seed):
    """Random byte changes, insertions and truncations of Range-only sequences: the C
    decoder declines (None) or reads exactly the ranges protobuf parses from the same bytes
    (and protobuf does parse them); undamaged sequences it always reads."""
    rng = np.random.default_rng(seed)
    accepted = 0
    for _ in range(400):
        n = int(rng.integers(1, 20))
        starts = rng.choice([0, 5, 200, 2**20, 2**40], n) + rng.integers(0, 50, n)
        segs = [Seg(range=Seg.Range(start=int(a), end=int(a + rng.integers(0, 3)))) for a in starts]
        data = rowids_pb2.RowIdSequence(segments=segs).SerializeToString()
        bad = _damaged(data, rng, [8, 10, 16, 24, 0x80, 1])  # may be whole: must be read
        got = rowids._range_segments(bad)
        if got is None:
            assert bad != data, "an undamaged Range-only sequence was declined"
            continue
        accepted += 1
        parsed = rowids_pb2.RowIdSequence.FromString(bad)  # DecodeError: accepted garbage
        assert all(s.WhichOneof("segment") == "range" for s in parsed.segments), bad.hex()
        assert [(s.range.start, s.range.end) for s in parsed.segments] == list(
            zip(got[0].tolist(), got[1].tolist(), strict=True)
        ), bad.hex()
    assert accepted > 100


def test_version_sequence_runs():
    msg = rowids_pb2.RowDatasetVersionSequence(
        runs=[
            rowids_pb2.RowDatasetVersionRun(span=Seg(range=Seg.Range(start=0, end=3)), version=5),
            rowids_pb2.RowDatasetVersionRun(span=Seg(range=Seg.Range(start=3, end=4)), version=9),
            rowids_pb2.RowDatasetVersionRun(span=Seg(sorted_array=u16(4, [0, 1])), version=2),
        ]
    )
    seq = VersionSequence.from_bytes(msg.SerializeToString())
    assert seq.to_numpy().tolist() == [5, 5, 5, 9, 2, 2]
    assert seq.values_at(np.array([5, 0, 3])).tolist() == [2, 5, 9]
    assert VersionSequence.uniform(3, 1).to_numpy().tolist() == [1, 1, 1]


def test_external_row_ids_and_versions_are_read_by_range(tmp_path):
    seq = rowids_pb2.RowIdSequence(segments=[Seg(array=u64([42, 7, 19]))]).SerializeToString()
    vers = rowids_pb2.RowDatasetVersionSequence(
        runs=[rowids_pb2.RowDatasetVersionRun(span=Seg(range=Seg.Range(start=0, end=3)), version=4)]
    ).SerializeToString()
    os.makedirs(tmp_path / "_versions")
    blob = b"junk" + seq + vers + b"tail"
    (tmp_path / "data.bin").write_bytes(blob)
    frag = FragmentInfo(
        table_pb2.DataFragment(
            id=3,
            physical_rows=3,
            external_row_ids=table_pb2.ExternalFile(path="data.bin", offset=4, size=len(seq)),
            external_last_updated_at_versions=table_pb2.ExternalFile(
                path="data.bin", offset=4 + len(seq), size=len(vers)
            ),
        )
    )
    log = TableLog.__new__(TableLog)
    log.fs, log.uri = LocalFileSystem(str(tmp_path)), str(tmp_path)
    assert log.row_ids(frag).to_numpy().tolist() == [42, 7, 19]
    assert log.last_updated_versions(frag).to_numpy().tolist() == [4, 4, 4]
    # absent: not recorded (pylance 0.33-0.38.2 wrote none), not "version 1"
    assert log.created_versions(frag).to_numpy().tolist() == [UNKNOWN_VERSION] * 3


def test_deletion_files_both_flavours(tmp_path):
    os.makedirs(tmp_path / "_deletions")
    fs = LocalFileSystem(str(tmp_path))
    with pa.OSFile(str(tmp_path / "_deletions/4-2-77.arrow"), "wb") as sink:
        t = pa.table({"ids": pa.array([9, 1, 5], pa.int32())})
        with pa.ipc.new_file(sink, t.schema) as w:
            w.write_table(t)
    (tmp_path / "_deletions/4-3-78.bin").write_bytes(BitMap(range(0, 20000, 3)).serialize())
    arrow = table_pb2.DeletionFile(file_type=0, read_version=2, id=77, num_deleted_rows=3)
    bitmap = table_pb2.DeletionFile(file_type=1, read_version=3, id=78, num_deleted_rows=6667)
    assert read_deletion_vector(fs, 4, arrow).to_numpy().tolist() == [1, 5, 9]
    dv = read_deletion_vector(fs, 4, bitmap)
    assert len(dv) == 6667 and dv.to_numpy()[:3].tolist() == [0, 3, 6]
    assert dv.logical_offsets(np.array([1, 2, 4])).tolist() == [0, 1, 2]
    (tmp_path / "_deletions/4-3-78.bin").write_bytes(b"\x01\x02garbage")
    with pytest.raises(CorruptFileError, match="4-3-78.bin"):
        read_deletion_vector(fs, 4, bitmap)


@pytest.fixture(scope="module")
def deletion_files(tmp_path_factory):
    """A real pylance table after deletes of random sizes from 1 to 100,000 rows per
    fragment: (uri, every (version, fragment entry) with a deletion file)."""
    uri = str(tmp_path_factory.mktemp("dels") / "t.lance")
    per_frag = 120_000
    n = 3 * per_frag
    lance.write_dataset(
        pa.table({"id": np.arange(n)}), uri, enable_stable_row_ids=True, max_rows_per_file=per_frag
    )
    rng = np.random.default_rng(18)
    live = np.ones(n, dtype=bool)
    for size in [1, 2, 7, 40, 300, 1500, 4000, 9000, 30000, 100000]:
        ds = lance.dataset(uri)
        if size <= 1500:
            ids = rng.choice(np.flatnonzero(live), size, replace=False)
            ds.delete(f"id IN ({','.join(map(str, ids))})")
            live[ids] = False
        else:  # scattered over every fragment without a long IN list
            m = n // size
            r = int(rng.integers(m))
            ds.delete(f"id % {m} = {r}")
            live[np.arange(r, n, m)] = False
    log = TableLog(uri)
    entries = [
        (v, f) for v in log.versions for f in log.manifest(v).fragments if f.deletion is not None
    ]
    return uri, entries


def test_deletion_files_match_lance(deletion_files):
    """Every deletion file pylance wrote (.arrow and .bin, 1 to 100,000 rows) decodes to
    what Lance's own scan says (the rows it no longer returns)."""
    uri, entries = deletion_files
    log = TableLog(uri)
    kinds, sizes = set(), []
    for version, frag in entries:
        path = deletions.deletion_file_path(frag.id, frag.deletion)
        got = read_deletion_vector(log.fs, frag.id, frag.deletion).to_numpy()
        kinds.add(path.rsplit(".", 1)[1])
        sizes.append(got.size)
        frag_ds = lance.dataset(uri, version=version).get_fragment(frag.id)
        addrs = frag_ds.to_table(columns=[], with_row_address=True)["_rowaddr"].to_numpy()
        live = (addrs & 0xFFFFFFFF).astype(np.int64)
        expected = np.setdiff1d(np.arange(frag.physical_rows), live)
        assert np.array_equal(got, expected), path
    assert kinds == {"arrow", "bin"}
    assert min(sizes) == 1 and max(sizes) >= 30_000


def _ipc_file(values: pa.Array, compression=None, batches: int = 1) -> bytes:
    sink = pa.BufferOutputStream()
    table = pa.table({"row_id": values})
    options = pa.ipc.IpcWriteOptions(compression=compression)
    with pa.ipc.new_file(sink, table.schema, options=options) as writer:
        for chunk in np.array_split(np.arange(len(table)), batches):
            writer.write_table(table.take(chunk))
    return sink.getvalue().to_pybytes()


@pytest.mark.parametrize("seed", range(3))
def test_arrow_deletion_files_of_any_shape_read_as_their_values(seed):
    """Arrow IPC files of other shapes than pylance's (several batches, other codecs and
    integer types, duplicates, dense or spread values) read as the set of their values;
    nulls or a non-integer column are refused (ValueError)."""
    rng = np.random.default_rng(seed)
    for _ in range(30):
        n = int(rng.integers(0, 5000))
        # dense (one roaring container past 4,096 values) or spread; with duplicates or not
        values = rng.choice(1 << int(rng.choice([13, 20])), n, replace=bool(rng.integers(2)))
        arr = pa.array(values, [pa.uint32(), pa.int32(), pa.uint64()][int(rng.integers(3))])
        codec = [None, "zstd", "lz4"][int(rng.integers(3))]
        data = _ipc_file(arr, codec, batches=int(rng.integers(1, 4)))
        got = deletions._decode(data, deletions.ARROW)
        assert got.to_array().tolist() == np.unique(values).tolist()
    with pytest.raises(ValueError, match="nulls"):
        deletions._decode(_ipc_file(pa.array([1, None, 3], pa.uint32())), deletions.ARROW)
    with pytest.raises(ValueError, match="integer column"):
        deletions._decode(_ipc_file(pa.array([1.5, 2.0])), deletions.ARROW)


class _Files:
    """A FileSystem stand-in that serves the given bytes for one path."""

    root = "mem://t"

    def __init__(self, data: bytes):
        self.data = data

    def read(self, path: str) -> bytes:
        return self.data


def test_damaged_deletion_files_raise_corrupt_file_error(deletion_files):
    """Random byte changes, insertions and truncations of real `.arrow` and `.bin` deletion
    files: each read returns a vector or raises CorruptFileError naming the file, never any
    other exception (read_deletion_vector catches only the types pyarrow and pyroaring
    raise on garbage)."""
    uri, entries = deletion_files
    log = TableLog(uri)
    rng = np.random.default_rng(7)
    files = {deletions.deletion_file_path(f.id, f.deletion): f for _, f in entries}
    refused = {"arrow": 0, "bin": 0}
    for path, frag in files.items():
        data = log.fs.read(path)
        for _ in range(150):
            bad = bytearray(data)
            what, at = int(rng.integers(4)), int(rng.integers(len(bad)))
            if what == 0:
                bad = bad[:at]
            elif what == 1:
                bad.insert(at, int(rng.integers(256)))
            else:
                for _ in range(what):  # one or two bytes changed
                    bad[int(rng.integers(len(bad)))] = int(rng.integers(256))
            try:
                read_deletion_vector(_Files(bytes(bad)), frag.id, frag.deletion)
            except CorruptFileError as exc:
                assert path in str(exc)
                refused[path.rsplit(".", 1)[1]] += 1
    assert refused["arrow"] > 100 and refused["bin"] > 100


def test_real_table_roaring_deletions_and_segments(tmp_path):
    uri = str(tmp_path / "t.lance")
    lance.write_dataset(pa.table({"id": np.arange(20000)}), uri, enable_stable_row_ids=True)
    ds = lance.dataset(uri)
    ds.delete("id % 3 = 0")  # 6667 deletions in one fragment: Lance writes a roaring .bin
    assert any(n.endswith(".bin") for n in os.listdir(os.path.join(uri, "_deletions")))
    log = TableLog(uri)
    frag = log.manifest(2).fragments[0]
    live_ids = log.row_ids(frag).values_at(log.deletions(frag).live_offsets(frag.physical_rows))
    scanned = lance.dataset(uri).to_table(columns=[], with_row_id=True)["_rowid"].to_numpy()
    assert np.array_equal(np.sort(live_ids), np.sort(scanned))


def test_manifest_facts_and_naming_schemes(tmp_path):
    uri = str(tmp_path / "t.lance")
    lance.write_dataset(pa.table({"id": [1, 2]}), uri, enable_stable_row_ids=True)
    lance.dataset(uri).delete("id = 1")
    versions, scheme = list_versions(LocalFileSystem(uri))
    assert versions == [1, 2] and scheme == "v2"
    log = TableLog(uri)
    m = log.manifest(2)
    assert (m.version, m.operation, m.next_row_id, m.stable_row_ids) == (2, "Delete", 2, True)
    assert m.top_level_columns == ("id",)
    assert log.manifest(1).operation in ("Overwrite", "Append")
    # a V1-named manifest beside V2 names is a mixture, which the format forbids
    src = os.path.join(uri, "_versions", sorted(os.listdir(os.path.join(uri, "_versions")))[0])
    with open(src, "rb") as f:
        data = f.read()
    (tmp_path / "t.lance/_versions/3.manifest").write_bytes(data)
    with pytest.raises(CorruptFileError, match="mixes the V1"):
        list_versions(LocalFileSystem(uri))


def test_v1_naming_scheme(tmp_path):
    os.makedirs(tmp_path / "_versions")
    for v in (1, 2, 10):
        (tmp_path / f"_versions/{v}.manifest").write_bytes(b"")
    assert list_versions(LocalFileSystem(str(tmp_path))) == ([1, 2, 10], "v1")
    os.makedirs(tmp_path / "empty/_versions")
    with pytest.raises(TableNotFoundError):
        list_versions(LocalFileSystem(str(tmp_path / "empty")))


def _manifest_files(uri: str) -> dict[int, bytes]:
    vdir = os.path.join(uri, "_versions")
    out = {}
    for name in os.listdir(vdir):
        if name.endswith(".manifest"):
            data = open(os.path.join(vdir, name), "rb").read()
            out[parse_manifest(data).version] = data
    return out


def _whole_body(data: bytes) -> table_pb2.Manifest:
    pos = struct.unpack_from("<Q", data, len(data) - 16)[0]
    (length,) = struct.unpack_from("<I", data, pos)
    return table_pb2.Manifest.FromString(data[pos + 4 : pos + 4 + length])


@pytest.fixture(scope="module")
def churned_manifests(tmp_path_factory) -> dict[int, bytes]:
    """The manifests of a table after appends, scattered updates and deletes, a
    merge_insert, a new column and a compaction (ids 0 included: proto3 leaves them out)."""
    uri = str(tmp_path_factory.mktemp("entries") / "t.lance")
    rng = np.random.default_rng(7)
    n = 3000
    lance.write_dataset(
        pa.table({"id": np.arange(n), "v": rng.random(n)}),
        uri,
        enable_stable_row_ids=True,
        max_rows_per_file=700,
    )
    ds = lance.dataset(uri)
    ds.update({"v": "v + 1"}, where="id % 97 = 3")
    ds = lance.dataset(uri)
    ds.delete("id % 89 = 5")
    ds = lance.dataset(uri)
    ids = rng.choice(n + 200, 400, replace=False)
    src = pa.table({"id": ids, "v": rng.random(ids.size)})
    ds.merge_insert("id").when_matched_update_all().when_not_matched_insert_all().execute(src)
    lance.write_dataset(
        pa.table({"id": np.arange(n, n + 50), "v": rng.random(50)}), uri, mode="append"
    )
    lance.dataset(uri).add_columns({"w": "v * 2"})
    lance.dataset(uri).optimize.compact_files(target_rows_per_fragment=2000)
    lance.dataset(uri).delete("id % 7 = 0")
    return _manifest_files(uri)


def test_manifest_entries_parse_as_protobuf_does(churned_manifests):
    """Every version's fragment entries, left as bytes and parsed one by one, are the
    message protobuf parses from the whole manifest, with the same ids and order; two
    versions' entries are the same entry exactly when their messages are equal."""
    parsed = {}
    for v, data in sorted(churned_manifests.items()):
        m = parse_manifest(data, f"v{v}")
        whole = _whole_body(data)
        assert m.entries is not None and len(m.proto.fragments) == 0
        assert [f.id for f in m.fragments] == [f.id for f in whole.fragments]
        assert m.whole_proto() == whole
        parsed[v] = m
    same = differ = 0
    for v in sorted(parsed)[1:]:
        old, new = parse_manifest(churned_manifests[v - 1]), parse_manifest(churned_manifests[v])
        for fid, nf in new.fragment_map.items():
            of = old.fragment_map.get(fid)
            if of is None:
                continue
            expected = (
                _whole_body(churned_manifests[v - 1]).fragments[
                    [f.id for f in old.fragments].index(fid)
                ]
                == nf.proto
            )
            assert of.same_entry(nf) == expected, (v, fid)
            same += expected
            differ += not expected
    assert same > 5 and differ > 5
    assert 0 in {f.id for m in parsed.values() for f in m.fragments}


@pytest.mark.parametrize("seed", range(3))
def test_manifest_reader_reads_damaged_bytes_as_protobuf_does(churned_manifests, seed):
    """Random byte changes, insertions and truncations of manifests: a manifest read with
    its entries left as bytes is what protobuf parses whole: equal messages where protobuf
    parses it, a CorruptFileError (at once or when the damaged entry is looked into) where
    it does not; and the hand reader of the top level reads most of them."""
    rng = np.random.default_rng(seed)
    datas = [churned_manifests[v] for v in sorted(churned_manifests)]
    accepted = 0
    for _ in range(300):
        data = datas[int(rng.integers(len(datas)))]
        pos = struct.unpack_from("<Q", data, len(data) - 16)[0]
        (length,) = struct.unpack_from("<I", data, pos)
        body = _damaged(data[pos + 4 : pos + 4 + length], rng, [0x12, 0x08, 0x80, 0xFF, 1, 0x0B])
        accepted += manifest_mod._manifest_entries(body, 0, len(body)) is not None
        framed = struct.pack("<I", len(body)) + body
        file = framed + struct.pack("<QHH4s", 0, 0, 3, b"LANC")
        try:
            whole = table_pb2.Manifest.FromString(body)
        except Exception:
            whole = None
        try:
            got = parse_manifest(file, "damaged", transaction=False).whole_proto()
        except CorruptFileError:
            got = None
        assert (got is None) == (whole is None), body.hex()
        if got is not None:
            assert got == whole
    assert accepted > 100


@pytest.mark.parametrize("mapped", [False, True])
def test_manifests_read_mapped_or_not_alike(tmp_path, monkeypatch, mapped):
    """Manifests of 1 MB or more are memory-mapped while they are parsed: forced on every
    file (and off), every version parses to the same message and operation, and a damaged
    one still names the file."""
    import lance_cdf.format.io as io

    uri = str(tmp_path / "t.lance")
    lance.write_dataset(pa.table({"id": np.arange(300)}), uri, enable_stable_row_ids=True)
    lance.dataset(uri).update({"id": "id + 1000"}, where="id % 7 = 0")
    lance.dataset(uri).delete("id % 5 = 0")
    expected = {v: TableLog(uri).manifest(v) for v in (1, 2, 3)}
    monkeypatch.setattr(io, "_MAP_AT_LEAST", 0 if mapped else 1 << 40)
    log = TableLog(uri)
    for v, m in expected.items():
        got = log.manifest(v)
        assert got.whole_proto() == m.whole_proto() and got.operation == m.operation
        assert got.version == v
    vdir = os.path.join(uri, "_versions")
    path = sorted(os.path.join(vdir, n) for n in os.listdir(vdir) if n.endswith(".manifest"))[0]
    data = bytearray(open(path, "rb").read())
    with open(path, "wb") as fh:
        fh.write(data[:-3])
    with pytest.raises(CorruptFileError, match=os.path.basename(path)):
        TableLog(uri).manifest(3)


def test_corrupt_and_truncated_manifests_name_the_file(tmp_path):
    uri = str(tmp_path / "t.lance")
    lance.write_dataset(pa.table({"id": [1, 2]}), uri, enable_stable_row_ids=True)
    vdir = os.path.join(uri, "_versions")
    path = next(os.path.join(vdir, n) for n in os.listdir(vdir) if n.endswith(".manifest"))
    data = open(path, "rb").read()
    assert parse_manifest(data, path).version == 1
    with pytest.raises(CorruptFileError, match="footer magic"):
        parse_manifest(data[:-3], path)
    with pytest.raises(CorruptFileError, match="shorter than the 16-byte footer"):
        parse_manifest(data[:5], path)
    pos = struct.unpack_from("<Q", data, len(data) - 16)[0]
    bad = bytearray(data)
    bad[pos + 4 : pos + 14] = b"\xff" * 10  # garbage inside the protobuf
    with pytest.raises(CorruptFileError, match=os.path.basename(path)):
        parse_manifest(bytes(bad), path)


def test_a_log_tells_its_own_manifests_from_a_table_created_again_at_the_path(tmp_path):
    from lance_cdf.format.table import TableLog

    uri = str(tmp_path / "t.lance")
    data = pa.table({"id": pa.array(range(5), pa.int64())})
    lance.write_dataset(data, uri, enable_stable_row_ids=True)
    log = TableLog(uri)
    assert not log.still_own()  # holds no manifest: nothing to tell by
    lance.write_dataset(data, uri, mode="append")
    log.manifest(2, operation=False)
    assert log.still_own()  # read again: the same manifest
    lance.write_dataset(data, uri, mode="overwrite")  # version 3: 2 stays the table's
    assert log.still_own()
    shutil.rmtree(uri)  # dropped, and another table made at the path
    lance.write_dataset(data, uri, enable_stable_row_ids=True)
    lance.write_dataset(data, uri, mode="append")
    assert not log.still_own()  # its version 2 is another manifest
    shutil.rmtree(uri)
    assert not log.still_own()  # gone
