"""The local publisher's JVM options: the native-heap trim is given only to a JVM that has
it as a product option (an older one refuses to start with it), told by its `release`
file; and the JVM on this machine starts with what publish gives it."""

import shutil
import subprocess

import pytest

from lance_cdf.spark.publish.spark_driver import (
    LOCAL_JVM_OPTIONS,
    NATIVE_TRIM_OPTION,
    java_version,
    local_jvm_options,
    trims_native_heap,
)


@pytest.mark.parametrize(
    ("version", "trims"),
    [
        ((17, 0, 10), False),
        ((17, 0, 11), True),
        ((17, 0, 15), True),
        ((18,), False),
        ((20, 0, 2), False),
        ((21,), False),
        ((21, 0, 2), False),
        ((21, 0, 3), True),
        ((22,), False),
        ((22, 0, 1), True),
        ((23,), True),
        ((11, 0, 25), False),
    ],
)
def test_trim_only_where_a_product_option(version, trims):
    assert trims_native_heap(version) is trims


@pytest.mark.parametrize(
    ("line", "version"),
    [
        ('JAVA_VERSION="17.0.15"', (17, 0, 15)),
        ('JAVA_VERSION="23"', (23,)),
        ('JAVA_VERSION="1.8.0_392"', (1, 8, 0)),
        ('JAVA_VERSION="21-ea"', (21,)),
        ('JAVA_VERSION="x"', None),
    ],
)
def test_version_from_release_file(tmp_path, line, version):
    (tmp_path / "release").write_text(f'IMPLEMENTOR="Someone"\n{line}\n')
    assert java_version(str(tmp_path)) == version


def test_no_release_file_no_trim(tmp_path):
    assert java_version(str(tmp_path)) is None
    assert local_jvm_options(str(tmp_path)) == LOCAL_JVM_OPTIONS
    (tmp_path / "release").write_text('JAVA_VERSION="17.0.15"\n')
    assert local_jvm_options(str(tmp_path)) == f"{LOCAL_JVM_OPTIONS} {NATIVE_TRIM_OPTION}"


@pytest.mark.skipif(shutil.which("java") is None, reason="no java on PATH")
def test_this_machines_jvm_starts_with_them():
    out = subprocess.run(
        ["java", *local_jvm_options().split(), "-version"], capture_output=True, text=True
    )
    assert out.returncode == 0, out.stderr
