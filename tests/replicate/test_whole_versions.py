"""A replica that is the source at one version after every commit: the
replicator reads the transaction topic and applies whole commit versions only.

The oracle is the source table itself: every replica commit that records a source version
`v` (`lance-cdf.source-version`) must equal the source table at `v`, all columns, row by
row (the replica's `_source_rowid` against the source's `_rowid`)."""

import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
import uuid

import lance
import pytest
from confluent_kafka.admin import AdminClient, NewTopic

from lance_cdf.cli import main
from lance_cdf.replicate.replica import (
    INSIDE_VERSION_PROPERTY,
    RECORDS_THROUGH_PROPERTY,
    SOURCE_VERSION_PROPERTY,
)
from lance_cdf.replicate.replicator import Replicator
from tests.support.oracle import table_state
from tests.support.publish_process import publish_args, start_cli
from tests.support.workload import Workload

pytestmark = pytest.mark.integration  # `lance-cdf publish` / `replicate` in subprocesses

PARTITIONS = 3
OPS = ["append", "update", "delete_sparse", "upsert", "upsert_delete_missing"]


def replica_commits(dst):
    """(replica version, its transaction properties) of every commit that recorded a
    Kafka position."""
    ds = lance.dataset(dst)
    out = []
    for v in sorted(x["version"] for x in ds.versions()):
        try:
            tx = ds.read_transaction(v)
        except TypeError:  # pylance 14: a compaction of an indexed table (see replica.py)
            continue
        props = (tx.transaction_properties or {}) if tx is not None else {}
        if "lance-cdf.offsets" in props:
            out.append((v, dict(props)))
    return out


def replica_state(dst, version):
    rows = lance.dataset(dst, version=version).to_table().to_pylist()
    keys = [r["_source_rowid"] for r in rows]
    assert len(keys) == len(set(keys)), f"replica version {version}: duplicate keys"
    return {r.pop("_source_rowid"): r for r in rows}


def check_every_commit(src, dst):
    """Each replica commit with a source version equals the source there; the number of
    commits checked."""
    checked = 0
    for version, props in replica_commits(dst):
        if INSIDE_VERSION_PROPERTY in props or SOURCE_VERSION_PROPERTY not in props:
            continue
        held = int(props[SOURCE_VERSION_PROPERTY])
        want = table_state(src, held)
        got = replica_state(dst, version)
        assert got.keys() == want.keys(), (version, held)
        diff = [k for k in want if {c: got[k].get(c) for c in want[k]} != want[k]]
        assert not diff, (version, held, diff[:3])
        checked += 1
    return checked


def new_topic(bootstrap, prefix, replication=1):
    topic = f"{prefix}-{uuid.uuid4().hex[:8]}"
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(topic, PARTITIONS, replication)])[topic].result(30)
    return topic


