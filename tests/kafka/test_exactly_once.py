"""Exactly once into Kafka: `lance-cdf publish` killed at random points (its Python
workers, i.e. executor-side writers and readers, and the whole process group: driver, JVM
and workers) and the broker restarted, while commits keep coming; a read_committed
consumer then finds every change once, in per-key order (read_changes is the oracle)."""

import os
import random
import signal
import subprocess
import threading
import time
import uuid

import lance
import numpy as np
import pyarrow as pa
import pytest
from confluent_kafka.admin import AdminClient, NewTopic

from lance_cdf.cli import main
from tests.kafka.test_kafka_order import consume_by_key, expected_by_key
from tests.support.publish_process import CLI, cli_env, publish_args

pytestmark = pytest.mark.integration  # `lance-cdf publish` (Spark) in subprocesses

PARTITIONS = 4


def _children(pid):
    out = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                continue
            if ppid == pid:
                out.append(int(entry))
    return out


def python_workers(root):
    """Spark's Python workers under `root` (children of a pyspark daemon process: Spark's
    own, or lance_cdf.spark.sink.warm_daemon that publish's writer tasks fork from)."""
    todo, workers = [root], []
    while todo:
        pid = todo.pop()
        for child in _children(pid):
            todo.append(child)
            try:
                with open(f"/proc/{pid}/cmdline", "rb") as f:
                    parent_cmd = f.read()
            except OSError:
                continue
            if b"pyspark.daemon" in parent_cmd or b"lance_cdf.spark.sink.warm_daemon" in parent_cmd:
                workers.append(child)
    return workers


def writer(uri, stop, commits=60):
    """Commits that move user keys between row IDs, until stopped (at most `commits`)."""
    rng = random.Random(7)
    for _ in range(commits):
        if stop.is_set():
            return
        ds = lance.dataset(uri)
        ids = rng.sample(range(200), 5)
        kind = rng.random()
        if kind < 0.4:
            ds.update({"s": f"'u{ds.version}'"}, where=f"id IN {tuple(ids)}")
        elif kind < 0.7:
            ds.delete(f"id IN {tuple(ids)}")
            lance.write_dataset(
                pa.table({"id": ids, "s": [f"b{ds.version}"] * 5}), uri, mode="append"
            )
        else:
            src = pa.table({"id": ids, "s": [f"m{ds.version}"] * 5})
            ds.merge_insert("id").when_matched_update_all().when_not_matched_insert_all().execute(
                src
            )
        time.sleep(0.5)


def killable_publish(args):
    """`lance-cdf publish ARGS` as a command to kill: a trigger that never waits, and a
    local master that retries a failed task (local[N,F])."""
    return [*CLI, *args, "--trigger-interval", "0 seconds", "--master", "local[2,100]"]


def publish_under_kills(
    cmd,
    env,
    uri,
    rng,
    kills_total,
    group_most,
    group_p,
    pause,
    commits=60,
    restart_at=None,
    restart=None,
):
    """Run `cmd` (a `lance-cdf publish`) while `writer` commits to `uri`, SIGKILLing, at
    random pauses of `pause` (min, max) seconds, its whole process group (at most
    `group_most` times, with probability `group_p`) or one of its Python workers, restarting
    it after each group kill, until `kills_total` kills; `restart()` (a broker restart) once
    `restart_at` kills are done. Returns the kills by kind; the publisher is dead after."""
    stop = threading.Event()
    thread = threading.Thread(target=writer, args=(uri, stop, commits), daemon=True)
    thread.start()
    proc = None
    kills = {"worker": 0, "group": 0}
    try:
        while sum(kills.values()) < kills_total:
            if proc is None or proc.poll() is not None:
                proc = subprocess.Popen(
                    cmd,
                    env=env,
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                    start_new_session=True,
                )
            time.sleep(rng.uniform(*pause))
            if restart is not None and sum(kills.values()) == restart_at:
                restart()  # same ports and data; producers reconnect
            workers = python_workers(proc.pid)
            if kills["group"] < group_most and (rng.random() < group_p or not workers):
                os.killpg(proc.pid, signal.SIGKILL)  # driver, JVM and workers at once
                proc.wait(30)
                kills["group"] += 1
            elif workers:
                os.kill(rng.choice(workers), signal.SIGKILL)  # one task or runner
                kills["worker"] += 1
    finally:
        stop.set()
        thread.join(60)
        if proc is not None and proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(30)
    return kills


def test_killed_publisher_and_restarted_broker_deliver_each_change_once(
    tmp_path, kafka_broker, schema_registry
):
    publish_killed_and_check(
        tmp_path,
        kafka_broker,
        schema_registry,
        replication=1,
        kills_total=12,
        fault_at=6,
        fault=lambda topic: kafka_broker.restart(),
    )


def publish_killed_and_check(
    tmp_path, kafka, registry, replication, kills_total, fault_at, fault, after=None
):
    """`lance-cdf publish` into a new topic of `kafka` (replication factor `replication`)
    while `writer` commits, killed `kills_total` times (`publish_under_kills`, `fault(topic)`
    or `fault()` once `fault_at` kills are done, then `after()`); then a run to the end
    from the checkpoint, and a read_committed consumer must find every change once, per key
    in commit order (read_changes is the oracle)."""
    uri = str(tmp_path / "t.lance")
    lance.write_dataset(
        pa.table({"id": np.arange(200), "s": ["a"] * 200}),
        uri,
        enable_stable_row_ids=True,
        max_rows_per_file=50,
    )
    topic = f"eo-{uuid.uuid4().hex[:8]}"
    admin = AdminClient({"bootstrap.servers": kafka.bootstrap_servers})
    admin.create_topics([NewTopic(topic, PARTITIONS, replication)])[topic].result(30)
    args = publish_args(
        uri,
        kafka.bootstrap_servers,
        topic,
        registry.url,
        tmp_path / "ck",
        "--starting-version",
        "1",
        "--key",
        "id",
        "--max-rows-per-trigger",
        "60",
    )
    kills = publish_under_kills(
        killable_publish(args),
        cli_env(),
        uri,
        random.Random(20),
        kills_total=kills_total,
        group_most=3,
        group_p=0.25,
        pause=(1, 5),
        restart_at=fault_at,
        restart=lambda: fault(topic),
    )
    assert kills["group"] >= 1 and kills["worker"] >= kills_total // 2
    if after is not None:
        after(topic)
    assert main([*args, "--available-now"]) == 0  # the rest, from the checkpoint
    want = expected_by_key(uri)
    count = sum(len(v) for v in want.values())
    got, _ = consume_by_key(
        kafka.bootstrap_servers,
        topic,
        registry.url,
        count + 1,
        isolation="read_committed",
    )
    assert got == want  # every change once, per key in commit order
