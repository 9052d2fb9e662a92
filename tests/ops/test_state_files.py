"""The state-file helper (ops/state_files.py): whole files replaced by rename, updates under
a lock that several processes take in turn, tolerant reads of what may be missing or torn,
and the files its users write, byte for byte as before."""

import fcntl
import json
import multiprocessing
import os
import stat
from dataclasses import dataclass

import pytest

from lance_cdf.errors import StorageAccessError
from lance_cdf.ops import state_files
from lance_cdf.ops.state_files import (
    checkpoint_file,
    locked,
    read_bytes,
    read_json,
    read_record,
    update_record,
    write_atomic,
    write_record,
)


@dataclass
class Count:
    n: int = 0
    who: str = ""


@dataclass(frozen=True)
class Needs:
    first: int
    last: int


def test_checkpoint_file_is_local_only():
    assert checkpoint_file("/tmp/cp", "x.json") == "/tmp/cp/x.json"
    assert checkpoint_file("file:///tmp/cp", "x.json") == "/tmp/cp/x.json"
    assert checkpoint_file("s3://bucket/cp", "x.json") is None
    assert checkpoint_file(None, "x.json") is None
    assert checkpoint_file("", "x.json") is None


def test_write_atomic_replaces_the_file_and_leaves_no_temporary(tmp_path):
    path = str(tmp_path / "a" / "state.json")
    with pytest.raises(FileNotFoundError):
        write_atomic(path, "{}")  # no parents made unless asked
    write_atomic(path, "one", parents=True)
    write_atomic(path, b"two", sync=True)
    assert read_bytes(path) == b"two"
    assert os.listdir(tmp_path / "a") == ["state.json"]


def test_write_atomic_sets_the_mode_asked(tmp_path):
    path = str(tmp_path / "report.json")
    write_atomic(path, "{}", mode=0o600)
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600


def test_a_failed_write_keeps_the_old_file_and_no_temporary(tmp_path, monkeypatch):
    path = str(tmp_path / "state.json")
    write_atomic(path, "old")

    def refuse(src, dst):
        raise OSError("disk full")

    monkeypatch.setattr(state_files.os, "replace", refuse)
    with pytest.raises(OSError, match="disk full"):
        write_atomic(path, "new")
    assert read_bytes(path) == b"old"
    assert os.listdir(tmp_path) == ["state.json"]


def test_reads_tolerate_missing_and_corrupt_files(tmp_path):
    path = tmp_path / "state.json"
    assert read_bytes(str(path)) is None
    assert read_json(str(path)) is None
    assert read_record(str(path), Count) is None
    for torn in ("{", "[1, 2]", '"text"', ""):
        path.write_text(torn)
        assert read_json(str(path)) is None
        assert read_record(str(path), Count) is None
    path.write_text('{"first": 1}')  # a field it needs is missing
    assert read_record(str(path), Needs) is None
    path.write_text('{"first": 1, "last": 3, "later": true}')  # one it does not know
    assert read_record(str(path), Needs) == Needs(1, 3)


def test_write_record_writes_json_dump_of_the_fields(tmp_path):
    """The bytes `json.dump(asdict(...))` wrote before the helper existed."""
    path = str(tmp_path / "state.json")
    write_record(path, Count(2, "t"))
    assert read_bytes(path) == json.dumps({"n": 2, "who": "t"}).encode()


def test_update_record_starts_from_a_default(tmp_path):
    path = str(tmp_path / "state.json")

    def bump(c: Count) -> None:
        c.n += 1

    assert update_record(path, Count, bump, lock=False) == Count(1)
    assert update_record(path, Count, bump, lock=True) == Count(2)
    assert read_record(path, Count) == Count(2)


def _bump_many(path: str, times: int) -> None:
    def bump(c: Count) -> None:
        c.n += 1

    for _ in range(times):
        update_record(path, Count, bump, lock=True)


def test_locked_updates_of_several_processes_lose_none(tmp_path):
    path = str(tmp_path / "state.json")
    ctx = multiprocessing.get_context("fork")
    procs = [ctx.Process(target=_bump_many, args=(path, 25)) for _ in range(3)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
    assert [p.exitcode for p in procs] == [0, 0, 0]
    assert read_record(path, Count) == Count(75)


def test_locked_makes_the_directory_or_names_the_file(tmp_path):
    path = str(tmp_path / "d" / "lease.json")
    with locked(path, parents=True):
        assert os.path.exists(path + ".lock")
    blocked = tmp_path / "file"
    blocked.write_text("")
    with pytest.raises(StorageAccessError, match="cannot create the lease .*: .*writable"):
        with locked(str(blocked / "lease.json"), what="the lease", parents=True):
            pass
    with pytest.raises(StorageAccessError, match="cannot create"):
        with locked(str(tmp_path / "missing" / "x.json")):  # no parents: not made
            pass


def test_locked_takes_again_a_lock_file_removed_meanwhile(tmp_path, monkeypatch):
    """A holder removes the lock file on release (ops/lease.py): a lock taken on the
    removed file is no lock, and is taken again on the new one."""
    path = str(tmp_path / "lease.json")
    real_flock = fcntl.flock
    calls = []

    def flock(fd, op):
        calls.append(fd)
        if len(calls) == 1:
            os.unlink(path + ".lock")  # released (and removed) while we waited
        real_flock(fd, op)

    monkeypatch.setattr(fcntl, "flock", flock)
    with locked(path):
        assert os.stat(path + ".lock")
    assert len(calls) == 2