def status(src, dst):
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "lance_cdf.cli",
            "status",
            "--json",
            "--table",
            src,
            "--replica",
            dst,
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    text = subprocess.run(
        [sys.executable, "-m", "lance_cdf.cli", "status", "--table", src, "--replica", dst],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return json.loads(out.stdout), text


def test_every_replica_commit_is_the_source_at_its_version_under_kills(
    tmp_path, kafka_broker, schema_registry
):
    replicate_killed_and_check(tmp_path, kafka_broker, schema_registry)


def replicate_killed_and_check(tmp_path, kafka, schema_registry, replication=1, kills_at_least=5):
    """`lance-cdf publish` (continuous) into a new topic of `kafka` (replication factor
    `replication`) while a writer commits, and `lance-cdf replicate` SIGKILLed
    `kills_at_least` times while replicating; then both run to the end undisturbed, and
    every replica commit with a source version must equal the source at it."""
    src, dst = str(tmp_path / "src.lance"), str(tmp_path / "replica.lance")
    w = Workload(src, seed=32, rows=200)
    bootstrap = kafka.bootstrap_servers
    topic = new_topic(bootstrap, "whole", replication)
    publish = publish_args(
        src, bootstrap, topic, schema_registry.url, tmp_path / "ck", "--starting-version", "1"
    )
    replicate = [
        sys.executable,
        "-m",
        "lance_cdf.cli",
        "replicate",
        "--bootstrap-servers",
        bootstrap,
        "--topic",
        topic,
        "--schema-registry",
        schema_registry.url,
        "--target",
        dst,
        "--max-batch-rows",
        "120",
        "--max-batch-interval",
        "0.3",
        "--compact-every",
        "7",
        "--group-id",
        f"g-{topic}",
        # (no group settings: a killed replicator's replacement takes its partitions over
        # at once as the same static member, by default)
    ]
    stop = threading.Event()
    rng = random.Random(3)

    def writer():
        for _ in range(300):
            if stop.is_set():
                return
            w.step(rng.choice(OPS))
            time.sleep(0.3)

    pub = start_cli(
        [*publish, "--trigger-interval", "0 seconds", "--master", "local[2]"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    commits = threading.Thread(target=writer, daemon=True)
    commits.start()
    kills, rep, log = 0, None, open(tmp_path / "replicate.log", "wb")
    try:
        deadline = time.monotonic() + 300
        while kills < kills_at_least and time.monotonic() < deadline:
            if rep is None or rep.poll() is not None:
                rep = subprocess.Popen(replicate, stdout=subprocess.DEVNULL, stderr=log)
            time.sleep(rng.uniform(3, 8))  # a replicator starts in ~2-4 s here
            if rep.poll() is None:
                rep.send_signal(signal.SIGKILL)
                rep.wait(30)
                kills += os.path.exists(dst)  # killed while replicating, not at start-up
    finally:
        stop.set()
        commits.join(60)
        if rep is not None and rep.poll() is None:
            rep.send_signal(signal.SIGKILL)
            rep.wait(30)
        os.killpg(pub.pid, signal.SIGTERM)
        pub.wait(60)
    assert kills >= kills_at_least
    # the rest published, then replicated undisturbed
    assert main([*publish, "--available-now"]) == 0
    run = subprocess.run([*replicate, "--idle-timeout", "8"], capture_output=True, timeout=300)
    assert run.returncode == 0, run.stderr.decode()[-3000:]
    assert check_every_commit(src, dst) >= 10
    # the last commit holds the newest source version with rows changed
    report, text = status(src, dst)
    last = report["replica_version"]
    assert table_state(src, last) == table_state(src, lance.dataset(src).version)
    assert report["replica_inside_version"] is None
    assert f"equals the source at version {last}" in text


def test_a_version_over_the_bound_is_applied_in_pieces_and_status_says_so(
    tmp_path, kafka_broker, schema_registry
):
    src, dst = str(tmp_path / "src.lance"), str(tmp_path / "replica.lance")
    w = Workload(src, seed=5, rows=40)  # version 1: 40 rows
    for _ in range(3):
        w.step("append")  # 1-150 rows each
    bootstrap = kafka_broker.bootstrap_servers
    topic = new_topic(bootstrap, "pieces")
    once = ("--starting-version", "1", "--available-now", "--master", "local[2]")
    args = publish_args(src, bootstrap, topic, schema_registry.url, tmp_path / "ck", *once)
    assert main(args) == 0
    rep = Replicator(
        bootstrap,
        topic,
        schema_registry.url,
        dst,
        group_id=f"g-{topic}",
        max_batch_rows=15,
        max_batch_interval=0.3,
        max_pending_records=20,
    )
    _ends_first(rep)
    run_until_caught_up(rep, lance.dataset(src).version, dst)
    commits = replica_commits(dst)
    pieces = [p for _, p in commits if INSIDE_VERSION_PROPERTY in p]
    assert pieces, "no version was applied in pieces"
    for p in pieces:  # a piece never claims the version it is inside of
        held = int(p.get(SOURCE_VERSION_PROPERTY, 0))
        assert held < int(p[INSIDE_VERSION_PROPERTY])
    assert check_every_commit(src, dst) >= 1
    report, text = status(src, dst)
    assert report["replica_version"] == lance.dataset(src).version
    assert report["replica_inside_version"] is None
    # stopped inside a version: status says so
    w.step("append")
    w.step("append")
    rep = Replicator(
        bootstrap,
        topic,
        schema_registry.url,
        dst,
        group_id=f"g-{topic}",
        max_batch_rows=15,
        max_batch_interval=0.3,
        max_pending_records=20,
    )
    once = ("--available-now", "--master", "local[2]")
    args = publish_args(src, bootstrap, topic, schema_registry.url, tmp_path / "ck", *once)
    assert main(args) == 0
    _ends_first(rep)
    rep.take = _stop_after_first_piece(rep)
    rep.run(idle_timeout=30)  # (stopped by its first piece)
    report, text = status(src, dst)
    assert report["replica_inside_version"] is not None
    assert "plus part of version" in text
    assert check_every_commit(src, dst) >= 1


def run_until_caught_up(rep, version, dst, within=180.0):
    """Run `rep` until its replica records source version `version` (not a fixed idle
    time: on a loaded machine the transaction topic's END records may come seconds after
    the change records), then stop it; the run's error, if any, is raised."""
    failed = []

    def run():
        try:
            rep.run()
        except BaseException as exc:  # noqa: BLE001 (raised again below)
            failed.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    deadline = time.monotonic() + within
    while thread.is_alive() and time.monotonic() < deadline:
        try:
            commits = replica_commits(dst)
        except (OSError, ValueError):  # (no replica yet: created with the first batch)
            commits = []
        held = {
            int(p.get(SOURCE_VERSION_PROPERTY, 0))
            for _, p in commits
            if INSIDE_VERSION_PROPERTY not in p
        }
        if version in held:
            break
        time.sleep(0.5)
    rep.stop()
    thread.join(60)
    assert not thread.is_alive(), "the replicator did not stop"
    if failed:
        raise failed[0]


def _ends_first(rep):
    """The gate reads every END already written before it takes any record. A piece is
    only cut while a version's records are partly polled and every END has been read; a
    transaction-topic fetch that came after all of a version's records (a loaded machine)
    left that version to be applied whole, and no piece was ever cut."""
    start_mode = rep._start_mode

    def wrapped():
        mode = start_mode()
        deadline = time.monotonic() + 60
        while mode == "versions" and not rep._gate._caught_up():
            assert time.monotonic() < deadline, "the transaction topic was not read"
            rep._gate._poll_transactions()
        return mode

    rep._start_mode = wrapped


def _stop_after_first_piece(rep):
    take = rep.take

    def wrapped(msgs, *rest):
        take(msgs, *rest)
        position = rep.replica.position()
        if INSIDE_VERSION_PROPERTY in position:
            rep.stop()

    return wrapped


def test_without_a_transaction_topic_no_source_version_is_recorded(
    tmp_path, kafka_broker, schema_registry
):
    src, dst = str(tmp_path / "src.lance"), str(tmp_path / "replica.lance")
    Workload(src, seed=9, rows=30).step("update")
    bootstrap = kafka_broker.bootstrap_servers
    topic = new_topic(bootstrap, "notxn")
    once = ("--starting-version", "1", "--available-now", "--master", "local[2]")
    args = publish_args(src, bootstrap, topic, schema_registry.url, tmp_path / "ck", *once)
    assert main([*args, "--no-transaction-metadata"]) == 0
    rep = Replicator(
        bootstrap, topic, schema_registry.url, dst, group_id=f"g-{topic}", max_batch_interval=0.3
    )
    rep.run(idle_timeout=3)
    position = rep.replica.position()
    assert SOURCE_VERSION_PROPERTY not in position
    assert position[RECORDS_THROUGH_PROPERTY] == "2"
    report, text = status(src, dst)
    assert report["replica_version"] is None
    assert "no transaction metadata" in text
