"""publish -> Kafka -> replicate over a broker whose only client listener is SASL_SSL
(SCRAM-SHA-512, a CA made for this run) and a registry behind HTTPS + basic auth, with
every credential given through files and `${env:NAME}`.

Oracles: the source table (the replica must equal it); the planted secret strings,
searched for byte by byte in everything the run printed or wrote (stdout, stderr, the
checkpoint and every other file under the test's directory, status JSON, the metrics
endpoint) and in the command lines of every process of publish's tree; the kernel's
socket tables (/proc/net/tcp, tcp6) for what publish's tree listens on."""

import ipaddress
import os
import signal
import subprocess
import sys
import time
import urllib.request
import uuid
from pathlib import Path

import lance
import pytest

from lance_cdf_devtools.process import free_port
from tests.replicate.test_replicate import assert_replica_equals_source
from tests.support.workload import Workload

pytestmark = pytest.mark.integration  # lance-cdf publish / replicate / status as subprocesses

CHANGING = ["append", "update", "upsert", "delete_sparse"]


def _tree(root: int) -> list[int]:
    """`root` and its descendants, from /proc/*/stat (ppid is field 4)."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            text = stat.read_text()
        except OSError:
            continue
        pid = int(stat.parent.name)
        ppid = int(text.rsplit(")", 1)[1].split()[1])
        children.setdefault(ppid, []).append(pid)
    out, todo = [], [root]
    while todo:
        pid = todo.pop()
        out.append(pid)
        todo.extend(children.get(pid, []))
    return out


def _listening(pids: list[int]) -> list[str]:
    """`address:port` of every listening TCP socket the processes hold."""
    inodes: set[str] = set()
    for pid in pids:
        try:
            for fd in Path(f"/proc/{pid}/fd").iterdir():
                link = os.readlink(fd)
                if link.startswith("socket:["):
                    inodes.add(link[8:-1])
        except OSError:
            continue
    found = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            local, state, inode = fields[1], fields[3], fields[9]
            if state != "0A" or inode not in inodes:  # 0A: LISTEN
                continue
            addr_hex, port_hex = local.split(":")
            raw = bytes.fromhex(addr_hex)
            # the kernel prints each 32-bit word in host (little-endian) order
            raw = b"".join(raw[i : i + 4][::-1] for i in range(0, len(raw), 4))
            ip = ipaddress.ip_address(raw)
            found.append(f"{ip}:{int(port_hex, 16)}")
    return found


def _is_loopback(address: str) -> bool:
    ip = ipaddress.ip_address(address.rsplit(":", 1)[0])
    mapped = getattr(ip, "ipv4_mapped", None)
    return ip.is_loopback or bool(mapped and mapped.is_loopback)


def _scan(secrets: dict[str, str], where: str, data: bytes) -> list[str]:
    return [f"{name} in {where}" for name, s in secrets.items() if s.encode() in data]


def test_publish_replicate_status_over_sasl_ssl_with_secrets_nowhere(
    tmp_path, secure_kafka_broker, secure_schema_registry
):
    kafka, registry = secure_kafka_broker, secure_schema_registry
    work = tmp_path / "run"  # everything the run writes; the settings files live beside it
    work.mkdir()
    src, dst, ck = str(work / "src.lance"), str(work / "replica.lance"), str(work / "ck")
    topic = f"secured-{uuid.uuid4().hex[:8]}"
    w = Workload(src, seed=34, rows=150)
    w.step("update")

    secrets = {
        "kafka password": kafka.password,
        "registry password": registry.password,
        "planted oauthbearer config": f"planted-oauth-{uuid.uuid4().hex}",
        "planted storage secret": f"planted-aws-{uuid.uuid4().hex}",
    }
    env = {
        **os.environ,
        "PYSPARK_PYTHON": sys.executable,
        "T_KAFKA_USER": kafka.username,
        "T_KAFKA_PASSWORD": kafka.password,
        "T_REGISTRY_USERINFO": f"{registry.username}:{registry.password}",
        "T_OAUTH": secrets["planted oauthbearer config"],
        "T_AWS": secrets["planted storage secret"],
    }
    client = tmp_path / "client.properties"
    client.write_text(
        "# as Kafka's own client.properties\n"
        "security.protocol=SASL_SSL\n"
        "sasl.mechanism: SCRAM-SHA-512\n"
        "sasl.username=${env:T_KAFKA_USER}\n"
        "sasl.password = ${env:T_KAFKA_PASSWORD}\n"
        f"ssl.ca.location={kafka.ca_pem}\n"
        "sasl.oauthbearer.config=${env:T_OAUTH}\n"
    )
    reg_props = tmp_path / "registry.properties"
    reg_props.write_text(
        f"basic.auth.user.info=${{env:T_REGISTRY_USERINFO}}\nssl.ca.location={registry.ca_pem}\n"
    )
    # replicate takes the registry credentials in the URL (user-info from the environment;
    # its INFO request log names the URL), publish in a settings file
    userinfo_url = registry.url.replace("https://", "https://${env:T_REGISTRY_USERINFO}@")
    storage = ["--storage-option", "aws_secret_access_key=${env:T_AWS}"]
    common = ["--bootstrap-servers", kafka.bootstrap_servers, "--topic", topic]
    port = free_port()
    pub_cmd = [
        sys.executable,
        "-m",
        "lance_cdf.cli",
        "publish",
        "--table",
        src,
        *common,
        "--schema-registry",
        registry.url,
        "--registry-config-file",
        str(reg_props),
        "--checkpoint",
        ck,
        "--starting-version",
        "1",
        "--trigger-interval",
        "500ms",
        "--producer-config-file",
        str(client),
        *storage,
        "--metrics-port",
        str(port),
    ]
    pub_out, pub_err = open(work / "publish.out", "wb"), open(work / "publish.err", "wb")
    proc = subprocess.Popen(pub_cmd, stdout=pub_out, stderr=pub_err, env=env)
    found: list[str] = []
    try:
        metrics_url = f"http://127.0.0.1:{port}/metrics"
        latest = lance.dataset(src).version
        deadline, body, tree_seen = time.monotonic() + 300, b"", False
        while time.monotonic() < deadline:
            assert proc.poll() is None, (work / "publish.err").read_text()[-3000:]
            try:
                with urllib.request.urlopen(metrics_url, timeout=5) as r:
                    body = r.read()
            except OSError:
                time.sleep(0.5)
                continue
            if not tree_seen:
                # the query runs: its whole process tree (JVM, Python workers) is up
                tree = _tree(proc.pid)
                for pid in tree:
                    try:
                        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
                    except OSError:
                        continue
                    found += _scan(secrets, f"the command line of pid {pid}", cmdline)
                ps = subprocess.run(["ps", "-eo", "args"], capture_output=True).stdout
                found += _scan(secrets, "ps", ps)
                exposed = [a for a in _listening(tree) if not _is_loopback(a)]
                assert not exposed, f"publish's tree listens beyond loopback: {exposed}"
                assert len(tree) > 2, tree  # the JVM and Python workers were seen
                tree_seen = True
            if f"lance_cdf_published_version {latest}".encode() in body:
                break
            time.sleep(0.5)
        else:
            raise AssertionError(f"publish never got to {latest}: {body[-2000:]!r}")
        found += _scan(secrets, "the metrics endpoint", body)
        for op in CHANGING:  # a second round while it runs
            w.step(op)
        latest = lance.dataset(src).version
        deadline = time.monotonic() + 180
        while f"lance_cdf_published_version {latest}".encode() not in body:
            assert time.monotonic() < deadline, body[-2000:]
            time.sleep(0.5)
            with urllib.request.urlopen(metrics_url, timeout=5) as r:
                body = r.read()
        found += _scan(secrets, "the metrics endpoint", body)
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        pub_out.close()
        pub_err.close()
    start_line = (work / "publish.out").read_text()
    assert "publishing" in start_line and "'sasl.password': '***'" in start_line, start_line

    rep = subprocess.run(
        [
            sys.executable,
            "-m",
            "lance_cdf.cli",
            "replicate",
            *common,
            "--schema-registry",
            userinfo_url,
            "--registry-config",
            f"ssl.ca.location={registry.ca_pem}",
            "--target",
            dst,
            "--consumer-config-file",
            str(client),
            *storage,
            "--idle-timeout",
            "5",
            "--max-batch-interval",
            "500ms",
        ],
        capture_output=True,
        env=env,
        timeout=300,
    )
    (work / "replicate.out").write_bytes(rep.stdout)
    (work / "replicate.err").write_bytes(rep.stderr)
    assert rep.returncode == 0, rep.stderr.decode()[-3000:]
    # the registry client's request log ran, its URL without the user-info
    assert b"HTTP Request: GET https://***@127.0.0.1" in rep.stderr, rep.stderr[-2000:]
    assert_replica_equals_source(src, dst)

    status = subprocess.run(
        [
            sys.executable,
            "-m",
            "lance_cdf.cli",
            "status",
            "--table",
            src,
            "--checkpoint",
            ck,
            "--replica",
            dst,
            "--json",
            *storage,
        ],
        capture_output=True,
        env=env,
        timeout=120,
    )
    assert status.returncode == 0, status.stderr.decode()
    assert b'"replica_lag": 0' in status.stdout, status.stdout
    found += _scan(secrets, "status", status.stdout + status.stderr)

    # a wrong password is refused, and its error names no secret either
    bad = subprocess.run(
        [
            sys.executable,
            "-m",
            "lance_cdf.cli",
            "replicate",
            *common,
            "--schema-registry",
            userinfo_url,
            "--registry-config",
            f"ssl.ca.location={registry.ca_pem}",
            "--target",
            str(work / "never.lance"),
            "--consumer-config-file",
            str(client),
            "--consumer-config",
            "sasl.password=${env:T_OAUTH}",
            "--idle-timeout",
            "2",
        ],
        capture_output=True,
        env=env,
        timeout=120,
    )
    assert bad.returncode != 0
    found += _scan(secrets, "a failed replicate", bad.stdout + bad.stderr)

    for path in work.rglob("*"):
        if path.is_file():
            found += _scan(secrets, str(path.relative_to(tmp_path)), path.read_bytes())
    assert not found, found


def test_killed_publisher_and_restarted_broker_deliver_each_change_once_over_sasl_ssl(
    tmp_path, monkeypatch, secure_kafka_broker, secure_schema_registry
):
    """The exactly-once restart of test_exactly_once, shortened, over SASL_SSL and the
    HTTPS registry: the position reader reads the topic back through the same settings
    (settings files, ${env:NAME})."""
    import random

    import numpy as np
    import pyarrow as pa
    from confluent_kafka.admin import AdminClient, NewTopic

    from lance_cdf.cli import main
    from tests.kafka.test_exactly_once import killable_publish, publish_under_kills
    from tests.kafka.test_kafka_order import consume_by_key, expected_by_key
    from tests.support.publish_process import cli_env, publish_args

    kafka, registry = secure_kafka_broker, secure_schema_registry
    uri = str(tmp_path / "t.lance")
    lance.write_dataset(
        pa.table({"id": np.arange(200), "s": ["a"] * 200}),
        uri,
        enable_stable_row_ids=True,
        max_rows_per_file=50,
    )
    topic = f"eo-sasl-{uuid.uuid4().hex[:8]}"
    admin = AdminClient({"bootstrap.servers": kafka.bootstrap_servers, **kafka.client_config})
    admin.create_topics([NewTopic(topic, 2, 1)])[topic].result(30)
    client = tmp_path / "client.properties"
    client.write_text(
        "security.protocol=SASL_SSL\nsasl.mechanism=SCRAM-SHA-512\n"
        f"sasl.username={kafka.username}\nsasl.password=${{env:T_KAFKA_PASSWORD}}\n"
        f"ssl.ca.location={kafka.ca_pem}\n"
    )
    reg = tmp_path / "registry.properties"
    reg.write_text(
        f"basic.auth.user.info=${{env:T_REGISTRY_USERINFO}}\nssl.ca.location={registry.ca_pem}\n"
    )
    secrets_env = {
        "T_KAFKA_PASSWORD": kafka.password,
        "T_REGISTRY_USERINFO": f"{registry.username}:{registry.password}",
    }
    args = publish_args(
        uri,
        kafka.bootstrap_servers,
        topic,
        registry.url,
        tmp_path / "ck",
        "--starting-version",
        "1",
        "--key",
        "id",
        "--max-rows-per-trigger",
        "60",
        "--producer-config-file",
        str(client),
        "--registry-config-file",
        str(reg),
    )
    kills = publish_under_kills(
        killable_publish(args),
        cli_env(**secrets_env),
        uri,
        random.Random(34),
        kills_total=5,
        group_most=2,
        group_p=0.3,
        pause=(2, 6),
        commits=30,
        restart_at=3,
        restart=kafka.restart,
    )
    assert kills["group"] >= 1 and kills["worker"] >= 1, kills
    for k, v in secrets_env.items():
        monkeypatch.setenv(k, v)
    assert main([*args, "--available-now"]) == 0  # the rest, from the checkpoint
    want = expected_by_key(uri)
    count = sum(len(v) for v in want.values())
    got, _ = consume_by_key(
        kafka.bootstrap_servers,
        topic,
        registry.url,
        count + 1,
        isolation="read_committed",
        config=kafka.client_config,
        registry_config=registry.client_config,
    )
    assert got == want  # every change once, per key in commit order
