"""Reachability checks of the Kafka broker, topic and schema registry, shared by
`lance-cdf publish` and `lance-cdf replicate`: each fails fast with the address and the fix."""

from __future__ import annotations

import re
import threading
import time
from concurrent.futures import Future, wait
from typing import TypeVar

from confluent_kafka import (
    OFFSET_BEGINNING,
    Consumer,
    KafkaError,
    KafkaException,
    TopicPartition,
)
from confluent_kafka.admin import AdminClient, ClusterMetadata
from confluent_kafka.schema_registry import SchemaRegistryClient

from lance_cdf.errors import KafkaAuthorizationError, PublishError
from lance_cdf.ops.clientconfig import (
    KafkaConnection,
    Setting,
    redact_url,
    registry_config,
    scrub,
)

_BROKER_PREFIX = re.compile(r"^\S+/\S+: ")

_T = TypeVar("_T")


class _Causes:
    """librdkafka's `error_cb` and `logger` while a check waits: what it knows of why the
    broker does not answer. Authentication and TLS failures, and a protocol that does not
    match the listener's, are decisive (no retry can help); a refused connection is not
    (the broker may be starting). Nothing here is printed but the one line of `message`."""

    REPEATS = 2  # disconnects of one kind before they are taken as the listener's answer

    def __init__(self, protocol: str) -> None:
        self.protocol = protocol.upper()
        self.decisive: tuple[str, str] | None = None  # (kind, librdkafka's text)
        self.last = ""
        self._seen: dict[str, int] = {}

    def __call__(self, err: KafkaError) -> None:  # error_cb
        code, text = err.code(), err.str()
        if code != KafkaError._ALL_BROKERS_DOWN:  # says nothing of why
            self.last = text
        if code in (KafkaError._AUTHENTICATION, KafkaError.SASL_AUTHENTICATION_FAILED):
            self._decide("auth", text)
        elif code == KafkaError._SSL:
            self._classify(text, tls_error=True)
        elif code == KafkaError._TRANSPORT:
            self._classify(text, tls_error=False)

    def log(self, level: int, fmt: str, *args: object) -> None:  # logger (logging.Logger.log)
        if len(args) < 3 or str(args[0]) != "FAIL":  # (facility, client name, text)
            return
        text = _BROKER_PREFIX.sub("", str(args[-1]))  # "[proto://]host:port/id: "
        self.last = text
        if "Authentication" in text or "SASL authentication" in text:
            self._decide("auth", text)
        else:
            self._classify(text, tls_error="SSL handshake failed" in text)

    def _classify(self, text: str, tls_error: bool) -> None:
        low = text.lower()
        if tls_error and "verify failed" in low:
            self._decide("verify", text)
        elif "connecting to a plaintext" in low or "wrong version number" in low:
            self._decide("no-tls", text)
        elif tls_error:
            self._decide("tls", text)
        elif "connecting to a ssl listener" in low:
            self._decide("expects-tls", text)
        elif "in state APIVERSION_QUERY" in text and "SSL" not in self.protocol:
            # a TLS listener closes on a plaintext ApiVersion request
            self._count("expects-tls", text)
        elif "SSL connection closed by peer" in text and "in state UP" in text:
            if self.protocol == "SSL":  # TLS went through, the listener wants SASL next
                self._count("needs-sasl", text)

    def _count(self, kind: str, text: str) -> None:
        self._seen[kind] = self._seen.get(kind, 0) + 1
        if self._seen[kind] >= self.REPEATS:
            self._decide(kind, text)

    def _decide(self, kind: str, text: str) -> None:
        if self.decisive is None:
            self.decisive = (kind, text)

    def message(self, bootstrap_servers: str, flag: str) -> str:
        """One line naming the decisive cause and the setting to fix."""
        assert self.decisive is not None
        kind, text = self.decisive[0], scrub(self.decisive[1])
        where = f"the Kafka broker at {redact_url(bootstrap_servers)}"
        settings = f"--{flag}-config-file (or --{flag}-config)"
        return {
            "auth": f"{where} refused the client's credentials ({text}); check sasl.username, "
            f"sasl.password and sasl.mechanism in {settings}.",
            "verify": f"TLS verification of {where} failed ({text}); set ssl.ca.location in "
            f"{settings} to the CA that signed the broker's certificate.",
            "no-tls": f"{where} does not speak TLS on this port ({text}); set "
            f"security.protocol to PLAINTEXT or SASL_PLAINTEXT in {settings}, or use the "
            "broker's TLS listener.",
            "tls": f"TLS with {where} failed ({text}); check the ssl.* settings in {settings}.",
            "expects-tls": f"{where} expects another protocol on this port ({text}); for a "
            f"TLS listener set security.protocol=SSL or SASL_SSL (and ssl.ca.location) in "
            f"{settings}.",
            "needs-sasl": f"{where} closes the connection once TLS is up ({text}): its "
            f"listener expects SASL; set security.protocol=SASL_SSL, sasl.mechanism, "
            f"sasl.username and sasl.password in {settings}.",
        }[kind]


