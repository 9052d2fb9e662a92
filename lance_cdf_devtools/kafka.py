"""A single-node Apache Kafka broker in KRaft combined mode on 127.0.0.1: plaintext
(`KafkaBroker`) or SASL_SSL with SCRAM-SHA-512 (`SecureKafkaBroker`)."""

from __future__ import annotations

import base64
import os
import secrets
import shutil
import subprocess
import uuid
from collections.abc import Sequence
from typing import Unpack

from lance_cdf_devtools.maven import kafka_lib
from lance_cdf_devtools.process import CacheOption, JavaService, free_port, java_executable

_LOG4J2 = """\
rootLogger.level = INFO
rootLogger.appenderRef.out.ref = out
appender.out.type = Console
appender.out.name = out
appender.out.layout.type = PatternLayout
appender.out.layout.pattern = [%d] %p %m (%c)%n
logger.request.name = kafka.request.logger
logger.request.level = WARN
logger.statechange.name = state.change.logger
logger.statechange.level = WARN
logger.raft.name = org.apache.kafka.raft
logger.raft.level = WARN
"""


def _cluster_id() -> str:
    """What `kafka-storage random-uuid` prints: 16 random bytes, URL-safe base64."""
    while True:
        cid = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
        if not cid.startswith("-"):
            return cid


class BrokerOptions(CacheOption, total=False):
    """`KafkaBroker`'s keywords besides its workdir, as a subclass hands them on."""

    auto_create_topics: bool
    heap: str
    num_partitions: int


