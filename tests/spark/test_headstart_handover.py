"""Commits made while `lance-cdf publish` starts are published by its head start until the
query has started (spark/publish/headstart.py, spark/source/handover.py), and the hand-over
leaves no gap and no duplicate. The query's writer tasks are held where they would take
over (the test hook: none of them has written meanwhile), so what reaches Kafka then is
the head start's. Oracles: read_changes (each change once in the topic, per key in commit
order) and the change topic's own counts (one BEGIN and one END per version, counting its
records)."""

import os
import signal
import subprocess
import sys
import time
import uuid

import lance
import pyarrow as pa
import pytest
from confluent_kafka import Consumer, KafkaException, TopicPartition

from lance_cdf.spark.source.handover import HOLD_ENV
from tests.kafka.test_kafka_order import consume_by_key, expected_by_key
from tests.kafka.test_transactions import change_counts, check_transactions, transactions
from tests.replicate.test_whole_versions import new_topic
from tests.spark.test_headstart import _history

pytestmark = pytest.mark.integration  # `lance-cdf publish` in a subprocess

# (s) how long a publisher may take to reach its hand-over, or a version its END (Spark's
# start on a loaded machine included): a bound on waiting, not a measurement
REACH_S = 240
NAME = "shop.items"  # the records' namespace (--table-name)


def _ends(bootstrap, topic, registry_url):
    """The versions with an END on the transaction topic (none while the broker does not
    lead it: one frozen moments ago, see `_thaw`)."""
    try:
        txns = transactions(bootstrap, f"{topic}.transaction", registry_url)
    except KafkaException:
        return set()
    return {int(t["id"].rsplit(":", 1)[1]) for t in txns if t["status"] == "END"}


def _thaw(broker, topic):
    """The frozen broker let go on, and waited for until it leads the topics again: a
    single KRaft node frozen past its session timeout is fenced by its own controller and
    answers "not leader" / "unknown partition" until it has registered again (the next
    test in this worker gets a broker that answers)."""
    os.kill(broker.pid, signal.SIGCONT)
    time.sleep(3)  # (its controller's look at the sessions, which may fence it first)
    deadline = time.monotonic() + REACH_S
    probe = Consumer({"bootstrap.servers": broker.bootstrap_servers, "group.id": "thaw"})
    try:
        for name in (topic, f"{topic}.transaction"):
            while True:
                try:
                    meta = probe.list_topics(name, timeout=10).topics[name]
                    for p in meta.partitions:
                        probe.get_watermark_offsets(TopicPartition(name, p), timeout=10)
                    break
                except KafkaException:
                    assert time.monotonic() < deadline, f"the broker did not lead {name} again"
                    time.sleep(0.5)
    finally:
        probe.close()


def _wait_for(what, done, proc, log):
    deadline = time.monotonic() + REACH_S
    while not done():
        assert proc.poll() is None, log.read_text()[-3000:]
        assert time.monotonic() < deadline, (
            f"{what}: not within {REACH_S} s\n" + (log.read_text()[-3000:])
        )
        time.sleep(0.2)


def _commit(uri, rows):
    """Commits made while the publisher runs: an update and an append (new versions)."""
    ds = lance.dataset(uri)
    ds.update({"s": "'late'"}, where=f"id = {rows[0]}")
    lance.write_dataset(
        pa.table({"id": rows[1:], "s": ["new"] * len(rows[1:])}), uri, mode="append"
    )


def _publisher(tmp_path, bootstrap, database):
    """The table (versions 1-6), its topic, the records' namespace and publish's flags:
    one table's, or a database's holding that table."""
    if database:
        src, prefix = tmp_path / "db" / "src.lance", f"dbhandover{uuid.uuid4().hex[:6]}"
        topic = f"{prefix}.src"  # (made by the head start)
        source = ("--database", str(src.parent), "--topic-prefix", prefix)
        return str(src), topic, topic, source
    topic = new_topic(bootstrap, "handover")
    return (
        str(tmp_path / "src.lance"),
        topic,
        NAME,
        ("--table", str(tmp_path / "src.lance"), "--topic", topic, "--table-name", NAME),
    )


def _launch(tmp_path, bootstrap, registry, src, source, hold, *extra):
    """`lance-cdf publish` of table `src`'s versions 1-6 (made here, waiting at launch), its
    writer tasks held before their marks while `hold` exists: the process and its log."""
    _history(src)
    hold.touch()
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable, HOLD_ENV: f"handover:{hold}"}
    args = [
        *(sys.executable, "-m", "lance_cdf.cli", "publish", *source),
        *("--bootstrap-servers", bootstrap, "--schema-registry", registry),
        *("--checkpoint", str(tmp_path / "ck"), *extra),
        *("--starting-version", "1", "--key", "id", "--master", "local[2]"),
    ]
    log = tmp_path / "publish.log"
    with open(log, "w") as out:
        proc = subprocess.Popen(args, env=env, stdout=out, stderr=out, start_new_session=True)
    return proc, log


