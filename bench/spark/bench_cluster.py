"""Publishing throughput on a standalone cluster with 1 and with 2 workers.

    python -m bench.spark.bench_cluster --rows 1000000 --commits 5 \
        --out bench/results/results_cluster.json

A master and N workers (1 core, 1 GB each) on 127.0.0.1 (lance_cdf_devtools.SparkCluster),
a real broker and registry; `spark-submit` runs cluster_publish_job.py, which streams the
table's commits (one per micro-batch) into the lance-cdf-kafka sink as `lance-cdf publish`
does, one writer task per worker. Reported per cluster size: the steady rate (micro-batches
after the first, which pays for Python workers and producers) and the first micro-batch.
On one machine the workers share its cores with the driver, the broker and the registry.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import uuid
from pathlib import Path

import lance

from bench.support.results import write_result
from bench.support.tables import narrow

JOB = Path(__file__).resolve().parents[1] / "support" / "cluster_publish_job.py"


def run(workers, uri, kafka, registry, partitions, workdir) -> dict:
    from confluent_kafka.admin import AdminClient, NewTopic

    from lance_cdf_devtools.spark import SparkCluster, spark_home

    topic = f"cluster-bench-{uuid.uuid4().hex[:6]}"
    admin = AdminClient({"bootstrap.servers": kafka.bootstrap_servers})
    admin.create_topics([NewTopic(topic, partitions, 1)])[topic].result(30)
    out = workdir / f"result-{workers}.json"
    args = {
        "executors": workers,
        "table": uri,
        "partitions": partitions,
        "topic": topic,
        "bootstrap_servers": kafka.bootstrap_servers,
        "schema_registry": registry.url,
        "checkpoint": str(workdir / f"ck-{workers}"),
        "out": str(out),
    }
    py = sys.executable
    env = {
        **os.environ,
        "PYSPARK_PYTHON": py,
        "PYSPARK_DRIVER_PYTHON": py,
        "SPARK_LOCAL_IP": "127.0.0.1",
    }
    with SparkCluster(
        workdir / f"cluster-{workers}", workers=workers, cores=1, memory="1g"
    ) as cluster:
        cmd = [
            str(spark_home() / "bin" / "spark-submit"),
            "--master",
            cluster.master_url,
            "--driver-memory",
            "1g",
            "--conf",
            f"spark.pyspark.python={py}",
            "--conf",
            "spark.executor.memory=1g",
            "--conf",
            "spark.executor.cores=1",
            "--conf",
            "spark.ui.enabled=false",
            "--conf",
            "spark.sql.session.timeZone=UTC",
            str(JOB),
            json.dumps(args),
        ]
        log = workdir / f"submit-{workers}.log"
        with open(log, "wb") as fh:
            done = subprocess.run(cmd, env=env, stdout=fh, stderr=subprocess.STDOUT, timeout=1800)
        if done.returncode:
            raise SystemExit(log.read_text()[-4000:] + cluster.logs())
    result = json.loads(out.read_text())
    rest = result["batches"][1:]
    return {
        "workers": workers,
        "s": result["s"],
        "first_batch_s": result["batches"][0][1],
        "events": sum(n for n, _ in result["batches"]),
        "steady_eps": sum(n for n, _ in rest) / sum(s for _, s in rest) if rest else None,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--commits", type=int, default=5)
    ap.add_argument("--partitions", type=int, default=4)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    from lance_cdf_devtools import KafkaBroker, SchemaRegistry

    workdir = Path(tempfile.mkdtemp(prefix="bench-cluster-"))
    uri = str(workdir / "narrow.lance")
    table = narrow(args.rows)
    step = -(-args.rows // args.commits)
    for i in range(0, args.rows, step):
        mode = "append" if i else "create"
        lance.write_dataset(
            table.slice(i, step),
            uri,
            enable_stable_row_ids=True,
            max_rows_per_file=250_000,
            mode=mode,
        )
    results = []
    try:
        with KafkaBroker(heap="1g") as kafka, SchemaRegistry() as registry:
            for workers in (1, 2):
                r = run(workers, uri, kafka, registry, args.partitions, workdir)
                results.append(r)
                print(json.dumps(r), flush=True)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    if len(results) == 2 and all(r["steady_eps"] for r in results):
        growth = results[1]["steady_eps"] / results[0]["steady_eps"]
        print(f"2 workers / 1 worker, steady: {growth:.2f}x")
    write_result(args.out, results)


if __name__ == "__main__":
    main()
