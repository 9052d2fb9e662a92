"""pytest plugin: one local S3-compatible server (moto, `lance_cdf_devtools.S3Server`)
per test session, and a fresh table URI on it per test.

Register with `pytest_plugins = ["tests.support.s3_services"]` or `-p tests.support.s3_services`."""

import uuid

import pytest

from lance_cdf_devtools import S3Server

BUCKET = "lance-cdf-tests"


@pytest.fixture(scope="session")
def s3_server(tmp_path_factory):
    """A started `S3Server` with bucket `lance-cdf-tests`: `.storage_options()`,
    `.request_counts()`."""
    server = S3Server(tmp_path_factory.mktemp("s3"))
    server.start()
    server.create_bucket(BUCKET)
    yield server
    server.close()


@pytest.fixture
def s3_uri(s3_server):
    """`s3://lance-cdf-tests/<unique>/t.lance`: where a test writes its table."""
    return f"s3://{BUCKET}/{uuid.uuid4().hex}/t.lance"
