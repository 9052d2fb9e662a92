"""Three Apache Kafka nodes in KRaft combined mode on 127.0.0.1, replicating as production
clusters do: each node a broker and one of three controller voters (a static quorum),
replication factor 3 by default, `min.insync.replicas=2`, the offsets and transaction
state topics on all three brokers with a minimum in-sync set of 2.

    with KafkaCluster() as cluster:
        cluster.bootstrap_servers            # all three client listeners
        cluster.leader("topic", 0)           # the node id leading a partition
        cluster.kill(2)                      # SIGKILL one node (broker and controller)
        cluster.restart(2)                   # the same ports and data again
        cluster.transaction_coordinator(tid) # the node coordinating a transactional id
        cluster.group_coordinator(group)     # the node coordinating a consumer group

It reuses `KafkaBroker` (the same cached jars) for each node."""

from __future__ import annotations

import os
import signal
import socket
import tempfile
import time
from pathlib import Path
from typing import Any, Self, Unpack

from lance_cdf_devtools.kafka import KafkaBroker, _cluster_id
from lance_cdf_devtools.process import CacheOption

NODES = 3
# the internal topics' partition counts: small, so that a test finds (and kills) the
# broker coordinating a transaction or a group at once; real clusters keep 50
TRANSACTION_PARTITIONS = 1
OFFSETS_PARTITIONS = 1


class ClusterNode(KafkaBroker):
    """One of `KafkaCluster`'s nodes: broker and controller voter `node_id`."""

    name = "kafka-node"

    def __init__(
        self,
        workdir: Path,
        node_id: int,
        cluster_id: str,
        heap: str,
        **kw: Unpack[CacheOption],
    ):
        super().__init__(workdir, heap=heap, **kw)
        self.node_id, self.cluster_id = node_id, cluster_id
        self.voters = ""  # set by the cluster once every node has its ports

    def _quorum_lines(self) -> list[str]:
        return [f"controller.quorum.voters={self.voters}"]

    def _quorum_format_args(self) -> list[str]:
        return []  # a static quorum: the voters are in server.properties

    def _replication_lines(self) -> list[str]:
        return [
            f"default.replication.factor={NODES}",
            "min.insync.replicas=2",
            f"offsets.topic.replication.factor={NODES}",
            f"offsets.topic.num.partitions={OFFSETS_PARTITIONS}",
            f"transaction.state.log.replication.factor={NODES}",
            "transaction.state.log.min.isr=2",
            f"transaction.state.log.num.partitions={TRANSACTION_PARTITIONS}",
            f"share.coordinator.state.topic.replication.factor={NODES}",
            "share.coordinator.state.topic.min.isr=2",
            # a killed broker's replicas leave the ISR within seconds, not 30 s
            "replica.lag.time.max.ms=5000",
            "broker.session.timeout.ms=6000",
            "broker.heartbeat.interval.ms=1000",
        ]

    def _ready(self) -> bool:
        # the node alone cannot serve clients before a quorum of voters runs: its
        # controller listener open is enough here; the cluster waits for the brokers
        with socket.socket() as s:
            s.settimeout(1)
            return s.connect_ex(("127.0.0.1", self.controller_port)) == 0

    def kill(self) -> None:
        """SIGKILL the node's process group: no shutdown, no controlled leader moves."""
        proc, self.proc = self.proc, None
        if proc is not None and proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


