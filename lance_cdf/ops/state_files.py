"""The small JSON files a checkpoint or a replica keeps beside its data (a lease, the
Kafka outage state, the writer tasks' retries, a replicator's renewals and unfinished
versions, a database stream's report): written whole by rename, updated under a lock
where several processes write them, read back tolerantly where they are only reports.

Local disk only; a lease on object storage has its own conditional writes (`lease._ObjectStore`)."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

from lance_cdf.errors import StorageAccessError

T = TypeVar("T")
# the tries at locking a lock file that its holder removes on release (`lease._LocalStore.remove`)
_LOCK_TRIES = 100


def checkpoint_file(checkpoint: str | None, name: str) -> str | None:
    """The file `name` in a local checkpoint directory (a path or file:// URI); None when
    there is no checkpoint or it is on object storage."""
    if not checkpoint or ("://" in checkpoint and not checkpoint.startswith("file://")):
        return None
    return os.path.join(checkpoint.removeprefix("file://"), name)


def write_atomic(
    path: str, data: str | bytes, *, sync: bool = False, parents: bool = False, mode: int = 0o666
) -> None:
    """Replace `path` with `data` at once: written to a temporary file beside it, then
    renamed over it, so a reader sees the old file or the new one, never a part. `sync`:
    the data forced to disk before the rename; `parents`: missing directories made;
    `mode`: the new file's permissions (before the umask). Raises OSError."""
    directory = os.path.dirname(path) or "."
    if parents:
        os.makedirs(directory, exist_ok=True)
    tmp = f"{path}.{os.getpid()}.tmp"
    raw = data.encode() if isinstance(data, str) else data
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(raw)
            if sync:
                f.flush()
                os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def read_bytes(path: str) -> bytes | None:
    """The file's bytes; None when it does not exist (other errors raise OSError)."""
    try:
        with open(path, "rb") as f:
            return f.read()
    except FileNotFoundError:
        return None


def read_json(path: str) -> dict[str, Any] | None:
    """The JSON object in `path`; None when it is missing, unreadable or not one."""
    try:
        with open(path) as f:
            found = json.load(f)
    except (OSError, ValueError):
        return None
    return found if isinstance(found, dict) else None


def read_record(path: str, kind: type[T]) -> T | None:
    """The dataclass `kind` from the JSON object in `path` (keys it does not have are
    ignored); None when the file is missing, unreadable or does not make one."""
    raw = read_json(path)
    if raw is None:
        return None
    names = getattr(kind, "__dataclass_fields__", {})
    try:
        return kind(**{k: raw[k] for k in names if k in raw})
    except TypeError:  # a field it needs is missing
        return None


def write_record(path: str, record: Any, *, parents: bool = False) -> None:
    """The dataclass `record` as a JSON object, written by `write_atomic`."""
    write_atomic(path, json.dumps(dataclasses.asdict(record)), parents=parents)


def update_record(path: str, kind: type[T], change: Callable[[T], None], *, lock: bool) -> T:
    """Read the `kind` in `path` (a default one when there is none), `change` it and write
    it back; `lock`: all of it under `locked`, for files several processes update at
    once. Returns the record written. Raises OSError or StorageAccessError."""
    with locked(path) if lock else contextlib.nullcontext():
        record = read_record(path, kind) or kind()
        change(record)
        write_record(path, record)
        return record


@contextlib.contextmanager
def locked(path: str, *, what: str = "", parents: bool = False) -> Iterator[None]:
    """An exclusive flock of `<path>.lock` for the block. A holder may remove the lock
    file on release (under the lock; `lease._LocalStore.remove`): a lock taken on a file removed
    meanwhile is taken again. `parents`: missing directories made (and made again when
    removed meanwhile). `what` names the file in errors (StorageAccessError)."""
    import fcntl

    named = f"{what} {path}" if what else path
    lock = f"{path}.lock"
    for _ in range(_LOCK_TRIES):
        try:
            if parents:
                os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
            fd = os.open(lock, os.O_CREAT | os.O_RDWR, 0o644)
        except OSError as exc:
            if parents and isinstance(exc, FileNotFoundError):
                continue  # the directory removed meanwhile (a release)
            raise StorageAccessError(
                f"cannot create {named}: {exc.strerror}; check that the directory is writable"
            ) from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            try:
                same = os.stat(lock).st_ino == os.fstat(fd).st_ino
            except FileNotFoundError:
                same = False
            if same:
                yield
                return
        finally:
            os.close(fd)  # (drops the flock)
    raise StorageAccessError(f"cannot lock {named}: it keeps being removed")
