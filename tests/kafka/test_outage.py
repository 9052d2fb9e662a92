"""kafka/outage.py without a broker: what a writer task does while Kafka does not answer,
and the state it leaves for metrics and `lance-cdf status`."""

import json

import pytest
from confluent_kafka import KafkaException

from lance_cdf.cli import main
from lance_cdf.errors import KafkaUnavailableError
from lance_cdf.kafka import outage
from lance_cdf.kafka.outage import RideOut, describe_state, read_state


def test_retries_until_kafka_answers_and_records_the_outage(tmp_path, monkeypatch, caplog):
    monkeypatch.setattr(outage, "BACKOFF_S", (0.01,))
    calls = []

    def attempt():
        calls.append(1)
        if len(calls) < 4:
            raise KafkaException("broker down")
        return "marks"

    # (an outage from the first failure on: the flush timeout taken as 0)
    ride = RideOut("127.0.0.1:9", str(tmp_path), outage_after_s=0.0)
    with caplog.at_level("WARNING", logger="lance_cdf.kafka"):
        assert ride.call("reading offsets", attempt, (KafkaException,)) == "marks"
    assert len(calls) == 4
    # logged once when Kafka stopped answering, once when it answered again
    assert [r.getMessage().split(" (")[0] for r in caplog.records] == [
        "Kafka at 127.0.0.1:9 does not answer",
        "Kafka at 127.0.0.1:9 answers again after 0 s",
    ]
    state = read_state(str(tmp_path))
    assert state.outages == 1 and state.retries == 3 and state.unavailable_since == 0
    assert "broker down" in state.cause
    assert "1 outage(s) ridden out" in describe_state(str(tmp_path))[1]


def test_failures_shorter_than_the_flush_timeout_are_retries_not_an_outage(
    tmp_path, monkeypatch, caplog
):
    """One rule for the log, `status` and the metrics: an outage is Kafka not answering for
    longer than the flush timeout. A request that fails and then succeeds within it (a
    partition's leader moving after a broker was killed) is counted as retries only; the
    same failures lasting past it are an outage."""
    monkeypatch.setattr(outage, "BACKOFF_S", (0.01,))
    failures = iter([KafkaException("leader moved")] * 3)

    def attempt():
        exc = next(failures, None)
        if exc is not None:
            raise exc
        return "marks"

    ride = RideOut("127.0.0.1:9", str(tmp_path), outage_after_s=60.0)
    with caplog.at_level("WARNING", logger="lance_cdf.kafka"):
        assert ride.call("reading offsets", attempt, (KafkaException,)) == "marks"
    assert not caplog.records
    state = read_state(str(tmp_path))
    assert state.outages == 0 and state.retries == 3 and state.unavailable_since == 0
    assert "0 outage(s) ridden out" in describe_state(str(tmp_path))[1]
    # a flush that waited the whole flush timeout is an outage at once
    ride.waiting("5 record(s) not acknowledged", waited_s=60.0)
    ride.answered()
    assert read_state(str(tmp_path)).outages == 1


def test_an_outage_longer_than_the_budget_stops_with_one_line(tmp_path):
    ride = RideOut("127.0.0.1:9", str(tmp_path), budget_s=0.0, outage_after_s=0.0)

    def attempt():
        raise KafkaException("broker down")

    with pytest.raises(KafkaUnavailableError) as err:
        ride.call("reading offsets", attempt, (KafkaException,))
    text = str(err.value)
    assert "\n" not in text and text.startswith("Kafka at 127.0.0.1:9 did not answer for 0 s")
    # the facts only: the fix is the caller's to say (publish's, once it stops on it)
    assert text.endswith("(reading offsets: broker down)") and "rerun" not in text
    # still unavailable as far as the checkpoint knows: status says so
    state = read_state(str(tmp_path))
    assert state.unavailable_since > 0
    assert "not answering the publisher since" in describe_state(str(tmp_path))[1]


def test_publish_stopped_by_an_outage_says_to_rerun_and_a_head_start_does_not(tmp_path):
    """The error says what happened; publish, stopped by it (the query's failure, as Spark
    words it), adds the fix; a head start that ends on it leaves the outage to the query."""
    from lance_cdf.spark.publish.runner import _one_line, _said

    ride = RideOut("127.0.0.1:9", None, budget_s=0.0, outage_after_s=0.0)
    with pytest.raises(KafkaUnavailableError) as err:
        ride.waiting("flushing: broker down")
    spark_text = (
        "[STREAM_FAILED] Query terminated with exception: Job aborted.\n"
        "Traceback (most recent call last):\n  ...\n"
        f"lance_cdf.errors.KafkaUnavailableError: {err.value}\n\tat org.apache.spark..."
    )
    line = _one_line(RuntimeError(spark_text), str(tmp_path))
    assert line.startswith(f"{err.value}; nothing is lost: rerun lance-cdf publish (same ")
    assert "--checkpoint) once the broker is back (details: " in line and "\n" not in line
    assert _said(err.value) == str(err.value)  # the head start's: no rerun advised
    # other errors of ours are told as they are
    other = "lance_cdf.errors.PublishError: the schema registry failed: no answer\n"
    assert _one_line(RuntimeError(other), str(tmp_path)).startswith(
        "the schema registry failed: no answer (details: "
    )


