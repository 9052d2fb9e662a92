"""Prometheus metrics of `lance-cdf publish` / `lance-cdf replicate` (`--metrics-port`),
scraped over HTTP and parsed with prometheus_client's own text parser while the
pipeline runs. Oracles: the table's versions and commit times as pylance reports
them, read_changes' event counts, and the records in the topic."""

import signal
import subprocess
import sys
import time
import urllib.request
import uuid

import lance
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

import lance_cdf
from lance_cdf.ops.metrics import PipelineMetrics, Progress
from lance_cdf_devtools.process import free_port
from tests.replicate.test_replicate import publish
from tests.support.publish_process import publish_args, start_cli
from tests.support.workload import Workload

CHANGING = ["append", "update", "upsert", "delete_sparse", "upsert_delete_missing"]


def scrape(url: str) -> dict[str, float]:
    """sample name (labels left out) -> value, as a Prometheus server would read them."""
    with urllib.request.urlopen(url, timeout=10) as r:
        text = r.read().decode()
    return {s.name: s.value for f in text_string_to_metric_families(text) for s in f.samples}


def scrape_until(url: str, done, proc, timeout: float = 240) -> dict[str, float]:
    deadline, last, why = time.monotonic() + timeout, None, None
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise AssertionError(f"exited {proc.returncode}: {proc.stderr.read()[-3000:]}")
        try:
            last = scrape(url)
            if done(last):
                return last
        except OSError as exc:  # not listening yet
            why = exc
        time.sleep(0.5)
    raise AssertionError(f"metrics never got there: {last} ({why})")


def commit_seconds(uri: str) -> dict[int, float]:
    """version -> commit time, as pylance reports it."""
    return {v["version"]: v["timestamp"].timestamp() for v in lance.dataset(uri).versions()}


def test_lag_from_the_table_and_the_counters(tmp_path):
    uri = str(tmp_path / "t.lance")
    w = Workload(uri, seed=1, rows=50)
    for op in ("update", "append", "delete_sparse", "upsert"):
        w.step(op)
    latest = lance.dataset(uri).version
    commits = commit_seconds(uri)
    state = Progress(
        version=2,
        events=40,
        batches=3,
        dead_letters=1,
        delivery_failures=2,
        last_error=1234.5,
        kafka_lag=7,
        consumer_restarts=1,
    )
    metrics = PipelineMetrics("replicate", lambda: state, uri, topic="t.cdf")
    url = metrics.serve(0)
    try:
        before = time.time()
        m = scrape(url)
        after = time.time()
        assert m["lance_cdf_source_latest_version"] == latest
        assert m["lance_cdf_applied_version"] == 2
        assert m["lance_cdf_lag_versions"] == latest - 2
        # the oldest version not applied is 3: its age at the moment of the scrape
        assert before - commits[3] - 0.01 <= m["lance_cdf_lag_seconds"] <= after - commits[3]
        assert m["lance_cdf_events_total"] == 40 and m["lance_cdf_batches_total"] == 3
        assert m["lance_cdf_dead_letters_total"] == 1
        assert m["lance_cdf_delivery_failures_total"] == 2
        assert m["lance_cdf_last_error_timestamp_seconds"] == 1234.5
        assert m["lance_cdf_kafka_lag_records"] == 7
        assert m["lance_cdf_consumer_restarts_total"] == 1
        assert m["lance_cdf_pipeline_info"] == 1
        # caught up: no lag; a new commit: lag again, from the new table state
        state.version, state.events = latest, 90
        m = scrape(url)
        assert m["lance_cdf_lag_versions"] == 0 and m["lance_cdf_lag_seconds"] == 0
        assert m["lance_cdf_events_per_second"] > 0  # 50 more events since the last scrape
        w.step("update")
        m = scrape(url)
        assert m["lance_cdf_source_latest_version"] == latest + 1
        assert m["lance_cdf_lag_versions"] == 1
    finally:
        metrics.close()


