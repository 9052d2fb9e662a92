"""The replicator on a real broker and registry: the replica equals the source.

The oracle is the source table itself: after every round, the replica's rows
(keyed by `_source_rowid`, or by the user key) equal the source's rows at its
latest version on every source column, with no duplicate keys.
"""

import contextlib
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
import pyarrow as pa
import pytest
from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition

import lance_cdf
from lance_cdf.core.feed import ChangeFeed
from lance_cdf.errors import RegistryUnavailableError, ReplicateError
from lance_cdf.kafka.publisher import KafkaChangePublisher, user_schema_of
from lance_cdf.replicate.replica import CRASH_ENV, OFFSETS_PROPERTY, SOURCE_ROWID, ReplicaTable
from lance_cdf.replicate.replicator import Replicator
from tests.support.workload import Workload

pytestmark = pytest.mark.integration  # `lance-cdf replicate` in subprocesses
# the commits of the replica's upkeep (a compaction reserves its fragment IDs first)
UPKEEP_OPERATIONS = ("Rewrite", "ReserveFragments", "CreateIndex", "UpdateConfig")

# ops the replica can follow (index/config commits change no rows, so they are in too)
ROUND_OPS = [
    "append",
    "delete_sparse",
    "delete_dense",
    "update",
    "upsert",
    "upsert_delete_missing",
    "compact",
    "index",
    "config",
    "add_column",
    "overwrite",
    "restore",
]


def publish(kafka, registry, uri, topic, start, end=None, key=None):
    """Publish versions start..end with the same publisher the Spark sink uses."""
    feed = ChangeFeed(uri)
    start, end = feed.resolve_range(start, end)
    events = lance_cdf.read_changes(uri, start, end).read_all()
    ops = {v: feed.table.manifest(v).operation for v in range(start, end + 1)}
    pub = KafkaChangePublisher(
        kafka.bootstrap_servers,
        topic,
        registry.url,
        user_schema_of(events.schema),
        uri,
        key_columns=key,
    )
    pub.publish(events, ops)
    return end


def source_rows(uri, key=None):
    table = lance.dataset(uri).to_table(with_row_id=True)
    rows = table.to_pylist()
    k = key or "_rowid"
    return {r[k]: {c: r[c] for c in table.column_names if c != "_rowid"} for r in rows}


def assert_replica_equals_source(source_uri, replica_uri, key=None):
    source = source_rows(source_uri, key)
    replica = lance.dataset(replica_uri).to_table().to_pylist()
    k = key or SOURCE_ROWID
    keys = [r[k] for r in replica]
    assert len(keys) == len(set(keys)), "duplicate keys in the replica"
    got = {r[k]: {c: r.get(c) for c in next(iter(source.values()), {})} for r in replica}
    assert got.keys() == source.keys()
    diff = [x for x in source if got[x] != source[x]]
    assert not diff, (diff[:3], [source[x] for x in diff[:3]], [got[x] for x in diff[:3]])


def run_to_the_end_and_compare(cmd, src, dst):
    """A last, undisturbed replicator run; then the replica must equal the source."""
    run = subprocess.run(cmd, capture_output=True, timeout=300)
    assert run.returncode == 0, run.stderr.decode()[-2000:]
    assert_replica_equals_source(src, dst)


def make_replicator(kafka, registry, topic, target, **kw):
    kw.setdefault("max_batch_interval", 0.5)
    return Replicator(
        kafka.bootstrap_servers, topic, registry.url, target, group_id=f"g-{topic}", **kw
    )


def test_random_rounds_replica_equals_source(tmp_path, kafka_broker, schema_registry):
    src, dst = str(tmp_path / "src.lance"), str(tmp_path / "replica.lance")
    topic = f"rep-{uuid.uuid4().hex[:8]}"
    w = Workload(src, seed=11, rows=200)
    published = publish(kafka_broker, schema_registry, src, topic, 1)
    rng = random.Random(5)
    for round_ in range(6):
        for _ in range(3):
            w.step(rng.choice(ROUND_OPS))
        published = publish(kafka_broker, schema_registry, src, topic, published + 1)
        # small batches: a round spans several Lance commits on the replica
        rep = make_replicator(kafka_broker, schema_registry, topic, dst, max_batch_rows=150)
        counters = rep.run(idle_timeout=2)
        assert counters.batches >= 1
        assert_replica_equals_source(src, dst)
        # the newest data commit carries the position (the upkeep's compaction and index
        # commits, which may follow any batch, carry none)
        ds, table = lance.dataset(dst), ChangeFeed(dst).table
        version = ds.version
        while table.manifest(version).operation in UPKEEP_OPERATIONS:
            version -= 1
        assert OFFSETS_PROPERTY in ds.read_transaction(version).transaction_properties, round_
    # the replica keeps the vector type and has stable row IDs of its own
    ds = lance.dataset(dst)
    assert ds.schema.field("vec").type == pa.list_(pa.field("item", pa.float32()), 4)
    assert lance_cdf.read_changes(dst, 1, 1).read_all().num_rows > 0


