"""tests/support/classify.py, the unit/integration split and the guard of unit-only runs, on
probe test files run by a real pytest in a subprocess (its plugins loaded with -p, as
tests/conftest.py loads them). Nothing here starts a service unless the guard is broken."""

import os
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]  # the project root: `tests.support.*` importable
PLUGINS = [
    f"tests.support.{name}"
    for name in ("spark_session", "kafka_services", "s3_services", "classify")
]

PROBES = """
import subprocess

import pytest


def test_plain():
    pass


def test_dynamic_service_fixture(request):
    request.getfixturevalue("kafka_broker")


def test_broker_started_by_hand(tmp_path):
    from lance_cdf_devtools import KafkaBroker

    KafkaBroker(tmp_path).start()


def test_java_in_a_subprocess():
    subprocess.run(["java", "-version"], capture_output=True)


def test_spark_fixture(spark):
    pass


@pytest.mark.parametrize("spark", ["not the fixture"])
def test_parameter_named_like_a_fixture(spark):
    pass
"""


USAGE_ERROR, TESTS_FAILED = int(pytest.ExitCode.USAGE_ERROR), int(pytest.ExitCode.TESTS_FAILED)


def run_pytest(tmp_path, source, *args, unit_only=False):
    (tmp_path / "test_probe.py").write_text(source)
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    env = {k: v for k, v in os.environ.items() if k != "LANCE_CDF_UNIT_ONLY"}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    if unit_only:
        env["LANCE_CDF_UNIT_ONLY"] = "1"
    plugins = [a for p in PLUGINS for a in ("-p", p)]
    cmd = [
        sys.executable,
        "-m",
        "pytest",
        "-p",
        "no:cacheprovider",
        *plugins,
        "-c",
        str(tmp_path / "pytest.ini"),
        "--rootdir",
        str(tmp_path),
        "--junitxml",
        str(tmp_path / "out.xml"),
        *args,
        "test_probe.py",
    ]
    done = subprocess.run(cmd, env=env, cwd=tmp_path, capture_output=True, text=True, timeout=300)
    return done, done.stdout + done.stderr


def outcomes(tmp_path) -> dict[str, str]:
    got = {}
    for case in ET.parse(tmp_path / "out.xml").iter("testcase"):
        kinds = [c.tag for c in case if c.tag in ("failure", "error", "skipped")]
        messages = [c.get("message", "") for c in case if c.tag in ("failure", "error")]
        got[case.get("name")] = (kinds[0] if kinds else "passed", " ".join(messages))
    return got


def test_a_test_cannot_be_unit_and_use_a_service(tmp_path):
    source = (
        "import pytest\n\n\n@pytest.mark.unit\ndef test_a(spark):\n    pass\n\n\n"
        "@pytest.mark.unit\n@pytest.mark.integration\ndef test_b():\n    pass\n"
    )
    done, out = run_pytest(tmp_path, source, "--collect-only")
    assert done.returncode == USAGE_ERROR, out
    assert "test_a: marked unit but uses spark" in out and "test_b: marked both" in out, out


def test_a_unit_only_run_refuses_integration_tests(tmp_path):
    done, out = run_pytest(tmp_path, PROBES, unit_only=True)  # no -m unit
    assert done.returncode == USAGE_ERROR, out
    assert "selected integration tests" in out and "test_spark_fixture" in out, out


def test_a_unit_only_run_runs_the_unit_tests_and_fails_what_starts_a_service(tmp_path):
    done, out = run_pytest(tmp_path, PROBES, "-m", "unit", unit_only=True)
    got = outcomes(tmp_path)
    # classified by the fixtures a test requests (a parameter named `spark` is not one)
    assert set(got) == {
        "test_plain",
        "test_dynamic_service_fixture",
        "test_broker_started_by_hand",
        "test_java_in_a_subprocess",
        "test_parameter_named_like_a_fixture[not the fixture]",
    }, out
    assert got["test_plain"] == ("passed", ""), out
    kind, message = got["test_dynamic_service_fixture"]
    assert kind == "failure" and "fixture 'kafka_broker'" in message, out
    kind, message = got["test_broker_started_by_hand"]
    assert kind == "failure" and "KafkaBroker must not start" in message, out
    # java itself exits 97 (the test does not look); the session fails for it
    assert got["test_java_in_a_subprocess"] == ("passed", ""), out
    assert "java was started" in out and "-version" in out, out
    assert done.returncode == TESTS_FAILED, out
