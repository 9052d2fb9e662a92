"""The Spark driver of `lance-cdf publish`: how its session is built (the local JVM's
options, the Python Spark runs, the signals its JVM ignores), where Spark logs, and its
planner daemons and accumulators kept quiet when the query stops."""

from __future__ import annotations

import os
import signal
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from lance_cdf.spark.publish.settings import PublishSettings

if TYPE_CHECKING:  # pyspark is imported once the checks are under way (see _publish)
    from pyspark.sql import SparkSession


@contextmanager
def jvm_ignores_sigterm() -> Iterator[None]:
    """Spark's JVM (and the Python runners it starts) launched with SIGTERM ignored, as
    pyspark already launches it with SIGINT ignored. SIGTERM to publish's whole process
    group (`kill -TERM -- -PGID`) or control group (systemd's default stop) otherwise kills
    the JVM under the running query (exit 1, a Py4JNetworkError traceback): this way only
    publish acts on it, stopping the query and then the JVM. A signal ignored at exec stays
    ignored: HotSpot installs no shutdown handler for it (as for `nohup java`)."""
    from pyspark import java_gateway

    popen = java_gateway.Popen  # type: ignore[attr-defined]  # pyspark's subprocess.Popen

    def launch(*args: Any, **kwargs: Any) -> Any:
        inner = kwargs.get("preexec_fn")

        def preexec() -> None:
            if inner is not None:
                inner()
            signal.signal(signal.SIGTERM, signal.SIG_IGN)

        return popen(*args, **{**kwargs, "preexec_fn": preexec})

    java_gateway.Popen = launch  # type: ignore[attr-defined,assignment]
    try:
        yield
    finally:
        java_gateway.Popen = popen  # type: ignore[attr-defined]


@contextmanager
def signal_handlers_kept() -> Iterator[None]:
    """The SIGTERM / SIGINT handlers as they were before the block (what Spark's start
    installs is undone)."""
    if threading.current_thread() is not threading.main_thread():
        yield  # (signal handlers belong to the main thread)
        return
    kept = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield
    finally:
        for s, handler in kept.items():
            if handler is not None:
                signal.signal(s, handler)


@contextmanager
def python_for_spark() -> Iterator[None]:
    """PYSPARK_PYTHON, if unset, this interpreter while the block starts Spark (the JVM
    and the workers it starts keep it); the process's environment as it was after."""
    if "PYSPARK_PYTHON" in os.environ:
        yield
        return
    os.environ["PYSPARK_PYTHON"] = sys.executable
    try:
        yield
    finally:
        os.environ.pop("PYSPARK_PYTHON", None)


