"""One writer per target: a lease object under a directory, on local disk or object storage.

    Lease.acquire(location, what) -> held until release(); renewed at least every ttl/3

The lease is one small JSON object, `<location>/<what>.lease`, naming its holder (host,
pid, command, since, a random token) and when it expires (the holder's clock at its
last renewal + the TTL). Every change to it is atomic against every other writer:

  * object storage (s3://, gs://, az://, through obstore, the client of Lance's own
    Rust `object_store`): created with a conditional PUT (`If-None-Match: *`), renewed,
    taken over and released with `If-Match: <the ETag we last saw>`; a writer that lost
    the race gets a precondition failure and re-reads;
  * local disk: read-decide-write under an exclusive `flock` of `<what>.lease.lock`
    beside it, the new content put in place with an atomic rename.

A lease is free when there is none, when its holder released it, when it expired (not
renewed for its TTL: the holder is dead, hung or cut off), or when its holder ran on
this machine (same host name, boot and PID namespace) and its process is gone (a
SIGKILLed writer's successor need not wait the TTL). A free lease is taken over, with a
log line naming the old holder. Expiry compares the holder's clock with ours: clocks
must agree to well within the TTL (30 s by default).

A lease cannot fence storage writes: a holder that stops renewing (a stopped process)
and comes back after its TTL may write once more before `renew` tells it the lease is
lost. `keep_alive` renews from a thread so that long work does not let it lapse; a
`LeaseKeeper` renews many leases (a database replicator's) from one thread.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import errno
import json
import logging
import os
import re
import secrets
import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from types import TracebackType
from typing import TYPE_CHECKING

from lance_cdf.errors import (
    LanceCdfError,
    LeaseHeldError,
    LeaseLostError,
    StorageAccessError,
    in_words,
)
from lance_cdf.format.io import local_path
from lance_cdf.ops import state_files

if TYPE_CHECKING:
    from obstore import PutMode

log = logging.getLogger("lance_cdf.ops.lease")

LEASE_FORMAT = 1


@dataclass(frozen=True)
class LeaseHolder:
    """Who holds a lease: `command` says what it is doing (no secrets: callers build it
    from names, never from argv); `since` is when it acquired it (unix time)."""

    host: str
    pid: int
    command: str
    since: float
    token: str  # random per acquisition: tells this holder from an earlier one of the pid

    def describe(self) -> str:
        when = dt.datetime.fromtimestamp(self.since, dt.UTC).strftime("%Y-%m-%d %H:%M:%S")
        return f"{self.command!r} (pid {self.pid} on {self.host}, since {when} UTC)"


@dataclass(frozen=True)
class _State:
    """The lease object's content."""

    holder: LeaseHolder
    expires: float  # unix time, the holder's clock: renewed + ttl
    ttl_s: float
    released: bool
    machine: str  # boot id + PID namespace: where `holder.pid` means a process

    def to_bytes(self) -> bytes:
        doc = {
            "format": LEASE_FORMAT,
            "holder": asdict(self.holder),
            "expires": self.expires,
            "ttl_s": self.ttl_s,
            "released": self.released,
            "machine": self.machine,
        }
        return json.dumps(doc, sort_keys=True).encode()

    @classmethod
    def from_bytes(cls, data: bytes, where: str) -> _State:
        try:
            doc = json.loads(data)
            h = doc["holder"]
            holder = LeaseHolder(
                str(h["host"]), int(h["pid"]), str(h["command"]), float(h["since"]), str(h["token"])
            )
            return cls(
                holder,
                float(doc["expires"]),
                float(doc["ttl_s"]),
                bool(doc["released"]),
                str(doc["machine"]),
            )
        except (ValueError, KeyError, TypeError) as exc:
            raise LanceCdfError(
                f"the lease {where} is not one lance-cdf wrote ({in_words(exc)}); "
                "stop every writer of this target, delete that file, and start again"
            ) from None

    def free(self, now: float) -> str | None:
        """Why the lease may be taken over (None: it is held)."""
        if self.released:
            return "released"
        if now > self.expires:
            return f"expired {now - self.expires:.1f} s ago"
        if self.machine == _machine() and self.holder.host == socket.gethostname():
            if not _alive(self.holder.pid):
                return f"its process {self.holder.pid} is gone"
        return None


