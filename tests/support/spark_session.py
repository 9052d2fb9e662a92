"""One local Spark session for the whole test run (Spark starts in ~4 s), and one Spark
standalone cluster for the tests that submit jobs to one."""

import os
import sys

import pytest


@pytest.fixture(scope="session")
def spark():
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    session = (
        SparkSession.builder.master("local[2]")
        .appName("lance-cdf-tests")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.driver.memory", "1g")
        .getOrCreate()
    )
    import lance_cdf.spark

    lance_cdf.spark.register(session)
    yield session
    session.stop()


@pytest.fixture(scope="session")
def spark_cluster(tmp_path_factory):
    """A started `SparkCluster` (a master and two workers of one core and 1g on 127.0.0.1),
    shared by the tests that `spark-submit` to a cluster: each job is an application of its
    own, with executors of its own under `<workdir>/worker<i>/work/<app>`."""
    from lance_cdf_devtools.spark import SparkCluster

    cluster = SparkCluster(
        tmp_path_factory.mktemp("spark-cluster"), workers=2, cores=1, memory="1g"
    )
    cluster.start()
    yield cluster
    cluster.stop()
