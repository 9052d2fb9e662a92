"""Write the class-data-sharing archives the tests' JVMs map (`short_jvms`): a local
Spark driver (what every `lance-cdf publish` of the tests starts), a Kafka broker and the
schema registry, each started once under the tests' JVM options with
`LANCE_CDF_TEST_JVM_CDS_WRITE=1`, so each writes the archive of its class path when it
exits. Run by `make provision`; an archive already there is kept. Nothing of what a test
proves depends on it: a JVM without an archive starts as before, only slower.

    python -m tests.support.jvm_archives   (from the project root)
"""

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from tests.support.short_jvms import CDS_ENV, WRITE_ENV, install, options_in_use

# a local Spark session's first results: the classes a driver loads to run a query
_SPARK = """
from pyspark.sql import SparkSession
spark = SparkSession.builder.master("local[1]").config("spark.ui.enabled", "false").getOrCreate()
spark.range(1000).selectExpr("id % 7 AS k").groupBy("k").count().collect()
gateway = spark.sparkContext._gateway
spark.stop()
gateway.proc.stdin.close()  # the JVM exits at its stdin's end, writing its archive
gateway.proc.wait(120)
"""


def main() -> int:
    options = options_in_use()
    if not options or os.environ.get(CDS_ENV, "1") == "0":
        return 0
    from lance_cdf_devtools import KafkaBroker, SchemaRegistry

    work = Path(tempfile.mkdtemp(prefix="lance-cdf-jvm-archives-"))
    try:
        (work / "java").mkdir()
        install(work / "java", options)
        broker = KafkaBroker(work / "kafka")
        # formatted first without writing: the storage tool has the broker's class path
        broker.start().stop()
        os.environ[WRITE_ENV] = "1"
        broker.start().stop()  # a restart keeps the formatted data
        SchemaRegistry(work / "registry").start().stop()
        env = {**os.environ, "PYSPARK_PYTHON": sys.executable}
        subprocess.run([sys.executable, "-c", _SPARK], check=True, env=env)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