def _machine() -> str:
    """This machine's boot and PID namespace ("" where unknown: then no PID is trusted)."""
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            boot = f.read().strip()
        return f"{boot}/{os.stat('/proc/self/ns/pid').st_ino}"
    except OSError:
        return ""


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, another user's
        return True
    return True


def _slug(what: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "-", what).strip("-") or "target"


class _LocalStore:
    """The lease on local disk: read-decide-write under flock, replaced by rename."""

    def __init__(self, directory: str, name: str):
        self.directory = directory
        self.path = os.path.join(directory, name)
        self.where = self.path

    @contextlib.contextmanager
    def locked(self) -> Iterator[None]:
        """An exclusive flock of `<lease>.lock`. Release removes that file (under the
        lock), so a lock taken on a file that was removed meanwhile is taken again."""
        with state_files.locked(self.path, what="the lease", parents=True):
            yield

    def read(self) -> tuple[_State | None, str | None]:
        data = state_files.read_bytes(self.path)
        return (None if data is None else _State.from_bytes(data, self.where)), None

    def write(self, state: _State, expect: str | None, create: bool) -> str | None:
        """(Called under `locked`: the caller has just read the state it replaces.)"""
        state_files.write_atomic(self.path, state.to_bytes(), sync=True)
        return None

    def remove(self) -> None:
        """(Under `locked`.) The lease and its lock file gone, and the directory if that
        leaves it empty: a writer that wrote nothing leaves no trace."""
        for path in (self.path, self.path + ".lock"):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)
        with contextlib.suppress(OSError):
            os.rmdir(self.directory)


class _Conflict(Exception):
    """Another writer changed the lease object between our read and our write."""


class _ObjectStore:
    """The lease on object storage: conditional PUTs (create / If-Match)."""

    def __init__(self, location: str, name: str, storage_options: dict[str, str] | None):
        import obstore
        from obstore.store import from_url

        from lance_cdf.format.objectstore import store_arguments

        self._obstore = obstore
        self.where = f"{location.rstrip('/')}/{name}"
        self.name = name
        try:
            args = store_arguments(location, storage_options)
            self.store = from_url(location.rstrip("/"), **args)
        except LanceCdfError:
            raise
        except Exception as exc:  # obstore's own types, and panics on bad keys
            raise StorageAccessError(
                f"cannot configure the object store for the lease {self.where}: "
                f"{in_words(exc)}; check the "
                "storage options"
            ) from None

    @contextlib.contextmanager
    def locked(self) -> Iterator[None]:
        yield  # the conditional writes are the lock

    def _failed(self, exc: Exception) -> StorageAccessError:
        return StorageAccessError(
            f"the lease {self.where} could not be read or written ({in_words(exc)[:200]}); "
            "check the object store and its storage options"
        )

    def read(self) -> tuple[_State | None, str | None]:
        try:
            got = self._obstore.get(self.store, self.name)
            data = bytes(got.bytes())
        except FileNotFoundError:
            return None, None
        except Exception as exc:  # noqa: BLE001 - obstore's types, named in the error
            raise self._failed(exc) from None
        return _State.from_bytes(data, self.where), got.meta["e_tag"]

    def write(self, state: _State, expect: str | None, create: bool) -> str | None:
        from obstore.exceptions import AlreadyExistsError, PreconditionError

        mode: PutMode = "create" if create else {"e_tag": expect}
        try:
            put = self._obstore.put(self.store, self.name, state.to_bytes(), mode=mode)
        except (AlreadyExistsError, PreconditionError):
            raise _Conflict from None
        except FileNotFoundError:  # If-Match on an object deleted meanwhile
            raise _Conflict from None
        except Exception as exc:  # noqa: BLE001 - obstore's types, named in the error
            raise self._failed(exc) from None
        return put["e_tag"]

    def remove(self) -> None:
        raise NotImplementedError  # released leases are marked, not deleted (no If-Match DELETE)


