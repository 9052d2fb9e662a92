"""A child process (a Java service, or a Python one) that never outlives us: own process
group, a parent-death signal, atexit cleanup; a log file, a readiness wait, and free
127.0.0.1 ports."""

from __future__ import annotations

import atexit
import functools
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Self, TypedDict

from lance_cdf_devtools.maven import default_cache_dir, provision

_live: list[ChildService] = []
_lock = threading.Lock()
_handed_out: set[int] = set()


def _ephemeral_low() -> int:
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def free_port() -> int:
    """A port free on 127.0.0.1, chosen below the kernel's ephemeral range so that
    no client connection takes it while a service restarts on the same port."""
    hi = max(_ephemeral_low(), 20001)
    for _ in range(200):
        port = random.randrange(20000, hi)
        if port in _handed_out:
            continue
        with socket.socket() as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
        _handed_out.add(port)
        return port
    raise RuntimeError("no free port found on 127.0.0.1")


def java_executable() -> str:
    home = os.environ.get("JAVA_HOME")
    if home and os.access(Path(home, "bin", "java"), os.X_OK):
        return str(Path(home, "bin", "java"))
    java = shutil.which("java")
    if java is None:
        raise RuntimeError("Java 17+ is needed for the local Kafka broker and registry (no java)")
    return java


@functools.cache
def _setpriv() -> str | None:
    """The path of a working `setpriv`, or None (probed once)."""
    exe = shutil.which("setpriv")
    ok = (
        exe is not None
        and subprocess.run([exe, "--pdeathsig", "TERM", "true"], capture_output=True).returncode
        == 0
    )
    return exe if ok else None


def _death_signal_prefix() -> list[str]:
    """`setpriv --pdeathsig TERM`: the child gets SIGTERM if we die without running
    atexit (SIGKILL, an unhandled SIGTERM). The signal fires when the *thread* that
    spawned the child exits, so only spawns from the main thread use it."""
    if threading.current_thread() is not threading.main_thread():
        return []
    setpriv = _setpriv()
    return [setpriv, "--pdeathsig", "TERM"] if setpriv else []


def _cleanup_all() -> None:
    with _lock:
        services = list(reversed(_live))
    for svc in services:
        try:
            svc.close()
        except Exception as exc:  # noqa: BLE001 - at exit: close the others all the same
            print(f"lance-cdf devtools: could not stop {svc!r}: {exc}", file=sys.stderr)


atexit.register(_cleanup_all)


class CacheOption(TypedDict, total=False):
    """The keyword a service hands on to `ChildService` besides its workdir and heap."""

    cache_dir: str | os.PathLike[str] | None


class ServiceOptions(CacheOption, total=False):
    """The keywords of `ChildService` besides its workdir."""

    heap: str


class ChildService:
    """Subclasses give `name`, `_command()`, `_ready()` and optionally `_provision()`
    (fetch what the command needs) and `_prepare()` (write its config)."""

    name = "service"
    start_timeout = 120.0
    stop_timeout = 30.0

    def __init__(
        self,
        workdir: str | os.PathLike[str] | None = None,
        heap: str = "512m",
        cache_dir: str | os.PathLike[str] | None = None,
    ):
        self._owns_workdir = workdir is None
        self.workdir = Path(workdir or tempfile.mkdtemp(prefix=f"lance-cdf-{self.name}-"))
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.heap = heap
        self.cache_dir = Path(cache_dir) if cache_dir else default_cache_dir()
        self.log_path = self.workdir / f"{self.name}.log"
        self.proc: subprocess.Popen[bytes] | None = None

    # -- subclass hooks
    def _provision(self) -> None:
        pass

    def _prepare(self) -> None:
        pass

    def _env(self) -> dict[str, str] | None:
        """The child's environment (None: ours)."""
        return None

    def _command(self) -> list[str]:
        raise NotImplementedError

    def _ready(self) -> bool:
        raise NotImplementedError

    # -- lifecycle
    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None else None

    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def start(self) -> Self:
        if self.running():
            return self
        self._provision()
        self._prepare()
        with open(self.log_path, "ab") as log:
            log.write(f"--- {time.strftime('%Y-%m-%d %H:%M:%S')} starting {self.name}\n".encode())
            log.flush()
            self.proc = subprocess.Popen(
                [*_death_signal_prefix(), *self._command()],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=self.workdir,
                env=self._env(),
                start_new_session=True,  # own group
            )
        with _lock:
            if self not in _live:
                _live.append(self)
        deadline = time.monotonic() + self.start_timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                code = self.proc.returncode
                self.proc = None
                raise RuntimeError(
                    f"{self.name} exited at start (code {code}); log {self.log_path}:\n"
                    f"{self.log_tail()}"
                )
            if self._ready():
                return self
            time.sleep(0.25)
        self.stop()
        raise RuntimeError(
            f"{self.name} not ready after {self.start_timeout:.0f}s; log {self.log_path}:\n"
            f"{self.log_tail()}"
        )

    def stop(self) -> None:
        """SIGTERM to the process group, SIGKILL after `stop_timeout`. Keeps the work dir."""
        proc, self.proc = self.proc, None
        if proc is None:
            return
        if proc.poll() is None:
            try:
                os.killpg(proc.pid, signal.SIGTERM)
                proc.wait(self.stop_timeout)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
            except ProcessLookupError:
                proc.wait()

    def close(self) -> None:
        """Stop, and remove the work dir if this object created it."""
        self.stop()
        with _lock:
            if self in _live:
                _live.remove(self)
        if self._owns_workdir:
            shutil.rmtree(self.workdir, ignore_errors=True)

    def log_tail(self, n: int = 60) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return "(no log)"

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        state = f"pid {self.pid}" if self.running() else "stopped"
        return f"<{type(self).__name__} {state} {self.workdir}>"


class JavaService(ChildService):
    """A service run from jars that Maven provisions into the cache dir."""

    def _provision(self) -> None:
        self.cache_dir = provision(self.cache_dir)


__all__ = ["ChildService", "JavaService", "free_port", "java_executable"]