def test_port_in_use_is_a_clear_error(tmp_path):
    first = PipelineMetrics("publish", Progress)
    url = first.serve(0)
    port = int(url.rsplit(":", 1)[1].split("/")[0])
    try:
        second = PipelineMetrics("publish", Progress)
        try:
            second.serve(port)
            raise AssertionError("a second server on the same port")
        except lance_cdf.LanceCdfError as exc:
            assert str(port) in str(exc) and "--metrics-port" in str(exc)
    finally:
        first.close()


def test_the_url_names_the_address_bound_and_the_table_label_hides_user_info():
    """--metrics-host 0.0.0.0 listens on every interface: the URL says so (it said
    127.0.0.1); the table label never shows a URL's user-info."""
    metrics = PipelineMetrics("publish", Progress, None)
    try:
        url = metrics.serve(0, "0.0.0.0")
        assert url.startswith("http://0.0.0.0:"), url
        assert metrics.server is not None and metrics.server.server_address[0] == "0.0.0.0"
    finally:
        metrics.close()
    local = PipelineMetrics("publish", Progress, None)
    try:
        assert local.serve(0).startswith("http://127.0.0.1:")
    finally:
        local.close()
    labelled = PipelineMetrics("publish", Progress, "s3://key:s3cr3t-value@bucket/t.lance")
    labelled._source = lambda version: (None, None)  # no table to read
    text = generate_latest(labelled.registry)
    assert b"s3cr3t-value" not in text and b"s3://***@bucket/t.lance" in text


def _stop(proc) -> None:
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=120)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def test_replicate_metrics_while_it_runs(tmp_path, kafka_broker, schema_registry):
    src, dst = str(tmp_path / "src.lance"), str(tmp_path / "replica.lance")
    topic = f"metrics-rep-{uuid.uuid4().hex[:8]}"
    w = Workload(src, seed=2, rows=120)
    for op in CHANGING[:3]:
        w.step(op)
    first = publish(kafka_broker, schema_registry, src, topic, 1)
    records = lance_cdf.read_changes(src, 1).read_all()
    port = free_port()
    cmd = [
        sys.executable,
        "-m",
        "lance_cdf.cli",
        "replicate",
        "--bootstrap-servers",
        kafka_broker.bootstrap_servers,
        "--topic",
        topic,
        "--schema-registry",
        schema_registry.url,
        "--target",
        dst,
        "--group-id",
        f"g-{topic}",
        "--max-batch-rows",
        "100",
        "--max-batch-interval",
        "0.3",
        "--metrics-port",
        str(port),
        "--source-table",
        src,
    ]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    url = f"http://127.0.0.1:{port}/metrics"
    try:
        # one Kafka record per event, update preimages excepted; plus a tombstone per delete
        kinds = records["_change_type"].to_pylist()
        sent = sum(k != "update_preimage" for k in kinds) + kinds.count("delete")
        m = scrape_until(
            url,
            # the consumer lag is measured just after a batch is counted: wait for both
            lambda m: (
                m.get("lance_cdf_applied_version") == first
                and m["lance_cdf_events_total"] >= sent
                and m["lance_cdf_kafka_lag_records"] == 0
            ),
            proc,
        )
        assert m["lance_cdf_events_total"] == sent, m
        assert m["lance_cdf_source_latest_version"] == first
        assert m["lance_cdf_lag_versions"] == 0 and m["lance_cdf_lag_seconds"] == 0
        assert m["lance_cdf_batches_total"] >= sent / 100
        assert m["lance_cdf_dead_letters_total"] == 0
        # the source moves on: the lag shows before anything is published ...
        for op in CHANGING[3:]:
            w.step(op)
        latest = lance.dataset(src).version
        m = scrape(url)
        assert m["lance_cdf_lag_versions"] == latest - first
        assert m["lance_cdf_lag_seconds"] > 0
        # ... and goes back to 0 once the replicator applied the new versions
        publish(kafka_broker, schema_registry, src, topic, first + 1)
        m = scrape_until(url, lambda m: m.get("lance_cdf_applied_version") == latest, proc)
        assert m["lance_cdf_lag_versions"] == 0
    finally:
        _stop(proc)