def session_builder(
    own_session: bool, settings: PublishSettings
) -> tuple[SparkSession.Builder, str | None]:
    """The session builder publish starts Spark with, and the master it sets (None:
    spark-submit's or the active session's). `own_session`: no session is active, so the
    settings of a long-running local publisher are publish's to give."""
    from pyspark.sql import SparkSession

    master, topic, checkpoint = settings.run.master, settings.target.topic, settings.checkpoint
    builder = SparkSession.builder
    chosen = None  # the master publish sets (None: spark-submit's or the active session's)
    if master or (own_session and "PYSPARK_GATEWAY_PORT" not in os.environ):
        chosen = master or "local[2]"
        builder = builder.master(chosen)  # (spark-submit sets the gateway)
    if own_session:
        builder = builder.appName(f"lance-cdf publish {topic}").config("spark.ui.enabled", "false")
        # publish prints its own progress lines; Spark's "[Stage N:>...]" bars are noise
        builder = builder.config("spark.ui.showConsoleProgress", "false")
        if (chosen or "").startswith("local") and "SPARK_LOCAL_IP" not in os.environ:
            # a local master needs no port reachable from elsewhere: the driver's RPC and
            # block-manager ports listen on loopback only (Spark's default is the host's
            # external address, with authentication off); SPARK_LOCAL_IP asks otherwise
            builder = builder.config("spark.driver.bindAddress", "127.0.0.1").config(
                "spark.driver.host", "127.0.0.1"
            )
        # The footprint of a long-running local publisher: Spark's status store keeps up to
        # 1000 SQL executions, 1000 jobs and stages and 100,000 tasks even with the UI off,
        # and every micro-batch adds one of each, so the JVM grew for as long as it ran
        # (docs/benchmarks.md, "Publisher footprint"). A publisher needs none of that
        # history (its progress is its own log): keep 50 of each, 1000 tasks, 50 DAG roots.
        for key, value in (
            ("spark.sql.ui.retainedExecutions", "50"),
            ("spark.ui.retainedJobs", "50"),
            ("spark.ui.retainedStages", "50"),
            ("spark.ui.retainedTasks", "1000"),
            ("spark.ui.dagGraph.retainedRootRDDs", "50"),
            # Python workers: reused (the default, kept explicit: a fresh worker per task
            # re-imports pyarrow + lance, markedly slower per micro-batch). Spark starts one
            # daemon per worker module (6: lookup/create/plan-read/write-into data source,
            # the writer tasks, the streaming sink's commit runner) and forks workers from
            # them; the planners' workers are used once at start and Spark stops idle
            # workers after a minute; the tasks' workers, the largest processes, are bounded
            # by the local master's cores, 2 by default (`--master local[N]` to change).
            # (docs/benchmarks.md, "Publisher footprint")
            ("spark.python.worker.reuse", "true"),
        ):
            builder = builder.config(key, value)
        if "PYSPARK_GATEWAY_PORT" not in os.environ:  # the JVM is started here: its log
            options = spark_log(checkpoint)
            if (chosen or "").startswith("local"):
                options = f"{options} {local_jvm_options()}"
                # the writer tasks' workers fork warm (`warm_daemon`): Spark
                # starts them in the first micro-batch with data and again after any minute
                # without one, and fresh workers' imports made those micro-batches' commits
                # slower than steady ones; warm workers cut that at start and after a quiet
                # minute, for more memory idle and less under load (the workers share the
                # preloaded pages; docs/benchmarks.md, "A whole database"). Spark 4.3 uses
                # this module for the task workers only (pyspark.worker). One given in
                # PYSPARK_SUBMIT_ARGS wins (`--conf spark.python.daemon.module=pyspark.daemon`:
                # cold workers). A database's publisher only: one table's publisher, whose
                # workers a commit a second keeps warm, has a footprint target
                # (docs/benchmarks.md, "Publisher footprint") the idle daemon's memory would
                # move away from (not measured for it).
                submit_args = os.environ.get("PYSPARK_SUBMIT_ARGS", "")
                if (
                    settings.database is not None
                    and "spark.python.daemon.module" not in submit_args
                ):
                    builder = builder.config(
                        "spark.python.daemon.module", "lance_cdf.spark.sink.warm_daemon"
                    )
            builder = builder.config("spark.driver.extraJavaOptions", options)
    return builder, chosen


# The JVM of a local publisher, smaller: the serial collector, the client compiler only,
# a small initial heap and young generation; the heap limit (Spark's driver memory) is
# unchanged. Why each option: docs/reference/internals.md, "The local publisher's JVM".
LOCAL_JVM_OPTIONS = "-XX:+UseSerialGC -XX:TieredStopAtLevel=1 -Xms64m -Xmn16m"

# What the JVM frees of the memory it allocates with malloc (compiler arenas and other
# short-lived native buffers) glibc keeps, resident, in its arenas: a publisher's JVM held
# ~30 MB of it after 20 minutes, more than its heap grew (docs/benchmarks.md, "Publisher
# footprint"). The JVM hands it back every 30 s (`TrimNativeHeapInterval`). The option is a product
# option from JDK 17.0.11, 21.0.3 and 22.0.1 on, and a JVM that does not know it refuses
# to start: it is given only to a JVM whose `release` file says it is one of those.
NATIVE_TRIM_OPTION = "-XX:TrimNativeHeapInterval=30000"
_NATIVE_TRIM_SINCE = ((17, 0, 11), (21, 0, 3), (22, 0, 1))