def test_inserts_without_lookup_follow_restore_overwrite_and_replays(
    tmp_path, kafka_broker, schema_registry
):
    """Source inserts are written without a key lookup (a new source row ID cannot be in
    the replica); rows that come back under their old row ID (restore after a delete),
    overwrites, deletes and re-inserts in one batch or across batches, and a re-published
    range (duplicates above the replica's offsets) must still leave the replica equal to
    the source, the source snapshot being the oracle after every round."""
    src, dst = str(tmp_path / "src.lance"), str(tmp_path / "replica.lance")
    topic = f"rep-fresh-{uuid.uuid4().hex[:8]}"
    w = Workload(src, seed=31, rows=150)
    published = publish(kafka_broker, schema_registry, src, topic, 1)
    rng = random.Random(17)
    ops = [
        "append",
        "delete_dense",
        "delete_sparse",
        "restore",
        "restore",
        "overwrite",
        "update",
        "upsert",
        "upsert_delete_missing",
        "compact",
    ]
    fresh = 0
    for _round in range(6):
        for _ in range(4):
            w.step(rng.choice(ops))
        published = publish(kafka_broker, schema_registry, src, topic, published + 1)
        # batch sizes vary: a delete and its re-insert land in one batch or in two
        rep = make_replicator(
            kafka_broker, schema_registry, topic, dst, max_batch_rows=rng.choice([25, 90, 1000])
        )
        counters = rep.run(idle_timeout=2)
        fresh += counters.fresh_upserts
        assert_replica_equals_source(src, dst)
    assert fresh > 0  # the lookup-free path was taken
    assert any(op == "restore" for _, op in w.log)
    # the whole history published again: every insert is now at or below the version the
    # replica recorded, so each one is looked up (and replaces, never duplicates)
    publish(kafka_broker, schema_registry, src, topic, 1, published)
    again = make_replicator(kafka_broker, schema_registry, topic, dst).run(idle_timeout=2)
    assert again.upserts > 0 and again.fresh_upserts == 0
    assert_replica_equals_source(src, dst)


def test_replica_seeded_by_hand_is_always_looked_up(tmp_path, kafka_broker, schema_registry):
    """A replica the replicator did not create may hold any row: its inserts are looked up."""
    src, dst = str(tmp_path / "src.lance"), str(tmp_path / "replica.lance")
    topic = f"rep-seeded-{uuid.uuid4().hex[:8]}"
    Workload(src, seed=5, rows=80).step("append")
    seed = lance.dataset(src).to_table(with_row_id=True)
    seed = seed.append_column(SOURCE_ROWID, seed["_rowid"].cast(pa.int64())).drop(["_rowid"])
    lance.write_dataset(seed, dst, enable_stable_row_ids=True)  # holds every row already
    publish(kafka_broker, schema_registry, src, topic, 1)
    counters = make_replicator(kafka_broker, schema_registry, topic, dst).run(idle_timeout=2)
    assert counters.upserts == seed.num_rows and counters.fresh_upserts == 0
    assert_replica_equals_source(src, dst)


def test_user_key_and_restart_skips_applied(tmp_path, kafka_broker, schema_registry):
    src, dst = str(tmp_path / "src.lance"), str(tmp_path / "replica.lance")
    topic = f"rep-key-{uuid.uuid4().hex[:8]}"
    w = Workload(src, seed=3, rows=120)
    for op in ("update", "upsert", "delete_sparse", "append", "upsert"):
        w.step(op)
    publish(kafka_broker, schema_registry, src, topic, 1, key=["id"])
    rep = make_replicator(kafka_broker, schema_registry, topic, dst, key=["id"])
    first = rep.run(idle_timeout=2)
    assert_replica_equals_source(src, dst, key="id")
    assert SOURCE_ROWID not in lance.dataset(dst).schema.names
    version = lance.dataset(dst).version
    # a new consumer group (Kafka has no committed offsets for it): the replica's own
    # position makes it skip everything already applied
    rep = Replicator(
        kafka_broker.bootstrap_servers,
        topic,
        schema_registry.url,
        dst,
        key=["id"],
        group_id=f"other-{topic}",
        max_batch_interval=0.5,
    )
    again = rep.run(idle_timeout=2)
    assert again.upserts == again.deletes == 0
    assert lance.dataset(dst).version == version
    assert first.upserts > 0 and first.deletes > 0