def _admin(
    bootstrap_servers: str, config: dict[str, Setting] | None, causes: _Causes
) -> AdminClient:
    # librdkafka's own messages go to `causes` only (never to the terminal: they may
    # name settings), at INFO so that each failed connection is seen with its reason
    connection = KafkaConnection(bootstrap_servers, config or {})
    return AdminClient(
        connection.admin(fixed={"error_cb": causes, "logger": causes, "log_level": 6})
    )


def _metadata(
    admin: AdminClient,
    causes: _Causes,
    bootstrap_servers: str,
    flag: str,
    timeout: float,
    topic: str | None = None,
) -> ClusterMetadata:
    """`admin.list_topics`, in short steps that serve `error_cb`: a decisive cause ends
    the wait at once, named; running out of time names the address and the last error."""
    deadline = time.monotonic() + timeout
    while True:
        step = max(0.05, min(0.5, deadline - time.monotonic()))
        try:
            return admin.list_topics(topic=topic, timeout=step)
        except KafkaException as exc:
            admin.poll(0)  # serves error_cb
            if causes.decisive is not None:
                raise PublishError(causes.message(bootstrap_servers, flag)) from None
            if time.monotonic() >= deadline:
                last = scrub(causes.last or str(exc))
                raise PublishError(
                    f"cannot reach a Kafka broker at {redact_url(bootstrap_servers)} within "
                    f"{timeout:.0f}s ({last}); check --bootstrap-servers and that the broker "
                    "is running."
                ) from None


def check_broker(
    bootstrap_servers: str,
    config: dict[str, Setting] | None = None,
    timeout: float = 10,
    flag: str = "producer",
) -> None:
    """Fail within `timeout` seconds if no broker answers, naming the address; at once,
    naming the cause and the setting to fix, if the broker refuses the client
    (credentials, TLS verification, protocol). `flag`: whose settings ("producer",
    "consumer") the message points at."""
    causes = _Causes(str((config or {}).get("security.protocol", "PLAINTEXT")))
    _metadata(_admin(bootstrap_servers, config, causes), causes, bootstrap_servers, flag, timeout)


DENIED = (KafkaError.TOPIC_AUTHORIZATION_FAILED, KafkaError.GROUP_AUTHORIZATION_FAILED)


def denied(
    kind: str,
    name: str,
    operations: str,
    bootstrap_servers: str,
    flag: str,
    cause: object,
    other: str,
) -> KafkaAuthorizationError:
    """The one line for an ACL that denies the client `operations` on `kind` `name`
    ("topic", "consumer group"); `other`: the flag that names another one."""
    text = cause.str() if isinstance(cause, KafkaError) else str(cause)
    return KafkaAuthorizationError(
        f"the client is not authorized to use {kind} {name!r} on "
        f"{redact_url(bootstrap_servers)} ({scrub(text)}); grant its principal (sasl.username "
        f"in --{flag}-config-file) {operations} on the {kind} (kafka-acls --add), or name "
        f"another with {other}."
    )


def _kafka_error(exc: KafkaException) -> KafkaError | None:
    err = exc.args[0] if exc.args else None
    return err if isinstance(err, KafkaError) else None


