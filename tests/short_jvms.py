"""pytest plugin (loaded by tests/conftest.py): the JVMs the tests start (brokers, the
registry, Kafka Connect, Spark drivers and workers, in the test process or in the `lance-cdf`
commands it runs) compile with the client compiler only and collect with the serial
collector.

A test's JVM lives for seconds to minutes and spends much of its CPU compiling hot code for
a peak it never reaches; on a small machine running two test workers, that CPU is what the
suite waits for. What a test proves does not depend on the JIT or the collector: the same
code runs, with the same settings users give it. `JAVA_HOME` and the front of `PATH` point
at a `java` that adds the two options and runs the real one (so no JVM prints a notice, as
with `JAVA_TOOL_OPTIONS`); LANCE_CDF_TEST_JVM_OPTIONS="" turns it off. Not in a unit-only
run, whose `java` refuses to start (`classify`)."""

import os
import shlex
import tempfile
from pathlib import Path

from classify import java_first, unit_only

OPTIONS_ENV = "LANCE_CDF_TEST_JVM_OPTIONS"
DEFAULT_OPTIONS = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"
_MARK = "LANCE_CDF_TEST_JAVA"  # the wrapper in use (xdist workers inherit it)
_JAVA = """#!/bin/sh
exec {java} {options} "$@"
"""


def pytest_configure(config):
    options = os.environ.get(OPTIONS_ENV, DEFAULT_OPTIONS).strip()
    if unit_only(config) or not options or os.environ.get(_MARK):
        return
    from lance_cdf_devtools.process import java_executable

    java = Path(java_executable()).resolve()
    home = Path(tempfile.mkdtemp(prefix="lance-cdf-test-java-"))
    quoted = " ".join(shlex.quote(o) for o in shlex.split(options))
    script = _JAVA.format(java=shlex.quote(str(java)), options=quoted)
    # keytool and the rest of the JDK's tools as they are
    os.environ[_MARK] = str(java_first(home, script, tools=java.parent))
