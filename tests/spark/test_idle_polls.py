"""How often a database stream looks at its tables (spark/source/idle_polls.py): a quiet table
at most once per ceiling, a written one every trigger, a change after a quiet period seen
within the ceiling; and on the S3 server (moto), each idle table's requests counted by the
server itself."""

from __future__ import annotations

import lancedb
import numpy as np
import pyarrow as pa
import pytest
from pyspark.sql.streaming.datasource import ReadAllAvailable

from lance_cdf.errors import LanceCdfError
from lance_cdf.spark.source import table_feeds
from lance_cdf.spark.source.database_stream import DatabaseOptions, DatabaseReader
from lance_cdf.spark.source.idle_polls import (
    DUE_SLACK,
    IDLE_POLL_MAX,
    IDLE_POLL_MAX_LOCAL,
    IdlePolls,
    idle_poll_max,
)

pytest_plugins = ["tests.support.s3_services"]
STABLE = {"new_table_enable_stable_row_ids": "true"}
# the options publish gives a database stream of work items
WORK_ITEMS = {"writerSlots": "1", "keyHash": "_rowid", "kafkaPartitions": "1"}


def run(polls: IdlePolls, changes: set[float], until: float, trigger: float = 1.0) -> list:
    """Triggers every `trigger` s from 0 to `until` for one table that changes at the times
    in `changes`; returns the trigger times it was looked at, each with whether it saw a
    change (a look sees every change made since the previous look)."""
    looks, last = [], -1.0
    t = 0.0
    while t <= until:
        if polls.due("t", t):
            changed = any(last < c <= t for c in changes) or not looks
            polls.looked("t", changed, t)
            looks.append((t, changed))
            last = t
        t = round(t + trigger, 6)
    return looks


@pytest.mark.unit
@pytest.mark.parametrize("ceiling", [4.0, 10.0, 30.0])
def test_a_quiet_table_is_looked_at_at_most_once_per_ceiling(ceiling):
    looks = run(IdlePolls(ceiling=ceiling), set(), until=600)
    times = [t for t, _ in looks]
    late = [t for t in times if t >= 6 * ceiling]  # long quiet: the ceiling holds
    gaps = np.diff(late)
    assert len(late) and gaps.min() >= ceiling - DUE_SLACK and gaps.max() <= ceiling + 1
    per_minute = sum(1 for t in times if 300 <= t < 360)
    assert per_minute <= 60 / ceiling


@pytest.mark.unit
def test_tables_quiet_since_the_same_trigger_are_looked_at_in_different_triggers():
    """200 tables taken up together, then quiet: once at the ceiling, their looks spread
    over its triggers instead of all falling on one (oracle: all in one, without the
    spread, is 200 in every tenth trigger)."""
    polls = IdlePolls(ceiling=10.0)
    per_trigger = []
    for t in range(0, 400):
        due = [n for n in (f"t{i}" for i in range(200)) if polls.due(n, float(t))]
        for name in due:
            polls.looked(name, t == 0, float(t))
        per_trigger.append(len(due))
    late = per_trigger[200:]
    assert sum(late) == 200 * len(late) / 10  # each table once per ceiling
    assert max(late) <= 45, late[:20]


@pytest.mark.unit
def test_a_table_written_every_second_is_looked_at_every_trigger():
    changes = {float(s) for s in range(1, 300)}
    looks = run(IdlePolls(ceiling=10.0), changes, until=300)
    assert [t for t, _ in looks] == [float(s) for s in range(0, 301)]


@pytest.mark.unit
@pytest.mark.parametrize("quiet", [30.0, 200.0, 1000.0])
@pytest.mark.parametrize("ceiling", [5.0, 10.0])
def test_a_change_after_a_quiet_period_is_seen_within_the_ceiling(quiet, ceiling):
    """Also right after it: a second commit shortly after the first is seen at the next
    trigger (the first change brings the table back to every trigger)."""
    for offset in np.linspace(0.05, ceiling, 7):
        change = round(quiet + offset, 2)
        looks = run(IdlePolls(ceiling=ceiling), {change}, until=change + 30)
        (first,) = [t for t, changed in looks if changed and t >= change]
        assert first - change <= ceiling + DUE_SLACK, (change, looks[-8:])
        after = first + 0.5
        looks = run(IdlePolls(ceiling=ceiling), {change, after}, until=change + 30)
        seen = [t for t, changed in looks if changed and t >= change]
        assert seen == [first, first + 1.0], (change, looks[-8:])


