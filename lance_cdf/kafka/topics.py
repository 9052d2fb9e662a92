"""The topics lance-cdf writes, created on purpose.

A change topic and its transaction topic are made with CreateTopics, with the partitions,
replication factor and topic settings the user chose (`--partitions`,
`--replication-factor`, `--topic-config`; the sink's `topic.partitions`,
`topic.replicationFactor`, `topic.config.<key>`), the broker's defaults for what the user
left out. They are never made by a metadata request: every client lance-cdf creates has
`allow.auto.create.topics=false` (clientconfig.ALWAYS), so a broker with
`auto.create.topics.enable` does not create them with its own `num.partitions` first.

A topic that exists is used as it is: a change topic with its own partition count (the
writers and the key routing follow it), a transaction topic only with exactly one
partition (its last record must be the last one written), refused in one line otherwise.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from typing import TYPE_CHECKING

from confluent_kafka import KafkaError, KafkaException

from lance_cdf.errors import KafkaUnavailableError, PublishError, TransactionMetadataError
from lance_cdf.kafka import clients
from lance_cdf.kafka.topic_settings import TopicSettings
from lance_cdf.ops.clientconfig import KafkaConnection, redact_url

if TYPE_CHECKING:
    from confluent_kafka.admin import AdminClient, TopicMetadata

# CreateTopics answers that say the cluster is busy or unreachable, not that it refuses
TRANSIENT = frozenset(
    {
        KafkaError._TIMED_OUT,
        KafkaError._TRANSPORT,
        KafkaError._ALL_BROKERS_DOWN,
        KafkaError.REQUEST_TIMED_OUT,
        KafkaError.NOT_CONTROLLER,
        KafkaError.NETWORK_EXCEPTION,
        KafkaError.BROKER_NOT_AVAILABLE,
        KafkaError.LEADER_NOT_AVAILABLE,
    }
)
# how long a new topic's metadata (every partition with a leader) is waited for: a
# controller under load publishes it seconds after CreateTopics answers
METADATA_WAIT_S = 60.0


def ensure_topic(
    connection: KafkaConnection,
    topic: str,
    settings: TopicSettings,
    one_partition: bool = False,
    other: str = "--topic",
) -> int:
    """The partition count of `topic`, created with `settings` if it does not exist.
    `one_partition`: a transaction topic (created with one partition; an existing one
    with more is refused). `other`: the flag that names another topic (for the messages).
    Raises `KafkaUnavailableError` where the brokers did not answer (worth retrying), else
    `PublishError` (or another `LanceCdfError`) naming the cause and the fix."""
    admin = clients.admin(connection.admin(defaults={"log_level": 0}))
    where = redact_url(connection.bootstrap_servers)
    found = _describe(admin, topic, connection, other)
    if found is None:
        _create(admin, topic, settings, connection, other)
        found = _wait_for_metadata(admin, topic, connection, other)
    count = len(found.partitions)
    if one_partition and count != 1:
        raise TransactionMetadataError(
            f"transaction topic {topic!r} on {where} has {count} partitions; it needs exactly "
            f"one (delete it, or name another with {other})"
        )
    return count


def _describe(
    admin: AdminClient, topic: str, connection: KafkaConnection, other: str
) -> TopicMetadata | None:
    """The topic's metadata, None if it does not exist; an ACL denial named."""
    from lance_cdf.kafka.endpoints import DENIED, denied

    try:
        found = admin.list_topics(topic=topic, timeout=10).topics.get(topic)
    except KafkaException as exc:
        raise KafkaUnavailableError(
            f"cannot describe topic {topic!r} on {redact_url(connection.bootstrap_servers)} "
            f"({_text(exc)}); check that the brokers are up"
        ) from None
    err = found.error if found is not None else None
    if err is not None and err.code() in DENIED:
        raise denied(
            "topic",
            topic,
            "Describe and Write",
            connection.bootstrap_servers,
            connection.flag,
            err,
            other,
        )
    if found is None or err is not None or not found.partitions:
        return None  # (UNKNOWN_TOPIC_OR_PART; a topic being deleted or made: asked again)
    return found


