"""Apicurio Registry (in-memory H2 storage) with its Confluent-compatible API."""

from __future__ import annotations

import os
import urllib.error
import urllib.request
from typing import Any

from lance_cdf.devtools.maven import registry_jar
from lance_cdf.devtools.process import JavaService, free_port, java_executable


class SchemaRegistry(JavaService):
    """`.url` is the base URL for Confluent schema-registry clients
    (`http://127.0.0.1:<port>/apis/ccompat/v7`). Data lives in memory: a restart
    starts empty."""

    name = "registry"

    def __init__(
        self, workdir: str | os.PathLike[str] | None = None, heap: str = "512m", **kw: Any
    ):
        super().__init__(workdir, heap=heap, **kw)
        self.port = free_port()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/apis/ccompat/v7"

    def _command(self) -> list[str]:
        props = {
            "quarkus.http.host": "127.0.0.1",
            "quarkus.http.port": self.port,
            "quarkus.management.enabled": "false",
            "quarkus.log.level": "INFO",
            "quarkus.banner.enabled": "false",
            "quarkus.http.access-log.enabled": "false",
            # Confluent's registry lets clients delete subjects and versions; so do we.
            "apicurio.rest.deletion.group.enabled": "true",
            "apicurio.rest.deletion.artifact.enabled": "true",
            "apicurio.rest.deletion.artifact-version.enabled": "true",
            # in-memory H2: a small pool is plenty (the default opens 20 connections)
            "apicurio.datasource.jdbc.initial-size": 1,
            "apicurio.datasource.jdbc.min-size": 1,
            "apicurio.datasource.jdbc.max-size": 20,
            "apicurio.storage.snapshot.location": self.workdir,
            "vertx.cacheDirBase": self.workdir / "vertx-cache",
            "java.io.tmpdir": self.workdir,
        }
        return [
            java_executable(), f"-Xmx{self.heap}", "-XX:+ExitOnOutOfMemoryError",
            *(f"-D{k}={v}" for k, v in props.items()),
            "-jar", str(registry_jar(self.cache_dir)),
        ]  # fmt: skip

    def _ready(self) -> bool:
        try:
            with urllib.request.urlopen(f"{self.url}/subjects", timeout=2) as resp:
                return resp.status == 200
        except (urllib.error.URLError, OSError):
            return False


__all__ = ["SchemaRegistry"]
