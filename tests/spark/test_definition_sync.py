"""Which definition the sink's commit sends, on which version (spark/sink/definition_sync.py):
a micro-batch's span from a Spark checkpoint's offsets (single table, database, snapshot,
head start, remote checkpoint), and the comparison with what the topic's consumers know
(a replay that stopped midway, a head start's definition, a version cleaned up)."""

from __future__ import annotations

import json
from pathlib import Path

import lance
import pyarrow as pa
import pytest

from lance_cdf.format.definitions import TableDefinition
from lance_cdf.kafka.transactions import TransactionRecord
from lance_cdf.spark.sink.definition_sync import Span, TableDefinitions, batch_spans

pytestmark = pytest.mark.unit


def offsets(checkpoint: Path, batch: int, offset: dict[str, object], committed: bool) -> None:
    (checkpoint / "offsets").mkdir(parents=True, exist_ok=True)
    (checkpoint / "commits").mkdir(parents=True, exist_ok=True)
    meta = {"batchWatermarkMs": 0, "batchTimestampMs": 0, "conf": {}}
    text = f"v1\n{json.dumps(meta)}\n{json.dumps(offset)}"
    (checkpoint / "offsets" / str(batch)).write_text(text)
    if committed:
        (checkpoint / "commits" / str(batch)).write_text("v1\n{}")


def test_spans_of_a_single_table(tmp_path: Path) -> None:
    ck = tmp_path / "ck"
    offsets(ck, 0, {"version": 4}, True)
    offsets(ck, 1, {"version": 7}, False)
    assert batch_spans(str(ck), 0, {None: [1, 2]}) == {None: Span(None, 4)}  # a new start
    assert batch_spans(str(ck), 1, {None: [5]}) == {None: Span(4, 7)}  # 6, 7: no events
    # the head start commits as batch -1: from the committed offset to what it published
    assert batch_spans(str(ck), -1, {None: [5, 6]}) == {None: Span(4, 6)}
    # a remote checkpoint: the versions with events
    assert batch_spans("s3://b/ck", 3, {None: [5, 6]}) == {None: Span(None, 6, True)}
    # a snapshot: nothing while it is delivered, then its version against nothing
    offsets(ck, 2, {"version": 3, "snapshot": {"fragment": 1, "offset": 0}}, True)
    offsets(ck, 3, {"version": 3}, False)
    assert batch_spans(str(ck), 2, {None: [3]}) == {}
    assert batch_spans(str(ck), 3, {None: [3]}) == {None: Span(None, 3)}


def test_spans_of_a_database(tmp_path: Path) -> None:
    ck = tmp_path / "ck"
    offsets(ck, 0, {"tables": {"a": {"version": 2}}, "from": "1"}, True)
    offsets(ck, 1, {"tables": {"a": {"version": 5}, "b": {"version": 3}}, "from": "1"}, False)
    offsets(
        ck, 2, {"tables": {"a": {"version": 5}, "b": {"version": 3}, "c": {"version": 0}}}, False
    )
    # b new to the stream: against nothing; a from its previous offset
    assert batch_spans(str(ck), 1, {"a": [3]}) == {"a": Span(2, 5), "b": Span(None, 3)}
    assert batch_spans(str(ck), 2, {}) == {}  # nothing moved; c before its first version
    assert batch_spans(str(ck), -1, {"a": [3, 4]}) == {"a": Span(2, 4)}


def table(tmp_path: Path) -> str:
    uri = str(tmp_path / "t.lance")
    ds = lance.write_dataset(pa.table({"id": list(range(50))}), uri, enable_stable_row_ids=True)
    ds.create_scalar_index("id", "BTREE")  # v2
    lance.write_dataset(pa.table({"id": [50]}), uri, mode="append")  # v3
    lance.dataset(uri).update_config({"k": "v"})  # v4
    return uri


def end(version: int, definition: TableDefinition | None) -> TransactionRecord:
    return TransactionRecord("END", f"x:{version}", version, 1, {0: (1, 1)}, definition)