def check_consumer_access(
    bootstrap_servers: str,
    topic: str,
    group: str,
    config: dict[str, Setting] | None = None,
    transaction_topic: str | None = None,
    timeout: float = 10,
) -> None:
    """What `replicate` needs of the broker's ACLs, asked before anything is applied:
    Describe and Read on `topic` and `transaction_topic` (those that exist; Read is tried
    with one fetch from the start of a partition) and the consumer group's offsets. A
    denial raises `KafkaAuthorizationError` naming it; a check that cannot finish within
    `timeout` is left to the run (which names a denial just the same)."""
    causes = _Causes(str((config or {}).get("security.protocol", "PLAINTEXT")))
    admin = _admin(bootstrap_servers, config, causes)
    deadline = time.monotonic() + timeout
    names = {topic: "--topic"}
    if transaction_topic:
        names[transaction_topic] = "--transaction-topic (or --no-transaction-topic)"
    consumer = _probe_consumer(bootstrap_servers, group, config, causes)
    try:
        first = _first_partitions(consumer, names, bootstrap_servers, timeout)
        if first is None:
            return  # the broker did answer check_broker: left to the run
        _check_group(admin, group, bootstrap_servers, timeout)
        _check_reads(consumer, first, names, group, bootstrap_servers, deadline)
    finally:
        consumer.close()


def _probe_consumer(
    bootstrap_servers: str, group: str, config: dict[str, Setting] | None, causes: _Causes
) -> Consumer:
    """A consumer of `group` that asks what `check_consumer_access` checks, and no more."""
    # no metadata request creates a topic (clientconfig.ALWAYS): a transaction topic made
    # here would hold the replicator waiting for versions no publisher writes
    return Consumer(
        KafkaConnection(bootstrap_servers, config or {}).consumer(
            fixed={
                "group.id": group,
                "enable.auto.commit": False,
                "enable.partition.eof": True,
                # one record answers the Read check: no prefetch of a long topic's backlog
                "queued.min.messages": 1,
                "queued.max.messages.kbytes": 64,
                "error_cb": causes,
                "logger": causes,
                "log_level": 6,
            }
        )
    )


def _first_partitions(
    consumer: Consumer, names: dict[str, str], bootstrap_servers: str, timeout: float
) -> list[TopicPartition] | None:
    """The first partition of each topic of `names` (topic -> the flag naming it) that
    exists, from its start; a topic the client may not describe raises; None when the
    broker did not answer."""
    first: list[TopicPartition] = []
    for name, other in names.items():
        try:
            found = consumer.list_topics(name, timeout=timeout).topics.get(name)
        except KafkaException:
            return None
        err = found.error if found is not None else None
        if err is not None and err.code() == KafkaError.TOPIC_AUTHORIZATION_FAILED:
            raise denied(
                "topic", name, "Describe and Read", bootstrap_servers, "consumer", err, other
            )
        if found is not None and err is None and found.partitions:
            first.append(TopicPartition(name, min(found.partitions), OFFSET_BEGINNING))
    return first


def _check_group(admin: AdminClient, group: str, bootstrap_servers: str, timeout: float) -> None:
    """Raise if the client may not use consumer group `group` (Describe on it)."""
    # the group (FindCoordinator, DescribeGroups: Describe on the group); the admin
    # API answers a denial at once, where the consumer's committed() retries it.
    # Not list_consumer_group_offsets: librdkafka 2.16 dies of SIGSEGV in its own
    # thread when the coordinator answers that offset fetch with NOT_COORDINATOR (a
    # fresh broker creating __consumer_offsets, a coordinator moving; open upstream:
    # https://github.com/confluentinc/librdkafka/issues/5040): it killed the
    # replicator at start in bench runs, DescribeGroups never
    # (docs/benchmarks.md, "Inside the publisher")
    asked = admin.describe_consumer_groups([group], request_timeout=max(1.0, timeout / 2))
    try:
        for future in asked.values():
            future.result(timeout=max(1.0, timeout / 2))
    except KafkaException as exc:
        err = _kafka_error(exc)
        if err is not None and err.code() == KafkaError.GROUP_AUTHORIZATION_FAILED:
            raise denied(
                "consumer group", group, "Read", bootstrap_servers, "consumer", err, "--group-id"
            ) from None
    except Exception:  # noqa: BLE001 (not an authorization answer: left to the run)
        pass


