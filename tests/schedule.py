"""pytest plugin (loaded by tests/conftest.py): how a run with pytest-xdist workers
(`make test`: `-n 2 --dist loadgroup`) shares the tests out.

- A module whose tests share a module-scoped fixture (the three-broker cluster, Kafka
  Connect, PostgreSQL, a module's own brokers) runs whole in one worker, so that fixture
  starts once: its tests get one `xdist_group`, named after the module.
- Every other test is scheduled on its own, so a long module is spread over the workers.
- The longest work is handed out first, the short work fills the end (a worker left with a
  long test at the end is what makes a parallel run slow): the integration tests of the
  grouped modules, then the other integration tests, then the unit tests, each in
  collection order.

Without workers the order stays pytest's own."""

import pytest

# where a run with workers hands each kind of test out: lower first
_GROUPED, _INTEGRATION, _UNIT = 0, 1, 2


def _shares_a_module_fixture(item) -> bool:
    defs = getattr(item, "_fixtureinfo", None)
    if defs is None:
        return False
    return any(
        d.scope == "module" for fixturedefs in defs.name2fixturedefs.values() for d in fixturedefs
    )


def _kind(item) -> int:
    if item.get_closest_marker("integration") is None:
        return _UNIT
    return _GROUPED if item.get_closest_marker("xdist_group") is not None else _INTEGRATION


def _module(item) -> str:
    module = getattr(item, "module", None)
    return module.__name__ if module is not None else item.nodeid.split("::")[0]


# neither first (`classify` marks unit / integration first) nor last: before xdist's own
# hook, which reads the groups (a plugin registered later runs earlier)
def pytest_collection_modifyitems(config, items):
    if config.getoption("dist", "no") != "loadgroup":
        return
    modules = {_module(item) for item in items if _shares_a_module_fixture(item)}
    for item in items:
        if _module(item) in modules:
            item.add_marker(pytest.mark.xdist_group(_module(item)))
    items.sort(key=_kind)  # (a stable sort: collection order within each kind)