def test_what_the_consumers_know_decides(tmp_path: Path) -> None:
    uri = table(tmp_path)
    defs = TableDefinitions(uri, {})
    at = {v: defs.at(v) for v in (1, 2, 3, 4)}
    d = {v: c[0] for v, c in at.items() if c is not None}
    assert d[1] == TableDefinition() and d[2] == d[3] and d[3] != d[4]
    # a new checkpoint: against nothing
    assert defs.change(Span(None, 3))(None) == d[3]
    assert not defs.unchanged(Span(None, 3))
    # the index came in (1, 3]: sent; an earlier attempt of (1, 4] that stopped after
    # version 3's END (the definition goes on 4's) leaves it to be sent
    assert defs.change(Span(1, 3))(end(1, None)) == d[3]
    assert defs.change(Span(1, 4))(end(3, None)) == d[4]
    # the head start sent it on version 2: the query's (1, 3] sends nothing
    assert defs.change(Span(1, 3))(end(2, d[2])) is None
    # (2, 3]: nothing new (and the topic need not be read)
    assert defs.unchanged(Span(2, 3)) and defs.change(Span(2, 3))(end(2, None)) is None
    # the config commit, the latest version, no events
    assert defs.change(Span(3, 4))(end(3, None)) == d[4]
    # a remote checkpoint: against the definition at the topic's last END (the index
    # commit, version 2, had no events and no END: it rides with version 3's)
    assert defs.change(Span(None, 3, True))(end(1, None)) == d[3]
    assert defs.change(Span(None, 3, True))(end(2, None)) is None
    assert defs.change(Span(None, 3, True))(None) == d[3]
    assert not defs.unchanged(Span(None, 3, True))


def test_a_start_cleaned_up_is_sent_again(tmp_path: Path) -> None:
    uri = table(tmp_path)
    want = TableDefinitions(uri, {}).at(3)
    names = [p for p in (Path(uri) / "_versions").iterdir() if p.suffix == ".manifest"]
    (gone,) = [p for p in names if p.name in ("2.manifest", f"{2**64 - 1 - 2:020}.manifest")]
    gone.unlink()  # version 2 cleaned up
    fresh = TableDefinitions(uri, {})
    assert fresh.at(2) is None
    assert want is not None and fresh.change(Span(2, 3))(end(2, None)) == want[0]
    assert not fresh.unchanged(Span(2, 3))


@pytest.mark.parametrize("on", [True, False])
def test_an_index_only_batch_is_committed_with_its_definition(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, on: bool
) -> None:
    """The sink's commit of a micro-batch with no events whose last version creates an
    index: BEGIN/END asked for that version with the definition (none with option
    tableDefinitions=false, which then writes nothing at all)."""
    from lance_cdf.cli import build_parser
    from lance_cdf.cli.publish_command import publish_settings
    from lance_cdf.spark.publish.runner import _sink_options
    from lance_cdf.spark.sink import kafka_sink
    from lance_cdf.spark.sink.sink_options import SinkOptions

    uri = table(tmp_path)
    ck = tmp_path / "ck"
    offsets(ck, 0, {"version": 1}, True)
    offsets(ck, 1, {"version": 2}, False)  # (1, 2]: the index, no events
    args = ["publish", "--table", uri, "--bootstrap-servers", "b", "--topic", "x"]
    args += ["--schema-registry", "http://r", "--checkpoint", str(ck)]
    settings = publish_settings(
        build_parser().parse_args([*args, *([] if on else ["--no-table-definitions"])])
    )
    # as Spark hands publish's options to the sink
    options = SinkOptions.parse(_sink_options(settings).to_options())
    asked: list[tuple[object, ...]] = []
    writer = kafka_sink.KafkaStreamWriter(options)
    monkeypatch.setattr(writer, "_transaction_writer", lambda o, n: "writer")
    monkeypatch.setattr(writer, "_write_markers", lambda *a: asked.append(a))
    writer.commit([kafka_sink.Published(0)], 1)
    if not on:
        assert asked == []
        return
    ((w, versions, change, upto),) = asked
    assert (w, versions, upto) == ("writer", [], 2)
    sent = change(None)
    assert sent is not None and [i.name for i in sent.indexes] == ["id_idx"]
    assert change(end(2, sent)) is None  # written already: nothing again
