"""pytest plugin (loaded by tests/conftest.py): how a run with pytest-xdist workers
(`make test`'s TEST_WORKERS: `-n N --dist loadgroup --no-loadscope-reorder`) shares the tests out.

- A module whose tests share a module-scoped fixture (the three-broker cluster, Kafka
  Connect, PostgreSQL, a module's own brokers) runs whole in one worker, so that fixture
  starts once: its tests get one `xdist_group`, named after the module.
- Every other test is scheduled on its own, so a long module is spread over the workers.
- The longest work is handed out first and the short work fills the end (a worker left
  with a long test at the end is what makes a parallel run slow): the tests in order of
  their duration in an earlier run (`tests/durations.json`: seconds per test id; it may
  hold only the longest), longest first; a test not in it is taken as an integration test
  of `UNKNOWN_INTEGRATION_S` or a unit test of none (so a stale file costs time, never a
  test).
  `LANCE_CDF_STORE_DURATIONS=PATH` writes this run's durations there (`make durations`).

Without workers the order stays pytest's own."""

import json
import os
from collections import defaultdict
from pathlib import Path

import pytest

DURATIONS = Path(__file__).resolve().parents[1] / "durations.json"  # tests/durations.json
STORE_ENV = "LANCE_CDF_STORE_DURATIONS"
UNKNOWN_INTEGRATION_S = 10.0


def _shares_a_module_fixture(item) -> bool:
    defs = getattr(item, "_fixtureinfo", None)
    if defs is None:
        return False
    return any(
        d.scope == "module" for fixturedefs in defs.name2fixturedefs.values() for d in fixturedefs
    )


def _module(item) -> str:
    module = getattr(item, "module", None)
    return module.__name__ if module is not None else item.nodeid.split("::")[0]


def _known() -> dict[str, float]:
    try:
        data = json.loads(DURATIONS.read_text())
    except (OSError, ValueError):
        return {}
    return {str(k): float(v) for k, v in data.items()} if isinstance(data, dict) else {}


# neither first (`classify` marks unit / integration first) nor last: before xdist's own
# hook, which reads the groups (a plugin registered later runs earlier)
def pytest_collection_modifyitems(config, items):
    if config.getoption("dist", "no") != "loadgroup":
        return
    modules = {_module(item) for item in items if _shares_a_module_fixture(item)}
    for item in items:
        if _module(item) in modules:
            item.add_marker(pytest.mark.xdist_group(_module(item)))
    known = _known()

    def seconds(item) -> float:
        if item.nodeid in known:
            return known[item.nodeid]
        integration = item.get_closest_marker("integration") is not None
        return UNKNOWN_INTEGRATION_S if integration else 0.0

    def scope(item) -> str:  # what xdist hands out as one piece: a group, or one test
        return _module(item) if _module(item) in modules else item.nodeid

    total: dict[str, float] = defaultdict(float)
    for item in items:
        total[scope(item)] += seconds(item)
    items.sort(key=lambda i: -total[scope(i)])


class _Recorder:
    def __init__(self, path: str) -> None:
        self.path = path
        self.seconds: dict[str, float] = defaultdict(float)

    def pytest_runtest_logreport(self, report) -> None:
        nodeid = report.nodeid.rsplit("@", 1)[0]  # (xdist names a grouped test id@group)
        self.seconds[nodeid] += report.duration

    def pytest_sessionfinish(self, session) -> None:
        done = {k: round(v, 2) for k, v in sorted(self.seconds.items())}
        Path(self.path).write_text(json.dumps(done, indent=0) + "\n")


def pytest_configure(config):
    path = os.environ.get(STORE_ENV)
    # in the controller of a run with workers (the workers' reports reach it), or alone
    if path and not hasattr(config, "workerinput"):
        config.pluginmanager.register(_Recorder(path), "lance-cdf-durations")
