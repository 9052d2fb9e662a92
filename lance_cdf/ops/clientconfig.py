"""Client settings from flags, files and the environment, and the one rule deciding what
of them may be printed.

Settings come from a Java-properties file (the format of Kafka's `client.properties`) and
from repeatable KEY=VALUE flags, the flags winning; any value may be `${env:NAME}` (or hold
it among other text), read from the environment so that no secret need sit in argv.

The redaction rule covers everything lance-cdf prints or logs: a setting is secret when
librdkafka documents it as sensitive, when it is a schema-registry credential, or when its
name says key / secret / token / password / credential (storage options); user-info in any
URL is hidden (`https://user:pass@host` -> `https://***@host`). The values of the secret
settings a command was given are also registered (`remember`) and scrubbed from any text
it prints (`scrub`: errors, log records)."""

from __future__ import annotations

import logging
import os
import re
import threading
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import javaproperties

from lance_cdf.errors import ClientConfigError, in_words

# librdkafka's properties flagged _RK_SENSITIVE (src/rdkafka_conf.c, confluentinc/librdkafka
# at 4c3b017, 2026-07), plus the alias of one of them and the JVM client's JAAS config
# (Spark's Kafka sink passes kafka.sasl.jaas.config through)
LIBRDKAFKA_SENSITIVE = frozenset(
    {
        "sasl.username",
        "sasl.password",
        "sasl.oauthbearer.config",
        "sasl.oauthbearer.client.secret",
        "sasl.oauthbearer.client.credentials.client.secret",
        "sasl.oauthbearer.assertion.private.key.file",
        "sasl.oauthbearer.assertion.private.key.passphrase",
        "sasl.oauthbearer.assertion.private.key.pem",
        "ssl.key.location",
        "ssl.key.password",
        "ssl.key.pem",
        "ssl_key",
        "ssl.ca.pem",
        "ssl.keystore.password",
        "ssl.truststore.password",
        "sasl.jaas.config",
    }
)
# confluent-kafka's schema-registry client: basic and bearer auth, the TLS client key
REGISTRY_SENSITIVE = frozenset(
    {
        "basic.auth.user.info",
        "bearer.auth.token",
        "bearer.auth.client.secret",
        "bearer.auth.client.id",
        "ssl.key.location",
        "ssl.key.password",
    }
)
# storage options (and any other setting) whose name says it holds a credential
SECRET_WORDS = (
    "key",
    "secret",
    "token",
    "password",
    "passwd",
    "credential",
    "passphrase",
    "jaas",
    "auth.user.info",
)
MASK = "***"

_ENV = re.compile(r"\$\{env:([^}]*)\}")
# the line terminators of a properties file (a form feed is whitespace there)
_LINE_END = re.compile(r"\r\n|\r|\n")
# scheme://user-info@ : everything between "//" and the last "@" before the host ends
_USERINFO = re.compile(r"(?P<scheme>[A-Za-z][A-Za-z0-9+.\-]*://)(?P<info>[^/@\s?#]+)@")


def is_secret(key: str) -> bool:
    """True for a setting whose value must never be printed (the key, prefixes such as
    Spark's `kafka.` or lance-cdf's `storage.` / `registry.` stripped by the caller or
    matched by the word rule)."""
    k = key.strip().lower()
    bare = k.split(".", 1)[1] if k.split(".", 1)[0] in ("kafka", "registry", "storage") else k
    if k in LIBRDKAFKA_SENSITIVE or bare in LIBRDKAFKA_SENSITIVE:
        return True
    if k in REGISTRY_SENSITIVE or bare in REGISTRY_SENSITIVE:
        return True
    return any(w in k for w in SECRET_WORDS)


def redact_url(text: str) -> str:
    """`text` with the user-info of every URL in it replaced by ***."""
    return _USERINFO.sub(lambda m: f"{m['scheme']}{MASK}@", text)


def redact(config: Mapping[str, object]) -> dict[str, str]:
    """Settings safe to print: secret values masked, URLs without user-info."""
    return {k: MASK if is_secret(k) else redact_url(str(v)) for k, v in config.items()}


