"""The flags several commands share, their parsing, and the signal handling of the
long-running commands."""

from __future__ import annotations

import argparse
import contextlib
import signal
import threading
from collections.abc import Callable, Iterable, Iterator
from types import FrameType
from typing import TYPE_CHECKING, Any, TypeAlias

from lance_cdf.spark.source.idle_polls import (
    EVENTS_POLL_MAX,
    IDLE_POLL_MAX,
    IDLE_POLL_MAX_LOCAL,
    idle_poll_max,
)

if TYPE_CHECKING:
    from lance_cdf.format.definitions import IndexDefinition
    from lance_cdf.kafka.topic_settings import TopicSettings

# what `add_subparsers` returns: each command's parser is made with its `add_parser`
Subcommands: TypeAlias = "argparse._SubParsersAction[argparse.ArgumentParser]"


EXAMPLES = """examples:
  lance-cdf changes /data/events.lance --from 3 --to 9
  lance-cdf status --table /data/events.lance --checkpoint /data/ck/events
  lance-cdf changes /data/events.lance --from 1 --format jsonl --columns id,name
  lance-cdf changes file:///data/events.lance --from 5 --format parquet --output changes.parquet
  lance-cdf changes /data/events.lance --from 3 --to 9 --net --drop-unchanged-updates
  lance-cdf changes /data/events.lance --snapshot --from 7 --format jsonl
  lance-cdf changes --database /data/lancedb sales.orders --from 2
"""


def idle_poll_max_flag(value: str) -> float:
    """--idle-poll-max: seconds >= 0 (argparse reports a bad value as a usage error)."""
    from lance_cdf.errors import LanceCdfError

    try:
        return idle_poll_max(value)
    except LanceCdfError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def csv_list(value: str) -> list[str]:
    return [c.strip() for c in value.split(",") if c.strip()]


def kafka_endpoint_flags(parser: argparse.ArgumentParser, topic_required: bool = True) -> None:
    """The broker, topic and schema registry publish writes to and replicate reads from."""
    parser.add_argument("--bootstrap-servers", required=True, metavar="HOST:PORT")
    parser.add_argument("--topic", required=topic_required)
    parser.add_argument(
        "--schema-registry", required=True, metavar="URL", help="Confluent-compatible registry URL"
    )


def client_settings_flags(parser: argparse.ArgumentParser, client: str, table: str) -> None:
    """The repeatable KEY=VALUE settings passed through to Kafka, the registry and storage,
    and the Java-properties files Kafka and registry settings can come from instead (a
    flag wins over its file; any value may be ${env:NAME})."""
    for flag, help_text in (
        (f"--{client}-config", f"{client} setting, e.g. security.protocol=SASL_SSL"),
        (
            "--registry-config",
            "schema registry client setting, e.g. basic.auth.user.info=${env:REGISTRY_AUTH}",
        ),
        ("--storage-option", f"storage option for {table}, e.g. aws_region=eu-west-1"),
    ):
        parser.add_argument(
            flag,
            action="append",
            default=[],
            metavar="KEY=VALUE",
            help=help_text + " (repeatable; ${env:NAME} reads a variable)",
        )
    for name in (client, "registry"):
        parser.add_argument(
            f"--{name}-config-file",
            default=None,
            metavar="FILE",
            help=f"{name} settings in Java-properties form (Kafka's "
            f"client.properties); --{name}-config flags win",
        )


def client_settings(args: argparse.Namespace, name: str) -> dict[str, str]:
    """The settings of one client (`producer`, `consumer`, `registry`): its file, then its
    flags, ${env:NAME} expanded; the secret values remembered for redaction."""
    from lance_cdf.ops.clientconfig import settings

    flag = f"--{name.replace('_', '-')}"
    return settings(
        getattr(args, name),
        getattr(args, f"{name}_file", None),
        flag=flag,
        file_flag=f"{flag}-file",
    )


def positive_int(value: str) -> int:
    try:
        number = int(value)
    except ValueError:
        number = 0
    if number < 1:
        raise argparse.ArgumentTypeError(f"{value!r} is not a whole number of at least 1")
    return number


def topic_flags(parser: argparse.ArgumentParser) -> None:
    """How publish creates the topics it writes that do not exist yet (an existing topic
    is used as it is)."""
    group = parser.add_argument_group(
        "new topics (created with CreateTopics; one that exists is used as it is)"
    )
    group.add_argument(
        "--partitions",
        type=positive_int,
        default=None,
        metavar="N",
        help="partitions of a new change topic (default: the broker's "
        "num.partitions; with --database, one per writer)",
    )
    group.add_argument(
        "--replication-factor",
        type=positive_int,
        default=None,
        metavar="N",
        help="replication factor of new topics (default: the broker's default.replication.factor)",
    )
    group.add_argument(
        "--topic-config",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="topic setting of new topics, e.g. min.insync.replicas=2 (repeatable; "
        "the transaction topic takes all but cleanup.policy)",
    )


def topic_settings(args: argparse.Namespace) -> TopicSettings:
    from lance_cdf.kafka.topic_settings import TopicSettings
    from lance_cdf.ops.clientconfig import parse_pairs

    config = parse_pairs(args.topic_config, "--topic-config")
    return TopicSettings.of(args.partitions, args.replication_factor, config)


def metrics_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--metrics-port",
        type=int,
        default=None,
        metavar="PORT",
        help="serve Prometheus metrics at http://HOST:PORT/metrics (lag, "
        "events/s, batches, failures; 0 = any free port)",
    )
    parser.add_argument(
        "--metrics-host",
        default="127.0.0.1",
        metavar="HOST",
        help="address the metrics endpoint listens on (default 127.0.0.1; "
        "0.0.0.0 for a scraper on another host)",
    )


