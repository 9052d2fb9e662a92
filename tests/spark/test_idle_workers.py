"""A local publisher keeps its Python workers through quiet periods: Spark stops every idle
worker of a factory once nothing has used it for a minute (its monitor looks every 10 s),
and `keep_workers_warm` marks the factories as just used. Here the factories' last use is
set a minute and more back (Spark's clock), as after a quiet minute: marked, the same
workers serve the next job; not marked (the control), Spark stops them."""

import os
import time

from lance_cdf.spark.publish.spark_driver import keep_workers_warm

# Spark's monitor looks every 10 s: a wait past one of its looks
MONITOR_WAIT_S = 15.0
STAMP = "org$apache$spark$api$python$PythonWorkerFactory$$lastActivityNs"


def factories(spark):
    jvm = spark._jvm
    env = spark.sparkContext._jsc.sc().env()
    field = jvm.java.lang.Class.forName("org.apache.spark.SparkEnv").getDeclaredField(
        "pythonWorkers"
    )
    field.setAccessible(True)
    out, it = [], field.get(env).values().iterator()
    while it.hasNext():
        out.append(it.next())
    return out


def age_factories(spark, seconds: float) -> None:
    """Set every factory's last use `seconds` back (as if idle that long)."""
    now = spark._jvm.java.lang.System.nanoTime()
    for factory in factories(spark):
        stamp = factory.getClass().getDeclaredField(STAMP)
        stamp.setAccessible(True)
        stamp.setLong(factory, now - int(seconds * 1e9))


def worker_pids(spark) -> set[int]:
    return set(spark.sparkContext.parallelize(range(2), 2).map(lambda _: os.getpid()).collect())


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False


def test_marked_workers_outlive_a_quiet_minute_and_unmarked_ones_do_not(spark):
    pids = worker_pids(spark)
    assert pids and all(alive(p) for p in pids)

    age_factories(spark, 120)
    assert keep_workers_warm(spark) >= 1
    time.sleep(MONITOR_WAIT_S)
    assert all(alive(p) for p in pids), "marked workers were stopped"
    assert worker_pids(spark) & pids, "the next job did not reuse a kept worker"

    pids = worker_pids(spark)
    age_factories(spark, 120)  # the control: not marked
    deadline = time.monotonic() + 3 * MONITOR_WAIT_S
    while any(alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(1)
    assert not any(alive(p) for p in pids), "Spark kept idle workers without the mark"
