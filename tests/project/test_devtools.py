"""The local broker and registry are real services: Avro records go through the
registry and the broker, a broker restart keeps the data, provisioning is offline once
cached, and no Java process outlives its owner."""

import os
import shutil
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
from confluent_kafka import OFFSET_BEGINNING, Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic
from confluent_kafka.schema_registry import SchemaRegistryClient
from confluent_kafka.schema_registry.avro import AvroDeserializer, AvroSerializer
from confluent_kafka.serialization import MessageField, SerializationContext

from lance_cdf_devtools import maven

pytestmark = pytest.mark.integration  # `lance_cdf_devtools up` in a subprocess

ROOT = Path(__file__).resolve().parents[2]
SCHEMA = """{"type": "record", "name": "Probe", "namespace": "lance_cdf.test", "fields": [
  {"name": "id", "type": "long"}, {"name": "name", "type": "string"},
  {"name": "score", "type": ["null", "double"], "default": null}]}"""


def create_topic(bootstrap, topic, partitions=1):
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(topic, partitions, 1)])[topic].result(30)


def consume(bootstrap, topic, n, timeout=60.0):
    c = Consumer(
        {"bootstrap.servers": bootstrap, "group.id": uuid.uuid4().hex, "enable.auto.commit": False}
    )
    c.assign([TopicPartition(topic, 0, OFFSET_BEGINNING)])
    got, deadline = [], time.monotonic() + timeout
    try:
        while len(got) < n and time.monotonic() < deadline:
            m = c.poll(0.5)
            if m is not None and not m.error():
                got.append(m)
    finally:
        c.close()
    assert len(got) == n, f"{len(got)} of {n} records arrived on {topic}"
    return got


def produce(bootstrap, topic, values):
    p = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True})
    for v in values:
        p.produce(topic, value=v)
    assert p.flush(30) == 0


def pid_alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"


def child_pids(parent):
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == parent:
            found.append(int(stat.parent.name))
    return found


def wait_gone(pid, timeout=30.0):
    deadline = time.monotonic() + timeout
    while pid_alive(pid):
        assert time.monotonic() < deadline, f"process {pid} still running"
        time.sleep(0.2)


def test_avro_round_trip_through_the_registry(kafka_broker, schema_registry):
    topic = f"probe-{uuid.uuid4().hex[:8]}"
    create_topic(kafka_broker.bootstrap_servers, topic)
    client = SchemaRegistryClient({"url": schema_registry.url})
    ctx = SerializationContext(topic, MessageField.VALUE)
    sent = {"id": 42, "name": "änne", "score": 0.5}
    produce(kafka_broker.bootstrap_servers, topic, [AvroSerializer(client, SCHEMA)(sent, ctx)])

    (msg,) = consume(kafka_broker.bootstrap_servers, topic, 1)
    value = msg.value()
    assert value[0] == 0  # Confluent wire format: magic byte, 4-byte schema id, Avro body
    schema_id = int.from_bytes(value[1:5], "big")
    registered = client.get_latest_version(f"{topic}-value")
    assert registered.schema_id == schema_id
    assert "Probe" in client.get_schema(schema_id).schema_str
    # a fresh client (no cache) resolves the id through the registry
    fresh = SchemaRegistryClient({"url": schema_registry.url})
    assert AvroDeserializer(fresh)(value, ctx) == sent


def test_broker_restart_keeps_the_data(kafka_broker):
    topic = f"restart-{uuid.uuid4().hex[:8]}"
    create_topic(kafka_broker.bootstrap_servers, topic)
    produce(kafka_broker.bootstrap_servers, topic, [b"before-1", b"before-2"])
    bootstrap, pid = kafka_broker.bootstrap_servers, kafka_broker.pid

    kafka_broker.restart()

    assert kafka_broker.bootstrap_servers == bootstrap  # same port: clients reconnect
    assert kafka_broker.pid != pid
    assert not pid_alive(pid)
    produce(kafka_broker.bootstrap_servers, topic, [b"after"])
    got = consume(kafka_broker.bootstrap_servers, topic, 3)
    assert [m.value() for m in got] == [b"before-1", b"before-2", b"after"]