def local_jvm_options(java_home: str | None = None) -> str:
    """The options of a local publisher's JVM: LOCAL_JVM_OPTIONS, and NATIVE_TRIM_OPTION
    where the JVM Spark starts (`java_home`, else JAVA_HOME's, else the `java` on PATH, as
    spark-submit finds it) takes it."""
    version = java_version(java_home if java_home is not None else _java_home())
    if version is not None and trims_native_heap(version):
        return f"{LOCAL_JVM_OPTIONS} {NATIVE_TRIM_OPTION}"
    return LOCAL_JVM_OPTIONS


def trims_native_heap(version: tuple[int, ...]) -> bool:
    """Whether a JVM of this version has `TrimNativeHeapInterval` as a product option."""
    major = version[0]
    if major > 22:
        return True
    return any(major == since[0] and version >= since for since in _NATIVE_TRIM_SINCE)


def _java_home() -> str | None:
    home = os.environ.get("JAVA_HOME")
    if home:
        return home
    import shutil

    java = shutil.which("java")
    return None if java is None else os.path.dirname(os.path.dirname(os.path.realpath(java)))


def java_version(java_home: str | None) -> tuple[int, ...] | None:
    """The JVM's version from its `release` file (JAVA_VERSION="17.0.15" -> (17, 0, 15));
    None when there is none or it says something else."""
    if not java_home:
        return None
    try:
        with open(os.path.join(java_home, "release")) as f:
            text = f.read()
    except OSError:
        return None
    for line in text.splitlines():
        if line.startswith("JAVA_VERSION="):
            parts = line.split("=", 1)[1].strip().strip('"').split(".")
            numbers = []
            for part in parts:
                digits = part.split("_")[0].split("-")[0].split("+")[0]
                if not digits.isdigit():
                    break
                numbers.append(int(digits))
            return tuple(numbers) if numbers else None
    return None


# The Python data-source planners Spark runs in the driver when the query starts (look the
# source up, create it, plan the read): each gets its own pyspark.daemon that stays for the
# life of the application (their workers Spark stops after a minute idle); a running query
# does not use them again (docs/benchmarks.md, "Publisher footprint"). (The
# writer-creating module, write_into_data_source, runs at every micro-batch: kept.)
_PLANNER_MODULES = frozenset(
    {
        "pyspark.sql.worker.lookup_data_sources",
        "pyspark.sql.worker.create_data_source",
        "pyspark.sql.worker.plan_data_source_read",
    }
)


def stop_planner_daemons(spark: SparkSession) -> int:
    """Stop the planners' Python daemons (and workers) once the query runs (3 processes of a
    local publisher); the number stopped. Spark keeps one worker factory per worker
    module in the private `SparkEnv.pythonWorkers` map and offers no call to stop one:
    this removes the planners' factories and stops them, so a later planning (a restarted
    query) starts a fresh daemon as on the first. Best effort: on a Spark without that map
    nothing is stopped (a debug log line)."""
    try:
        # no method of SparkEnv is called through py4j: its reflection of SparkEnv's
        # methods fails (a signature names a protobuf class Spark does not ship)
        jvm = spark._jvm
        env = spark.sparkContext._jsc.sc().env()
        field = jvm.java.lang.Class.forName("org.apache.spark.SparkEnv").getDeclaredField(  # type: ignore[union-attr]
            "pythonWorkers"
        )
        field.setAccessible(True)
        workers = field.get(env)
        keys = []
        it = workers.keysIterator()
        while it.hasNext():
            keys.append(it.next())
        stopped = 0
        for key in keys:
            if str(key.workerModule()) in _PLANNER_MODULES:
                factory = workers.remove(key)
                if factory.isDefined():
                    factory.get().stop()
                    stopped += 1
        return stopped
    except Exception as exc:  # py4j errors: a Spark whose internals differ
        import logging

        logging.getLogger("lance_cdf.kafka").debug("planner daemons not stopped: %s", exc)
        return 0


