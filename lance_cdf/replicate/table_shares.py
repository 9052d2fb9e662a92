"""Which tables each replicator of a consumer group applies: the group's members from
Kafka's consumer-group protocol, the tables shared out among them whole.

Several `lance-cdf replicate --database-target` processes with one `--group-id` share the
database's tables. Kafka's own assignors (range, roundrobin, cooperative-sticky: the only
ones librdkafka offers, and a Python client cannot add one) hand out *partitions*: a table
whose topic has several partitions would be split between processes, and none of them
could apply its whole versions. So the group protocol is used for what it does well,
membership and failure detection, and the tables are shared out here:

  * every process joins the group with a membership consumer (`GroupMembers`: subscribed
    to the table topics, its partitions paused, never read; it heartbeats, and leaves the
    group on close). A process that dies leaves the group after the session timeout
    (`--member-timeout`), and the others are told at once through a rebalance;
  * every process reads the group's members (the admin API's describe, while the group
    is stable) and computes the same sharing of the same table list (`share_tables`):
    highest-random-weight (rendezvous) hashing with a bound on load, so each table has
    one owner, none holds more than an even share (rounded up), and a member joining or
    leaving moves few more tables than its share;
  * the replica's lease (`Lease`, one per replica table) is what makes a process
    its writer: a process applies a table only once it holds that lease, and gives a
    table it no longer owns up (its batch finished, the lease released) for its new
    owner to take. Two processes that briefly disagree about the members therefore
    never both write a replica: the second waits for the lease.

The replica's recorded position (in its own commits) is where its new owner resumes,
never the group's committed offsets.
"""

from __future__ import annotations

import hashlib
import logging
import math
import re
import threading
from collections.abc import Sequence
from typing import Any

from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient

from lance_cdf.errors import LanceCdfError
from lance_cdf.kafka.endpoints import denied
from lance_cdf.ops.clientconfig import KafkaConnection

log = logging.getLogger("lance_cdf.replicate")

# the group's state in which its member list is settled (not mid-rebalance)
_STABLE = "STABLE"


def _weight(member: str, table: str) -> int:
    """The rendezvous weight of `table` on `member` (the same in every process)."""
    digest = hashlib.blake2b(f"{member}\0{table}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big")


def share_tables(tables: Sequence[str], members: Sequence[str]) -> dict[str, str]:
    """Each of `tables` -> the one of `members` that applies it: every member holds
    at most ceil(tables / members) tables, each table goes to the member of highest
    rendezvous weight that has room (tables placed in an order of their own hash).
    Depends only on the two sets, so every process computes the same; {} without
    members."""
    if not members:
        return {}
    ranked = sorted(set(members))
    room = math.ceil(len(set(tables)) / len(ranked))
    load = dict.fromkeys(ranked, 0)
    out: dict[str, str] = {}
    order = sorted(set(tables), key=lambda t: (_weight("", t), t))
    for table in order:
        for member in sorted(ranked, key=lambda m: (-_weight(m, table), m)):
            if load[member] < room:
                out[table] = member
                load[member] += 1
                break
    return out


def topics_under(prefix: str) -> str:
    """The subscription pattern of the topics `<prefix>.*` as librdkafka's regex engine
    reads it (POSIX-like: a topic name's `.` and `-` put in brackets, not escaped)."""
    return "^" + "".join(c if c.isalnum() or c == "_" else f"[{c}]" for c in prefix) + "[.].*"


class GroupMembers:
    """This process's membership of consumer group `group_id` (the topics matching
    `pattern` subscribed, never read) and the group's members as Kafka reports them.
    `changed` is set on every rebalance this member is told of; `poll()` serves the
    group's callbacks and is called from the replicator's loop."""

    def __init__(
        self,
        connection: KafkaConnection,
        group_id: str,
        pattern: str,
        session_timeout_s: float,
    ):
        self.group_id, self.bootstrap_servers = group_id, connection.bootstrap_servers
        self.changed = threading.Event()
        self.consumer = Consumer(
            connection.consumer(
                defaults={
                    "session.timeout.ms": int(session_timeout_s * 1000),
                    "heartbeat.interval.ms": max(100, int(session_timeout_s * 1000 / 5)),
                    # the topic list read often: a new table topic becomes part of the
                    # subscription soon (it matters little: tables are shared out here)
                    "topic.metadata.refresh.interval.ms": 30_000,
                    # a long batch (a big version, a compaction) between two polls must
                    # not drop the member: its heartbeats, from librdkafka's own thread,
                    # are what tells whether it is alive
                    "max.poll.interval.ms": 1_800_000,
                },
                fixed={
                    "group.id": group_id,
                    "enable.auto.commit": False,
                    "enable.auto.offset.store": False,
                    "auto.offset.reset": "latest",
                    # eager rebalances: the callbacks below (re)assign the whole set
                    "partition.assignment.strategy": "roundrobin",
                },
            )
        )
        self.admin = AdminClient(connection.admin())
        self.consumer.subscribe([pattern], on_assign=self._assigned, on_revoke=self._revoked)
        self._members: list[str] | None = None

    def _assigned(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        # the partitions are the group protocol's, not the tables': never fetched
        consumer.assign(partitions)
        if partitions:
            consumer.pause(partitions)
        self.changed.set()

    def _revoked(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        consumer.unassign()
        self.changed.set()

    @property
    def me(self) -> str:
        """This process's member id ("" until it has joined)."""
        return self.consumer.memberid() or ""

    def poll(self) -> None:
        """Serve the group's callbacks (rebalances); the consumer returns no records (its
        partitions are paused). A group the client may not use is raised, naming it."""
        m = self.consumer.poll(0)
        err = m.error() if m is not None else None
        if err is not None and err.code() == KafkaError.GROUP_AUTHORIZATION_FAILED:
            raise self._denied(err)

    def members(self) -> list[str] | None:
        """The group's members (sorted member ids) while the group is stable and this
        process is one of them; None while it is not (rebalancing, not joined yet, the
        broker not answering): then nothing changes hands."""
        me = self.me
        if not me:
            return None
        try:
            future = self.admin.describe_consumer_groups([self.group_id], request_timeout=10)
            description: Any = future[self.group_id].result(timeout=15)
        except KafkaException as exc:
            err = exc.args[0] if exc.args and isinstance(exc.args[0], KafkaError) else None
            if err is not None and err.code() == KafkaError.GROUP_AUTHORIZATION_FAILED:
                raise self._denied(err) from None
            log.warning("cannot read the members of group %r (%s)", self.group_id, exc)
            return None
        if _state_name(description.state) != _STABLE:
            return None
        members = sorted(m.member_id for m in description.members)
        if me not in members:
            return None
        if members != self._members:
            log.info(
                "group %r: %d replicator(s) share the tables (this one is %s)",
                self.group_id,
                len(members),
                me,
            )
            self._members = members
        return members

    def _denied(self, err: KafkaError) -> LanceCdfError:
        return denied(
            "consumer group",
            self.group_id,
            "Read and Describe",
            self.bootstrap_servers,
            "consumer",
            err,
            "--group-id",
        )

    def close(self) -> None:
        """Leave the group (the others are told at once, without the session timeout)."""
        self.consumer.close()


def _state_name(state: Any) -> str:
    """A ConsumerGroupState's name ("STABLE", ...), whatever the client's enum spells."""
    name = getattr(state, "name", str(state))
    return re.sub(r"^.*\.", "", str(name)).upper()
