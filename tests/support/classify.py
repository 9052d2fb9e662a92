"""pytest plugin (loaded by tests/conftest.py): every test is `unit` or `integration`,
never both, never neither.

`integration`: the test's fixture closure holds a fixture of a service plugin
(`spark_session`, `kafka_services`, `s3_services`: a JVM, a broker, a registry, a
Spark session, the S3 server process), or its module says `pytestmark =
pytest.mark.integration` because its tests start such things themselves (Spark
clusters, `lance-cdf publish` / `replicate` / the demo as subprocesses, ...).
`unit`: everything else. A test may carry one of the two marks explicitly; `unit` on a
test that uses a service fixture is a collection error.

A unit-only run (`make test-unit`: `LANCE_CDF_UNIT_ONLY=1`, or `-m unit`) proves that
it starts nothing:
- every selected test must be `unit` (else a usage error before anything runs);
- setting up a service plugin's fixture fails the test;
- `lance_cdf_devtools`' services (broker, registry, Connect, PostgreSQL, S3 server,
  Spark master/worker) refuse to start;
- `JAVA_HOME` and the front of `PATH` point at a `java` that records its call and
  exits 97, so a JVM started by a subprocess (spark-submit, a PySpark session, the
  CLI) fails too, and the session fails if it was called at all.
"""

import os
import shutil
import stat
import tempfile
from pathlib import Path

import pytest

# pytest plugins whose fixtures start real services (by module name, so a fixture
# added to one of them is a service fixture without being listed anywhere else)
SERVICE_PLUGINS = ("spark_session", "kafka_services", "s3_services")
UNIT_ONLY_ENV = "LANCE_CDF_UNIT_ONLY"
CLASSES = ("unit", "integration")


def unit_only(config) -> bool:
    return os.environ.get(UNIT_ONLY_ENV) == "1" or (config.option.markexpr or "").strip() == "unit"


def _service_plugin(fixturedef) -> str | None:
    module = getattr(fixturedef.func, "__module__", None) or ""
    module = module.rsplit(".", 1)[-1]  # tests.support.kafka_services -> kafka_services
    return module if module in SERVICE_PLUGINS else None


def service_fixtures(item) -> list[str]:
    """The fixtures in `item`'s closure (transitively) that start a real service."""
    defs = getattr(item, "_fixtureinfo", None)
    if defs is None:  # not a python test function: it requests no fixture
        return []
    return sorted(
        name
        for name, fixturedefs in defs.name2fixturedefs.items()
        if any(_service_plugin(d) for d in fixturedefs)
    )


@pytest.hookimpl(tryfirst=True)  # before `-m` deselects by these marks
def pytest_collection_modifyitems(config, items):
    errors = []
    for item in items:
        explicit = {m.name for m in item.iter_markers() if m.name in CLASSES}
        services = service_fixtures(item)
        if len(explicit) > 1:
            errors.append(f"{item.nodeid}: marked both unit and integration")
        elif explicit == {"unit"} and services:
            errors.append(f"{item.nodeid}: marked unit but uses {', '.join(services)}")
        elif not explicit:
            item.add_marker("integration" if services else "unit")
    if errors:
        raise pytest.UsageError("test classification:\n  " + "\n  ".join(errors))


def pytest_collection_finish(session):
    if not unit_only(session.config):
        return
    wrong = [i.nodeid for i in session.items if i.get_closest_marker("unit") is None]
    if wrong:
        raise pytest.UsageError(
            f"a unit-only run ({UNIT_ONLY_ENV}=1 or -m unit) selected integration tests "
            f"(run it with -m unit): {', '.join(wrong[:5])}"
        )


# -- the unit-only guard

_java_home = pytest.StashKey[Path]()
_JAVA = """#!/bin/sh
echo "$PPID $*" >> '{log}'
echo "lance-cdf unit run ({env}=1): a test tried to start java $*" >&2
exit 97
"""


def java_first(home: Path, script: str, tools: Path | None = None) -> Path:
    """Make `script` the `java` of this process and its children: `home`/bin/java, with
    JAVA_HOME at `home` and its bin first on PATH (the other files of `tools`, a JDK's bin,
    linked beside it). Returns the script's path."""
    (home / "bin").mkdir()
    for tool in tools.iterdir() if tools is not None else ():
        if tool.name != "java":
            (home / "bin" / tool.name).symlink_to(tool)
    java = home / "bin" / "java"
    java.write_text(script)
    java.chmod(java.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    os.environ["JAVA_HOME"] = str(home)
    os.environ["PATH"] = f"{home / 'bin'}{os.pathsep}{os.environ.get('PATH', '')}"
    return java


def pytest_configure(config):
    if not unit_only(config):
        return
    os.environ[UNIT_ONLY_ENV] = "1"  # subprocesses of the tests know it too
    home = Path(tempfile.mkdtemp(prefix="lance-cdf-no-java-"))
    java_first(home, _JAVA.format(log=home / "java-calls", env=UNIT_ONLY_ENV))
    config.stash[_java_home] = home

    from lance_cdf_devtools.process import ChildService

    def refuse(self, *args, **kwargs):
        pytest.fail(
            f"unit run ({UNIT_ONLY_ENV}=1): {type(self).__name__} must not start here; "
            "mark the test's module `pytestmark = pytest.mark.integration`",
            pytrace=False,
        )

    ChildService.start = refuse


@pytest.hookimpl(tryfirst=True)
def pytest_fixture_setup(fixturedef, request):
    if not unit_only(request.config):
        return
    plugin = _service_plugin(fixturedef)
    if plugin:
        pytest.fail(
            f"unit run ({UNIT_ONLY_ENV}=1): fixture {fixturedef.argname!r} ({plugin}) "
            "starts a real service and may only be used by integration tests",
            pytrace=False,
        )


def pytest_sessionfinish(session):
    home = session.config.stash.get(_java_home, None)
    if home is not None and (home / "java-calls").exists():
        calls = (home / "java-calls").read_text().strip()
        session.config.get_terminal_writer().line(
            f"\nFAILED unit run: java was started ({UNIT_ONLY_ENV}=1):\n{calls}", red=True
        )
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_unconfigure(config):
    home = config.stash.get(_java_home, None)
    if home is not None:
        shutil.rmtree(home, ignore_errors=True)