def _end_offsets(kafka, topic) -> dict[int, int]:
    c = Consumer({"bootstrap.servers": kafka.bootstrap_servers, "group.id": f"w-{topic}"})
    try:
        parts = c.list_topics(topic, timeout=10).topics[topic].partitions
        return {p: c.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1] for p in parts}
    finally:
        c.close()


def churned_source(src, seed, rng_seed, steps, rows=300):
    """A `rows`-row source with `steps` random commits; the workload and its generator (to
    go on with the same history)."""
    w, rng = Workload(src, seed=seed, rows=rows), random.Random(rng_seed)
    for _ in range(steps):
        w.step(rng.choice(["update", "upsert", "delete_sparse", "append", "upsert_delete_missing"]))
    return w, rng


def test_compaction_and_reindex_mid_stream_then_restart(tmp_path, kafka_broker, schema_registry):
    src, dst = str(tmp_path / "src.lance"), str(tmp_path / "replica.lance")
    topic = f"rep-compact-{uuid.uuid4().hex[:8]}"
    w, rng = churned_source(src, seed=23, rng_seed=9, steps=6)
    published = publish(kafka_broker, schema_registry, src, topic, 1)
    # small batches, compaction every 3rd batch, every new fragment indexed at once; the
    # key index, not the key map (with the map serving integer keys no index is built)
    rep = make_replicator(
        kafka_broker,
        schema_registry,
        topic,
        dst,
        max_batch_rows=60,
        compact_every=3,
        index_rows_max=0,
        key_map=False,
    )
    first = rep.run(idle_timeout=2)
    assert first.batches >= 6
    table = ChangeFeed(dst).table  # pylance cannot decode a Rewrite of an indexed table
    ops = [table.manifest(v).operation for v in range(2, lance.dataset(dst).version + 1)]
    assert "Rewrite" in ops, ops  # compacted mid-stream ...
    assert ops.count("CreateIndex") >= 2, ops  # ... and the key index brought up to date
    assert_replica_equals_source(src, dst)
    replica = ReplicaTable(dst, [SOURCE_ROWID], key_map=False)
    assert replica.unindexed_rows() == 0
    end = _end_offsets(kafka_broker, topic)
    assert replica.applied_offsets(topic) == end  # the position survives maintenance commits

    def more(n):
        nonlocal published
        before = sum(_end_offsets(kafka_broker, topic).values())
        for _ in range(n):
            w.step(rng.choice(["update", "upsert", "delete_sparse", "append", "compact"]))
        published = publish(kafka_broker, schema_registry, src, topic, published + 1)
        return sum(_end_offsets(kafka_broker, topic).values()) - before

    more(3)
    make_replicator(kafka_broker, schema_registry, topic, dst, compact_every=0, key_map=False).run(
        2
    )
    assert len(lance.dataset(dst).get_fragments()) > 1
    done = replica.maintain(compact=True)  # the newest commits: a compaction, an index
    assert done["fragments_removed"] > 1 and done["indexed_rows"] > 0
    assert table.manifest(lance.dataset(dst).version).operation != "Update"
    assert_replica_equals_source(src, dst)

    new_records = more(3)
    assert new_records > 0
    # a new consumer group (no committed offsets in Kafka): the position comes from the
    # replica, from behind its compaction and index commits
    rep = Replicator(
        kafka_broker.bootstrap_servers,
        topic,
        schema_registry.url,
        dst,
        group_id=f"other-{topic}",
        max_batch_interval=0.5,
        max_batch_rows=60,
        compact_every=2,
        index_rows_max=0,
        key_map=False,
    )
    again = rep.run(idle_timeout=2)
    assert again.records == new_records and again.skipped == 0
    assert_replica_equals_source(src, dst)


