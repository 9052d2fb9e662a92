"""A Spark standalone cluster on 127.0.0.1 from the pyspark installation: one master
and N workers (`spark-class ...deploy.master.Master` / `...deploy.worker.Worker`; the
pip package has no sbin/start-*.sh), each a child process with a log and a clean stop.

    with SparkCluster(workers=2) as cluster:
        cluster.master_url         # "spark://127.0.0.1:<port>"
        cluster.spark_submit(...)  # argv for $SPARK_HOME/bin/spark-submit

Workers get `worker_env` only (plus PATH/JAVA_HOME/HOME): nothing of the caller's
PYTHONPATH leaks to executors, so jobs must ship their code (`--py-files`).
"""

from __future__ import annotations

import json
import os
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any, cast

from lance_cdf_devtools.process import ChildService, free_port, java_executable

PASSED_ENV = ("PATH", "HOME", "JAVA_HOME", "LANG", "TMPDIR")


def spark_home() -> Path:
    import pyspark

    return Path(pyspark.__file__).resolve().parent


def _base_env(extra: dict[str, str] | None) -> dict[str, str]:
    env = {k: os.environ[k] for k in PASSED_ENV if k in os.environ}
    env.setdefault("JAVA_HOME", str(Path(java_executable()).resolve().parents[1]))
    env.update(SPARK_HOME=str(spark_home()), SPARK_LOCAL_IP="127.0.0.1", SPARK_NO_DAEMONIZE="1")
    env.update(extra or {})
    return env


class _SparkDaemon(ChildService):
    def __init__(self, workdir: str | os.PathLike[str], env: dict[str, str]):
        super().__init__(workdir)
        self.env = env

    def _env(self) -> dict[str, str]:
        return self.env


class SparkMaster(_SparkDaemon):
    name = "spark-master"
    start_timeout = 90.0

    def __init__(self, workdir: str | os.PathLike[str], env: dict[str, str]):
        super().__init__(workdir, env)
        self.port, self.ui_port = free_port(), free_port()

    @property
    def url(self) -> str:
        return f"spark://127.0.0.1:{self.port}"

    def _command(self) -> list[str]:
        return [
            str(spark_home() / "bin" / "spark-class"),
            "org.apache.spark.deploy.master.Master",
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
            "--webui-port",
            str(self.ui_port),
        ]

    def state(self) -> dict[str, Any]:
        url = f"http://127.0.0.1:{self.ui_port}/json/"
        with urllib.request.urlopen(url, timeout=3) as resp:
            return cast(dict[str, Any], json.loads(resp.read()))

    def _ready(self) -> bool:
        try:
            return self.state().get("status") == "ALIVE"
        except (urllib.error.URLError, OSError, ValueError):
            return False

    def alive_workers(self) -> int:
        try:
            return sum(1 for w in self.state().get("workers", []) if w.get("state") == "ALIVE")
        except (urllib.error.URLError, OSError, ValueError):
            return 0


class SparkWorker(_SparkDaemon):
    name = "spark-worker"
    start_timeout = 90.0

    def __init__(
        self,
        workdir: str | os.PathLike[str],
        env: dict[str, str],
        master: SparkMaster,
        cores: int,
        memory: str,
    ):
        super().__init__(workdir, env)
        self.master, self.cores, self.memory = master, cores, memory
        self.port, self.ui_port = free_port(), free_port()
        self._seen = 0

    def _command(self) -> list[str]:
        return [
            str(spark_home() / "bin" / "spark-class"),
            "org.apache.spark.deploy.worker.Worker",
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
            "--webui-port",
            str(self.ui_port),
            "--cores",
            str(self.cores),
            "--memory",
            self.memory,
            "--work-dir",
            str(self.workdir / "work"),
            self.master.url,
        ]

    def _ready(self) -> bool:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return False
        return "Successfully registered with master" in text


class SparkCluster:
    """A master and `workers` workers (`cores` cores and `memory` each) on 127.0.0.1."""

    def __init__(
        self,
        workdir: str | os.PathLike[str],
        workers: int = 2,
        cores: int = 1,
        memory: str = "1g",
        worker_env: dict[str, str] | None = None,
    ):
        self.workdir = Path(workdir)
        env = _base_env({"SPARK_DAEMON_MEMORY": "256m", **(worker_env or {})})
        self.master = SparkMaster(self.workdir / "master", env)
        self.workers = [
            SparkWorker(self.workdir / f"worker{i}", env, self.master, cores, memory)
            for i in range(workers)
        ]

    @property
    def master_url(self) -> str:
        return self.master.url

    def start(self) -> SparkCluster:
        try:
            self.master.start()
            for w in self.workers:
                w.start()
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        for svc in [*self.workers, self.master]:
            svc.close()

    def logs(self) -> str:
        return "\n".join(
            f"== {s.name} ({s.log_path})\n{s.log_tail(30)}" for s in [self.master, *self.workers]
        )

    def __enter__(self) -> SparkCluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


__all__ = ["SparkCluster", "spark_home"]
