"""How lance-cdf creates a topic it writes that does not exist yet (the settings alone:
`kafka.topics` creates it). Apart from `kafka.topics` so that reading the sink's options
does not import the Kafka client."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace

from lance_cdf.errors import PublishError

# topic settings the transaction topic does not take from the change topic's: its BEGIN
# and END records of a version share a key, so compaction would drop the BEGINs
TRANSACTION_TOPIC_SKIPS = frozenset({"cleanup.policy"})


@dataclass(frozen=True)
class TopicSettings:
    """How lance-cdf creates a topic it writes that does not exist yet."""

    partitions: int | None = None  # None: the broker's num.partitions
    replication_factor: int | None = None  # None: the broker's default.replication.factor
    config: tuple[tuple[str, str], ...] = ()  # topic-level settings (KEY, VALUE), sorted

    @classmethod
    def of(
        cls,
        partitions: int | None = None,
        replication_factor: int | None = None,
        config: Mapping[str, str] | None = None,
    ) -> TopicSettings:
        return cls(partitions, replication_factor, tuple(sorted((config or {}).items())))

    @classmethod
    def from_options(cls, options: Mapping[str, str]) -> TopicSettings:
        """From the sink's options (`topic.partitions`, `topic.replicationFactor`,
        `topic.config.<key>`; option names in any case)."""
        lower = {k.lower(): v for k, v in options.items()}
        prefix = "topic.config."
        config = {k[len(prefix) :]: v for k, v in lower.items() if k.startswith(prefix)}
        return cls.of(
            _count(lower.get("topic.partitions"), "topic.partitions"),
            _count(lower.get("topic.replicationfactor"), "topic.replicationFactor"),
            config,
        )

    def options(self) -> dict[str, str]:
        """The sink options that give these settings."""
        out = {f"topic.config.{k}": v for k, v in self.config}
        if self.partitions is not None:
            out["topic.partitions"] = str(self.partitions)
        if self.replication_factor is not None:
            out["topic.replicationFactor"] = str(self.replication_factor)
        return out

    def for_transactions(self) -> TopicSettings:
        """The settings of the matching transaction topic: one partition, the same
        replication factor and topic settings but `TRANSACTION_TOPIC_SKIPS`."""
        kept = tuple((k, v) for k, v in self.config if k not in TRANSACTION_TOPIC_SKIPS)
        return replace(self, partitions=1, config=kept)


def _count(value: str | None, option: str) -> int | None:
    if value is None or value == "":
        return None
    try:
        count = int(value)
    except ValueError:
        count = 0
    if count < 1:
        raise PublishError(f"option {option} is {value!r}; give a whole number of at least 1")
    return count