def test_poison_record_goes_to_dead_letter_topic(tmp_path, kafka_broker, schema_registry):
    src, dst = str(tmp_path / "src.lance"), str(tmp_path / "replica.lance")
    topic = f"rep-dlq-{uuid.uuid4().hex[:8]}"
    w = Workload(src, seed=4, rows=50)
    p = Producer({"bootstrap.servers": kafka_broker.bootstrap_servers})
    p.produce(topic, key=b"k", value=b"\x00\x00\x00\x00\x07garbage")  # wire header, bad body
    assert p.flush(10) == 0
    published = publish(kafka_broker, schema_registry, src, topic, 1)
    p.produce(topic, key=b"k2", value=b"not avro at all")
    assert p.flush(10) == 0
    w.step("update")
    publish(kafka_broker, schema_registry, src, topic, published + 1)

    # without a dead-letter topic: stops at the first record, naming partition and
    # offset, and applies nothing of its batch
    with pytest.raises(ReplicateError, match=r"partition 0 offset 0 of .*dead-letter"):
        make_replicator(kafka_broker, schema_registry, topic, dst).run(idle_timeout=2)
    assert not os.path.exists(dst)

    dlq = f"{topic}.dlq"
    rep = make_replicator(kafka_broker, schema_registry, topic, dst, dead_letter_topic=dlq)
    counters = rep.run(idle_timeout=2)
    assert counters.dead_letters == 2
    assert_replica_equals_source(src, dst)
    c = Consumer(
        {
            "bootstrap.servers": kafka_broker.bootstrap_servers,
            "group.id": "dlq-reader",
            "auto.offset.reset": "earliest",
        }
    )
    c.subscribe([dlq])
    got = []
    for _ in range(40):
        m = c.poll(0.5)
        if m is not None and not m.error():
            got.append(m)
        if len(got) == 2:
            break
    c.close()
    assert sorted(m.value() for m in got) == [b"\x00\x00\x00\x00\x07garbage", b"not avro at all"]
    for m in got:
        headers = dict(m.headers())
        assert headers["lance-cdf.error"] and b"offset" in headers["lance-cdf.source"]


def _replicate_cmd(kafka, registry, topic, dst, *extra):
    return [
        sys.executable,
        "-m",
        "lance_cdf.cli",
        "replicate",
        "--bootstrap-servers",
        kafka.bootstrap_servers,
        "--topic",
        topic,
        "--schema-registry",
        registry.url,
        "--target",
        dst,
        "--group-id",
        f"g-{topic}",
        "--max-batch-rows",
        "60",
        "--max-batch-interval",
        "0.3",
        # (no group settings: a killed replicator's replacement takes its partitions over
        # at once as the same static member, by default)
        *extra,
    ]


@pytest.mark.parametrize("point", ["before-lance-commit", "between-commits", "after-lance-commit"])
def test_crash_points_converge(tmp_path, kafka_broker, schema_registry, point):
    src, dst = str(tmp_path / "src.lance"), str(tmp_path / "replica.lance")
    topic = f"rep-crash-{uuid.uuid4().hex[:8]}"
    w = Workload(src, seed=7, rows=150)
    for op in ("update", "delete_sparse", "upsert", "append", "upsert_delete_missing", "update"):
        w.step(op)
    publish(kafka_broker, schema_registry, src, topic, 1)
    cmd = _replicate_cmd(kafka_broker, schema_registry, topic, dst, "--idle-timeout", "3")
    for _ in range(3):  # each run dies at its first pass through `point`
        run = subprocess.run(cmd, env={**os.environ, CRASH_ENV: point}, capture_output=True)
        assert run.returncode == 137, run.stderr.decode()[-2000:]
    run_to_the_end_and_compare(cmd, src, dst)