@pytest.mark.unit
def test_ceiling_zero_looks_every_trigger_and_the_setting_is_checked():
    looks = run(IdlePolls(ceiling=0.0), set(), until=100)
    assert len(looks) == 101
    assert idle_poll_max("2.5") == 2.5 and idle_poll_max("0") == 0
    for bad in ("-1", "x", "inf", "nan"):
        with pytest.raises(LanceCdfError, match="seconds"):
            idle_poll_max(bad)


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def rows(lo: int, hi: int) -> pa.Table:
    return pa.table({"id": np.arange(lo, hi), "s": [f"a{i}" for i in range(lo, hi)]})


@pytest.mark.parametrize("ceiling", [6.0, 0.0])
def test_idle_tables_on_s3_cost_what_the_ceiling_allows(s3_server, s3_uri, ceiling, monkeypatch):
    """Five idle tables of a LanceDB database on the S3 server, the database stream's
    triggers every (simulated) second: per table, the server counts at most 60 / ceiling
    requests a minute once the tables have been quiet a while (ceiling 0, the control: one
    listing every trigger), and a commit to one of them after the quiet period moves its
    offset within the ceiling. The process keeps fewer tables' feeds than it follows (as
    with hundreds of tables): a look at a quiet table must not open one."""
    monkeypatch.setattr(table_feeds._FEEDS, "size", 2)
    opts = s3_server.storage_options()
    root = s3_uri.rsplit("/", 1)[0] + "/db"
    db = lancedb.connect(root, storage_options=opts)
    tables = {
        f"t{i}": db.create_table(f"t{i}", rows(0, 5), storage_options={**opts, **STABLE})
        for i in range(5)
    }
    storage = {f"storage.{k}": v for k, v in opts.items()}
    options = {"database": root, "writerSlots": "1", "keyHash": "id", "kafkaPartitions": "1"}
    r = DatabaseReader({**options, "idlePollMax": str(ceiling), **storage})
    r.clock = clock = FakeClock()
    offset = r.initialOffset()
    assert sorted(offset["tables"]) == sorted(tables) and not r.skipped

    def trigger() -> None:
        nonlocal offset
        clock.now += 1.0
        offset = r.latestOffset(offset, ReadAllAvailable())

    for _ in range(240):  # quiet for four minutes
        trigger()
    s3_server.request_counts_by_table(reset=True)
    for _ in range(60):
        trigger()
    counts = s3_server.request_counts_by_table()
    bucket_path = root.removeprefix("s3://")
    per_table = {n: sum(counts.get(f"{bucket_path}/{n}.lance", {}).values()) for n in tables}
    assert all(n >= 1 for n in per_table.values()), per_table  # each was still looked at
    assert max(per_table.values()) <= (60 / ceiling if ceiling else 180), per_table
    assert max(per_table.values()) >= (1 if ceiling else 60), per_table

    before = offset["tables"]["t3"]
    tables["t3"].add(rows(5, 9))
    committed = clock.now
    while offset["tables"]["t3"] == before:
        assert clock.now - committed <= max(ceiling, 1.0) + DUE_SLACK, "not seen in time"
        trigger()
    assert offset["tables"]["t3"]["version"] == before["version"] + 1


@pytest.mark.unit
def test_publish_passes_the_ceiling_to_the_database_stream(tmp_path):
    from lance_cdf.spark.publish.runner import _database_options
    from lance_cdf.spark.publish.settings import Database
    from lance_cdf.spark.sink.sink_options import SinkOptions

    for given, option in ((None, None), (2.5, "2.5"), (0.0, "0")):
        source: dict[str, str] = {"path": "unused"}
        sink = SinkOptions("b", "http://r", table="t", topic="x")
        _database_options(Database("/db", "p", idle_poll_max=given), source, sink, str(tmp_path))
        assert source.get("idlePollMax") == option
    r = DatabaseReader({"database": str(tmp_path), **WORK_ITEMS, "idlePollMax": "2.5"})
    assert r.polls.ceiling == 2.5
    # not given: one request per 10 s on object storage, a listing per 2 s on a filesystem
    default = DatabaseReader({"database": str(tmp_path), **WORK_ITEMS})
    assert default.polls.ceiling == IDLE_POLL_MAX_LOCAL == 2.0
    for uri in ("s3://bucket/db", "gs://bucket/db", "az://container/db"):
        parsed = DatabaseOptions.parse({"database": uri, **WORK_ITEMS})
        assert parsed.idle_poll_max == IDLE_POLL_MAX == 10.0, uri
    for path in (str(tmp_path), f"file://{tmp_path}"):
        parsed = DatabaseOptions.parse({"database": path, **WORK_ITEMS})
        assert parsed.idle_poll_max == IDLE_POLL_MAX_LOCAL, path
