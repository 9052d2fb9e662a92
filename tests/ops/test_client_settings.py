"""Every client lance-cdf creates gets the user's connection settings.

`publish` (one table, then a database) and `replicate` (one table, then a database) run
against the SASL_SSL broker and the HTTPS registry with settings no lab default supplies:
TLS verification of the broker off and no CA for it (a client that drops the setting
cannot connect), SASL, a `client.id` and a socket timeout; the registry with its CA and
basic auth. A `sitecustomize` module put on PYTHONPATH (so in the driver and in every
Python process Spark starts) records the settings each confluent-kafka client is made
with, and every producer, consumer, admin client and registry client recorded must hold
each given setting and no topic auto-creation."""

import json
import os
import subprocess
import sys
import textwrap
import uuid

import lancedb
import pytest

from lance_cdf.ops.clientconfig import ALWAYS
from tests.support.workload import Workload

pytestmark = pytest.mark.integration  # the secured services, Spark in subprocesses

RECORDER = textwrap.dedent(
    """\
    import json, os, threading
    import confluent_kafka, confluent_kafka.admin, confluent_kafka.schema_registry

    _LOG, _LOCK = os.environ["T_CLIENT_LOG"], threading.Lock()

    def _record(role, conf):
        shown = {k: v for k, v in conf.items() if not callable(v)}
        with _LOCK, open(_LOG, "a") as f:
            f.write(json.dumps({"role": role, "pid": os.getpid(), "conf": shown},
                               default=str) + "\\n")

    def _subclass(module, name, role):  # a C type: a recording subclass in its place
        base = getattr(module, name)

        class Recorded(base):
            def __init__(self, conf, *args, **kwargs):
                _record(role, conf)
                super().__init__(conf, *args, **kwargs)

        Recorded.__name__ = Recorded.__qualname__ = name
        setattr(module, name, Recorded)

    def _patch(cls, role):  # a Python class: its own __init__ records
        init = cls.__init__

        def __init__(self, conf, *args, **kwargs):
            _record(role, conf)
            init(self, conf, *args, **kwargs)

        cls.__init__ = __init__

    _subclass(confluent_kafka, "Producer", "producer")
    _subclass(confluent_kafka, "Consumer", "consumer")
    _patch(confluent_kafka.admin.AdminClient, "admin")
    _patch(confluent_kafka.schema_registry.SchemaRegistryClient, "registry")
    """
)


def _start(args, env, cwd, name):
    """`lance-cdf ARGS` started, its output to `cwd/name.out` and `cwd/name.err`."""
    with open(cwd / f"{name}.out", "w") as out, open(cwd / f"{name}.err", "w") as err:
        return subprocess.Popen(
            [sys.executable, "-m", "lance_cdf.cli", *args],
            env=env,
            cwd=cwd,
            stdout=out,
            stderr=err,
            text=True,
        )


def _finish(proc, cwd, name):
    try:
        proc.wait(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
    out, err = ((cwd / f"{name}.{x}").read_text() for x in ("out", "err"))
    assert proc.returncode == 0, out[-2000:] + err[-3000:]


def _run(args, env, cwd):
    _finish(_start(args, env, cwd, args[0]), cwd, args[0])


def test_every_client_gets_the_users_connection_settings(
    tmp_path, secure_kafka_broker, secure_schema_registry
):
    kafka, registry = secure_kafka_broker, secure_schema_registry
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(RECORDER)
    log = tmp_path / "clients.jsonl"
    env = {
        **os.environ,
        "PYSPARK_PYTHON": sys.executable,
        "T_CLIENT_LOG": str(log),
        "PYTHONPATH": os.pathsep.join([str(site), os.environ.get("PYTHONPATH", "")]),
    }
    given = {  # no ssl.ca.location: only a client without verification connects
        "security.protocol": "SASL_SSL",
        "sasl.mechanism": kafka.MECHANISM,
        "sasl.username": kafka.username,
        "sasl.password": kafka.password,
        "enable.ssl.certificate.verification": "false",
        "client.id": "lance-cdf-settings-probe",
        "socket.timeout.ms": "45000",
    }
    client = tmp_path / "client.properties"
    client.write_text("".join(f"{k}={v}\n" for k, v in given.items()))
    reg_given = {
        "basic.auth.user.info": f"{registry.username}:{registry.password}",
        "ssl.ca.location": str(registry.ca_pem),
    }
    reg = tmp_path / "registry.properties"
    reg.write_text("".join(f"{k}={v}\n" for k, v in reg_given.items()))
    common = [
        "--bootstrap-servers",
        kafka.bootstrap_servers,
        "--schema-registry",
        registry.url,
        "--registry-config-file",
        str(reg),
    ]
    run = uuid.uuid4().hex[:8]
    table = str(tmp_path / "src.lance")
    work = Workload(table, seed=46, rows=40)
    work.update()
    work.upsert()
    work.delete_sparse()
    db = lancedb.connect(str(tmp_path / "db"))
    db.create_table(
        "items",
        work.ds.to_table().slice(0, 10),
        storage_options={"new_table_enable_stable_row_ids": "true"},
    )
    publish = [
        *common,
        "--producer-config-file",
        str(client),
        "--available-now",
        "--starting-version",
        "1",
    ]
    replicate = [
        *common,
        "--consumer-config-file",
        str(client),
        "--idle-timeout",
        "3",
        "--dead-letter-topic",
        f"dead-{run}",
    ]
    # the two publishers are independent (own checkpoint, own topics): they run side by side
    ck1, ck2 = str(tmp_path / "ck1"), str(tmp_path / "ck2")
    table_args = ["publish", "--table", table, "--topic", f"t-{run}", "--checkpoint", ck1]
    db_args = ["publish", "--database", str(tmp_path / "db"), "--topic-prefix", f"p{run}"]
    publishers = {
        "publish-table": _start([*table_args, *publish], env, tmp_path, "publish-table"),
        "publish-db": _start(
            [*db_args, "--checkpoint", ck2, *publish], env, tmp_path, "publish-db"
        ),
    }
    try:
        for name, proc in publishers.items():
            _finish(proc, tmp_path, name)
    finally:
        for proc in publishers.values():
            if proc.poll() is None:
                proc.kill()
    _run(
        [
            "replicate",
            "--topic",
            f"t-{run}",
            "--target",
            str(tmp_path / "replica.lance"),
            *replicate,
        ],
        env,
        tmp_path,
    )
    _run(
        [
            "replicate",
            "--topic-prefix",
            f"p{run}",
            "--database-target",
            str(tmp_path / "replicas"),
            *replicate,
        ],
        env,
        tmp_path,
    )

    made = [json.loads(line) for line in log.read_text().splitlines()]
    roles = {m["role"] for m in made}
    assert roles == {"producer", "consumer", "admin", "registry"}, roles
    assert len({m["pid"] for m in made if m["role"] == "producer"}) >= 3  # driver and workers
    for m in made:
        conf = {k: str(v).lower() if isinstance(v, bool) else str(v) for k, v in m["conf"].items()}
        if m["role"] == "registry":
            assert {k: conf.get(k) for k in reg_given} == reg_given, m
            continue
        assert {k: conf.get(k) for k in given} == given, m
        assert conf["bootstrap.servers"] == kafka.bootstrap_servers, m
        assert {k: conf.get(k) for k in ALWAYS} == {k: "false" for k in ALWAYS}, m
        other = {"producer": "group.id", "admin": "group.id"}.get(m["role"])
        assert other is None or other not in conf, m