def test_sigkill_at_random_points_converges(tmp_path, kafka_broker, schema_registry):
    """Replicators SIGKILLed at random points of their work: at least one kill must land
    mid-work (the process alive, ended by the signal, having applied some but not all of
    the topic by the replica's own recorded position), and a last run must converge."""
    src, dst = str(tmp_path / "src.lance"), str(tmp_path / "replica.lance")
    topic = f"rep-kill-{uuid.uuid4().hex[:8]}"
    # ~5,000 records in batches of 20: the replica takes a few hundred commits (a few
    # seconds), so a kill can land among them; with 300 rows it is done in 0.1 s
    _, rng = churned_source(src, seed=8, rng_seed=8, steps=12, rows=3000)
    publish(kafka_broker, schema_registry, src, topic, 1)
    end = sum(_end_offsets(kafka_broker, topic).values())
    replica = ReplicaTable(dst, [SOURCE_ROWID])

    def applied() -> int:  # records the replica holds, by the position it recorded
        return sum(replica.applied_offsets(topic).values())

    cmd = _replicate_cmd(
        kafka_broker, schema_registry, topic, dst, "--idle-timeout", "3", "--max-batch-rows", "20"
    )
    killed_mid_work = []
    for run in range(4):
        before = applied()
        if before == end:
            break  # nothing left to interrupt
        # the kill point: a random number of records into the rest of the topic
        target = before + rng.randint(1, max(1, (end - before) // 2))
        log = tmp_path / f"replicate-{run}.log"
        with open(log, "wb") as err:
            proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=err)
            try:
                deadline = time.monotonic() + 300
                while applied() < target and proc.poll() is None:
                    assert time.monotonic() < deadline, f"{target} records not applied in 300 s"
                    time.sleep(0.02)
                alive = proc.poll() is None
                if alive:
                    proc.send_signal(signal.SIGKILL)
                proc.wait(timeout=60)
            finally:
                if proc.poll() is None:
                    proc.kill()
                    proc.wait()
        at_kill = applied()
        assert proc.returncode in (0, -signal.SIGKILL), log.read_text()[-2000:]
        if alive and proc.returncode == -signal.SIGKILL and before < at_kill < end:
            killed_mid_work.append((before, at_kill))
    assert killed_mid_work, f"no SIGKILL landed mid-work (topic of {end} records)"
    run_to_the_end_and_compare(cmd, src, dst)


def test_sigterm_exits_cleanly(tmp_path, kafka_broker, schema_registry):
    src, dst = str(tmp_path / "src.lance"), str(tmp_path / "replica.lance")
    topic = f"rep-term-{uuid.uuid4().hex[:8]}"
    Workload(src, seed=9, rows=100)
    publish(kafka_broker, schema_registry, src, topic, 1)
    proc = subprocess.Popen(
        _replicate_cmd(kafka_broker, schema_registry, topic, dst),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    # once the first batch is committed (the directory alone exists from start: the
    # replicator's lease lives in it)
    deadline = time.monotonic() + 60
    while not os.path.exists(os.path.join(dst, "_versions")) and time.monotonic() < deadline:
        time.sleep(0.2)
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err[-2000:]
    assert "batch 1:" in err and "stopped:" in out
    # what it applied is whole batches: rows equal to the source's, position recorded
    source, ds = source_rows(src), lance.dataset(dst)
    for row in ds.to_table().to_pylist():
        assert source[row[SOURCE_ROWID]] == {c: row[c] for c in source[row[SOURCE_ROWID]]}
    offsets = ReplicaTable(dst, [SOURCE_ROWID]).position()[OFFSETS_PROPERTY]
    assert f'"{topic}"' in offsets
    # and a restart finishes the job
    run = subprocess.run(
        _replicate_cmd(kafka_broker, schema_registry, topic, dst, "--idle-timeout", "2"),
        capture_output=True,
        timeout=300,
    )
    assert run.returncode == 0, run.stderr.decode()[-2000:]
    assert_replica_equals_source(src, dst)


def test_a_killed_replicators_replacement_is_the_same_static_member(
    tmp_path, kafka_broker, schema_registry
):
    """A replicator SIGKILLed and started again: the replacement joins its group as the same
    static member (keyed to the replica), so the group hands it the partitions at once
    rather than after the dead member's session timeout; it applies what was published
    since, and the group holds that one member."""
    from confluent_kafka.admin import AdminClient

    from lance_cdf.replicate.consumers import replica_instance_id

    src, dst = str(tmp_path / "src.lance"), str(tmp_path / "replica.lance")
    topic = f"rep-static-{uuid.uuid4().hex[:8]}"
    w = Workload(src, seed=12, rows=120)
    last = publish(kafka_broker, schema_registry, src, topic, 1)
    replica = ReplicaTable(dst, [SOURCE_ROWID])

    def applied() -> int:
        try:
            return sum(replica.applied_offsets(topic).values())
        except (OSError, ValueError):
            return 0

    def wait_past(count: int, proc: subprocess.Popen) -> None:
        deadline = time.monotonic() + 120
        while applied() <= count:
            assert proc.poll() is None, f"replicate exited ({proc.returncode})"
            assert time.monotonic() < deadline, f"nothing applied past {count} in 120 s"
            time.sleep(0.2)

    cmd = _replicate_cmd(kafka_broker, schema_registry, topic, dst)
    procs = []
    try:
        for round_ in range(2):
            with open(tmp_path / f"replicate-{round_}.log", "wb") as log:
                procs.append(subprocess.Popen(cmd, stdout=log, stderr=log))
            before = applied()
            if round_:  # published after the kill: only the replacement can apply it
                for op in ("update", "upsert"):
                    w.step(op)
                last = publish(kafka_broker, schema_registry, src, topic, last + 1)
            wait_past(before, procs[-1])
            if not round_:
                procs[-1].send_signal(signal.SIGKILL)
                procs[-1].wait(30)
        admin = AdminClient({"bootstrap.servers": kafka_broker.bootstrap_servers})
        group = admin.describe_consumer_groups([f"g-{topic}"])[f"g-{topic}"].result(30)
        assert [m.group_instance_id for m in group.members] == [
            replica_instance_id(f"g-{topic}", dst)
        ]
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                proc.wait(60)


def test_the_replicas_static_member_id_is_its_own_and_can_be_turned_off():
    """Unit: the group.instance.id a replicator takes is the same for every process writing
    one replica (a path given relative or absolute), another for another replica or group;
    the user's --consumer-config wins, and an empty one makes the consumer dynamic."""
    from lance_cdf.ops.clientconfig import KafkaConnection
    from lance_cdf.replicate.consumers import replica_consumer_config, replica_instance_id

    here = replica_instance_id("g", "replica.lance")
    assert here == replica_instance_id("g", os.path.abspath("replica.lance"))
    assert here != replica_instance_id("g", "other.lance")
    assert here != replica_instance_id("h", "replica.lance")
    assert replica_instance_id("g", "s3://b/r.lance") == replica_instance_id("g", "s3://b/r.lance/")

    def instance(given: dict[str, str]) -> str | None:
        connection = KafkaConnection("127.0.0.1:9", given, "consumer")
        config = replica_consumer_config(connection, "g", lambda err, tps: None, here)
        return config.get("group.instance.id")

    assert instance({}) == here
    assert instance({"group.instance.id": "mine"}) == "mine"
    assert instance({"group.instance.id": ""}) is None


def test_unreachable_broker_is_named(tmp_path, schema_registry):
    with pytest.raises(lance_cdf.LanceCdfError, match="127.0.0.1:1"):
        Replicator("127.0.0.1:1", "t", schema_registry.url, str(tmp_path / "r.lance"))


REGISTRY_TIMEOUT_S = 2  # the registry client's request timeout in the outage test


@contextlib.contextmanager
def registry_down(registry):
    """The registry's process group stopped (SIGSTOP): connections hang, requests time
    out, as in an outage; SIGCONT afterwards, whatever happens (it is shared by the run)."""
    os.killpg(registry.proc.pid, signal.SIGSTOP)
    try:
        yield
    finally:
        os.killpg(registry.proc.pid, signal.SIGCONT)


def test_a_registry_outage_is_waited_out_never_dead_lettered(
    tmp_path, kafka_broker, schema_registry
):
    """The registry is down when the replicator meets a schema id it has not fetched yet
    (after add_columns): with a dead-letter topic, no good record goes there; the
    replicator waits, then applies everything once the registry answers. An outage longer
    than it waits stops it with RegistryUnavailableError, nothing applied of the batch and
    nothing set aside; a plain restart then completes the replica."""
    src, dst = str(tmp_path / "src.lance"), str(tmp_path / "replica.lance")
    topic = f"rep-outage-{uuid.uuid4().hex[:8]}"
    dlq = f"{topic}.dlq"
    w = Workload(src, seed=9, rows=80)
    published = publish(kafka_broker, schema_registry, src, topic, 1)
    rep = make_replicator(kafka_broker, schema_registry, topic, dst, dead_letter_topic=dlq)
    assert rep.run(idle_timeout=2).dead_letters == 0
    w.step("add_column")  # a new schema id, registered while the registry is up
    w.step("update")
    published = publish(kafka_broker, schema_registry, src, topic, published + 1)

    def replicator(group, **kw):  # a group of its own: no wait for the last one to leave
        # a 2-s registry request timeout (the replicator's is 10 s, overridable through
        # registry_config): each unanswered request is waited out 5x sooner
        return Replicator(
            kafka_broker.bootstrap_servers,
            topic,
            schema_registry.url,
            dst,
            group_id=f"{group}-{topic}",
            max_batch_interval=0.5,
            dead_letter_topic=dlq,
            registry_config={"timeout": REGISTRY_TIMEOUT_S},
            **kw,
        )

    # short of the wait: the outage is ridden out
    rep = replicator("g2")
    with registry_down(schema_registry):
        done = []
        runner = threading.Thread(target=lambda: done.append(rep.run(idle_timeout=3)))
        runner.start()
        # it meets the new schema id meanwhile: a timed-out request, retries (as before
        # with 10-s requests and 16 s down, the fetch has to start in the first 6 s)
        time.sleep(6 + REGISTRY_TIMEOUT_S)
    runner.join(120)
    assert done and done[0].dead_letters == 0 and done[0].registry_retries > 0
    assert_replica_equals_source(src, dst)

    # longer than the wait: a clear stop, nothing set aside, then a plain restart
    w.step("add_column")
    w.step("upsert")
    publish(kafka_broker, schema_registry, src, topic, published + 1)
    rep = replicator("g3", registry_outage_s=3)
    with (
        registry_down(schema_registry),
        pytest.raises(RegistryUnavailableError, match="no record is lost"),
    ):
        rep.run(idle_timeout=3)
    again = replicator("g4")
    assert again.run(idle_timeout=3).dead_letters == 0
    assert_replica_equals_source(src, dst)
    c = Consumer(
        {
            "bootstrap.servers": kafka_broker.bootstrap_servers,
            "group.id": "dlq-check",
            "auto.offset.reset": "earliest",
        }
    )
    c.subscribe([dlq])
    assert all(m is None or m.error() for m in (c.poll(0.5) for _ in range(6)))
    c.close()


def test_a_batch_is_what_has_arrived_up_to_its_bound(kafka_broker):
    """`consume_ready`: the records already on the topic come in one batch (the drain),
    never more than the bound, in offset order, and a quiet topic gives none."""
    from confluent_kafka.admin import AdminClient, NewTopic

    from lance_cdf.replicate.poll_loop import consume_ready

    topic = f"ready-{uuid.uuid4().hex[:8]}"
    admin = AdminClient({"bootstrap.servers": kafka_broker.bootstrap_servers})
    admin.create_topics([NewTopic(topic, 1, 1)])[topic].result(30)
    producer = Producer({"bootstrap.servers": kafka_broker.bootstrap_servers})
    n = random.randint(500, 3000)
    for i in range(n):
        producer.produce(topic, str(i).encode())
    assert producer.flush(30) == 0
    consumer = Consumer(
        {
            "bootstrap.servers": kafka_broker.bootstrap_servers,
            "group.id": topic,
            "enable.auto.commit": False,
        }
    )
    consumer.assign([TopicPartition(topic, 0, 0)])
    stop = threading.Event()
    try:
        bound = random.randint(1, n - 1)
        first = consume_ready(consumer, bound, 30.0, 30.0, stop)
        assert [m.value() for m in first] == [str(i).encode() for i in range(bound)]
        rest = consume_ready(consumer, 10 * n, 30.0, 30.0, stop)
        assert [m.value() for m in rest] == [str(i).encode() for i in range(bound, n)]
        assert consume_ready(consumer, 10 * n, 0.2, 30.0, stop) == []
    finally:
        consumer.close()


_ACCESS_CHECKS = r"""
import sys, uuid
from lance_cdf.kafka.endpoints import check_consumer_access
bootstrap = sys.stdin.readline().strip()  # imported before the broker is up: the window
for _ in range(10):  # new groups: each a coordinator lookup on a broker still loading
    check_consumer_access(bootstrap, "t-" + uuid.uuid4().hex[:6], "g-" + uuid.uuid4().hex,
                          timeout=5)
"""


def test_the_access_check_survives_a_fresh_brokers_coordinator(tmp_path):
    """replicate's start-up check asks the group's coordinator about its consumer group;
    on a broker whose __consumer_offsets is still being created the coordinator answers
    NOT_COORDINATOR, on which librdkafka's ListConsumerGroupOffsets dies of SIGSEGV in
    its own thread (it did to the replicator at start in bench runs). Four processes
    asking at once on each of two fresh brokers: with the offset fetch at least one died
    on every broker (4 of 4 tried); none may."""
    from lance_cdf_devtools import KafkaBroker

    for i in range(2):
        checks = [
            subprocess.Popen(
                [sys.executable, "-c", _ACCESS_CHECKS],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
            )
            for _ in range(4)
        ]
        with KafkaBroker(str(tmp_path / f"fresh{i}")) as fresh:
            for p in checks:  # all at once, the moment the broker answers
                assert p.stdin is not None
                p.stdin.write(fresh.bootstrap_servers + "\n")
                p.stdin.flush()
            outs = [p.communicate(timeout=240)[0] for p in checks]
            assert [p.returncode for p in checks] == [0] * 4, outs


def _records_in(bootstrap: str, topic: str) -> tuple[int, int]:
    """How many records the topic's partitions hold now, and how many were ever written to
    them (their offsets: compaction removes records, never offsets)."""
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"count-{uuid.uuid4().hex}",
            "enable.auto.commit": False,
            "enable.partition.eof": True,
        }
    )
    try:
        parts = consumer.list_topics(topic, timeout=10).topics[topic].partitions
        written = sum(
            consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1] for p in parts
        )
        consumer.assign([TopicPartition(topic, p, 0) for p in parts])
        n, ended = 0, set()
        while len(ended) < len(parts):
            m = consumer.poll(10)
            assert m is not None, "no end of partition reached"
            if m.error() is None:
                n += 1
            elif m.error().code() == KafkaError._PARTITION_EOF:
                ended.add(m.partition())
        return n, written
    finally:
        consumer.close()