def test_publish_metrics_while_it_runs(tmp_path, kafka_broker, schema_registry):
    src = str(tmp_path / "src.lance")
    topic = f"metrics-pub-{uuid.uuid4().hex[:8]}"
    w = Workload(src, seed=3, rows=200)
    w.step("update")
    port = free_port()
    args = publish_args(
        src,
        kafka_broker.bootstrap_servers,
        topic,
        schema_registry.url,
        tmp_path / "ck",
        "--starting-version",
        "1",
        "--trigger-interval",
        "500 milliseconds",
        "--metrics-port",
        str(port),
    )
    log = open(tmp_path / "publish.log", "w")
    proc = start_cli(args, stdout=log, stderr=subprocess.STDOUT, text=True)
    url = f"http://127.0.0.1:{port}/metrics"
    try:
        for round_ in range(2):
            if round_:
                for op in CHANGING[1:]:
                    w.step(op)
            latest = lance.dataset(src).version
            m = scrape_until(
                url, lambda m, v=latest: m.get("lance_cdf_published_version") == v, None, 480
            )
            assert m["lance_cdf_source_latest_version"] == latest
            assert m["lance_cdf_lag_versions"] == 0 and m["lance_cdf_lag_seconds"] == 0
            assert m["lance_cdf_events_total"] == lance_cdf.read_changes(src, 1).read_all().num_rows
            assert m["lance_cdf_batches_total"] >= 1
            assert m["lance_cdf_delivery_failures_total"] == 0
            assert m["lance_cdf_last_error_timestamp_seconds"] == 0
    except AssertionError as exc:
        log.flush()
        raise AssertionError(f"{exc}\n{(tmp_path / 'publish.log').read_text()[-4000:]}") from None
    finally:
        _stop(proc)
        log.close()


def scrape_tables(url: str) -> dict[tuple[str, str], float]:
    """(sample name, its `table` label) -> value, for the samples that carry one."""
    with urllib.request.urlopen(url, timeout=10) as r:
        text = r.read().decode()
    return {
        (s.name, s.labels["table"]): s.value
        for f in text_string_to_metric_families(text)
        for s in f.samples
        if "table" in s.labels and s.name != "lance_cdf_pipeline_info"
    }


def test_database_replicate_metrics_per_table(tmp_path, kafka_broker, schema_registry):
    """`replicate --database-target --metrics-port` (refused before): the applied
    version, Kafka lag and, with --source-database, the source and lag gauges per replica
    table (label `table`, only the tables replicated), the counters summed over them."""
    from confluent_kafka.admin import AdminClient, NewTopic

    from lance_cdf.format.namespace import table_location

    src, dst = str(tmp_path / "src"), str(tmp_path / "dst")
    prefix = f"mdb{uuid.uuid4().hex[:6]}"
    names = {"items": ("items",), "sales.orders": ("sales", "orders")}
    uris = {name: table_location(src, ident) for name, ident in names.items()}
    loads = {name: Workload(uri, seed=5 + i, rows=80) for i, (name, uri) in enumerate(uris.items())}
    for w in loads.values():
        w.step("update")
    published = {
        name: publish(kafka_broker, schema_registry, uri, f"{prefix}.{name}", 1)
        for name, uri in uris.items()
    }
    sent = 0
    for uri in uris.values():
        kinds = lance_cdf.read_changes(uri, 1).read_all()["_change_type"].to_pylist()
        sent += sum(k != "update_preimage" for k in kinds) + kinds.count("delete")
    # a dead-letter topic under the prefix is not taken for a table (no label "dead-letters")
    dead_letters = f"{prefix}.dead-letters"
    admin = AdminClient({"bootstrap.servers": kafka_broker.bootstrap_servers})
    admin.create_topics([NewTopic(dead_letters, 1, 1)])[dead_letters].result(30)
    port = free_port()
    cmd = [
        sys.executable,
        "-m",
        "lance_cdf.cli",
        "replicate",
        "--bootstrap-servers",
        kafka_broker.bootstrap_servers,
        "--schema-registry",
        schema_registry.url,
        "--database-target",
        dst,
        "--dead-letter-topic",
        dead_letters,
        "--topic-prefix",
        prefix,
        "--no-transaction-topic",
        "--max-batch-rows",
        "100",
        "--max-batch-interval",
        "0.3",
        "--refresh-interval",
        "1",
        "--metrics-port",
        str(port),
        "--source-database",
        src,
    ]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    url = f"http://127.0.0.1:{port}/metrics"
    try:
        applied = lambda m: {  # noqa: E731
            t: v for (n, t), v in scrape_tables(url).items() if n == "lance_cdf_applied_version"
        }
        scrape_until(
            url, lambda m: applied(m) == published and m["lance_cdf_events_total"] >= sent, proc
        )
        m, by_table = scrape(url), scrape_tables(url)
        assert m["lance_cdf_events_total"] == sent  # summed over both tables
        assert {t for _, t in by_table} == set(names)  # only the tables replicated
        for name in names:
            assert by_table["lance_cdf_source_latest_version", name] == published[name]
            assert by_table["lance_cdf_lag_versions", name] == 0
            assert by_table["lance_cdf_lag_seconds", name] == 0
            assert by_table["lance_cdf_kafka_lag_records", name] == 0
        # one table moves on: its lag shows, the other's does not
        for op in CHANGING[1:3]:
            loads["sales.orders"].step(op)
        latest = lance.dataset(uris["sales.orders"]).version
        by_table = scrape_tables(url)
        assert (
            by_table["lance_cdf_lag_versions", "sales.orders"] == latest - published["sales.orders"]
        )
        assert by_table["lance_cdf_lag_seconds", "sales.orders"] > 0
        assert by_table["lance_cdf_lag_versions", "items"] == 0
        publish(
            kafka_broker,
            schema_registry,
            uris["sales.orders"],
            f"{prefix}.sales.orders",
            published["sales.orders"] + 1,
        )
        scrape_until(url, lambda m: applied(m).get("sales.orders") == latest, proc)
        assert scrape_tables(url)["lance_cdf_lag_versions", "sales.orders"] == 0
    finally:
        _stop(proc)