# librdkafka's producer-only properties (C/P column "P" of CONFIGURATION.md, same commit as
# above) and the Python client's own producer callbacks: everything else a producer is given
# (connection, security, TLS verification, timeouts, DNS, proxies, ...) a consumer of the
# same cluster needs too
PRODUCER_ONLY = frozenset(
    {
        "acks",
        "batch.num.messages",
        "batch.size",
        "compression.codec",
        "compression.level",
        "compression.type",
        "delivery.report.only.error",
        "delivery.timeout.ms",
        "dr_cb",
        "dr_msg_cb",
        "enable.gapless.guarantee",
        "enable.idempotence",
        "linger.ms",
        "message.send.max.retries",
        "message.timeout.ms",
        "msg_order_cmp",
        "partitioner",
        "partitioner_cb",
        "produce.offset.report",
        "queue.buffering.backpressure.threshold",
        "queue.buffering.max.kbytes",
        "queue.buffering.max.messages",
        "queue.buffering.max.ms",
        "queuing.strategy",
        "request.required.acks",
        "request.timeout.ms",
        "retries",
        "sticky.partitioning.linger.ms",
        "transaction.timeout.ms",
        "transactional.id",
        "on_delivery",
    }
)


# librdkafka's consumer-only properties (C/P column "C" of CONFIGURATION.md, same commit as
# above) and the Python client's consumer callbacks
CONSUMER_ONLY = frozenset(
    {
        "auto.commit.enable",
        "auto.commit.interval.ms",
        "auto.offset.reset",
        "check.crcs",
        "consume.callback.max.messages",
        "consume_cb",
        "coordinator.query.interval.ms",
        "enable.auto.commit",
        "enable.auto.offset.store",
        "enable.partition.eof",
        "fetch.error.backoff.ms",
        "fetch.max.bytes",
        "fetch.message.max.bytes",
        "fetch.min.bytes",
        "fetch.queue.backoff.ms",
        "fetch.wait.max.ms",
        "group.id",
        "group.instance.id",
        "group.protocol",
        "group.protocol.type",
        "group.remote.assignor",
        "heartbeat.interval.ms",
        "isolation.level",
        "max.partition.fetch.bytes",
        "max.poll.interval.ms",
        "offset.store.method",
        "offset.store.path",
        "offset.store.sync.interval.ms",
        "offset_commit_cb",
        "on_commit",
        "partition.assignment.strategy",
        "queued.max.messages.kbytes",
        "queued.min.messages",
        "rebalance_cb",
        "session.timeout.ms",
    }
)

# The value of one setting of a Kafka or schema-registry client: a string, a number, a flag
# or a callback (error_cb, logger, oauth_cb). confluent-kafka takes them untyped, so Any
Setting = Any

# Given to every Kafka client lance-cdf creates, whatever the user's settings say: a
# metadata request never makes the broker create a topic with its own defaults (lance-cdf
# creates its topics on purpose, `kafka.topics.ensure_topic`; librdkafka's producers and
# admin clients allow it by default)
ALWAYS = {"allow.auto.create.topics": False}

# what each role drops of the user's settings: the other roles' own keys
_NOT_FOR = {
    "producer": CONSUMER_ONLY,
    "consumer": PRODUCER_ONLY,
    "admin": PRODUCER_ONLY | CONSUMER_ONLY,
}


@dataclass(frozen=True)
class KafkaConnection:
    """What the user gave to reach a Kafka cluster: its bootstrap servers and the client
    settings (`--producer-config` / `--consumer-config` and their files, the sink's
    `kafka.<setting>` options). The one place every Kafka client's settings are built:
    all of the user's settings but those of another role (a consumer does not get
    `acks`, a producer not `group.id`), the role's own `defaults` under them and its
    `fixed` keys over them, the bootstrap servers and `ALWAYS` last."""

    bootstrap_servers: str
    settings: Mapping[str, str] = field(default_factory=dict)
    flag: str = "producer"  # whose flags gave them (--producer-config, --consumer-config)

    def config(
        self,
        role: str,
        defaults: Mapping[str, Setting] | None = None,
        fixed: Mapping[str, Setting] | None = None,
    ) -> dict[str, Setting]:
        """The settings of a `role` ("producer", "consumer", "admin") client."""
        drop = _NOT_FOR[role]
        return {
            **(defaults or {}),
            **{k: v for k, v in self.settings.items() if k not in drop},
            **(fixed or {}),
            "bootstrap.servers": self.bootstrap_servers,
            **ALWAYS,
        }

    def producer(
        self,
        defaults: Mapping[str, Setting] | None = None,
        fixed: Mapping[str, Setting] | None = None,
    ) -> dict[str, Setting]:
        return self.config("producer", defaults, fixed)

    def consumer(
        self,
        defaults: Mapping[str, Setting] | None = None,
        fixed: Mapping[str, Setting] | None = None,
    ) -> dict[str, Setting]:
        return self.config("consumer", defaults, fixed)

    def admin(
        self,
        defaults: Mapping[str, Setting] | None = None,
        fixed: Mapping[str, Setting] | None = None,
    ) -> dict[str, Setting]:
        return self.config("admin", defaults, fixed)