def test_a_replica_from_scratch_of_a_compacted_topic_equals_the_source(
    tmp_path, kafka_broker, schema_registry, caplog
):
    """A compacted change topic (what Debezium users set) whose older records the log
    cleaner has removed: whole versions cannot be proven, so a new replica is built from
    the records as they come (said in one line), and equals the source. Without that it
    would wait for versions whose records are gone (the transaction topic exists)."""
    from confluent_kafka.admin import AdminClient, NewTopic

    src, dst = str(tmp_path / "src.lance"), str(tmp_path / "replica.lance")
    topic = f"compacted-{uuid.uuid4().hex[:8]}"
    bootstrap = kafka_broker.bootstrap_servers
    admin = AdminClient({"bootstrap.servers": bootstrap})
    config = {  # segments roll fast and the cleaner takes any of them at once
        "cleanup.policy": "compact",
        "segment.ms": "200",
        "min.cleanable.dirty.ratio": "0.01",
        "min.compaction.lag.ms": "0",
    }
    created = admin.create_topics(
        [NewTopic(topic, 2, 1, config=config), NewTopic(f"{topic}.transaction", 1, 1)]
    )
    for f in created.values():
        f.result(30)
    w = Workload(src, seed=3, rows=60)
    published = publish(kafka_broker, schema_registry, src, topic, 1)
    rng = random.Random(8)
    for _ in range(4):  # rows changed again and again: older records of a key to remove
        for _ in range(3):
            w.step(rng.choice(["update", "upsert", "delete_sparse", "append"]))
        time.sleep(0.3)  # the next records start a new segment: the last one can be cleaned
        published = publish(kafka_broker, schema_registry, src, topic, published + 1)
    deadline = time.monotonic() + 120  # the broker's cleaner looks every 15 s
    held, written = _records_in(bootstrap, topic)
    while held >= written and time.monotonic() < deadline:
        time.sleep(2)
        held, written = _records_in(bootstrap, topic)
    assert held < written, "the log cleaner compacted nothing"

    rep = make_replicator(kafka_broker, schema_registry, topic, dst)
    with caplog.at_level("WARNING", logger="lance_cdf.replicate"):
        rep.run(idle_timeout=3)
    assert any("is compacted (cleanup.policy=compact)" in r.getMessage() for r in caplog.records)
    assert_replica_equals_source(src, dst)