class Lease:
    """A held lease (see the module doc). A context manager: released on exit."""

    def __init__(
        self, store: _LocalStore | _ObjectStore, what: str, state: _State, etag: str | None
    ):
        self._store, self.what, self._state, self._etag = store, what, state, etag
        self._lock = threading.Lock()  # renew from a keep-alive thread vs release
        self._lost: LeaseLostError | None = None
        self._renewed = time.monotonic()
        self._keeper: threading.Thread | None = None  # its own keep-alive thread
        self._shared: LeaseKeeper | None = None  # or the keeper it was handed to
        self._stop = threading.Event()

    @property
    def holder(self) -> LeaseHolder:
        return self._state.holder

    @property
    def where(self) -> str:
        return self._store.where

    @classmethod
    def acquire(
        cls,
        location: str,
        what: str,
        storage_options: dict[str, str] | None = None,
        ttl_s: float = 30.0,
        command: str | None = None,
        target: str | None = None,
    ) -> Lease:
        """The lease `<location>/<what>.lease`, or LeaseHeldError naming its live holder.
        `what`: a short name of the target's kind ("replica", "checkpoint"); `command`:
        what this process does, shown to others (default "writer of <what>"); `target`:
        the target as messages name it (default `location`)."""
        if ttl_s <= 0:
            raise LanceCdfError(f"a lease TTL must be positive, not {ttl_s}")
        name = f"{_slug(what)}.lease"
        path = local_path(location)
        store: _LocalStore | _ObjectStore = (
            _LocalStore(path, name)
            if path is not None
            else _ObjectStore(location, name, storage_options)
        )
        now = time.time()
        me = LeaseHolder(
            socket.gethostname(),
            os.getpid(),
            command or f"writer of {what}",
            now,
            secrets.token_hex(8),
        )
        mine = _State(me, now + ttl_s, ttl_s, False, _machine())
        what = f"the {what} {target or location}"
        for _ in range(10):  # conflicts: another writer raced us; read again
            with store.locked():
                current, etag = store.read()
                if current is not None:
                    why = current.free(time.time())
                    if why is None:
                        held = LeaseHeldError(
                            f"{what} is being written by {current.holder.describe()}; one "
                            f"writer at a time. Stop that process first (its lease "
                            f"{store.where} expires {current.ttl_s:g} s after its last renewal "
                            "if it died, and is then taken over)."
                        )
                        held.holder_command = current.holder.command
                        raise held
                try:
                    etag = store.write(mine, etag, create=current is None)
                except _Conflict:
                    continue
            if current is not None and not current.released:
                log.warning(
                    "took over the lease %s from %s: %s",
                    store.where,
                    current.holder.describe(),
                    why,
                )
            return cls(store, what, mine, etag)
        raise LeaseHeldError(
            f"{what}: the lease {store.where} kept changing under us (other writers starting "
            "at the same time); start one writer only"
        )

    def renew(self) -> None:
        """Push the expiry a TTL ahead; LeaseLostError if another writer took it over
        (or it was released). Call at least every ttl/3."""
        with self._lock:
            self._renew()

    def _renew(self) -> None:
        if self._lost is not None:
            raise self._lost
        store, state = self._store, self._state
        with store.locked():
            current, etag = store.read()
            if current is None or current.holder.token != state.holder.token or current.released:
                self._lost = self._lost_error(current)
                raise self._lost
            new = _State(state.holder, time.time() + state.ttl_s, state.ttl_s, False, state.machine)
            try:
                self._etag = store.write(new, etag, create=False)
            except _Conflict:
                current, _ = store.read()
                self._lost = self._lost_error(current)
                raise self._lost from None
        self._state = new
        self._renewed = time.monotonic()

    def _lost_error(self, current: _State | None) -> LeaseLostError:
        now = (
            "free now"
            if current is None or current.released or current.free(time.time())
            else f"held now by {current.holder.describe()}"
        )
        return LeaseLostError(
            f"lost the lease on {self.what} ({self._store.where}): another writer took it "
            f"over after this one did not renew it for {self._state.ttl_s:g} s ({now}). "
            "Stopped without writing further; make sure only one writer runs, then start "
            "again."
        )

    def check(self) -> None:
        """Raise LeaseLostError when the keep-alive thread found the lease lost, or could
        not renew it for a whole TTL (it may then be taken over)."""
        if self._lost is not None:
            raise self._lost
        if time.monotonic() - self._renewed > self._state.ttl_s:
            with self._lock:
                self._renew()

    def keep_alive(self, keeper: LeaseKeeper | None = None) -> None:
        """Renew every ttl/3 until release(), from a daemon thread of its own or from
        `keeper`'s (one thread for many leases); failures to reach the storage are logged
        and retried; a lost lease is kept for `check`."""
        if self._keeper is not None or self._shared is not None:
            return
        if keeper is not None:
            self._shared = keeper
            keeper.add(self)
            return

        def loop() -> None:
            while not self._stop.wait(self._state.ttl_s / 3) and self.keep():
                pass

        self._keeper = threading.Thread(target=loop, name="lance-cdf-lease", daemon=True)
        self._keeper.start()

    @property
    def ttl_s(self) -> float:
        return self._state.ttl_s

    def keep(self) -> bool:
        """One keep-alive renewal: False once there is nothing more to keep (released, or
        lost: logged, and kept for `check`); a failure to reach the storage is logged and
        True (retried at the next turn)."""
        with self._lock:  # (release sets _stop first, then waits for this lock)
            if self._stop.is_set():
                return False
            try:
                self._renew()
            except LeaseLostError as exc:
                log.error("%s", exc)
                return False
            except Exception as exc:  # noqa: BLE001 - retried; `check` sees the lapse
                log.warning("could not renew the lease %s (%s); retrying", self._store.where, exc)
        return True

    def release(self) -> None:
        """Give the lease up (a no-op if it was lost or released already)."""
        self._stop.set()
        if self._shared is not None:
            self._shared.remove(self)
        if self._keeper is not None and self._keeper is not threading.current_thread():
            self._keeper.join(timeout=30)
        with self._lock:
            if self._lost is not None or self._state.released:
                return
            store, state = self._store, self._state
            try:
                with store.locked():
                    current, etag = store.read()
                    if current is None or current.holder.token != state.holder.token:
                        return
                    if isinstance(store, _LocalStore):
                        store.remove()
                    else:
                        store.write(
                            _State(state.holder, time.time(), state.ttl_s, True, state.machine),
                            etag,
                            create=False,
                        )
            except _Conflict:
                return  # taken over meanwhile: nothing of ours to release
            except OSError as exc:
                if exc.errno != errno.ENOENT:
                    raise
            self._state = _State(state.holder, state.expires, state.ttl_s, True, state.machine)

    def __enter__(self) -> Lease:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.release()


