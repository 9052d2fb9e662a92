"""Commits made while `lance-cdf publish` starts are published by its head start until the
query takes over (spark/publish/headstart.py, spark/source/handover.py), and the hand-over
leaves no gap and no duplicate. The query is held at its hand-over (the test hook: no
writer task of it can write meanwhile), so what reaches Kafka then is the head start's.
Oracles: read_changes (each change once in the topic, per key in commit order) and the
change topic's own counts (one BEGIN and one END per version, counting its records)."""

import os
import signal
import subprocess
import sys
import time

import lance
import pyarrow as pa
import pytest
from test_headstart import _history
from test_kafka_order import consume_by_key, expected_by_key
from test_transactions import change_counts, check_transactions, transactions
from test_whole_versions import new_topic

from lance_cdf.spark.sink.kafka_sink import HOLD_ENV

pytestmark = pytest.mark.integration  # `lance-cdf publish` in a subprocess

# (s) how long a publisher may take to reach its hand-over, or a version its END (Spark's
# start on a loaded machine included): a bound on waiting, not a measurement
REACH_S = 240
NAME = "shop.items"  # the records' namespace (--table-name)


def _ends(bootstrap, topic, registry_url):
    """The versions with an END on the transaction topic."""
    txns = transactions(bootstrap, f"{topic}.transaction", registry_url)
    return {int(t["id"].rsplit(":", 1)[1]) for t in txns if t["status"] == "END"}


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


def test_commits_made_while_spark_starts_are_published_by_the_head_start(
    tmp_path, kafka_broker, schema_registry
):
    src = str(tmp_path / "src.lance")
    _history(src)  # versions 1-6, waiting at launch
    bootstrap, registry = kafka_broker.bootstrap_servers, schema_registry.url
    topic = new_topic(bootstrap, "handover")
    hold, held = tmp_path / "hold", tmp_path / "hold.held"
    hold.touch()  # the query waits at its hand-over while this exists
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable, HOLD_ENV: f"handover:{hold}"}
    args = [
        *(sys.executable, "-m", "lance_cdf.cli", "publish", "--table", src),
        *("--bootstrap-servers", bootstrap, "--topic", topic, "--table-name", NAME),
        *("--schema-registry", registry, "--checkpoint", str(tmp_path / "ck")),
        *("--starting-version", "1", "--key", "id", "--master", "local[2]"),
    ]
    log = tmp_path / "publish.log"
    with open(log, "w") as out:
        proc = subprocess.Popen(args, env=env, stdout=out, stderr=out, start_new_session=True)
    try:
        # the versions waiting at launch: the head start's first round
        _wait_for("versions 1-6", lambda: 6 in _ends(bootstrap, topic, registry), proc, log)
        _commit(src, [2, 40, 41])  # versions 7 and 8, while Spark starts
        _wait_for("the hand-over", held.exists, proc, log)  # no writer task has written
        _commit(src, [5, 42])  # versions 9 and 10, the query held at its hand-over
        # published with their BEGIN/END before the query could write anything
        _wait_for("versions 7-10", lambda: 10 in _ends(bootstrap, topic, registry), proc, log)
        assert not (tmp_path / "ck" / "commits" / "0").exists()
        hold.unlink()  # the query takes over: its first writer tasks skip what is there
        # the head start says what it published once it has ended
        _wait_for("the head start's end", lambda: "head start: " in log.read_text(), proc, log)
        _commit(src, [8, 43])  # versions 11 and 12: the query's
        _wait_for("versions 11-12", lambda: 12 in _ends(bootstrap, topic, registry), proc, log)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(120) == 0, log.read_text()[-3000:]
    finally:
        hold.unlink(missing_ok=True)
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    text = log.read_text()
    assert "head start: " in text and "of version(s) 1-10 published" in text, text[-3000:]
    # each change once, per key in commit order; each version's BEGIN and END once, in
    # version order, counting its records
    want = expected_by_key(src)
    count = sum(len(v) for v in want.values())
    got, _ = consume_by_key(bootstrap, topic, registry, count + 1)
    assert got == want
    txns = transactions(bootstrap, f"{topic}.transaction", registry)
    counts = change_counts(bootstrap, topic)
    assert sorted(counts) == list(range(1, 13))
    check_transactions(txns, counts, NAME)