class KafkaBroker(JavaService):
    """`start()` formats the storage once, runs `kafka.Kafka` and waits until a client
    can list topics; `restart()` is a broker restart (same ports, same data)."""

    name = "kafka"

    def __init__(
        self,
        workdir: str | os.PathLike[str] | None = None,
        auto_create_topics: bool = True,
        heap: str = "512m",
        num_partitions: int = 1,
        **kw: Unpack[CacheOption],
    ):
        super().__init__(workdir, heap=heap, **kw)
        self.num_partitions = num_partitions  # the broker's default for new topics
        self.port = free_port()
        self.controller_port = free_port()
        self.auto_create_topics = auto_create_topics
        self.properties = self.workdir / "server.properties"
        self.data_dir = self.workdir / "data"
        self._formatted = False
        self.node_id = 1
        self.cluster_id = _cluster_id()

    @property
    def bootstrap_servers(self) -> str:
        return f"127.0.0.1:{self.port}"

    def _java(self, *args: str, heap: str | None = None) -> list[str]:
        return [
            java_executable(),
            f"-Xmx{heap or self.heap}",
            "-Djava.awt.headless=true",
            f"-Dlog4j2.configurationFile={self.workdir / 'log4j2.properties'}",
            "-cp",
            str(kafka_lib(self.cache_dir) / "*"),
            *args,
        ]

    def _prepare(self) -> None:
        (self.workdir / "log4j2.properties").write_text(_LOG4J2)
        if self._formatted:
            return  # a restart keeps the data
        shutil.rmtree(self.data_dir, ignore_errors=True)  # a work dir reused by a new broker
        self.properties.write_text(
            "\n".join(
                [
                    "process.roles=broker,controller",
                    f"node.id={self.node_id}",
                    *self._quorum_lines(),
                    *self._listener_lines(),
                    f"log.dirs={self.data_dir}",
                    f"num.partitions={self.num_partitions}",
                    *self._replication_lines(),
                    "group.initial.rebalance.delay.ms=0",
                    f"auto.create.topics.enable={str(self.auto_create_topics).lower()}",
                ]
            )
            + "\n"
        )
        cmd = self._java(
            "kafka.tools.StorageTool",
            "format",
            *self._quorum_format_args(),
            "-t",
            self.cluster_id,
            "-c",
            str(self.properties),
            *self._format_args(),
            heap="256m",
        )
        done = subprocess.run(cmd, capture_output=True, text=True, stdin=subprocess.DEVNULL)
        if done.returncode != 0:
            raise RuntimeError(
                f"kafka storage format failed (exit {done.returncode}):\n"
                f"{done.stdout[-3000:]}{done.stderr[-3000:]}"
            )
        self._formatted = True

    def _quorum_lines(self) -> list[str]:
        """How the node finds the KRaft controller quorum: itself, alone, here."""
        return [f"controller.quorum.bootstrap.servers=127.0.0.1:{self.controller_port}"]

    def _quorum_format_args(self) -> list[str]:
        """`kafka-storage format`'s quorum arguments: a quorum of this node alone."""
        return ["--standalone"]

    def _replication_lines(self) -> list[str]:
        """The internal topics' replication: one copy of each on one broker."""
        return [
            "offsets.topic.replication.factor=1",
            "offsets.topic.num.partitions=1",
            "transaction.state.log.replication.factor=1",
            "transaction.state.log.min.isr=1",
            "transaction.state.log.num.partitions=1",
            "share.coordinator.state.topic.replication.factor=1",
            "share.coordinator.state.topic.min.isr=1",
        ]

    def _listener_lines(self) -> list[str]:
        """The listeners of server.properties: one PLAINTEXT client listener here."""
        return [
            f"listeners=PLAINTEXT://127.0.0.1:{self.port},"
            f"CONTROLLER://127.0.0.1:{self.controller_port}",
            f"advertised.listeners=PLAINTEXT://127.0.0.1:{self.port}",
            "controller.listener.names=CONTROLLER",
            "inter.broker.listener.name=PLAINTEXT",
            "listener.security.protocol.map=CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT",
        ]

    def _format_args(self) -> list[str]:
        """Extra `kafka-storage format` arguments (SCRAM users)."""
        return []

    @property
    def client_config(self) -> dict[str, str]:
        """The librdkafka settings a client needs besides bootstrap.servers (none here)."""
        return {}

    @property
    def java_client_config(self) -> dict[str, str]:
        """The same for a Java client (Kafka Connect's worker, producer, consumer, admin)."""
        return {}

    def _command(self) -> list[str]:
        return self._java("-XX:+ExitOnOutOfMemoryError", "kafka.Kafka", str(self.properties))

    def _ready(self) -> bool:
        from confluent_kafka import KafkaException
        from confluent_kafka.admin import AdminClient

        admin = AdminClient(
            {"bootstrap.servers": self.bootstrap_servers, "log_level": 0, **self.client_config}
        )
        try:
            md = admin.list_topics(timeout=2)
        except KafkaException:
            return False
        return bool(md.brokers)

    def restart(self) -> KafkaBroker:
        """Stop and start again on the same ports and data dir (a broker restart)."""
        self.stop()
        return self.start()


