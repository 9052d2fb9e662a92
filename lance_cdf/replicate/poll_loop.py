"""The poll loop of a replicator, one table's or a whole database's: poll what has arrived
(error events sorted out), hand it over, and stop when told or once idle. What the loop
hands the records to, how long a poll waits and what counts as idle is the `Polled`'s
(`Replicator`, `DatabaseReplicator`)."""

from __future__ import annotations

import contextlib
import gc
import threading
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING, Protocol

from confluent_kafka import Consumer, KafkaError, KafkaException

from lance_cdf.errors import ConsumerFatalError, LanceCdfError
from lance_cdf.kafka.endpoints import DENIED, denied
from lance_cdf.replicate.replicate_settings import BatchSettings

if TYPE_CHECKING:
    from confluent_kafka import Message

# (s) a batch's drain: what the fetcher already holds is handed out within it (a zero
# timeout never hands it out); a record arriving later than this after the last one
# starts the next batch
DRAIN_S = 0.01


class Polled(Protocol):
    """What the poll loop drives."""

    def next_wait(self) -> float:
        """Called before each poll: how long it waits for a first record."""
        ...

    def topic_missing(self, m: Message) -> None:
        """An error event: a topic polled does not exist (yet, or any more)."""
        ...

    def consume_failed(self, m: Message, err: KafkaError) -> LanceCdfError:
        """What any other error event (but a partition's end) stops the loop with."""
        ...

    def handle(self, msgs: list[Message], poll_s: float) -> None:
        """The records of one poll (perhaps none), which took `poll_s` seconds."""
        ...

    def idle(self, idle_timeout: float, last_data: float) -> bool:
        """After a poll that got nothing: whether to stop (`last_data`: when records last
        came, time.monotonic(); 0.0: none yet)."""
        ...


def run_polls(
    consumer: Consumer,
    batching: BatchSettings,
    stop: threading.Event,
    polled: Polled,
    idle_timeout: float | None = None,
) -> None:
    """Poll `consumer` and hand each poll's records to `polled` until `stop` is set, or
    (with `idle_timeout`) until `polled` says it is idle. With `batching.pause_gc` the
    cyclic garbage collector is off while a batch is polled and handled."""
    last_data = 0.0
    while not stop.is_set():
        wait = polled.next_wait()
        # (the batch holds no reference cycles: reference counts free it)
        with gc_paused(batching.pause_gc):
            t0 = time.perf_counter()
            msgs = poll_batch(consumer, batching, wait, stop, polled)
            polled.handle(msgs, time.perf_counter() - t0)
            got = bool(msgs)
            del msgs
        if got:
            last_data = time.monotonic()
        elif idle_timeout is not None and polled.idle(idle_timeout, last_data):
            break


def poll_batch(
    consumer: Consumer,
    batching: BatchSettings,
    wait: float,
    stop: threading.Event,
    polled: Polled,
) -> list[Message]:
    """The records of one poll (`consume_ready`), its error events sorted out: a missing
    topic told to `polled`, a partition's end skipped, a fatal error (the consumer is
    unusable) raised as `ConsumerFatalError`, anything else raised as `polled` names it."""
    batch: list[Message] = []
    window = batching.max_batch_interval
    try:
        got = consume_ready(consumer, batching.max_batch_rows, wait, window, stop)
    except KafkaException as exc:
        if exc.args and isinstance(exc.args[0], KafkaError) and is_fatal(exc.args[0]):
            raise ConsumerFatalError(f"the Kafka consumer failed: {exc.args[0].str()}") from exc
        raise
    for m in got:
        err = m.error()
        if err is None:
            batch.append(m)
        elif is_fatal(err):
            raise ConsumerFatalError(f"the Kafka consumer failed: {err.str()}")
        elif err.code() == KafkaError.UNKNOWN_TOPIC_OR_PART:
            polled.topic_missing(m)
        elif err.code() != KafkaError._PARTITION_EOF:
            raise polled.consume_failed(m, err)
    return batch


def is_fatal(err: KafkaError) -> bool:
    """Whether librdkafka made the consumer unusable: its fatal error event (code _FATAL,
    whose `fatal()` confluent-kafka does not always set; the cause in its text)."""
    return bool(err.fatal()) or err.code() == KafkaError._FATAL


def consume_ready(
    consumer: Consumer, limit: int, wait: float, window: float, stop: threading.Event
) -> list[Message]:
    """Up to `limit` records (and error events) as soon as they are there: waits up to
    `wait` s for the first, then takes what keeps arriving (DRAIN_S apart) for at most
    `window` s from the first. librdkafka's consume(n, t) returns only when n records
    have come or t has passed, so a batch asked with consume(100_000, 1 s) held every
    record of a quiet topic for the whole second, where consume(1, 1 s) returns with the
    first record (docs/benchmarks.md, "Latency under load")."""
    got = consumer.consume(1, wait) if wait > 0 else []
    if not got:
        return []
    out = list(got)
    deadline = time.monotonic() + window
    while len(out) < limit and not stop.is_set() and time.monotonic() < deadline:
        more = consumer.consume(min(100_000, limit - len(out)), DRAIN_S)
        if not more:
            break
        out.extend(more)
    return out


def consume_error(
    err: KafkaError, topic: str, group_id: str, bootstrap_servers: str, topic_flag: str
) -> LanceCdfError:
    """What a consumer's error while polling `topic` stops the replicator with: an ACL
    denial on the group or the topic named in one line (`topic_flag`: the flag that names
    another topic), anything else as Kafka said it."""
    if err.code() == KafkaError.GROUP_AUTHORIZATION_FAILED:
        return denied(
            "consumer group", group_id, "Read", bootstrap_servers, "consumer", err, "--group-id"
        )
    if err.code() in DENIED:
        return denied(
            "topic", topic, "Describe and Read", bootstrap_servers, "consumer", err, topic_flag
        )
    return LanceCdfError(f"Kafka error while consuming {topic!r}: {err}")


@contextlib.contextmanager
def gc_paused(pause: bool) -> Iterator[None]:
    """With `pause`, Python's cyclic garbage collector off for the block (as it was
    after): a process-wide setting, so only where the process is the replicator's own
    (`lance-cdf replicate`)."""
    if not pause:
        yield
        return
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()
