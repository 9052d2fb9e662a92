"""A local S3-compatible server on 127.0.0.1 (moto's standalone server, from PyPI),
with the `storage_options` pylance and lance-cdf need to use it.

moto rather than S3Proxy: it installs with pip (no Maven provisioning shared with
the Kafka and registry jars), starts in about a second, and enforces conditional
PUT (`If-None-Match: *`), which is how Lance commits safely on S3 without a
commit lock. Data lives in memory: a restart starts empty.
"""

from __future__ import annotations

import json
import os
import sys
import urllib.error
import urllib.request
from collections import Counter
from typing import Unpack, cast

from lance_cdf_devtools.process import ChildService, ServiceOptions, free_port
from lance_cdf_devtools.s3app import BY_TABLE_PATH, COUNTS_PATH

ACCESS_KEY = "lance-cdf-test"
SECRET_KEY = "lance-cdf-test-secret"
REGION = "us-east-1"


class S3Server(ChildService):
    """`.endpoint` is `http://127.0.0.1:<port>`; `.storage_options()` the pylance
    options for it; `.create_bucket(name)`; `.request_counts()` what it has served."""

    name = "s3"
    start_timeout = 60.0
    stop_timeout = 10.0

    def __init__(self, workdir: str | os.PathLike[str] | None = None, **kw: Unpack[ServiceOptions]):
        super().__init__(workdir, **kw)
        self.port = free_port()

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def storage_options(self) -> dict[str, str]:
        """The same keys a user gives pylance for any S3-compatible endpoint."""
        return {
            "aws_endpoint": self.endpoint,
            "aws_region": REGION,
            "aws_access_key_id": ACCESS_KEY,
            "aws_secret_access_key": SECRET_KEY,
            "allow_http": "true",
        }

    def _provision(self) -> None:
        try:
            import moto.server  # noqa: F401
        except ImportError as exc:
            raise RuntimeError(
                f"the local S3 server needs moto's server extra ({exc}); "
                "install it with: pip install 'moto[s3,server]'"
            ) from None

    def _command(self) -> list[str]:
        return [sys.executable, "-m", "lance_cdf_devtools.s3app", "--port", str(self.port)]

    def _request(self, method: str, path: str) -> bytes:
        req = urllib.request.Request(f"{self.endpoint}{path}", method=method)
        with urllib.request.urlopen(req, timeout=10) as resp:
            return cast(bytes, resp.read())

    def _ready(self) -> bool:
        try:
            self._request("GET", COUNTS_PATH)
            return True
        except (urllib.error.URLError, OSError):
            return False

    def create_bucket(self, name: str) -> str:
        """Create bucket `name` (idempotent); returns `s3://name`."""
        try:
            self._request("PUT", f"/{name}")
        except urllib.error.HTTPError as exc:
            if exc.code != 409:  # 409: BucketAlreadyOwnedByYou
                detail = exc.read().decode(errors="replace")
                raise RuntimeError(
                    f"cannot create bucket {name!r} on {self.endpoint} (HTTP {exc.code}): "
                    f"{detail[:300]}. Bucket names are 3-63 lowercase letters, digits, '-', '.'"
                ) from None
        return f"s3://{name}"

    def request_counts(self, reset: bool = False) -> Counter[str]:
        """Requests served so far by kind (list, get, get_range, head, put, ...)."""
        body = self._request("DELETE" if reset else "GET", COUNTS_PATH)
        return Counter(json.loads(body))

    def request_counts_by_table(self, reset: bool = False) -> dict[str, Counter[str]]:
        """Requests served so far per table (`bucket/key` up to a Lance table's own
        folders, e.g. `lance-cdf-tests/db/t.lance`), by kind; `reset` resets every count."""
        body = self._request("DELETE" if reset else "GET", BY_TABLE_PATH)
        return {table: Counter(kinds) for table, kinds in json.loads(body).items()}

    def reset_counts(self) -> None:
        self.request_counts(reset=True)


__all__ = ["S3Server"]
