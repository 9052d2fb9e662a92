"""What a replicator settles before it applies anything: one writer per replica (its lease),
whose replica it is, and where it resumes: a replica that holds no position while the
consumer group has moved, or a topic that no longer holds the records from the replica's
position on, is refused rather than filled from the middle."""

from __future__ import annotations

import contextlib
import logging
import os
import time
from urllib.parse import urlparse

from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition

from lance_cdf.errors import LanceCdfError, ReplicaPositionError
from lance_cdf.ops.clientconfig import KafkaConnection
from lance_cdf.ops.lease import Lease, LeaseKeeper
from lance_cdf.replicate.replica import ReplicaTable, offsets_of
from lance_cdf.replicate.replica_identity import ReplicaIdentity

log = logging.getLogger("lance_cdf.replicate")

# The replica's lease (one writer per replica) lives inside the replica table's
# directory: it moves and is deleted with the table, needs no location or permissions
# of its own, and Lance leaves a directory it does not know alone (reads, writes,
# cleanup_old_versions).
LEASE_DIR = "_lance_cdf"

# the group coordinator is moving or loading: a committed-offsets request is asked again
_COORDINATOR_MOVING = (
    KafkaError.NOT_COORDINATOR,
    KafkaError.COORDINATOR_LOAD_IN_PROGRESS,
    KafkaError.COORDINATOR_NOT_AVAILABLE,
    KafkaError._TIMED_OUT,
)


