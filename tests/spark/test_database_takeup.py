"""`lance-cdf publish --database` stays up while it takes many tables up: tables present at
its start and many created at once while it runs, with the broker and then the schema
registry paused (SIGSTOP of their JVMs: requests go unanswered) during the take-up. The
publisher never exits; at the end every table's topic holds exactly its `read_changes`
(the oracle: one record per event, every table inserts only), and it stops on SIGTERM with
exit code 0.

The counts are settings (environment): LANCE_CDF_TAKEUP_AT_START tables present at start,
LANCE_CDF_TAKEUP_CREATED created at once while it runs, LANCE_CDF_TAKEUP_PAUSE_S seconds
each service is paused; the defaults keep the test near a minute on a small machine (an
outside run can give 300 and 1,000)."""

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from concurrent.futures import ThreadPoolExecutor

import lance
import numpy as np
import pyarrow as pa
import pytest

import lance_cdf
from lance_cdf.kafka.outage import read_state
from lance_cdf_devtools.commands import publish
from tests.spark.test_database_publish import topic_size

pytestmark = pytest.mark.integration  # `lance-cdf publish` (Spark) in a subprocess

AT_START = int(os.environ.get("LANCE_CDF_TAKEUP_AT_START", "20"))
CREATED = int(os.environ.get("LANCE_CDF_TAKEUP_CREATED", "60"))
# longer than the clients' request timeouts (a describe waits 10 s), so the writer tasks
# meet real faults (an unanswered request, a new topic's partitions not yet known) and
# ride them out, not only slow answers
PAUSE_S = float(os.environ.get("LANCE_CDF_TAKEUP_PAUSE_S", "25"))
DEADLINE_S = float(os.environ.get("LANCE_CDF_TAKEUP_DEADLINE_S", "600"))


def make_table(root, name, rows):
    ids = np.arange(rows)
    lance.write_dataset(
        pa.table({"id": ids, "s": [f"{name}-{i}" for i in ids]}),
        os.path.join(root, f"{name}.lance"),
        enable_stable_row_ids=True,
    )


def events_of(root, name):
    return lance_cdf.read_changes(os.path.join(root, f"{name}.lance"), 1).read_all().num_rows


def topics(bootstrap, prefix):
    """The topics `prefix.*` (transaction topics left out) and how many hold records."""
    from confluent_kafka.admin import AdminClient

    admin = AdminClient({"bootstrap.servers": bootstrap})
    names = admin.list_topics(timeout=30).topics
    return {n for n in names if n.startswith(f"{prefix}.") and not n.endswith(".transaction")}


def wait_until(check, proc, err_path, deadline, what):
    while not check():
        assert proc.poll() is None, err_path.read_text()[-5000:]
        assert time.monotonic() < deadline, f"never: {what}"
        time.sleep(0.5)


def paused(pid, seconds, proc):
    """The process `pid` stopped for `seconds` (the publisher must stay up meanwhile)."""
    os.kill(pid, signal.SIGSTOP)
    try:
        time.sleep(seconds)
        assert proc.poll() is None, "the publisher exited while a service was paused"
    finally:
        os.kill(pid, signal.SIGCONT)


@pytest.mark.timeout(DEADLINE_S + 300)  # a run of 300 + 1,000 tables sets a longer deadline
def test_many_tables_taken_up_through_paused_services(tmp_path, kafka_broker, schema_registry):
    root = str(tmp_path / "db")
    os.makedirs(root)
    for i in range(AT_START):
        make_table(root, f"start{i:04d}", 5)
    prefix = f"tk{uuid.uuid4().hex[:6]}"
    checkpoint = tmp_path / "ck"
    cmd = publish(
        kafka_broker.bootstrap_servers,
        schema_registry.url,
        checkpoint,
        database=root,
        prefix=prefix,
        extra=[
            *("--starting-version", "1", "--key", "id"),
            *("--trigger-interval", "500ms", "--master", "local[2,100]"),
        ],
    )
    err_path = tmp_path / "publish.err"
    proc = subprocess.Popen(
        cmd,
        env={**os.environ, "PYSPARK_PYTHON": sys.executable},
        stdout=subprocess.DEVNULL,
        stderr=open(err_path, "w"),
        start_new_session=True,
    )
    try:
        report = checkpoint / "database-tables.json"
        deadline = time.monotonic() + DEADLINE_S
        while not report.exists():  # the query runs and follows the tables at start
            assert proc.poll() is None, err_path.read_text()[-5000:]
            assert time.monotonic() < deadline, "the publisher never started its query"
            time.sleep(0.5)
        with ThreadPoolExecutor(8) as pool:  # created at once, while it runs
            list(pool.map(lambda i: make_table(root, f"new{i:04d}", 3), range(CREATED)))
        bootstrap = kafka_broker.bootstrap_servers
        new = {f"{prefix}.new{i:04d}" for i in range(CREATED)}
        made: set[str] = set()

        def some_made(at_least):
            made.clear()
            made.update(topics(bootstrap, prefix) & new)
            return len(made) >= at_least

        # paused while the take-up is under way: once its first new topics exist, the
        # broker; once more exist, the registry (the first records of a table register
        # its schemas)
        wait_until(lambda: some_made(1), proc, err_path, deadline, "a new topic")
        at_broker_pause = len(made)
        assert at_broker_pause < CREATED  # (paused while tables are still being taken up)
        paused(kafka_broker.pid, PAUSE_S, proc)
        wait_until(
            lambda: some_made(min(at_broker_pause + 1, CREATED)), proc, err_path, deadline, "more"
        )
        at_registry_pause = len(made)
        paused(schema_registry.pid, PAUSE_S, proc)
        print(
            f"new topics at the broker's pause {at_broker_pause}, at the registry's "
            f"{at_registry_pause}, of {CREATED}"
        )
        names = [f"start{i:04d}" for i in range(AT_START)] + [f"new{i:04d}" for i in range(CREATED)]
        want = {n: events_of(root, n) for n in names}
        while True:
            assert proc.poll() is None, err_path.read_text()[-5000:]
            have = {n: topic_size(kafka_broker.bootstrap_servers, f"{prefix}.{n}") for n in names}
            if all(have[n] >= want[n] for n in names):
                break
            missing = sorted(n for n in names if have[n] < want[n])
            assert time.monotonic() < deadline, f"{len(missing)} tables not published: {missing}"
            time.sleep(2)
        assert have == want  # exactly once: no record twice through the retries
        status = subprocess.run(
            [
                sys.executable,
                "-m",
                "lance_cdf.cli",
                "status",
                "--database",
                root,
                "--checkpoint",
                str(checkpoint),
                "--json",
            ],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert status.returncode == 0, status.stderr
        shown = json.loads(status.stdout)
        assert shown["aside"] == {} and "takeup_retries" in shown
        kafka = read_state(str(checkpoint))
        print(f"take-up retries {shown['takeup_retries']}; Kafka state {kafka}")
        os.kill(proc.pid, signal.SIGTERM)
        proc.wait(timeout=120)
        assert proc.returncode == 0, err_path.read_text()[-5000:]
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
