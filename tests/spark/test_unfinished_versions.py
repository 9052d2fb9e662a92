"""Unit tests of what completes a version: the stop's wait for the running micro-batch
(spark/publish/query_progress.py), the replicator's account of versions it stopped
without their END (replicate/wholeversions.py, replicate/unfinished.py), and the head
start's line (spark/publish/headstart.py). Fakes stand in for Spark's query and Kafka's
records; the oracles are the sequences they are given."""

import time

import pytest

from lance_cdf.kafka.publisher import VERSION_HEADER
from lance_cdf.kafka.transactions import TransactionRecord
from lance_cdf.replicate import unfinished
from lance_cdf.replicate.unfinished import Unfinished
from lance_cdf.replicate.wholeversions import VersionGate
from lance_cdf.spark.publish import query_progress
from lance_cdf.spark.publish.headstart import HeadStart
from lance_cdf.spark.publish.query_progress import (
    clear_of_trigger,
    finish_micro_batch,
    interval_seconds,
)

pytestmark = pytest.mark.unit


class FakeQuery:
    """A query whose trigger is active for the first `busy` looks at its status."""

    def __init__(self, busy: int, ends_after: int | None = None):
        self.busy, self.looks, self.ends_after = busy, 0, ends_after

    @property
    def isActive(self):  # noqa: N802 (Spark's name)
        return self.ends_after is None or self.looks < self.ends_after

    @property
    def status(self):
        self.looks += 1
        return {"isTriggerActive": self.looks <= self.busy, "message": ""}


def test_interval_text_in_seconds():
    assert interval_seconds("500 milliseconds") == 0.5
    assert interval_seconds("2 seconds") == 2.0
    assert interval_seconds("1 second") == 1.0
    assert interval_seconds("1 minute") == 60.0
    assert interval_seconds("0 seconds") == 0.0
    assert interval_seconds(None) is None
    assert interval_seconds("soon") is None
    assert interval_seconds("5 fortnights") is None


def test_a_stop_keeps_clear_of_the_next_trigger():
    # triggers at multiples of the interval since the epoch
    assert clear_of_trigger(1000.0, 1.0)  # one just fired: a whole interval to go
    assert not clear_of_trigger(1000.95, 1.0)  # 50 ms before the next
    assert clear_of_trigger(1000.5, 1.0)
    assert not clear_of_trigger(1000.19, 0.2)  # a quarter of a short interval
    assert clear_of_trigger(1000.99, None)  # no interval (available-now): any time
    assert clear_of_trigger(1000.99, 0.0)


def test_the_stop_waits_for_the_running_micro_batch(monkeypatch):
    monkeypatch.setattr(query_progress, "STOP_LOOK_S", 0.001)
    query = FakeQuery(busy=5)
    assert finish_micro_batch(query, 10.0, None)
    assert query.looks == 6  # stopped at the first look between micro-batches


def test_the_stop_gives_up_after_its_limit(monkeypatch):
    monkeypatch.setattr(query_progress, "STOP_LOOK_S", 0.001)
    query = FakeQuery(busy=10**9)
    t = time.monotonic()
    assert not finish_micro_batch(query, 0.05, None)
    assert time.monotonic() - t >= 0.05


def test_a_query_that_ends_meanwhile_needs_no_wait(monkeypatch):
    monkeypatch.setattr(query_progress, "STOP_LOOK_S", 0.001)
    assert finish_micro_batch(FakeQuery(busy=10**9, ends_after=3), 10.0, None)


class Msg:
    def __init__(self, partition, offset, version):
        self._p, self._o, self._v = partition, offset, version

    def partition(self):
        return self._p

    def offset(self):
        return self._o

    def headers(self):
        return [(VERSION_HEADER, str(self._v).encode())]


def _gate():
    gate = VersionGate.__new__(VersionGate)  # no consumer: the records are given
    gate.topic, gate.transaction_topic = "t", "t.transaction"
    gate.version, gate.transaction_offset = 0, 0
    gate.base, gate.applied, gate.pending, gate.ends = {}, {}, {}, []
    gate._poll_transactions = lambda: None
    return gate


def test_the_gate_names_the_versions_without_their_end():
    gate = _gate()
    assert gate.without_end() is None
    # partition 0: versions 1, 1, 2, 3; partition 1: versions 2, 4
    gate.add([Msg(0, 0, 1), Msg(0, 1, 1), Msg(0, 2, 2), Msg(0, 3, 3)])
    gate.add([Msg(1, 0, 2), Msg(1, 1, 4)])
    assert gate.without_end() == (6, 1, 4)
    gate.ends = [(TransactionRecord("END", "x:2", 2, 3, {0: (1, 1), 1: (1, 1)}), 5)]
    assert gate.without_end() == (2, 3, 4)  # versions 1-2 have their END (read)
    gate.ends = [(TransactionRecord("END", "x:4", 4, 1, {1: (1, 1)}), 9)]
    assert gate.without_end() is None


def test_unfinished_versions_are_kept_for_status_until_the_replica_is_past_them(tmp_path):
    target = str(tmp_path / "replica.lance")
    found = Unfinished(37, 1, 53, "orders", "orders.transaction", 1_800_000_000.0)
    line = found.line()
    assert "37 record(s) of source version(s) 1-53" in line
    assert "lance-cdf publish" in line and "\n" not in line
    unfinished.record(target, found)
    assert unfinished.read(target, None) == found
    assert unfinished.read(target, 52) == found
    assert unfinished.read(target, 53) is None  # the replica got past them since
    assert "run `lance-cdf publish`" in unfinished.describe(found)
    unfinished.record(target, None)  # a later stop holding none
    assert unfinished.read(target, None) is None
    assert unfinished.state_path("s3://bucket/replica") is None
    unfinished.record("s3://bucket/replica", found)  # (object storage: not kept)


def test_the_head_start_line_says_its_versions_are_complete():
    assert "published with their transaction metadata" in str(HeadStart(10, 1, 53, 0.5))
    assert "transaction metadata" not in str(HeadStart(10, 1, 53, 0.5, completed=False))


def test_the_hold_hook_waits_only_for_its_stage(tmp_path, monkeypatch):
    import threading

    from lance_cdf.spark.source import handover

    path = tmp_path / "hold"
    path.touch()
    monkeypatch.delenv(handover.HOLD_ENV, raising=False)
    handover.hold("commit")  # unset: no effect
    monkeypatch.setenv(handover.HOLD_ENV, f"write:{path}")
    handover.hold("commit")  # another stage: no effect
    assert not (tmp_path / "hold.held").exists()
    waiting = threading.Thread(target=handover.hold, args=("write",))
    waiting.start()
    waiting.join(0.3)
    assert waiting.is_alive() and (tmp_path / "hold.held").exists()
    path.unlink()
    waiting.join(10)
    assert not waiting.is_alive()
