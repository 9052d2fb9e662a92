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
run, whose `java` refuses to start (`classify`).

Most of the rest of a JVM's start is loading classes, the same ones each time a kind of JVM
starts, and the tests start a Spark driver for every `lance-cdf publish` they run. So the
`java` also maps a class-data-sharing archive of its class path when one is there (JDK
17's dynamic CDS, `-XX:SharedArchiveFile`): `make provision` writes them once
(`tests/support/jvm_archives.py`: a Spark driver, a broker, the registry, started under these
options with `LANCE_CDF_TEST_JVM_CDS_WRITE=1`, each writing its archive when it exits)
into the devtools cache, one directory per JDK and options. A JVM whose class path has
no archive starts as before; one the JVM finds unfit (another JDK) it ignores. CDS
logging is off: the Spark launcher's stdout is the command spark-class runs.
LANCE_CDF_TEST_JVM_CDS=0 turns the archives off."""

import hashlib
import os
import shlex
import tempfile
from pathlib import Path

from tests.support.classify import java_first, unit_only

OPTIONS_ENV = "LANCE_CDF_TEST_JVM_OPTIONS"
DEFAULT_OPTIONS = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"
CDS_ENV = "LANCE_CDF_TEST_JVM_CDS"
WRITE_ENV = "LANCE_CDF_TEST_JVM_CDS_WRITE"
_MARK = "LANCE_CDF_TEST_JAVA"  # the wrapper in use (xdist workers inherit it)
_JAVA = """#!/bin/sh
exec {java} {options} "$@"
"""
# the class path (-cp / -classpath / -jar's jar) names its archive
_JAVA_CDS = """#!/bin/sh
path= prev=
for arg in "$@"; do
  case "$prev" in -cp|-classpath|--class-path|-jar) path=$arg ;; esac
  prev=$arg
done
cds=
if [ -n "$path" ]; then
  jsa={archives}/$(printf '%s' "$path" | cksum | cut -d' ' -f1).jsa
  if [ -f "$jsa" ]; then
    cds="-XX:SharedArchiveFile=$jsa"
  elif [ -n "$LANCE_CDF_TEST_JVM_CDS_WRITE" ]; then
    cds="-XX:ArchiveClassesAtExit=$jsa"
  fi
fi
exec {java} {options} $cds -Xlog:cds*=off "$@"
"""


def options_in_use() -> str:
    """The options the tests' JVMs get ("" when turned off)."""
    return os.environ.get(OPTIONS_ENV, DEFAULT_OPTIONS).strip()


def archives_dir(java: Path, options: str) -> Path | None:
    """Where the archives of JVMs run by `java` with `options` are kept (None: turned off)."""
    if os.environ.get(CDS_ENV, "1") == "0":
        return None
    from lance_cdf_devtools.maven import default_cache_dir

    key = hashlib.sha256(f"{java}\0{options}".encode()).hexdigest()[:12]
    return default_cache_dir() / "jvm-archives" / key


def install(home: Path, options: str) -> Path:
    """Make the wrapper the `java` of this process and its children (`java_first`)."""
    from lance_cdf_devtools.process import java_executable

    java = Path(java_executable()).resolve()
    quoted = " ".join(shlex.quote(o) for o in shlex.split(options))
    archives = archives_dir(java, options)
    if archives is None:
        script = _JAVA.format(java=shlex.quote(str(java)), options=quoted)
    else:
        archives.mkdir(parents=True, exist_ok=True)
        script = _JAVA_CDS.format(
            java=shlex.quote(str(java)), options=quoted, archives=shlex.quote(str(archives))
        )
    # keytool and the rest of the JDK's tools as they are
    return java_first(home, script, tools=java.parent)


def pytest_configure(config):
    options = options_in_use()
    if unit_only(config) or not options or os.environ.get(_MARK):
        return
    os.environ.pop(WRITE_ENV, None)  # a test run only maps archives
    home = Path(tempfile.mkdtemp(prefix="lance-cdf-test-java-"))
    os.environ[_MARK] = str(install(home, options))