class LeaseKeeper:
    """One daemon thread renewing many leases (a database replicator's: one per replica
    table), each every ttl/3 as `Lease.keep_alive` does with a thread per lease: the same
    renewals, retries and lost-lease reports, without a thread per table. Renewals are
    made one after another, so a slow store delays the others (`Lease.check` renews in
    place a lease not renewed for a whole TTL). Started on the first `add`; `close` ends it."""

    def __init__(self) -> None:
        self._due: dict[Lease, float] = {}  # lease -> monotonic time of its next renewal
        self._cond = threading.Condition()
        self._thread: threading.Thread | None = None
        self._closed = False

    def add(self, lease: Lease) -> None:
        with self._cond:
            if self._closed:
                raise LanceCdfError("this lease keeper was closed; keep the lease alive anew")
            self._due[lease] = time.monotonic() + lease.ttl_s / 3
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._loop, name="lance-cdf-leases", daemon=True
                )
                self._thread.start()
            self._cond.notify()

    def remove(self, lease: Lease) -> None:
        with self._cond:
            self._due.pop(lease, None)

    def __len__(self) -> int:
        return len(self._due)

    def close(self) -> None:
        """Stop renewing (the leases stay held until released or expired)."""
        with self._cond:
            self._closed = True
            self._due.clear()
            self._cond.notify()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=30)

    def _loop(self) -> None:
        while True:
            with self._cond:
                if self._closed:
                    return
                now = time.monotonic()
                due = [lease for lease, at in self._due.items() if at <= now]
                if not due:
                    soonest = min(self._due.values(), default=now + 60.0)
                    self._cond.wait(soonest - now)
                    continue
            for lease in due:  # (outside the lock: add / remove do not wait on a renewal)
                kept = lease.keep()
                with self._cond:
                    if lease not in self._due:
                        continue  # released meanwhile
                    if kept:
                        self._due[lease] = time.monotonic() + lease.ttl_s / 3
                    else:
                        del self._due[lease]
