"""A fresh Spark application that never registers anything: test_discovery runs
it with `python` (local[2]) and with `spark-submit` (standalone cluster). It reads the
`lance-cdf` source through the DataFrame API, a SQL view and a stream, and reports what
it got as JSON.

    python discovery_job.py '<json arguments>'
"""

import json
import sys

from pyspark.sql import SparkSession

COLUMNS = "_rowid, _change_type, _commit_version, id, name"


def rows(df) -> list:
    return sorted(list(r) for r in df.selectExpr(*COLUMNS.split(", ")).collect())


def main(args: dict) -> None:
    builder = SparkSession.builder.appName("lance-cdf discovery")
    if args.get("master"):
        builder = builder.master(args["master"]).config("spark.ui.enabled", "false")
    spark = builder.config("spark.sql.session.timeZone", "UTC").getOrCreate()
    uri, start, end = args["table"], args["start"], args["end"]
    out: dict = {"lance_cdf_imported_before_read": "lance_cdf" in sys.modules}

    reader = spark.read.format("lance-cdf").option("path", uri)
    out["dataframe"] = rows(
        reader.option("startingVersion", start).option("endingVersion", end).load()
    )

    options = f"path '{uri}', startingVersion {start}, endingVersion {end}"
    spark.sql(f"CREATE TEMPORARY VIEW quoted USING `lance-cdf` OPTIONS ({options})")
    out["sql_view"] = rows(spark.sql("SELECT * FROM quoted"))
    try:  # does the hyphenated name parse without backquotes?
        spark.sql(f"CREATE TEMPORARY VIEW bare USING lance-cdf OPTIONS ({options})")
        out["sql_unquoted"] = rows(spark.sql("SELECT * FROM bare"))
    except Exception as exc:
        out["sql_unquoted_error"] = f"{type(exc).__name__}: {str(exc)[:300]}"

    manager = spark._jsparkSession.sessionState().dataSourceManager()
    out["sink_found"] = bool(manager.dataSourceExists("lance-cdf-kafka"))
    if not args.get("stream", True):
        finish(spark, args, out)
        return
    stream = (
        spark.readStream.format("lance-cdf")
        .option("path", uri)
        .option("startingVersion", start)
        .option("maxVersionsPerTrigger", 1)
        .load()
        .writeStream.format("memory")
        .queryName("changes")
        .trigger(availableNow=True)
        .start()
    )
    stream.awaitTermination()
    out["stream"] = rows(spark.sql("SELECT * FROM changes"))
    out["progress"] = [
        {"sources": p["sources"], "numInputRows": p["numInputRows"]} for p in stream.recentProgress
    ]
    finish(spark, args, out)


def finish(spark, args: dict, out: dict) -> None:
    with open(args["out"], "w") as f:
        json.dump(out, f)
    spark.stop()


if __name__ == "__main__":
    main(json.loads(sys.argv[1]))