def test_a_fenced_static_member_is_renewed(tmp_path, kafka_broker, schema_registry):
    """Another consumer joining the replicator's group with its group.instance.id fences
    the replicator's consumer (FENCED_INSTANCE_ID, fatal in librdkafka, as when the group's
    coordinator moved): the replicator renews its consumer and resumes from the replica's
    position; the replica equals the source, and the renewal is counted and shown by
    `status`."""
    src, dst = str(tmp_path / "src.lance"), str(tmp_path / "replica.lance")
    topic = f"rep-fence-{uuid.uuid4().hex[:8]}"
    w = Workload(src, seed=13, rows=200)
    last = publish(kafka_broker, schema_registry, src, topic, 1)
    static = {"group.instance.id": f"replicator-{topic}", "session.timeout.ms": 6000}
    rep = make_replicator(
        kafka_broker, schema_registry, topic, dst, consumer_config=static, max_batch_rows=60
    )
    failed = []

    def run():
        try:
            rep.run()
        except Exception as exc:  # noqa: BLE001 (asserted below)
            failed.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    replica = ReplicaTable(dst, [SOURCE_ROWID])
    deadline = time.monotonic() + 60
    while not _applied(replica, topic):
        assert thread.is_alive() and time.monotonic() < deadline, failed
        time.sleep(0.2)
    intruder = Consumer(
        {
            "bootstrap.servers": kafka_broker.bootstrap_servers,
            "group.id": f"g-{topic}",
            "enable.auto.commit": False,
            "log_level": 0,
            **static,
        }
    )
    intruder.subscribe([topic])
    try:
        while rep.counters.consumer_restarts == 0:  # fenced, and a new consumer took over
            assert thread.is_alive() and time.monotonic() < deadline + 60, failed
            intruder.poll(0.2)
    finally:
        intruder.close()
    for op in ("update", "delete_sparse", "upsert"):
        w.step(op)
    last = publish(kafka_broker, schema_registry, src, topic, last + 1)
    while (rep.counters.source_version or 0) < last:
        assert thread.is_alive() and time.monotonic() < deadline + 120, failed
        time.sleep(0.2)
    rep.stop()
    thread.join(60)
    assert not failed and not thread.is_alive()
    assert_replica_equals_source(src, dst)
    out = subprocess.run(
        [sys.executable, "-m", "lance_cdf.cli", "status", "--table", src, "--replica", dst]
        + ["--json"],
        capture_output=True,
        text=True,
        check=True,
    )
    renewed = json.loads(out.stdout)["replica_consumer_restarts"]
    assert renewed["restarts"] == rep.counters.consumer_restarts >= 1, renewed


def _applied(replica, topic):
    try:
        return sum(replica.applied_offsets(topic).values())
    except (OSError, ValueError):
        return 0
