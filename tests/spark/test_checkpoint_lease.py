"""One publisher per checkpoint: a second `lance-cdf publish` on a checkpoint
another one holds is refused before it sends anything; once the holder is SIGKILLed, the
next one takes the checkpoint over at once and the topic stays exactly once."""

import os
import signal
import subprocess
import time
import uuid

import lance
import numpy as np
import pyarrow as pa
from confluent_kafka import Consumer, TopicPartition

from tests.support.publish_process import publish_args, start_cli


def _publish(uri, ck, topic, kafka_broker, schema_registry):
    extra = ("--starting-version", "1", "--trigger-interval", "200 milliseconds")
    args = publish_args(uri, kafka_broker.bootstrap_servers, topic, schema_registry.url, ck, *extra)
    return start_cli(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _records(bootstrap, topic) -> int:
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": uuid.uuid4().hex})
    try:
        parts = c.list_topics(topic, timeout=10).topics[topic].partitions
        return sum(c.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1] for p in parts)
    finally:
        c.close()


def _wait(predicate, what, timeout=180.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


def test_a_second_publisher_on_a_checkpoint_is_refused_and_a_dead_ones_taken_over(
    tmp_path, kafka_broker, schema_registry
):
    uri = str(tmp_path / "t.lance")
    lance.write_dataset(pa.table({"id": np.arange(50)}), uri, enable_stable_row_ids=True)
    ck, topic = tmp_path / "ck", f"lease-{uuid.uuid4().hex[:8]}"
    bootstrap = kafka_broker.bootstrap_servers
    first = _publish(uri, ck, topic, kafka_broker, schema_registry)
    second = third = None
    try:
        _wait(lambda: first.poll() is not None or (ck / "commits" / "0").exists(), "publish")
        assert first.poll() is None, first.stderr.read()[-3000:]
        _wait(lambda: _records(bootstrap, topic) == 50, "version 1's inserts")

        # a second publisher on the same checkpoint: refused, one line, nothing sent
        second = _publish(uri, ck, topic, kafka_broker, schema_registry)
        out, err = second.communicate(timeout=120)
        assert second.returncode != 0, (out, err[-3000:])
        assert "Traceback" not in err, err[-3000:]
        lines = [line for line in err.strip().splitlines() if line.strip()]
        assert len(lines) == 1 and "is being written by" in lines[0], err[-3000:]
        assert "lance-cdf publish to " + topic in lines[0] and str(first.pid) in lines[0]
        lance.dataset(uri).update({"id": "id + 100"}, where="id < 10")  # version 2
        _wait(lambda: _records(bootstrap, topic) == 60, "the holder to publish version 2")

        # the holder dies: the next publisher takes the checkpoint over at once
        os.killpg(first.pid, signal.SIGKILL)
        first.wait()
        lance.dataset(uri).delete("id >= 40 AND id < 50")  # version 3: 10 deletes (+10 tombstones)
        third = _publish(uri, ck, topic, kafka_broker, schema_registry)
        _wait(
            lambda: third.poll() is not None or _records(bootstrap, topic) >= 80,
            "the new holder to publish version 3",
        )
        assert third.poll() is None, third.stderr.read()[-3000:]
        time.sleep(2)  # (not a timing assert: a duplicate would show in the count below)
        assert _records(bootstrap, topic) == 80
    finally:
        for proc in (first, second, third):
            if proc is not None and proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