def keep_workers_warm(spark: SparkSession) -> int:
    """Mark every Python worker factory of this JVM as just used, so Spark does not stop
    their idle workers (it stops them once no task has taken or returned one for a minute:
    PythonWorkerFactory's monitor, a fixed timeout in Spark 4.3); the number marked. Called
    every few seconds while a local publisher waits, it keeps the writer tasks' workers,
    the writer-creating worker and the commit runner's worker (and their Kafka connections
    and read caches) across quiet periods, so the first micro-batch after one costs what a
    steady one does; their memory stays while idle. Best effort, like
    `stop_planner_daemons`: on a Spark whose internals differ nothing is marked (a debug
    line). Only this JVM's workers: a cluster's executors keep Spark's own timeout."""
    try:
        jvm = spark._jvm
        env = spark.sparkContext._jsc.sc().env()
        field = jvm.java.lang.Class.forName("org.apache.spark.SparkEnv").getDeclaredField(  # type: ignore[union-attr]
            "pythonWorkers"
        )
        field.setAccessible(True)
        factories = field.get(env).values().iterator()
        stamp = None
        now = jvm.java.lang.System.nanoTime()  # type: ignore[union-attr]
        marked = 0
        while factories.hasNext():
            factory = factories.next()
            if stamp is None:
                stamp = factory.getClass().getDeclaredField(
                    "org$apache$spark$api$python$PythonWorkerFactory$$lastActivityNs"
                )
                stamp.setAccessible(True)
            stamp.setLong(factory, now)
            marked += 1
        return marked
    except Exception as exc:  # py4j errors: a Spark whose internals differ
        import logging

        logging.getLogger("lance_cdf.kafka").debug("Python workers not kept warm: %s", exc)
        return 0


def spark_log(checkpoint: str) -> str:
    """The JVM option that sends Spark's own log (its ERROR lines carry Java and Python
    tracebacks) to publish's log file instead of the terminal."""
    log_path = log_file(checkpoint)
    config = os.path.join(os.path.dirname(log_path), "lance-cdf-log4j2.properties")
    with open(config, "w") as f:
        f.write(
            "rootLogger.level = warn\nrootLogger.appenderRef.file.ref = file\n"
            "appender.file.type = File\nappender.file.name = file\n"
            f"appender.file.fileName = {log_path}\nappender.file.append = true\n"
            "appender.file.layout.type = PatternLayout\n"
            "appender.file.layout.pattern = %d{yyyy-MM-dd HH:mm:ss} %p %c{1}: %m%n%ex\n"
        )
    return f"-Dlog4j2.configurationFile=file:{config}"


def log_file(checkpoint: str) -> str:
    if "://" in checkpoint and not checkpoint.startswith("file://"):
        import tempfile

        return os.path.join(tempfile.gettempdir(), f"lance-cdf-publish-{os.getpid()}.log")
    root = checkpoint.removeprefix("file://")
    os.makedirs(root, exist_ok=True)
    return os.path.join(root, "lance-cdf-publish.log")


# pyspark's modules import each other in a cycle: two threads importing them at once can
# meet a partially initialised module (an ImportError), so publish's start-up threads
# import pyspark.sql through one lock (`import_pyspark`) before anything else of pyspark
_PYSPARK_IMPORT = threading.Lock()


def import_pyspark() -> None:
    """pyspark.sql imported whole, by whichever thread asks first; the others wait for it."""
    with _PYSPARK_IMPORT:
        import pyspark.sql  # noqa: F401


def warm_imports() -> None:
    """Import what the driver needs after the session starts (the source, its SQL function
    and the sink's classes; docs/benchmarks.md, "Inside the publisher"), in a thread while
    the main thread waits for the JVM. An import error here is raised again, in the main
    thread, where it is used."""
    try:
        import_pyspark()
        import lance_cdf.spark.sink.kafka_sink  # noqa: F401
        import lance_cdf.spark.source.data_source  # noqa: F401
        import lance_cdf.spark.source.table_changes  # noqa: F401
    except Exception:  # noqa: BLE001 - raised again where used, in the main thread
        pass


def quiet_accumulators(spark: SparkSession) -> None:
    """PySpark's accumulator server prints an EOFError traceback when the JVM closes its
    connection first (a race while a query or the session stops, not an error): silenced
    for the session publish owns."""
    server = getattr(spark.sparkContext, "_accumulatorServer", None)
    if server is not None:
        server.handle_error = lambda *_: None


def quiet_stop(spark: SparkSession) -> None:
    quiet_accumulators(spark)
    spark.stop()