# AWS client settings taken from a table's storage options (store_arguments' names: the
# long ones and the short ones object_store accepts) -> boto3's client argument
_AWS_CLIENT = {
    "aws_access_key_id": "aws_access_key_id",
    "aws_secret_access_key": "aws_secret_access_key",
    "aws_session_token": "aws_session_token",
    "aws_token": "aws_session_token",
    "aws_region": "region_name",
    "aws_default_region": "region_name",
}
# an SQS queue URL on AWS: https://sqs.<region>.amazonaws.com/<account>/<name>
_SQS_HOST = re.compile(r"sqs[.-]([a-z0-9-]+)\.amazonaws\.com(\.cn)?$")


def sqs_client_arguments(queue_url: str, storage_options: Mapping[str, str]) -> dict[str, str]:
    """Keyword arguments for `boto3.client("sqs", ...)` reading `queue_url` with the
    credentials and region of the database's storage options (the names pylance takes,
    `aws_access_key_id`, `aws_region`, ...; none given: boto3's own chain, the AWS_*
    variables and instance roles, as obstore's). The endpoint is the queue URL's own host
    (AWS's, or a local server's that serves S3 and SQS alike); the region is the queue
    URL's on AWS, else the storage options'."""
    from urllib.parse import urlparse

    from lance_cdf.format.objectstore import store_arguments

    config = store_arguments("s3://bucket", dict(storage_options))["config"]
    out = {_AWS_CLIENT[k]: str(v) for k, v in config.items() if k in _AWS_CLIENT}
    parsed = urlparse(queue_url)
    out["endpoint_url"] = f"{parsed.scheme}://{parsed.netloc}"
    on_aws = _SQS_HOST.match(parsed.hostname or "")
    if on_aws:
        out["region_name"] = on_aws.group(1)
    out.setdefault("region_name", "us-east-1")
    return out


def registry_config(
    url: str,
    settings: Mapping[str, str] | None = None,
    defaults: Mapping[str, Setting] | None = None,
) -> dict[str, Setting]:
    """The settings of a schema-registry client: the role's `defaults` under the user's
    `--registry-config` settings (the sink's `registry.<setting>`), and the URL."""
    return {**(defaults or {}), **(settings or {}), "url": url}


# -- the values a command was given, scrubbed from whatever it prints -----------------------
_secrets: set[str] = set()
_lock = threading.Lock()


def remember(config: Mapping[str, object]) -> None:
    """Register the values of the secret settings of `config` (and URL user-info in any
    value) for `scrub`."""
    found = {str(v) for k, v in config.items() if is_secret(k) and len(str(v)) >= 3}
    for v in config.values():
        found.update(m["info"] for m in _USERINFO.finditer(str(v)))
        found.update(p for m in _USERINFO.finditer(str(v)) for p in m["info"].split(":")[1:])
    with _lock:
        _secrets.update(s for s in found if len(s) >= 3)


def remember_url(url: str) -> None:
    remember({"url": url})


def scrub(text: str) -> str:
    """`text` with URL user-info and every remembered secret value replaced by ***."""
    out = redact_url(text)
    with _lock:
        secrets = sorted(_secrets, key=len, reverse=True)
    for s in secrets:
        out = out.replace(s, MASK)
    return out


