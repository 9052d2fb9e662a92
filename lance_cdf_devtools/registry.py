"""Apicurio Registry (in-memory H2 storage) with its Confluent-compatible API; plain
HTTP (`SchemaRegistry`) or behind HTTPS + basic auth (`SecureSchemaRegistry`)."""

from __future__ import annotations

import base64
import os
import secrets
import ssl
import sys
import urllib.error
import urllib.request
from typing import Unpack, cast

from lance_cdf_devtools.maven import registry_jar
from lance_cdf_devtools.process import (
    CacheOption,
    ChildService,
    JavaService,
    ServiceOptions,
    free_port,
    java_executable,
)


class SchemaRegistry(JavaService):
    """`.url` is the base URL for Confluent schema-registry clients
    (`http://127.0.0.1:<port>/apis/ccompat/v7`). Data lives in memory: a restart
    starts empty."""

    name = "registry"

    def __init__(
        self,
        workdir: str | os.PathLike[str] | None = None,
        heap: str = "512m",
        **kw: Unpack[CacheOption],
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
            java_executable(),
            f"-Xmx{self.heap}",
            "-XX:+ExitOnOutOfMemoryError",
            *(f"-D{k}={v}" for k, v in props.items()),
            "-jar",
            str(registry_jar(self.cache_dir)),
        ]

    def _ready(self) -> bool:
        try:
            with urllib.request.urlopen(f"{self.url}/subjects", timeout=2) as resp:
                return cast(int, resp.status) == 200
        except (urllib.error.URLError, OSError):
            return False


class SecureSchemaRegistry(ChildService):
    """The Apicurio registry behind HTTPS + basic auth: Apicurio itself on a loopback
    port, and in front of it `devtools.authproxy` (a small TLS + basic-auth reverse
    proxy: Apicurio has no basic auth without an OIDC server), with a certificate from a
    CA made per run. `.url` is the HTTPS URL, `.client_config` the schema-registry
    client's settings (`basic.auth.user.info`, `ssl.ca.location`), `.username` /
    `.password` random per run."""

    name = "registry-tls"
    start_timeout = 60.0
    stop_timeout = 10.0

    def __init__(self, workdir: str | os.PathLike[str] | None = None, **kw: Unpack[ServiceOptions]):
        super().__init__(workdir, **kw)
        from lance_cdf_devtools.tls import CertAuthority

        self.port = free_port()
        self.upstream = SchemaRegistry(self.workdir / "apicurio", **kw)
        self.username = "lance-cdf-registry"
        self.password = secrets.token_urlsafe(18)
        ca = CertAuthority(self.workdir / "tls")
        self.ca_pem = ca.ca_pem
        self._cert = ca.issue("registry")
        self._users = self.workdir / "users"
        self._users.touch(mode=0o600)
        self._users.write_text(f"{self.username}:{self.password}\n")

    @property
    def url(self) -> str:
        return f"https://127.0.0.1:{self.port}/apis/ccompat/v7"

    @property
    def client_config(self) -> dict[str, str]:
        return {
            "basic.auth.user.info": f"{self.username}:{self.password}",
            "ssl.ca.location": str(self.ca_pem),
        }

    def _prepare(self) -> None:
        self.upstream.start()

    def _command(self) -> list[str]:
        return [
            sys.executable,
            "-m",
            "lance_cdf_devtools.authproxy",
            "--port",
            str(self.port),
            "--upstream",
            f"http://127.0.0.1:{self.upstream.port}",
            "--cert",
            str(self._cert.cert_pem),
            "--key",
            str(self._cert.key_pem),
            "--users",
            str(self._users),
        ]

    def _ready(self) -> bool:
        ctx = ssl.create_default_context(cafile=str(self.ca_pem))
        token = base64.b64encode(f"{self.username}:{self.password}".encode()).decode()
        req = urllib.request.Request(
            f"{self.url}/subjects", headers={"Authorization": f"Basic {token}"}
        )
        try:
            with urllib.request.urlopen(req, timeout=2, context=ctx) as resp:
                return cast(int, resp.status) == 200
        except (urllib.error.URLError, OSError):
            return False

    def stop(self) -> None:
        super().stop()
        self.upstream.stop()

    def close(self) -> None:
        super().close()
        self.upstream.close()


__all__ = ["SchemaRegistry", "SecureSchemaRegistry"]
