"""A Spark Python daemon whose forked workers start warm: fewer slow micro-batches after
start and after a quiet minute, for a database's publisher.

Spark forks its Python workers from a daemon (`spark.python.daemon.module`, by default
`pyspark.daemon`), starts them when a micro-batch first needs them and stops every idle one
once no task has taken or returned a worker for a minute (PythonWorkerFactory's monitor;
Spark 4.3), so the first micro-batch after start, and after any minute without one, pays
fresh workers' imports (pyarrow, lance, confluent_kafka, fastavro, lance_cdf's sink: about
a second each; docs/benchmarks.md, "Inside the publisher"). This daemon imports them once
and then runs pyspark's own daemon, so each forked worker has them already. `lance-cdf
publish` names it as `spark.python.daemon.module` when it starts a local Spark session.

Forking is safe only from a single-threaded process. Threads per import, as counted on
Linux (`/proc/self/task`): confluent_kafka, fastavro, lance_cdf 0; numpy (through
pyarrow) 1, OpenBLAS's pool; pyarrow 1 more, its bundled jemalloc's background purge
thread (`jemalloc_bg_thd`); lance none beyond pyarrow's (its tokio runtime starts on
first use, after the fork). So `preload` switches both off before importing
(`OPENBLAS_NUM_THREADS=1`, `JE_ARROW_MALLOC_CONF=background_thread:false`, unless
already set; the workers inherit both: single-threaded BLAS, which the sink does not
use, and jemalloc purging on allocation instead of from a thread) and counts the
threads afterwards. If any thread is left (a user's own setting, a platform without
/proc) the process re-executes itself as plain `pyspark.daemon`: cold workers, never an
unsafe fork.

Importing this module does nothing; `python -m lance_cdf.spark.sink.warm_daemon WORKER_MODULE`
(how Spark starts a daemon) runs `main`.
"""

from __future__ import annotations

import importlib
import os
import sys

PRELOAD = ("confluent_kafka", "fastavro", "pyarrow", "lance", "lance_cdf.spark.sink.kafka_sink")
# the worker modules whose workers serve every micro-batch (the writer tasks, the writer
# factory, the streaming sink's commit runner); the planners (look the source up, create
# it, plan the read) run once at start and publish then stops their daemons: their
# daemons preload nothing (Spark 4.3 starts only the task workers' daemon from this module,
# the other two are listed for a Spark that starts theirs from it too; a preloading daemon
# holds more memory idle: docs/benchmarks.md, "A whole database")
WARM_MODULES = frozenset(
    {
        "pyspark.worker",
        "pyspark.sql.worker.write_into_data_source",
        "pyspark.sql.worker.python_streaming_sink_runner",
    }
)


def warms(argv: list[str]) -> bool:
    """Whether the daemon started with `argv` preloads (Spark passes the worker module)."""
    return (argv[1] if len(argv) > 1 else "pyspark.worker") in WARM_MODULES


def threads() -> int:
    """This process's thread count, or 0 when it cannot be told (no /proc)."""
    try:
        return len(os.listdir("/proc/self/task"))
    except OSError:
        return 0


def preload() -> int:
    """Import PRELOAD with the thread pools off; the thread count afterwards. pylance warns
    at every fork of a process that imported it ("lance is not fork-safe", on publish's
    terminal); the caller forks only when this returns 1 thread (no runtime started), so
    that warning is silenced in this process (and the workers it forks)."""
    import warnings

    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
    os.environ.setdefault("JE_ARROW_MALLOC_CONF", "background_thread:false")
    warnings.filterwarnings("ignore", message="lance is not fork-safe", category=UserWarning)
    for name in PRELOAD:
        importlib.import_module(name)
    return threads()


def main() -> None:
    if warms(sys.argv) and (threads() != 1 or preload() != 1):
        print(
            "lance_cdf.spark.sink.warm_daemon: threads after the imports; running pyspark.daemon",
            file=sys.stderr,
        )
        os.execv(sys.executable, [sys.executable, "-m", "pyspark.daemon", *sys.argv[1:]])
    from pyspark.daemon import manager

    manager()


if __name__ == "__main__":
    main()