class ScrubFilter(logging.Filter):
    """A logging filter that scrubs a record's message (`scrub`): installed on the handlers
    of the commands (the confluent client's and httpx's request logs name the registry
    URL with its user-info)."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        clean = scrub(message)
        if clean != message:
            record.msg, record.args = clean, None
        return True


def scrub_logging(logger: logging.Logger | None = None) -> None:
    """Put a `ScrubFilter` on every handler of `logger` (default: the root logger)."""
    for handler in (logger or logging.getLogger()).handlers:
        if not any(isinstance(f, ScrubFilter) for f in handler.filters):
            handler.addFilter(ScrubFilter())


# -- reading settings -------------------------------------------------------------------------
def expand_env(value: str, environ: Mapping[str, str] | None = None, what: str = "") -> str:
    """`value` with every `${env:NAME}` replaced by the variable's value; a missing
    variable is an error naming the variable (never a value)."""
    env = os.environ if environ is None else environ

    def sub(m: re.Match[str]) -> str:
        name = m[1]
        if not name or name not in env:
            where = f" (in {what})" if what else ""
            raise ClientConfigError(
                f"environment variable {name!r}{where} is not set; export it or give the value "
                "another way"
            )
        return env[name]

    return _ENV.sub(sub, value)


def parse_properties(text: str, source: str = "properties") -> dict[str, str]:
    """The key/value pairs of a Java-properties text as java.util.Properties reads them
    (javaproperties): `key=value`, `key: value`, `key value`, `#` / `!` comments,
    backslash line continuations and escapes. A later key wins; a malformed `\\uXXXX`
    escape is an error naming the line."""
    out: dict[str, str] = {}
    line = 1  # where the element being read starts
    try:
        for element in javaproperties.parse(text):
            if isinstance(element, javaproperties.KeyValue):
                out[element.key] = element.value
            line += len(_LINE_END.findall(element.source))
    except javaproperties.InvalidUEscapeError:
        raise ClientConfigError(
            f"{source}:{line}: malformed \\uXXXX escape; write 4 hex digits"
        ) from None
    return out


def read_properties(path: str, flag: str) -> dict[str, str]:
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except OSError as exc:
        raise ClientConfigError(
            f"cannot read {flag} {path} ({in_words(exc)}); check the path"
        ) from None
    except UnicodeDecodeError:
        raise ClientConfigError(f"{flag} {path} is not UTF-8 text; save it as UTF-8") from None
    return parse_properties(text, path)


def parse_pairs(pairs: Iterable[str], flag: str) -> dict[str, str]:
    """KEY=VALUE flags as a dict (a later key wins); the error never repeats the value."""
    out: dict[str, str] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key.strip():
            shown = key.strip() if sep else "(no '=')"
            raise ClientConfigError(f"{flag} {shown!r} is not KEY=VALUE; write {flag} KEY=VALUE")
        out[key.strip()] = value
    return out


def settings(
    pairs: Iterable[str] = (),
    file: str | None = None,
    flag: str = "--config",
    file_flag: str = "--config-file",
    environ: Mapping[str, str] | None = None,
) -> dict[str, str]:
    """The settings of one client: `file` (Java properties) overridden by the KEY=VALUE
    `pairs`, `${env:NAME}` expanded in every value; the secret ones are `remember`ed."""
    merged: dict[str, tuple[str, str]] = {}
    if file:
        merged.update(
            {k: (v, f"{file_flag} {file}") for k, v in read_properties(file, file_flag).items()}
        )
    merged.update({k: (v, f"{flag} {k}") for k, v in parse_pairs(pairs, flag).items()})
    out = {k: expand_env(v, environ, what) for k, (v, what) in merged.items()}
    remember(out)
    return out


__all__ = [
    "ALWAYS",
    "CONSUMER_ONLY",
    "KafkaConnection",
    "MASK",
    "PRODUCER_ONLY",
    "ScrubFilter",
    "expand_env",
    "is_secret",
    "parse_pairs",
    "parse_properties",
    "read_properties",
    "redact",
    "redact_url",
    "registry_config",
    "remember",
    "remember_url",
    "scrub",
    "scrub_logging",
    "settings",
    "sqs_client_arguments",
]