def test_cached_provision_does_no_maven_work(monkeypatch, kafka_broker):
    # the session broker has provisioned the cache; a repeat must not run Maven
    def no_maven(args):
        raise AssertionError(f"maven ran again: {args}")

    monkeypatch.setattr(maven, "_mvn", no_maven)
    t0 = time.monotonic()
    cache = maven.provision(kafka_broker.cache_dir)
    assert time.monotonic() - t0 < 1.0
    assert any(maven.kafka_lib(cache).glob(f"kafka_2.13-{maven.versions()['kafka.version']}.jar"))
    assert maven.registry_jar(cache).is_file()


def _spawn(args):
    path = os.pathsep.join(p for p in [str(ROOT), os.environ.get("PYTHONPATH")] if p)
    env = {**os.environ, "PYTHONPATH": path}
    return subprocess.Popen(
        [sys.executable, *args], stdout=subprocess.PIPE, text=True, cwd=ROOT, env=env
    )


def test_up_prints_both_and_sigterm_stops_both(kafka_broker):
    proc = _spawn(["-m", "lance_cdf_devtools", "up", "--cache-dir", str(kafka_broker.cache_dir)])
    try:
        lines = [proc.stdout.readline() for _ in range(3)]
        bootstrap = lines[0].split()[-1]
        url = lines[1].split()[-1]
        assert bootstrap.startswith("127.0.0.1:") and url.endswith("/apis/ccompat/v7"), lines
        assert SchemaRegistryClient({"url": url}).get_subjects() == []
        children = child_pids(proc.pid)
        assert len(children) == 2
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(60) == 0
        for pid in children:
            wait_gone(pid)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_up_secure_serves_sasl_ssl_and_https_with_credentials_in_files_only(kafka_broker):
    """`up --secure`: a SASL_SSL broker and an HTTPS + basic-auth registry that the
    printed settings files reach, and that refuse clients without them."""
    from lance_cdf.ops.clientconfig import parse_properties

    proc = _spawn(
        ["-m", "lance_cdf_devtools", "up", "--secure", "--cache-dir", str(kafka_broker.cache_dir)]
    )
    try:
        lines = [proc.stdout.readline() for _ in range(4)]
        bootstrap, url = lines[0].split()[-1], lines[1].split()[-1]
        client = parse_properties(Path(lines[2].split()[-1]).read_text())
        registry = parse_properties(Path(lines[3].split()[-1]).read_text())
        assert url.startswith("https://127.0.0.1:"), lines
        assert client["security.protocol"] == "SASL_SSL", client
        assert client["sasl.password"] not in "".join(lines)
        assert Path(lines[2].split()[-1]).stat().st_mode & 0o077 == 0
        # the broker admin's settings (for `devtools deny`), in a file of mode 0600 too
        admin_line = proc.stdout.readline()
        admin_file = Path(admin_line.split("--admin-config-file ")[1].split()[0])
        assert admin_file.stat().st_mode & 0o077 == 0
        admin = parse_properties(admin_file.read_text())
        assert admin["sasl.username"] == "admin" and admin["sasl.password"] not in admin_line
        md = AdminClient({"bootstrap.servers": bootstrap, **client}).list_topics(timeout=20)
        assert md.brokers
        with pytest.raises(Exception):  # noqa: B017 - plaintext: no SASL, no TLS
            AdminClient({"bootstrap.servers": bootstrap, "log_level": 0}).list_topics(timeout=3)
        assert SchemaRegistryClient({"url": url, **registry}).get_subjects() == []
        wrong = {**registry, "basic.auth.user.info": "lance-cdf-registry:wrong"}
        with pytest.raises(Exception, match="401"):
            SchemaRegistryClient({"url": url, **wrong}).get_subjects()
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(60) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


@pytest.mark.skipif(
    sys.platform != "linux" or shutil.which("setpriv") is None,
    reason="the parent-death signal needs Linux and setpriv (util-linux)",
)
def test_a_killed_owner_leaves_no_java_behind(kafka_broker, tmp_path):
    code = (
        "from lance_cdf_devtools import SchemaRegistry\n"
        f"r = SchemaRegistry({str(tmp_path)!r}, cache_dir={str(kafka_broker.cache_dir)!r})\n"
        "r.start()\n"
        "print(r.pid, flush=True)\n"
        "import time; time.sleep(600)\n"
    )
    proc = _spawn(["-c", code])
    try:
        java = int(proc.stdout.readline())
        assert pid_alive(java)
    finally:
        proc.kill()  # SIGKILL: no atexit, no finally in the owner
        proc.wait()
    try:
        wait_gone(java)
    finally:
        if pid_alive(java):  # do not leave it behind even when the test fails
            os.kill(java, signal.SIGKILL)
