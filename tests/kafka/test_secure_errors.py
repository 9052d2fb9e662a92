"""A misconfigured client of the secured broker (SASL_SSL, SCRAM-SHA-512, a CA made per
run) or registry (HTTPS + basic auth) is refused with one line naming the cause and the
setting to fix, before Spark starts.

Oracles: the misconfiguration each test plants (a wrong password, a CA that did not sign
the broker's certificate, the wrong security.protocol, a topic that does not exist); the
message must name that cause and setting, and no other. The checks are called directly
(in-process) and through `lance-cdf publish` / `replicate` as subprocesses: exit code
non-zero, the cause in one line of stderr, no traceback, no secret."""

import os
import subprocess
import sys
import time
import uuid

import pytest

from lance_cdf.errors import KafkaAuthorizationError, PublishError
from lance_cdf.kafka.endpoints import check_broker, check_registry
from lance_cdf.kafka.topic_settings import TopicSettings
from lance_cdf.kafka.topics import ensure_topic
from lance_cdf.ops.clientconfig import KafkaConnection
from lance_cdf_devtools.__main__ import _properties
from lance_cdf_devtools.kafka import SecureKafkaBroker
from lance_cdf_devtools.tls import CertAuthority
from tests.support.workload import Workload

AUTH = "refused the client's credentials"
VERIFY = "TLS verification of the Kafka broker"
EXPECTS_TLS = "expects another protocol on this port"
NO_TLS = "does not speak TLS on this port"


@pytest.fixture(scope="module")
def other_ca(tmp_path_factory) -> str:
    """A CA that signed nothing the services present."""
    return str(CertAuthority(tmp_path_factory.mktemp("other-ca")).ca_pem)


def _raises(fn, *args, **kw) -> str:
    t = time.monotonic()
    with pytest.raises((PublishError, KafkaAuthorizationError)) as info:
        fn(*args, **kw)
    message = str(info.value)
    print(f"{time.monotonic() - t:.2f} s: {message}")  # the times are reported, not asserted
    assert "\n" not in message
    return message


def test_broker_check_names_credentials_tls_and_protocol(
    secure_kafka_broker, kafka_broker, other_ca
):
    kafka = secure_kafka_broker
    good = kafka.client_config
    m = _raises(check_broker, kafka.bootstrap_servers, {**good, "sasl.password": "wrong"})
    assert AUTH in m and "sasl.password" in m and "--producer-config-file" in m, m
    assert "wrong" not in m.replace("wrong version", "")  # the planted password is not repeated
    m = _raises(
        check_broker, kafka.bootstrap_servers, {**good, "sasl.username": "nobody"}, flag="consumer"
    )
    assert AUTH in m and "--consumer-config-file" in m, m
    m = _raises(check_broker, kafka.bootstrap_servers, {**good, "ssl.ca.location": other_ca})
    assert VERIFY in m and "ssl.ca.location" in m, m
    for protocol in ("PLAINTEXT", "SASL_PLAINTEXT"):  # a plaintext client, a TLS listener
        m = _raises(check_broker, kafka.bootstrap_servers, {**good, "security.protocol": protocol})
        assert EXPECTS_TLS in m and "security.protocol=SSL or SASL_SSL" in m, m
    # TLS without SASL against the SASL_SSL listener
    m = _raises(check_broker, kafka.bootstrap_servers, {**good, "security.protocol": "SSL"})
    assert "its listener expects SASL" in m and "security.protocol=SASL_SSL" in m, m
    # a TLS client against a plaintext listener
    m = _raises(
        check_broker,
        kafka_broker.bootstrap_servers,
        {"security.protocol": "SSL", "ssl.ca.location": other_ca},
    )
    assert NO_TLS in m and "security.protocol" in m, m
    check_broker(kafka.bootstrap_servers, good)  # and the right settings pass


def test_a_missing_topic_is_created_over_sasl_ssl_and_wrong_credentials_named(
    secure_kafka_broker,
):
    kafka = secure_kafka_broker
    topic = f"missing-{uuid.uuid4().hex[:8]}"
    connection = KafkaConnection(kafka.bootstrap_servers, kafka.client_config)
    assert ensure_topic(connection, topic, TopicSettings.of(3)) == 3
    assert ensure_topic(connection, topic, TopicSettings()) == 3  # as it is, once there
    m = _raises(
        check_broker, kafka.bootstrap_servers, {**kafka.client_config, "sasl.password": "wrong"}
    )
    assert AUTH in m, m