def _create(
    admin: AdminClient, topic: str, settings: TopicSettings, connection: KafkaConnection, other: str
) -> None:
    from confluent_kafka.admin import NewTopic

    from lance_cdf.kafka.endpoints import DENIED, denied

    new = NewTopic(
        topic,
        num_partitions=settings.partitions or -1,  # -1: the broker's default (KIP-464)
        replication_factor=settings.replication_factor or -1,
        config=dict(settings.config),
    )
    try:
        admin.create_topics([new], request_timeout=30)[topic].result(60)
    except KafkaException as exc:
        err = exc.args[0] if exc.args and isinstance(exc.args[0], KafkaError) else None
        code = err.code() if err is not None else None
        if code == KafkaError.TOPIC_ALREADY_EXISTS:
            return  # made meanwhile (another writer): used as it is
        if code in (*DENIED, KafkaError.CLUSTER_AUTHORIZATION_FAILED):
            raise denied(
                "topic",
                topic,
                "Create, Describe and Write",
                connection.bootstrap_servers,
                connection.flag,
                err,
                other,
            ) from None
        if code in TRANSIENT:
            raise KafkaUnavailableError(
                f"could not create topic {topic!r} ({_text(exc)}): the brokers did not answer"
            ) from None
        raise PublishError(_create_failure(topic, settings, code, _text(exc))) from None


def _create_failure(topic: str, settings: TopicSettings, code: int | None, text: str) -> str:
    """One line for a CreateTopics answer other than success."""
    head = f"could not create topic {topic!r} ({text})"
    if code == KafkaError.INVALID_REPLICATION_FACTOR:
        asked = settings.replication_factor or "the broker's default.replication.factor"
        return (
            f"{head}: replication factor {asked} is more than the brokers the cluster has; "
            "give --replication-factor (option topic.replicationFactor) at most their number"
        )
    if code in (KafkaError.INVALID_CONFIG, KafkaError.POLICY_VIOLATION):
        return f"{head}: the broker refused its settings; check --topic-config (topic.config.*)"
    if code == KafkaError.INVALID_PARTITIONS:
        return f"{head}: check --partitions (option topic.partitions)"
    return f"{head}; create it yourself (kafka-topics --create), or retry"


def _wait_for_metadata(
    admin: AdminClient, topic: str, connection: KafkaConnection, other: str
) -> TopicMetadata:
    """The new topic's metadata once every partition has a leader (asked with a growing
    pause: a busy controller publishes a new topic seconds after creating it)."""
    deadline = time.monotonic() + METADATA_WAIT_S
    pause = 0.05
    while True:
        try:
            found = _describe(admin, topic, connection, other)
        except KafkaUnavailableError:
            found = None
        if found is not None and all(p.leader >= 0 for p in found.partitions.values()):
            return found
        if time.monotonic() >= deadline:
            raise KafkaUnavailableError(
                f"topic {topic!r} was created on {redact_url(connection.bootstrap_servers)} "
                f"but has no leader for every partition after {METADATA_WAIT_S:.0f} s; "
                "check the brokers' health, then retry"
            )
        time.sleep(pause)
        pause = min(pause * 2, 1.0)


def _text(exc: BaseException) -> str:
    err = exc.args[0] if exc.args else None
    return err.str() if isinstance(err, KafkaError) else str(exc)


class KnownTopics:
    """The partition counts of the topics this process made sure of, by (bootstrap
    servers, topic): one describe (or creation) per topic per process. Bounded (least
    recently used out) and safe across threads."""

    def __init__(self, size: int = 4096) -> None:
        self.size = size
        self._counts: OrderedDict[tuple[str, str], int] = OrderedDict()
        self._lock = threading.Lock()

    def ensure(
        self,
        connection: KafkaConnection,
        topic: str,
        settings: TopicSettings,
        one_partition: bool = False,
        other: str = "--topic",
    ) -> int:
        key = (connection.bootstrap_servers, topic)
        with self._lock:
            if key in self._counts:
                self._counts.move_to_end(key)
                return self._counts[key]
        count = ensure_topic(connection, topic, settings, one_partition, other)
        with self._lock:
            self._counts[key] = count
            while len(self._counts) > self.size:
                self._counts.popitem(last=False)
        return count

    def forget(self, connection: KafkaConnection, topic: str) -> None:
        with self._lock:
            self._counts.pop((connection.bootstrap_servers, topic), None)


# this process's: the writer tasks' change topics, the commits' transaction topics
KNOWN = KnownTopics()