class KafkaCluster:
    """`start()` formats and starts three nodes and waits until every broker serves;
    `kill(node)` / `restart(node)` fault one; `close()` stops all."""

    start_timeout = 180.0

    def __init__(
        self,
        workdir: str | os.PathLike[str] | None = None,
        heap: str = "384m",
        **kw: Unpack[CacheOption],
    ):
        self.workdir = Path(workdir or tempfile.mkdtemp(prefix="lance-cdf-kafka-cluster-"))
        cid = _cluster_id()
        self.nodes = {
            i: ClusterNode(self.workdir / f"node{i}", i, cid, heap, **kw)
            for i in range(1, NODES + 1)
        }
        voters = ",".join(f"{i}@127.0.0.1:{node.controller_port}" for i, node in self.nodes.items())
        for node in self.nodes.values():
            node.voters = voters

    @property
    def bootstrap_servers(self) -> str:
        return ",".join(node.bootstrap_servers for node in self.nodes.values())

    @property
    def client_config(self) -> dict[str, str]:
        return {}

    def _admin(self) -> Any:
        from confluent_kafka.admin import AdminClient

        return AdminClient({"bootstrap.servers": self.bootstrap_servers, "log_level": 0})

    def start(self) -> Self:
        for node in self.nodes.values():
            node.start()  # returns once its controller listens: the quorum forms after
        self.wait_for_brokers(set(self.nodes))
        return self

    def brokers(self) -> set[int]:
        """The ids of the brokers the cluster's metadata lists now (unfenced ones)."""
        from confluent_kafka import KafkaException

        try:
            return set(self._admin().list_topics(timeout=5).brokers)
        except KafkaException:
            return set()

    def wait_for_brokers(self, want: set[int], timeout: float | None = None) -> None:
        deadline = time.monotonic() + (timeout or self.start_timeout)
        while not want <= self.brokers():
            if time.monotonic() > deadline:
                tails = "\n".join(f"node {i}:\n{n.log_tail(30)}" for i, n in self.nodes.items())
                raise RuntimeError(f"Kafka brokers {sorted(want)} not serving:\n{tails}")
            time.sleep(0.5)

    def kill(self, node_id: int) -> None:
        """SIGKILL node `node_id` (its broker and its controller voter)."""
        self.nodes[node_id].kill()

    def restart(self, node_id: int) -> None:
        """Start node `node_id` again (same ports, same data) and wait until it serves."""
        self.nodes[node_id].start()
        self.wait_for_brokers({node_id})

    def partitions(self, topic: str) -> dict[int, Any]:
        """`PartitionMetadata` per partition of `topic` (leader, replicas, isrs)."""
        md = self._admin().list_topics(topic, timeout=10)
        return dict(md.topics[topic].partitions)

    def leader(self, topic: str, partition: int = 0) -> int:
        """The node id leading `topic`'s `partition` (-1: none now)."""
        return int(self.partitions(topic)[partition].leader)

    def wait_in_sync(self, topic: str, timeout: float = 120.0) -> None:
        """Wait until every partition of `topic` has all three replicas in sync."""
        deadline = time.monotonic() + timeout
        while any(len(p.isrs) < NODES for p in self.partitions(topic).values()):
            if time.monotonic() > deadline:
                raise RuntimeError(f"{topic}: replicas not back in sync after {timeout:.0f} s")
            time.sleep(0.5)

    def transaction_coordinator(self, transactional_id: str) -> int:
        """The node coordinating `transactional_id`: the leader of its partition of
        __transaction_state (Kafka's `abs(hashCode) % partitions`)."""
        parts = self.partitions("__transaction_state")
        return int(parts[_java_hash_abs(transactional_id) % len(parts)].leader)

    def group_coordinator(self, group: str, timeout: float = 60.0) -> int:
        """The node coordinating consumer group `group` (DescribeConsumerGroups). While the
        group moves to another node (its coordinator killed) the answer may be a retriable
        error such as NOT_COORDINATOR: asked again until `timeout`."""
        from confluent_kafka import KafkaError, KafkaException

        moving = {
            KafkaError.NOT_COORDINATOR,
            KafkaError.COORDINATOR_NOT_AVAILABLE,
            KafkaError.COORDINATOR_LOAD_IN_PROGRESS,
        }
        admin = self._admin()  # kept until the answer came: a dropped client drops it
        deadline = time.monotonic() + timeout
        while True:
            futures = admin.describe_consumer_groups([group], request_timeout=10)
            try:
                return int(futures[group].result(timeout=30).coordinator.id)
            except KafkaException as exc:
                error = exc.args[0]
                if not (error.retriable() or error.code() in moving) or time.monotonic() > deadline:
                    raise
            time.sleep(0.5)

    def close(self) -> None:
        """SIGKILL every node (a test cluster: nothing to shut down cleanly for) and
        remove them from the process registry."""
        for node in self.nodes.values():
            node.kill()
            node.close()

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()


def _java_hash_abs(text: str) -> int:
    """Kafka's `Utils.abs(text.hashCode())`: Java's String hash over UTF-16 code units."""
    h = 0
    data = text.encode("utf-16-be")
    for i in range(0, len(data), 2):
        h = (31 * h + int.from_bytes(data[i : i + 2], "big")) & 0xFFFFFFFF
    signed = h - (1 << 32) if h >= 1 << 31 else h
    return 0 if signed == -(1 << 31) else abs(signed)


__all__ = ["ClusterNode", "KafkaCluster"]