@pytest.mark.parametrize("database", [False, True], ids=["table", "database"])
def test_commits_made_while_spark_starts_are_published_by_the_head_start(
    tmp_path, kafka_broker, schema_registry, database
):
    bootstrap, registry = kafka_broker.bootstrap_servers, schema_registry.url
    src, topic, name, source = _publisher(tmp_path, bootstrap, database)
    hold, held = tmp_path / "hold", tmp_path / "hold.held"
    proc, log = _launch(tmp_path, bootstrap, registry, src, source, hold)

    def lines():  # the head start's lines so far
        return log.read_text().count("head start: ")

    try:
        # the versions waiting at launch: the head start's first round
        _wait_for("the head start's first round", lambda: lines() >= 1, proc, log)
        assert 6 in _ends(bootstrap, topic, registry)
        _commit(src, [2, 40, 41])  # versions 7 and 8, while Spark starts
        # the query's first micro-batch is planned: its writer tasks wait, none has written
        _wait_for("the query's writers", held.exists, proc, log)
        _commit(src, [5, 42])  # versions 9 and 10, after the query's first plan
        # published with their BEGIN/END before the query could write anything
        _wait_for("versions 7-10", lambda: 10 in _ends(bootstrap, topic, registry), proc, log)
        assert not (tmp_path / "ck" / "commits" / "0").exists()
        hold.unlink()  # the query's writers go on: they skip what the topic holds
        # the head start ends after the query's second micro-batch (9 and 10) and says
        # what it published after its first round
        _wait_for("the head start's end", lambda: lines() >= 2, proc, log)
        _commit(src, [8, 43])  # versions 11 and 12: the query's
        _wait_for("versions 11-12", lambda: 12 in _ends(bootstrap, topic, registry), proc, log)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(120) == 0, log.read_text()[-3000:]
    finally:
        hold.unlink(missing_ok=True)
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    text = log.read_text()
    if not database:
        for versions in ("1-6", "7-10"):
            assert f"of version(s) {versions} published with their transaction" in text, text
    _check_topic(bootstrap, registry, src, topic, name, 12)


def _check_topic(bootstrap, registry, src, topic, name, versions):
    """Each change once, per key in commit order; each of versions 1..`versions` has its
    BEGIN and END once, in version order, counting its records."""
    want = expected_by_key(src)
    count = sum(len(v) for v in want.values())
    got, _ = consume_by_key(bootstrap, topic, registry, count + 1)
    assert got == want
    txns = transactions(bootstrap, f"{topic}.transaction", registry)
    counts = change_counts(bootstrap, topic)
    assert sorted(counts) == list(range(1, versions + 1))
    check_transactions(txns, counts, name)


def _commit_like(hand_over):
    with hand_over.exclusive():
        pass


def test_the_hand_over_lets_one_writer_publish_at_a_time(tmp_path, monkeypatch):
    """The hand-over file's protocol: a head start's round holds the lock; a writer whose
    versions the head start has published goes on without taking over, and the query's
    commit waits for the round without taking over; a writer with a later version takes
    over, waiting for the round in progress, and no round starts after."""
    import threading

    from lance_cdf.spark.source import handover
    from lance_cdf.spark.source.handover import HandOver

    monkeypatch.delenv(handover.HOLD_ENV, raising=False)
    hand_over = HandOver(str(tmp_path / "handover"))
    open(hand_over.path, "w").close()
    with hand_over.turn() as mine:
        assert mine
        hand_over.published({"t": 5})
    hand_over.before_writing("t", 5)  # all published: no hand-over, rounds go on
    with hand_over.turn() as mine:
        assert mine
        # the query's commit waits for this round's BEGIN/END, and does not take over
        committing = threading.Thread(target=_commit_like, args=(hand_over,))
        committing.start()
        committing.join(0.5)
        assert committing.is_alive()
    committing.join(30)
    assert not committing.is_alive()
    with hand_over.turn() as mine:
        assert mine
        # a writer with version 6 waits for this round to end
        writer = threading.Thread(target=hand_over.before_writing, args=("t", 6))
        writer.start()
        writer.join(0.5)
        assert writer.is_alive()
        hand_over.published({"t": 6})
    writer.join(30)
    assert not writer.is_alive()
    with hand_over.turn() as mine:
        assert not mine  # taken over: no round after it
    hand_over.before_writing("u", 1)  # once taken over, nothing to wait for
    hand_over.remove()
    with hand_over.turn() as mine:
        assert not mine  # removed: the head start has ended
    hand_over.take()


def test_a_head_start_that_meets_an_outage_leaves_the_rest_to_the_query(
    tmp_path, kafka_broker, schema_registry
):
    """The broker frozen (SIGSTOP: requests go unanswered) for several flush timeouts while
    the head start publishes the commits made as Spark starts: the head start ends (a round
    holds the hand-over lock, so riding the outage out there would hold the query back)
    and the query, once the broker answers, publishes what it left: every change once,
    each version's BEGIN and END once."""
    bootstrap, registry = kafka_broker.bootstrap_servers, schema_registry.url
    src, topic, name, source = _publisher(tmp_path, bootstrap, False)
    hold, held = tmp_path / "hold", tmp_path / "hold.held"
    proc, log = _launch(tmp_path, bootstrap, registry, src, source, hold, "--flush-timeout", "2")
    frozen = False
    try:
        _wait_for(
            "the head start's first round", lambda: "head start: " in log.read_text(), proc, log
        )
        _wait_for("the query's writers", held.exists, proc, log)
        os.kill(kafka_broker.pid, signal.SIGSTOP)
        frozen = True
        _commit(src, [2, 40, 41])  # versions 7 and 8, for the head start to publish
        _wait_for("the head start's end", lambda: "head start ended" in log.read_text(), proc, log)
        _thaw(kafka_broker, topic)
        frozen = False
        hold.unlink()  # the query's writers go on and publish versions 7 and 8
        _wait_for("versions 7-8", lambda: 8 in _ends(bootstrap, topic, registry), proc, log)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(120) == 0, log.read_text()[-3000:]
    finally:
        if frozen:
            _thaw(kafka_broker, topic)
        hold.unlink(missing_ok=True)
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    _check_topic(bootstrap, registry, src, topic, name, 8)