def test_registry_check_names_401_and_tls_verification(secure_schema_registry, other_ca):
    registry = secure_schema_registry
    good = registry.client_config
    m = _raises(check_registry, registry.url, {**good, "basic.auth.user.info": "nobody:wrong"})
    assert "refused the credentials (HTTP 401)" in m and "basic.auth.user.info" in m, m
    assert "nobody:wrong" not in m
    m = _raises(check_registry, registry.url, {**good, "ssl.ca.location": other_ca})
    assert "TLS verification of the schema registry" in m and "ssl.ca.location" in m, m
    check_registry(registry.url, good)


def _cli(
    command: str,
    kafka,
    registry,
    tmp_path,
    kafka_over: str = "",
    registry_over: str = "",
    topic: str | None = None,
):
    """`lance-cdf COMMAND` against the secured services with every setting from files,
    `kafka_over` / `registry_over` appended to them (a later key wins)."""
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable, "T_KAFKA_PASSWORD": kafka.password}
    client = tmp_path / f"{command}-client.properties"
    client.write_text(
        "security.protocol=SASL_SSL\nsasl.mechanism=SCRAM-SHA-512\n"
        f"sasl.username={kafka.username}\nsasl.password=${{env:T_KAFKA_PASSWORD}}\n"
        f"ssl.ca.location={kafka.ca_pem}\n{kafka_over}"
    )
    reg = tmp_path / f"{command}-registry.properties"
    reg.write_text(
        f"basic.auth.user.info={registry.username}:{registry.password}\n"
        f"ssl.ca.location={registry.ca_pem}\n{registry_over}"
    )
    common = [
        "--bootstrap-servers",
        kafka.bootstrap_servers,
        "--topic",
        topic or f"t-{uuid.uuid4().hex[:8]}",
        "--schema-registry",
        registry.url,
        "--registry-config-file",
        str(reg),
    ]
    if command == "publish":
        src = str(tmp_path / "src.lance")
        if not os.path.exists(src):
            Workload(src, seed=5, rows=20)
        args = [
            *common,
            "--table",
            src,
            "--checkpoint",
            str(tmp_path / "ck"),
            "--available-now",
            "--producer-config-file",
            str(client),
        ]
    elif command == "replicate-database":  # `topic` is then the topic prefix
        common[2:4] = ["--topic-prefix", topic or "p"]
        args = [
            *common,
            "--database-target",
            str(tmp_path / "replicas"),
            "--idle-timeout",
            "2",
            "--consumer-config-file",
            str(client),
        ]
    else:
        args = [
            *common,
            "--target",
            str(tmp_path / "replica.lance"),
            "--idle-timeout",
            "2",
            "--consumer-config-file",
            str(client),
        ]
    t = time.monotonic()
    run = subprocess.run(
        [sys.executable, "-m", "lance_cdf.cli", command.split("-")[0], *args],
        capture_output=True,
        env=env,
        timeout=180,
        text=True,
    )
    took = time.monotonic() - t
    print(f"{command} {kafka_over or registry_over!r}: exit {run.returncode} after {took:.1f} s")
    return run


CASES = {  # the misconfiguration planted in the settings file -> what the one line names
    "wrong password": ("sasl.password=not-the-password\n", "", [AUTH, "sasl.password"]),
    "wrong CA": ("ssl.ca.location={other_ca}\n", "", [VERIFY, "ssl.ca.location"]),
    "plaintext client": ("security.protocol=SASL_PLAINTEXT\n", "", [EXPECTS_TLS]),
    "registry password": ("", "basic.auth.user.info=nobody:wrong\n", ["HTTP 401", "basic.auth"]),
    "registry CA": ("", "ssl.ca.location={other_ca}\n", ["schema registry", "ssl.ca.location"]),
}


@pytest.mark.parametrize("command", ["publish", "replicate"])
@pytest.mark.parametrize("case", list(CASES))
def test_cli_names_the_cause_in_one_line(
    command, case, tmp_path, secure_kafka_broker, secure_schema_registry, other_ca
):
    kafka_over, registry_over, expected = CASES[case]
    kafka_over, registry_over = (s.format(other_ca=other_ca) for s in (kafka_over, registry_over))
    run = _cli(
        command, secure_kafka_broker, secure_schema_registry, tmp_path, kafka_over, registry_over
    )
    assert run.returncode != 0, run.stdout + run.stderr
    assert "Traceback" not in run.stderr, run.stderr[-3000:]
    lines = [line for line in run.stderr.splitlines() if all(e in line for e in expected)]
    assert len(lines) == 1, run.stderr[-3000:]
    flag = {"publish": "producer", "replicate": "consumer"}[command]
    if "registry" not in case:
        assert f"--{flag}-config-file" in lines[0], lines[0]
    for secret in (
        secure_kafka_broker.password,
        secure_schema_registry.password,
        "not-the-password",
    ):
        assert secret not in run.stdout + run.stderr
    print(lines[0])


