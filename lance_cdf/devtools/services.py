"""Start, wait for and stop the local Kafka broker and schema registry."""

from __future__ import annotations

import atexit
import os
import signal
import socket
import subprocess
import tempfile
import time
import urllib.request
from pathlib import Path

from lance_cdf.devtools.provision import cache_dir, provision


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class _Service:
    """A Java process in its own process group, with a log file and a readiness probe."""

    name = "service"
    start_timeout = 120.0

    def __init__(self, workdir: str | None = None, heap: str = "512m"):
        self.workdir = Path(workdir or tempfile.mkdtemp(prefix=f"lance-cdf-{self.name}-"))
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.heap = heap
        self.proc: subprocess.Popen | None = None
        self.log_path = self.workdir / f"{self.name}.log"

    def _command(self) -> list[str]:
        raise NotImplementedError

    def _ready(self) -> bool:
        raise NotImplementedError

    def start(self):
        provision()
        self._prepare()
        log = open(self.log_path, "ab")
        self.proc = subprocess.Popen(
            self._command(), stdout=log, stderr=subprocess.STDOUT, cwd=self.workdir,
            start_new_session=True,
        )  # fmt: skip
        atexit.register(self.stop)
        deadline = time.monotonic() + self.start_timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.name} exited at start:\n{self.log_tail()}")
            if self._ready():
                return self
            time.sleep(0.5)
        self.stop()
        raise RuntimeError(
            f"{self.name} not ready after {self.start_timeout:.0f}s:\n{self.log_tail()}"
        )

    def _prepare(self) -> None:
        pass

    def log_tail(self, n: int = 40) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return "(no log)"

    def stop(self, timeout: float = 20.0) -> None:
        proc, self.proc = self.proc, None
        if proc is None or proc.poll() is not None:
            return
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()


class KafkaBroker(_Service):
    """Single-node Kafka in KRaft combined mode on 127.0.0.1."""

    name = "kafka"

    def __init__(self, workdir: str | None = None, auto_create_topics: bool = True, **kw):
        super().__init__(workdir, **kw)
        self.port = free_port()
        self.controller_port = free_port()
        self.auto_create_topics = auto_create_topics
        self._formatted = False

    @property
    def bootstrap_servers(self) -> str:
        return f"127.0.0.1:{self.port}"

    def _classpath(self) -> str:
        return str(cache_dir() / "kafka" / "lib" / "*")

    def _prepare(self) -> None:
        if self._formatted:
            return
        props = self.workdir / "server.properties"
        props.write_text(
            "\n".join(
                [
                    "process.roles=broker,controller",
                    "node.id=1",
                    f"controller.quorum.bootstrap.servers=127.0.0.1:{self.controller_port}",
                    f"listeners=PLAINTEXT://127.0.0.1:{self.port},"
                    f"CONTROLLER://127.0.0.1:{self.controller_port}",
                    f"advertised.listeners=PLAINTEXT://127.0.0.1:{self.port}",
                    "controller.listener.names=CONTROLLER",
                    "inter.broker.listener.name=PLAINTEXT",
                    "listener.security.protocol.map=CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT",
                    f"log.dirs={self.workdir / 'data'}",
                    "num.partitions=1",
                    "offsets.topic.replication.factor=1",
                    "transaction.state.log.replication.factor=1",
                    "transaction.state.log.min.isr=1",
                    "share.coordinator.state.topic.replication.factor=1",
                    "share.coordinator.state.topic.min.isr=1",
                    "group.initial.rebalance.delay.ms=0",
                    f"auto.create.topics.enable={str(self.auto_create_topics).lower()}",
                ]
            )
            + "\n"
        )
        cluster = subprocess.run(
            ["java", "-cp", self._classpath(), "kafka.tools.StorageTool", "random-uuid"],
            capture_output=True, text=True, check=True,
        ).stdout.strip().splitlines()[-1]  # fmt: skip
        subprocess.run(
            ["java", "-cp", self._classpath(), "kafka.tools.StorageTool", "format",
             "--standalone", "-t", cluster, "-c", str(props)],
            capture_output=True, text=True, check=True,
        )  # fmt: skip
        self._formatted = True

    def _command(self) -> list[str]:
        log4j = self.workdir / "log4j2.properties"
        log4j.write_text(
            "rootLogger.level=WARN\nrootLogger.appenderRef.out.ref=out\n"
            "appender.out.type=Console\nappender.out.name=out\n"
            "appender.out.layout.type=PatternLayout\nappender.out.layout.pattern=%d %p %c - %m%n\n"
        )
        return [
            "java", f"-Xmx{self.heap}", f"-Dlog4j2.configurationFile={log4j}",
            "-cp", self._classpath(), "kafka.Kafka", str(self.workdir / "server.properties"),
        ]  # fmt: skip

    def _ready(self) -> bool:
        from confluent_kafka.admin import AdminClient

        try:
            admin = AdminClient({"bootstrap.servers": self.bootstrap_servers, "log_level": 0})
            admin.list_topics(timeout=2)
            return True
        except Exception:
            return False

    def restart(self) -> KafkaBroker:
        """Stop and start again on the same ports and data (a broker restart)."""
        self.stop()
        return self.start()


class SchemaRegistry(_Service):
    """Apicurio Registry (in-memory) with its Confluent-compatible API."""

    name = "registry"

    def __init__(self, workdir: str | None = None, **kw):
        super().__init__(workdir, **kw)
        self.port = free_port()
        self.management_port = free_port()

    @property
    def url(self) -> str:
        """Base URL for Confluent schema-registry clients."""
        return f"http://127.0.0.1:{self.port}/apis/ccompat/v7"

    def _command(self) -> list[str]:
        runner = next((cache_dir() / "apicurio").glob("*-runner.jar"))
        return [
            "java", f"-Xmx{self.heap}",
            "-Dquarkus.http.host=127.0.0.1", f"-Dquarkus.http.port={self.port}",
            f"-Dquarkus.management.port={self.management_port}",
            "-Dquarkus.log.level=WARN",
            "-jar", str(runner),
        ]  # fmt: skip

    def _ready(self) -> bool:
        try:
            with urllib.request.urlopen(f"{self.url}/subjects", timeout=2) as resp:
                return resp.status == 200
        except Exception:
            return False


__all__ = ["KafkaBroker", "SchemaRegistry", "free_port"]