def test_a_lag_is_unknown_until_a_version_is_done(tmp_path):
    """Nothing published yet: the lag series are absent (unknown), never 0; a database
    publisher's table likewise until its first version is delivered."""
    uri = str(tmp_path / "t.lance")
    w = Workload(uri, seed=2, rows=20)
    w.step("append")
    latest = lance.dataset(uri).version
    state = Progress(version=None)
    tables = {"t": (uri, None)}
    metrics = PipelineMetrics("publish", lambda: state, uri, tables=lambda: tables)
    url = metrics.serve(0)
    try:
        m = scrape(url)
        assert m["lance_cdf_source_latest_version"] == latest
        assert "lance_cdf_lag_versions" not in m and "lance_cdf_lag_seconds" not in m
        state.version, tables["t"] = latest - 1, (uri, latest - 1)
        m = scrape(url)
        assert m["lance_cdf_lag_versions"] == 1 and m["lance_cdf_lag_seconds"] > 0
    finally:
        metrics.close()


def test_a_scrape_looks_only_at_tables_behind_what_the_publisher_has_seen(tmp_path):
    """A database publisher's scrape asks a table's storage only where the publisher has
    seen a version it has not published: a table published through all it has seen is
    reported from that (a commit its polls have not seen yet shows at the next poll)."""
    uri = str(tmp_path / "t.lance")
    w = Workload(uri, seed=3, rows=20)
    w.step("append")
    done = lance.dataset(uri).version
    w.step("append")  # a commit the publisher has not seen yet
    seen = {"t": done}
    metrics = PipelineMetrics(
        "publish",
        lambda: Progress(version=None),
        None,
        tables=lambda: {"t": (uri, done)},
        seen=lambda: seen,
    )
    url = metrics.serve(0)
    try:
        m = scrape_tables(url)
        assert m["lance_cdf_source_latest_version", "t"] == done  # not looked at
        assert m["lance_cdf_lag_versions", "t"] == 0
        seen["t"] = done + 1  # its poll saw the commit: the table is looked at
        m = scrape_tables(url)
        assert m["lance_cdf_source_latest_version", "t"] == done + 1
        assert m["lance_cdf_lag_versions", "t"] == 1 and m["lance_cdf_lag_seconds", "t"] > 0
    finally:
        metrics.close()
