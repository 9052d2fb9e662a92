"""The lance-cdf stream on a Spark standalone cluster (a master and two workers on
127.0.0.1, from the pyspark installation), with the table on the local S3-compatible
server, published to Kafka: the job ships lance_cdf with `--py-files` (executors have no
PYTHONPATH to the source tree), partitions travel to executor processes, and both
executors read slices of the change feed."""

import json
import os
import subprocess
import sys
import uuid
import zipfile
from pathlib import Path

import lance
import numpy as np
import pyarrow as pa
import pytest

import lance_cdf
from lance_cdf_devtools.spark import spark_home
from tests.kafka.test_kafka_sink import consume_all

pytestmark = pytest.mark.integration  # a Spark standalone cluster and spark-submit

JOB = Path(__file__).resolve().parents[1] / "support" / "cluster_job.py"


def package_zip(dest: Path) -> Path:
    """lance_cdf as a zip for --py-files (what a user builds or downloads)."""
    root = Path(lance_cdf.__file__).parent
    with zipfile.ZipFile(dest, "w") as z:
        # followlinks: avro/schemas links to the project's schemas/ (as `zip -r` does)
        for folder, dirs, files in os.walk(root, followlinks=True):
            dirs[:] = [d for d in dirs if d != "__pycache__"]
            for name in files:
                path = Path(folder, name)
                z.write(path, path.relative_to(root.parent))
    return dest


def make_table(uri, so):
    n = 240
    table = pa.table({"id": np.arange(n), "s": [f"s{i}" for i in range(n)]})
    lance.write_dataset(
        table, uri, enable_stable_row_ids=True, max_rows_per_file=40, storage_options=so
    )
    ds = lance.dataset(uri, storage_options=so)
    ds.update({"s": "'upd'"}, where="id % 50 = 1")
    ds = lance.dataset(uri, storage_options=so)
    ds.delete("id % 60 = 7")
    src = pa.table({"id": np.array([3, 500]), "s": ["m", "new"]})
    ds = lance.dataset(uri, storage_options=so)
    ds.merge_insert("id").when_matched_update_all().when_not_matched_insert_all().execute(src)


def expected_records(uri, so):
    out = []
    for e in lance_cdf.read_changes(uri, 1, storage_options=so).read_all().to_pylist():
        if e["_change_type"] == "update_preimage":
            continue
        op = {"insert": "c", "update_postimage": "u", "delete": "d"}[e["_change_type"]]
        after = None if op == "d" else {"id": e["id"], "s": e["s"]}
        out.append((e["_rowid"], e["_commit_version"], op, after))
    return sorted(out, key=repr)


def test_stream_on_a_standalone_cluster_from_s3_to_kafka(
    tmp_path, s3_server, s3_uri, kafka_broker, schema_registry, spark_cluster
):
    so = s3_server.storage_options()
    make_table(s3_uri, so)
    want = expected_records(s3_uri, so)
    events = lance_cdf.read_changes(s3_uri, 1, storage_options=so).read_all()
    topic = f"cluster-{uuid.uuid4().hex[:8]}"
    # 4 partitions: publish runs min(4, the cluster's 2 cores) = 2 writer tasks
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": kafka_broker.bootstrap_servers})
    admin.create_topics([NewTopic(topic, 4, 1)])[topic].result(30)
    out = tmp_path / "result.json"
    args = {
        "executors": 2,
        "table": s3_uri,
        "storage_options": so,
        "slice_rows": 60,
        "bootstrap_servers": kafka_broker.bootstrap_servers,
        "topic": topic,
        "schema_registry": schema_registry.url,
        "checkpoint": str(tmp_path / "ck"),
        "out": str(out),
    }
    py = sys.executable
    zip_path = package_zip(tmp_path / "lance_cdf.zip")
    # The venv's interpreter everywhere, and none of our PYTHONPATH. The driver gets the
    # zip on PYTHONPATH too: Spark runs a streaming source's planning in Python workers on
    # the driver, and those do not see --py-files (executors get only --py-files).
    env = {k: os.environ[k] for k in ("PATH", "HOME", "JAVA_HOME", "LANG") if k in os.environ}
    env.update(
        PYSPARK_PYTHON=py,
        PYSPARK_DRIVER_PYTHON=py,
        SPARK_LOCAL_IP="127.0.0.1",
        PYTHONPATH=str(zip_path),
    )
    cluster = spark_cluster
    cmd = [
        str(spark_home() / "bin" / "spark-submit"),
        "--master",
        cluster.master_url,
        "--py-files",
        str(zip_path),
        "--driver-memory",
        "512m",
        "--conf",
        f"spark.pyspark.python={py}",
        "--conf",
        "spark.executor.memory=512m",
        "--conf",
        "spark.executor.cores=1",
        "--conf",
        "spark.ui.enabled=false",
        "--conf",
        "spark.sql.session.timeZone=UTC",
        str(JOB),
        json.dumps(args),
    ]
    log = tmp_path / "submit.log"
    with open(log, "wb") as fh:
        done = subprocess.run(
            cmd, env=env, cwd=tmp_path, stdout=fh, stderr=subprocess.STDOUT, timeout=600
        )
    assert done.returncode == 0, log.read_text()[-6000:] + cluster.logs()
    result = json.loads(out.read_text())
    assert result["master"] == cluster.master_url and result["publish"] == 0
    # lance_cdf came from the shipped zip, on the driver and on both executors
    assert "lance_cdf.zip" in result["driver_lance_cdf"]
    executor_dirs = {d for d, _ in result["executors"]}
    assert len(executor_dirs) == 2
    assert all(d.startswith(str(cluster.workdir / "worker")) for d in executor_dirs)
    for cwd, origin in result["executors"]:  # each executor's own copy of the zip
        assert origin == f"{cwd}/lance_cdf.zip/lance_cdf/__init__.py"
    # slices of the feed were read in executor processes, by both executors
    assert result["partitions"] >= 4
    assert sum(n for _, n in result["slices"]) == events.num_rows
    assert {d for d, n in result["slices"] if n} == executor_dirs
    # and the stream the cluster published equals read_changes of the table on S3
    count = len(want) + sum(1 for r in want if r[2] == "d")
    got = consume_all(
        kafka_broker.bootstrap_servers, topic, schema_registry.url, count, with_partitions=True
    )
    got, partitions = [(k, v) for k, v, _ in got], [p for _, _, p in got]
    records = sorted(
        (k["_rowid"], v["source"]["commit_version"], v["op"], v["after"]) for k, v in got if v
    )
    assert records == sorted(want)
    # two writer tasks, each key in one partition, in commit order
    assert "with 2 writer(s) over 4 partition(s)" in log.read_text()
    partition_of, versions = {}, {}
    for (k, v), p in zip(got, partitions, strict=True):
        assert partition_of.setdefault(k["_rowid"], p) == p
        if v:
            versions.setdefault(k["_rowid"], []).append(v["source"]["commit_version"])
    assert len(set(partition_of.values())) >= 2
    assert all(vs == sorted(vs) for vs in versions.values())
    assert sum(1 for _, v in got if v is None) == sum(1 for r in want if r[2] == "d")