def _check_reads(
    consumer: Consumer,
    first: list[TopicPartition],
    names: dict[str, str],
    group: str,
    bootstrap_servers: str,
    deadline: float,
) -> None:
    """Raise if a fetch from `first` (one partition per topic) is denied: each answered
    with a record or the partition's end by `deadline` is allowed."""
    topic = next(iter(names))  # the change topic: `names` lists it first
    answered: set[str] = set()  # a record or the partition's end: Read is allowed
    consumer.assign(first)
    while len(answered) < len(first) and time.monotonic() < deadline:
        for m in consumer.consume(len(first), 0.2):
            err = m.error()
            if err is not None and err.code() == KafkaError.GROUP_AUTHORIZATION_FAILED:
                raise denied(
                    "consumer group",
                    group,
                    "Read",
                    bootstrap_servers,
                    "consumer",
                    err,
                    "--group-id",
                )
            if err is not None and err.code() in DENIED:
                name = m.topic() or topic
                raise denied(
                    "topic",
                    name,
                    "Describe and Read",
                    bootstrap_servers,
                    "consumer",
                    err,
                    names.get(name, "--topic"),
                )
            if err is None or err.code() == KafkaError._PARTITION_EOF:
                answered.add(m.topic() or "")


def check_registry(url: str, config: dict[str, Setting] | None = None) -> None:
    """Fail, naming the cause and the setting to fix, if the registry refuses the
    credentials (HTTP 401/403), its certificate does not verify, or it cannot be reached."""
    try:
        SchemaRegistryClient(registry_config(url, config)).get_subjects()
    except Exception as exc:  # the client raises several types: all end here, named
        # neither the URL's user-info nor a secret the client repeats
        raise PublishError(_registry_cause(redact_url(url), exc)) from None


def _registry_cause(where: str, exc: Exception) -> str:
    status = getattr(exc, "http_status_code", None)
    text = scrub(str(exc))
    settings = "--registry-config-file (or --registry-config)"
    if status in (401, 403):
        verb = "refused the credentials" if status == 401 else "denied the client access"
        return (
            f"the schema registry at {where} {verb} (HTTP {status}); check "
            f"basic.auth.user.info (user:password) in {settings}, or the URL's user-info."
        )
    chain: list[BaseException] = []
    seen: BaseException | None = exc
    while seen is not None and len(chain) < 8:  # httpx wraps ssl's error
        chain.append(seen)
        seen = seen.__cause__ or seen.__context__
    if any(
        "CERTIFICATE_VERIFY_FAILED" in str(e) or "certificate verify failed" in str(e)
        for e in chain
    ):
        return (
            f"TLS verification of the schema registry at {where} failed (certificate verify "
            f"failed); set ssl.ca.location in {settings} to the CA that signed its certificate."
        )
    if any("WRONG_VERSION_NUMBER" in str(e) or "wrong version number" in str(e) for e in chain):
        return (
            f"the schema registry at {where} does not speak TLS on this port ({text}); "
            "use its http:// URL (or its TLS port) in --schema-registry."
        )
    return (
        f"cannot reach the schema registry at {where} ({text}); check "
        "--schema-registry (for Apicurio: http://HOST:PORT/apis/ccompat/v7)."
    )


def first_failure(checks: Future[_T], stopping: threading.Event, within: float = 12) -> None:
    """Wait up to `within` seconds (or until `stopping`) for `checks` to end and raise
    their error, if any: a caller that starts something slow next (publish: the JVM)
    ends in seconds instead when a check fails. Checks still running are left running."""
    deadline = time.monotonic() + within
    while not stopping.is_set() and time.monotonic() < deadline:
        done, _ = wait([checks], timeout=0.2)
        if done:
            if checks.exception() is not None:
                checks.result()  # raises it
            return