def test_other_errors_are_not_retried(tmp_path):
    ride = RideOut("127.0.0.1:9", str(tmp_path))
    with pytest.raises(ValueError):
        ride.call(
            "reading offsets", lambda: (_ for _ in ()).throw(ValueError("x")), (KafkaException,)
        )
    assert read_state(str(tmp_path)) is None


def test_status_shows_the_kafka_state(tmp_path, capsys):
    import lance
    import pyarrow as pa

    uri = str(tmp_path / "t.lance")
    lance.write_dataset(pa.table({"id": [1]}), uri, enable_stable_row_ids=True)
    ck = tmp_path / "ck"
    ck.mkdir()
    state = {"unavailable_since": 0, "retries": 7, "outages": 2, "last_outage_s": 131.0}
    (ck / outage.STATE_FILE).write_text(json.dumps(state))
    assert main(["status", "--table", uri, "--checkpoint", str(ck), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["kafka"]["retries"] == 7 and report["kafka"]["outages"] == 2
    assert main(["status", "--table", uri, "--checkpoint", str(ck)]) == 0
    assert "kafka       answering; 2 outage(s) ridden out, the last one 131 s (7 retries)" in (
        capsys.readouterr().out
    )


def test_the_flush_timeout_flag_reaches_the_sinks_publishers(tmp_path):
    """`--flush-timeout` becomes the sink option `flushTimeout`, what the writer tasks' and
    the commit's waits for acknowledgements are (default: FLUSH_TIMEOUT_S)."""
    from lance_cdf.cli import build_parser
    from lance_cdf.cli.publish_command import publish_settings
    from lance_cdf.kafka import outage
    from lance_cdf.spark.publish.runner import _sink_options
    from lance_cdf.spark.sink.sink_options import SinkOptions

    base = [
        "publish",
        "--table",
        str(tmp_path / "t.lance"),
        "--bootstrap-servers",
        "b",
        "--topic",
        "x",
        "--schema-registry",
        "http://r",
        "--checkpoint",
        str(tmp_path / "c"),
    ]
    waits = []
    for extra in (["--flush-timeout", "2.5s"], []):
        settings = publish_settings(build_parser().parse_args([*base, *extra]))
        # as Spark hands publish's options to the sink
        options = SinkOptions.parse(_sink_options(settings).to_options())
        waits.append(options.flush_timeout_s)
    assert waits == [2.5, outage.FLUSH_TIMEOUT_S]


def test_a_short_outage_after_a_long_one_keeps_the_longest(tmp_path):
    """Two writer tasks share the checkpoint's state: a long outage ridden out by one, then a
    short one (a broker back from a freeze answering once with a stale epoch) by another:
    the last is the short one, the longest is kept and shown."""
    import time

    long = RideOut("127.0.0.1:9", str(tmp_path), outage_after_s=0.0)
    short = RideOut("127.0.0.1:9", str(tmp_path), outage_after_s=0.0)
    long.waiting("broker down")
    long.since = time.monotonic() - 40  # (as if it began 40 s ago)
    long.answered()
    short.waiting("stale leader epoch")
    short.answered()
    state = read_state(str(tmp_path))
    assert state.outages == 2 and state.last_outage_s < 5 and state.longest_outage_s >= 40
    assert describe_state(str(tmp_path))[1].endswith("; the longest 40 s")


def test_the_sink_and_a_publisher_ride_out_as_their_settings_say(tmp_path):
    """The sink's options and a publisher's settings make the same ride-out (`RideOut.of`):
    rideOut is the budget, flushTimeout how long unanswered counts as an outage."""
    from lance_cdf.kafka.publisher import PublisherSettings
    from lance_cdf.spark.sink.sink_options import SinkOptions

    options = SinkOptions.parse(
        {
            "kafka.bootstrap.servers": "b:9092",
            "schema.registry.url": "http://r",
            "topic": "t",
            "table": "/t.lance",
            "flushTimeout": "2.5",
            "rideOut": "30",
            "checkpointLocation": str(tmp_path),
        }
    )
    settings = PublisherSettings(flush_timeout_s=2.5, ride_out_s=30.0, checkpoint=str(tmp_path))
    for made in (RideOut.of(options.bootstrap_servers, options), RideOut.of("b:9092", settings)):
        assert (made.where, made.budget_s, made.outage_after_s) == ("b:9092", 30.0, 2.5)
        assert made.path == outage.state_path(str(tmp_path))