class StartChecks:
    """The start-up checks of the replicator of `topic` into `replica` (consumer group
    `group_id`; `rebuild`: a missing or empty replica may start from the beginning of the
    topic although the group has committed offsets)."""

    def __init__(
        self,
        topic: str,
        group_id: str,
        replica: ReplicaTable,
        consumer: Consumer,
        connection: KafkaConnection,
        rebuild: bool = False,
    ):
        self.topic, self.group_id, self.replica = topic, group_id, replica
        self.target = replica.uri
        self.consumer, self.connection, self.rebuild = consumer, connection, rebuild

    # -- one writer ---------------------------------------------------------------------
    def acquire_lease(self, ttl_s: float, keeper: LeaseKeeper | None = None) -> Lease:
        """The replica's lease (LeaseHeldError naming the holder when another replicator
        writes it), renewed from a thread until released (`keeper`: one keep-alive
        thread for many leases, a database replicator's)."""
        lease = Lease.acquire(
            f"{self.target.rstrip('/')}/{LEASE_DIR}",
            "replica",
            self.replica.storage_options,
            ttl_s=ttl_s,
            command=f"lance-cdf replicate --topic {self.topic} --group-id {self.group_id}",
            target=self.target,
        )
        lease.keep_alive(keeper)
        return lease

    def release(self, lease: Lease) -> None:
        """Give the lease up; a local target directory that holds nothing after that (no
        record applied: the lease's directory was all there was) is removed."""
        lease.release()
        parsed = urlparse(self.target)
        if parsed.scheme in ("", "file"):
            with contextlib.suppress(OSError):  # not empty, or gone: leave it
                os.rmdir(parsed.path if parsed.scheme == "file" else self.target)

    # -- whose replica, where it resumes ------------------------------------------------
    def check(self, identity: ReplicaIdentity) -> bool:
        """Refuse, before anything is applied, a replica of another topic, and a start
        that would fill the replica from the middle of the topic: the replica holds no
        position while the consumer group has committed offsets (a deleted or replaced
        replica; `rebuild` accepts starting it from the beginning), or the topic no
        longer holds the records from the replica's position on (retention). True: the
        topic does not exist yet (nothing to resume from, nothing lost)."""
        position = self.replica.position()
        identity.adopt(position)
        applied = offsets_of(position, self.topic)
        partitions = self.topic_partitions()
        if partitions is None:
            log.warning(
                "topic %r does not exist yet; waiting for it (--idle-timeout, if given, "
                "counts from start)",
                self.topic,
            )
            return True
        if not applied and not self.rebuild:
            moved = self._committed(partitions)
            if moved:
                what = "does not exist" if self.replica.open() is None else "holds no position"
                raise ReplicaPositionError(
                    f"the replica {self.target} {what}, but consumer group {self.group_id!r} "
                    f"has consumed {sum(moved.values())} records of {self.topic!r}: the "
                    "replica was deleted or replaced, and resuming from the group's offsets "
                    "would fill it from the middle. To build it again from the beginning of "
                    "the topic, run the same command with --rebuild."
                )
        if self.rebuild and applied:
            log.info("--rebuild: the replica holds a position already; resuming from it")
        self._check_history(applied, partitions)
        return False

    def _committed(self, partitions: list[int]) -> dict[int, int]:
        """The consumer group's committed offsets of the topic's partitions (those it has
        committed); a coordinator that is moving or loading is asked again, for up to a
        minute (the check is not skipped: a start it guards must not be guessed)."""
        deadline, delay = time.monotonic() + 60, 0.2
        while True:
            try:
                got = self.consumer.committed(
                    [TopicPartition(self.topic, p) for p in partitions], timeout=10
                )
                return {tp.partition: tp.offset for tp in got if tp.offset >= 0}
            except KafkaException as exc:
                err = exc.args[0] if exc.args and isinstance(exc.args[0], KafkaError) else None
                if err is None or not (err.retriable() or err.code() in _COORDINATOR_MOVING):
                    why: KafkaException = exc
                    break
                why = exc
            if time.monotonic() > deadline:
                break
            log.info("consumer group %r: %s; asked again", self.group_id, why)
            time.sleep(delay)
            delay = min(delay * 2, 5.0)
        raise LanceCdfError(
            f"cannot read the committed offsets of consumer group {self.group_id!r} in "
            f"{self.topic!r} ({why}); check the broker and start again"
        ) from None

    def topic_partitions(self) -> list[int] | None:
        """The topic's partitions (None: no such topic)."""
        try:
            meta = self.consumer.list_topics(self.topic, timeout=10)
        except KafkaException as exc:
            raise LanceCdfError(f"cannot read the partitions of {self.topic!r}: {exc}") from None
        t = meta.topics.get(self.topic)
        if t is None or t.error is not None or not t.partitions:
            return None
        return sorted(t.partitions)

    def _check_history(self, applied: dict[int, int], partitions: list[int]) -> None:
        """Each partition must still hold every record from where the replica resumes
        (its position, or the beginning): a low watermark above that means records were
        deleted (retention) before being applied. Only a compacted topic may start
        later than offset 0 for a new replica (it keeps the last record of every key)."""
        for p in partitions:
            start = applied.get(p, 0)
            try:
                low, high = self.consumer.get_watermark_offsets(
                    TopicPartition(self.topic, p), timeout=10
                )
            except KafkaException as exc:
                raise LanceCdfError(
                    f"cannot read the offsets of {self.topic!r} partition {p}: {exc}"
                ) from None
            if high < start:  # fewer records than applied: not the topic the replica read
                raise ReplicaPositionError(
                    f"the replica {self.target} applied {self.topic!r} partition {p} up to "
                    f"offset {start}, but the partition ends at offset {high}: the topic was "
                    "deleted and created again since. Replicate it into a new --target."
                )
            if low <= start:
                continue
            policy = self.cleanup_policy()
            if start == 0 and policy == "compact":
                continue
            held = "holds nothing of it" if start == 0 else f"resumes at offset {start}"
            raise ReplicaPositionError(
                f"the replica {self.target} cannot be built from topic {self.topic!r}: its "
                f"partition {p} now starts at offset {low} (cleanup.policy={policy}: older "
                f"records deleted) and the replica {held}, so it would lack changes. Publish "
                "the source into a new topic from a snapshot (lance-cdf publish --snapshot) "
                "and replicate that into a new --target."
            )

    def cleanup_policy(self) -> str:
        """The change topic's `cleanup.policy` ("unknown" when it cannot be read)."""
        from confluent_kafka.admin import AdminClient, ConfigResource, ResourceType

        resource = ConfigResource(ResourceType.TOPIC, self.topic)
        try:
            admin = AdminClient(self.connection.admin())  # (held: its futures die with it)
            configs = admin.describe_configs([resource])
            entry = configs[resource].result(timeout=10).get("cleanup.policy")
        except KafkaException as exc:
            log.warning("cannot read the configuration of %r: %s", self.topic, exc)
            return "unknown"
        return "unknown" if entry is None or entry.value is None else str(entry.value)