class SecureKafkaBroker(KafkaBroker):
    """A broker whose only client listener is SASL_SSL with SCRAM-SHA-512: a CA and the
    broker's certificate made per run (`devtools.tls`), users `admin` (the broker's own)
    and `user` (`.username`, `.password`: random per run) created at format time.
    `.client_config` is what a librdkafka client needs; `.ca_pem` the CA to trust.
    `authorizer=True` enforces ACLs (`deny()`; `.admin_client_config` is the super user's)."""

    name = "kafka-sasl"
    MECHANISM = "SCRAM-SHA-512"
    USERNAME = "lance-cdf-user"

    def __init__(
        self,
        workdir: str | os.PathLike[str] | None = None,
        authorizer: bool = False,
        **kw: Unpack[BrokerOptions],
    ):
        super().__init__(workdir, **kw)
        # Kafka's StandardAuthorizer: all allowed where no ACL says otherwise, `admin` (and
        # the controller's PLAINTEXT principal) super users; `deny()` adds ACLs
        self.authorizer = authorizer
        from lance_cdf_devtools.tls import CertAuthority

        self.username = self.USERNAME
        self.password = secrets.token_urlsafe(18)
        self._admin_password = secrets.token_urlsafe(18)
        ca = CertAuthority(self.workdir / "tls")
        self.ca_pem = ca.ca_pem
        self._cert = ca.issue("kafka")

    @property
    def client_config(self) -> dict[str, str]:
        return {
            "security.protocol": "SASL_SSL",
            "sasl.mechanism": self.MECHANISM,
            "sasl.username": self.username,
            "sasl.password": self.password,
            "ssl.ca.location": str(self.ca_pem),
        }

    @property
    def java_client_config(self) -> dict[str, str]:
        jaas = (
            "org.apache.kafka.common.security.scram.ScramLoginModule required "
            f'username="{self.username}" password="{self.password}";'
        )
        return {
            "security.protocol": "SASL_SSL",
            "sasl.mechanism": self.MECHANISM,
            "sasl.jaas.config": jaas,
            "ssl.truststore.type": "PEM",
            "ssl.truststore.location": str(self.ca_pem),
        }

    @property
    def admin_client_config(self) -> dict[str, str]:
        """`client_config` as the broker's super user `admin` (for ACLs)."""
        return {
            **self.client_config,
            "sasl.username": "admin",
            "sasl.password": self._admin_password,
        }

    def _listener_lines(self) -> list[str]:
        jaas = (
            "org.apache.kafka.common.security.scram.ScramLoginModule required "
            f'username="admin" password="{self._admin_password}";'
        )
        authorizer = [
            "authorizer.class.name=org.apache.kafka.metadata.authorizer.StandardAuthorizer",
            "super.users=User:admin;User:ANONYMOUS",
            "allow.everyone.if.no.acl.found=true",
        ]
        return [
            *(authorizer if self.authorizer else []),
            f"listeners=SASL_SSL://127.0.0.1:{self.port},"
            f"CONTROLLER://127.0.0.1:{self.controller_port}",
            f"advertised.listeners=SASL_SSL://127.0.0.1:{self.port}",
            "controller.listener.names=CONTROLLER",
            "inter.broker.listener.name=SASL_SSL",
            "listener.security.protocol.map=CONTROLLER:PLAINTEXT,SASL_SSL:SASL_SSL",
            f"sasl.enabled.mechanisms={self.MECHANISM}",
            f"sasl.mechanism.inter.broker.protocol={self.MECHANISM}",
            f"listener.name.sasl_ssl.scram-sha-512.sasl.jaas.config={jaas}",
            "ssl.keystore.type=PKCS12",
            f"ssl.keystore.location={self._cert.keystore}",
            f"ssl.keystore.password={self._cert.keystore_password}",
            f"ssl.key.password={self._cert.keystore_password}",
            "ssl.truststore.type=PEM",  # the broker's own inter-broker client trusts the CA
            f"ssl.truststore.location={self.ca_pem}",
            "ssl.client.auth=none",
        ]

    def _format_args(self) -> list[str]:
        # SCRAM users exist before the first start (KRaft: kafka-storage format
        # --add-scram); the passwords are random per run and the format process is brief
        return [
            "--add-scram",
            f"{self.MECHANISM}=[name=admin,password={self._admin_password}]",
            "--add-scram",
            f"{self.MECHANISM}=[name={self.username},password={self.password}]",
        ]


def deny(
    admin_config: dict[str, str],
    principal: str,
    topics: Sequence[str] = (),
    groups: Sequence[str] = (),
) -> None:
    """ACLs denying `principal` (`User:NAME`) every operation on `topics` and `groups`, made
    with `admin_config` (librdkafka settings of a super user, bootstrap.servers included)."""
    from confluent_kafka.admin import (
        AclBinding,
        AclOperation,
        AclPermissionType,
        AdminClient,
        ResourcePatternType,
        ResourceType,
    )

    acls = [
        AclBinding(
            kind,
            name,
            ResourcePatternType.LITERAL,
            principal,
            "*",
            AclOperation.ALL,
            AclPermissionType.DENY,
        )
        for kind, names in ((ResourceType.TOPIC, topics), (ResourceType.GROUP, groups))
        for name in names
    ]
    admin = AdminClient({**admin_config, "log_level": 0})
    for future in admin.create_acls(acls).values():
        future.result(timeout=30)


__all__ = ["KafkaBroker", "SecureKafkaBroker", "deny"]