def test_a_topic_or_group_the_user_may_not_use_is_named(tmp_path, secure_schema_registry):
    """One broker with ACLs for the user, a topic (or group) per denial; each command is
    refused with one line naming the topic or group, the permission and the setting, and
    replicate before it writes anything."""
    from confluent_kafka.admin import (
        AclBinding,
        AclOperation,
        AclPermissionType,
        AdminClient,
        NewTopic,
        ResourcePatternType,
        ResourceType,
    )

    broker = SecureKafkaBroker(tmp_path / "broker", authorizer=True)  # as `devtools up --secure`
    broker.start()
    try:
        config = {"bootstrap.servers": broker.bootstrap_servers, **broker.admin_client_config}
        admin = AdminClient({**config, "log_level": 0})
        run = uuid.uuid4().hex[:8]
        denied, txn, unread, grouped = (f"{n}-{run}" for n in ("denied", "txn", "unread", "grp"))
        group = f"lance-cdf-replicate-{grouped}"  # replicate's default group of `grouped`
        # the denials an outsider makes with `python -m lance_cdf_devtools deny`
        admin_file = _properties(tmp_path / "admin.properties", config)
        deny = subprocess.run(
            [
                sys.executable,
                "-m",
                "lance_cdf_devtools",
                "deny",
                "--admin-config-file",
                str(admin_file),
                "--topic",
                denied,
                "--topic",
                f"{txn}.transaction",
                "--group",
                group,
            ],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert deny.returncode == 0, deny.stderr
        assert broker._admin_password not in deny.stdout + deny.stderr
        principal = f"User:{broker.username}"
        allow_describe, deny_read = (  # may see `unread`, not read it
            AclBinding(
                ResourceType.TOPIC,
                unread,
                ResourcePatternType.LITERAL,
                principal,
                "*",
                op,
                permission,
            )
            for op, permission in (
                (AclOperation.DESCRIBE, AclPermissionType.ALLOW),
                (AclOperation.READ, AclPermissionType.DENY),
            )
        )
        for future in admin.create_acls([allow_describe, deny_read]).values():
            future.result(timeout=30)
        # a database replicator's table topic `<prefix>.items`, seen but not readable
        db_acls = [
            AclBinding(
                b.restype,
                f"{unread}.items",
                b.resource_pattern_type,
                principal,
                "*",
                b.operation,
                b.permission_type,
            )
            for b in (allow_describe, deny_read)
        ]
        for future in admin.create_acls(db_acls).values():
            future.result(timeout=30)
        created = admin.create_topics(
            [NewTopic(t, 1) for t in (txn, unread, grouped, f"{unread}.items")]
        )
        for future in created.values():
            future.result(timeout=30)
        allowed = f"allowed-{run}"
        connection = KafkaConnection(broker.bootstrap_servers, broker.client_config)
        assert ensure_topic(connection, allowed, TopicSettings()) >= 1
        m = _raises(ensure_topic, connection, denied, TopicSettings())
        assert "not authorized to use topic" in m and "Describe and Write" in m, m

        cases = [  # (command, --topic, what the line names)
            ("publish", denied, [f"topic {denied!r}", "Describe and Write", "--topic"]),
            ("replicate", denied, [f"topic {denied!r}", "Describe and Read", "--topic"]),
            ("publish", txn, [f"topic '{txn}.transaction'", "Write", "--transaction-topic"]),
            ("replicate", txn, [f"topic '{txn}.transaction'", "Read", "--transaction-topic"]),
            ("replicate", unread, [f"topic {unread!r}", "Describe and Read", "--topic"]),
            ("replicate", grouped, [f"consumer group {group!r}", "Read", "--group-id"]),
            (
                "replicate-database",
                unread,
                [f"topic '{unread}.items'", "Describe and Read", "--exclude"],
            ),
        ]
        for i, (command, topic, expected) in enumerate(cases):
            work = tmp_path / f"case{i}"
            work.mkdir()
            run_ = _cli(command, broker, secure_schema_registry, work, topic=topic)
            assert run_.returncode != 0 and "Traceback" not in run_.stderr, run_.stderr[-3000:]
            lines = [line for line in run_.stderr.splitlines() if "not authorized to use" in line]
            assert len(lines) == 1, (command, topic, run_.stderr[-3000:])
            flag = "producer" if command == "publish" else "consumer"
            assert all(e in lines[0] for e in [*expected, f"--{flag}-config-file"]), lines[0]
            assert broker.password not in run_.stdout + run_.stderr
            assert not (work / "replica.lance").exists()  # replicate: nothing applied
            # replicate --database-target: the table is declared (reserved), no version written
            assert not (work / "replicas" / "items.lance" / "_versions").exists()
            print(lines[0])
    finally:
        broker.close()