def seconds(value: str) -> float:
    text = value.strip().lower()
    try:
        if text.endswith("ms"):
            return float(text[:-2]) / 1000
        return float(text[:-1] if text.endswith("s") else text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{value!r} is not a duration (e.g. 1, 2.5s, 500ms)"
        ) from None


def trigger_interval(value: str) -> str:
    """A micro-batch interval for Spark's processingTime trigger: Spark's own form
    ('1 second', '500 milliseconds') as it is, the replicate-style 500ms / 2s / 1.5 as
    milliseconds (Spark rejects '500ms')."""
    if any(c.isspace() for c in value.strip()):
        return value.strip()
    return f"{round(seconds(value) * 1000)} milliseconds"


def registry_url(args: argparse.Namespace) -> str:
    """--schema-registry with ${env:NAME} expanded (user-info need not sit in argv); the
    URL's user-info is remembered for redaction."""
    from lance_cdf.ops.clientconfig import expand_env, remember_url

    url = expand_env(args.schema_registry, what="--schema-registry")
    remember_url(url)
    return url


def storage_options(pairs: Iterable[str], flag: str = "--storage-option") -> dict[str, str]:
    """Repeatable KEY=VALUE flags, ${env:NAME} expanded, secret values remembered."""
    from lance_cdf.ops.clientconfig import settings

    return settings(pairs, flag=flag)


def index_flag(value: str) -> IndexDefinition:
    """`--index NAME=TYPE:COLUMN[:k=v,...]` as an index definition: a replica-only index
    (`replicate --index`); each value an int, a float, true/false, or else text."""
    from lance_cdf.format.definitions import IndexDefinition

    name, eq, rest = value.partition("=")
    parts = rest.split(":", 2)
    if not eq or not name or len(parts) < 2 or not parts[0] or not parts[1]:
        raise argparse.ArgumentTypeError(
            f"{value!r}: give NAME=TYPE:COLUMN[:k=v,...], e.g. "
            "title_fts=INVERTED:title:with_position=true or "
            "emb_idx=IVF_PQ:vector:metric=cosine,num_partitions=256,num_sub_vectors=16"
        )
    params: dict[str, object] = {}
    for pair in parts[2].split(",") if len(parts) == 3 and parts[2] else []:
        k, eq, v = pair.partition("=")
        if not eq or not k:
            raise argparse.ArgumentTypeError(f"{value!r}: parameter {pair!r} is not k=v")
        params[k] = _scalar(v)
    return IndexDefinition.of(name, parts[0].upper(), (parts[1],), params)


def _scalar(v: str) -> object:
    if v.lower() in ("true", "false"):
        return v.lower() == "true"
    for kind in (int, float):
        try:
            return kind(v)
        except ValueError:
            pass
    return v


def database_flags(pub: argparse.ArgumentParser) -> None:
    """publish --database: every matching table of a database, one topic each."""
    for action in pub._actions:  # --topic: or --topic-prefix with --database
        if action.dest == "topic":
            action.required = False
    group = pub.add_argument_group("a whole database (instead of --table and --topic)")
    group.add_argument(
        "--database",
        default=None,
        metavar="URI",
        help="a LanceDB database / Lance directory namespace: publish every "
        "table (new ones within 10 s), each to PREFIX.<qualified name>",
    )
    group.add_argument(
        "--topic-prefix",
        default=None,
        metavar="PREFIX",
        help="with --database: table sales.orders goes to topic "
        "PREFIX.sales.orders (records PREFIX.sales.orders.Envelope)",
    )
    group.add_argument(
        "--include",
        default=None,
        metavar="REGEX",
        help="with --database: only tables whose whole qualified name matches",
    )
    group.add_argument(
        "--exclude",
        default=None,
        metavar="REGEX",
        help="with --database: leave out tables whose whole qualified name matches",
    )
    group.add_argument(
        "--idle-poll-max",
        type=idle_poll_max_flag,
        default=None,
        metavar="SECONDS",
        help="with --database: a table that stays quiet is listed less and less often, at "
        f"least every SECONDS, its first commit after a quiet period seen within that "
        f"(default {IDLE_POLL_MAX:g} on object storage: one request per table per "
        f"{IDLE_POLL_MAX:g} s; {IDLE_POLL_MAX_LOCAL:g} on a filesystem, where a listing "
        "costs no request; 0: every table every trigger)",
    )
    group.add_argument(
        "--commit-events",
        default=None,
        metavar="QUEUE_URL|files",
        help="with --database: find commits by the storage events that announce them "
        "instead of listing each table: the URL of the SQS queue the database's S3 bucket "
        "sends its ObjectCreated notifications to, or 'files' for a database on a local "
        "or mounted file system (inotify); tables are still listed at start and, as a "
        "safety net, every --commit-events-poll-max; while the events are not heard (the "
        "queue unreachable) tables are listed as without them, and status says why",
    )
    group.add_argument(
        "--commit-events-poll-max",
        type=idle_poll_max_flag,
        default=None,
        metavar="SECONDS",
        help="with --commit-events: the longest wait between two looks at a table while "
        f"the events are heard: a lost event delays a commit by this much at most "
        f"(default {EVENTS_POLL_MAX:g})",
    )


@contextlib.contextmanager
def on_signals(handler: Callable[[int, FrameType | None], Any]) -> Iterator[None]:
    """`handler` for SIGTERM and SIGINT during the block, the previous ones after (only
    the main thread has signal handlers: a command run from another thread installs none)."""
    previous = {}
    if threading.current_thread() is threading.main_thread():
        previous = {s: signal.signal(s, handler) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield
    finally:
        for s, h in previous.items():
            signal.signal(s, h)
