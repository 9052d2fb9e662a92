"""One writer per target (`lance_cdf.ops.lease`): on local disk, and on the S3 server
(conditional PUTs), with real processes holding and dying."""

import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
import uuid

import pytest

from lance_cdf.errors import LeaseHeldError, LeaseLostError
from lance_cdf.ops.lease import Lease, LeaseKeeper

pytest_plugins = ["tests.support.s3_services"]

HOLD = """
import sys, time
from lance_cdf.ops.lease import Lease, LeaseKeeper
opts = dict(a.split("=", 1) for a in sys.argv[3:])
lease = Lease.acquire(sys.argv[1], "replica", opts or None, ttl_s=float(sys.argv[2]),
                      command="holder-process")
print("held", flush=True)
time.sleep(600)
"""


def hold_in_child(location, ttl, options=None):
    """A child process that acquires the lease and then sleeps (until killed)."""
    args = [f"{k}={v}" for k, v in (options or {}).items()]
    proc = subprocess.Popen(
        [sys.executable, "-c", HOLD, location, str(ttl), *args], stdout=subprocess.PIPE, text=True
    )
    assert proc.stdout is not None and proc.stdout.readline().strip() == "held"
    return proc


def _two_writers(location, options=None):
    first = Lease.acquire(location, "replica", options, ttl_s=30, command="first writer")
    with pytest.raises(LeaseHeldError, match=r"is being written by 'first writer' \(pid "):
        Lease.acquire(location, "replica", options, ttl_s=30, command="second writer")
    first.renew()
    first.release()
    with Lease.acquire(location, "replica", options, command="second writer") as second:
        assert second.holder.command == "second writer"
    # released on exit: a third gets it at once
    Lease.acquire(location, "replica", options).release()


def _expired_is_taken_over(location, options, caplog):
    """A holder that stopped renewing (alive, as a stopped process would be) loses the
    lease after its TTL; its next renew says so."""
    old = Lease.acquire(location, "replica", options, ttl_s=1.0, command="stalled writer")
    with pytest.raises(LeaseHeldError):
        Lease.acquire(location, "replica", options, ttl_s=1.0)
    time.sleep(1.3)
    with caplog.at_level("WARNING", logger="lance_cdf.ops.lease"):
        new = Lease.acquire(location, "replica", options, ttl_s=30, command="new writer")
    assert "took over the lease" in caplog.text and "'stalled writer'" in caplog.text
    assert "expired" in caplog.text
    with pytest.raises(LeaseLostError, match=r"\(held now by 'new writer' \(pid "):
        old.renew()
    with pytest.raises(LeaseLostError):
        old.check()
    old.release()  # a no-op: it is not ours any more
    new.renew()  # still the new writer's
    with pytest.raises(LeaseHeldError, match="'new writer'"):
        Lease.acquire(location, "replica", options)
    new.release()


@pytest.mark.unit
def test_local_second_writer_refused_then_free_after_release(tmp_path):
    _two_writers(str(tmp_path / "t.lance" / "_lance_cdf"))


@pytest.mark.unit
def test_local_expired_lease_taken_over(tmp_path, caplog):
    _expired_is_taken_over(str(tmp_path / "t"), None, caplog)


@pytest.mark.unit
def test_local_killed_holder_taken_over_without_waiting(tmp_path, caplog):
    """A SIGKILLed holder on this machine: its process is gone, the lease is free at once
    (the TTL is long); a live one (SIGSTOPped) keeps it."""
    location = str(tmp_path / "t")
    proc = hold_in_child(location, 600)
    try:
        os.kill(proc.pid, signal.SIGSTOP)
        with pytest.raises(LeaseHeldError, match=f"'holder-process' \\(pid {proc.pid} on "):
            Lease.acquire(location, "replica", ttl_s=600)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
    finally:
        proc.kill()
        proc.wait()
    with caplog.at_level("WARNING", logger="lance_cdf.ops.lease"):
        Lease.acquire(location, "replica").release()
    assert f"process {proc.pid} is gone" in caplog.text


@pytest.mark.unit
def test_local_keep_alive_renews_and_release_removes(tmp_path):
    location = str(tmp_path / "t")
    lease = Lease.acquire(location, "replica", ttl_s=0.6)
    lease.keep_alive()
    time.sleep(1.5)  # several TTLs: the keep-alive thread renewed it meanwhile
    lease.check()
    with pytest.raises(LeaseHeldError):
        Lease.acquire(location, "replica", ttl_s=0.6)
    lease.release()
    assert not os.path.exists(os.path.join(location, "replica.lease"))


def _lease_threads() -> list[str]:
    return [t.name for t in threading.enumerate() if t.name.startswith("lance-cdf-lease")]


@pytest.mark.unit
def test_one_keeper_thread_renews_many_leases(tmp_path, caplog):
    """A database replicator's leases (one per replica table) kept alive by one thread:
    each renewed as its own thread would (held past several TTLs, refused to others); one
    released or lost leaves the others kept; closed, the thread ends."""
    before = _lease_threads()
    keeper = LeaseKeeper()
    locations = [str(tmp_path / f"t{i}" / "_lance_cdf") for i in range(5)]
    leases = [Lease.acquire(loc, "replica", ttl_s=0.6) for loc in locations]
    for lease in leases:
        lease.keep_alive(keeper)
    assert _lease_threads() == [*before, "lance-cdf-leases"]  # one thread, not five
    time.sleep(1.5)  # several TTLs: renewed meanwhile
    for lease, loc in zip(leases, locations, strict=True):
        lease.check()
        with pytest.raises(LeaseHeldError):
            Lease.acquire(loc, "replica", ttl_s=0.6)
    leases[0].release()  # given up: no longer renewed, free at once
    assert len(keeper) == 4
    Lease.acquire(locations[0], "replica").release()
    # lease 1 now names another writer (its file replaced at once, as a takeover writes
    # it): the keeper reports it lost and lets it go, the others are still kept
    thief = Lease.acquire(str(tmp_path / "other"), "replica", command="another writer")
    with caplog.at_level("ERROR", logger="lance_cdf.ops.lease"):
        stolen = os.path.join(locations[1], "replica.lease")
        shutil.copy(os.path.join(tmp_path, "other", "replica.lease"), stolen + ".new")
        os.replace(stolen + ".new", stolen)
        time.sleep(1.0)
    assert "lost the lease" in caplog.text and "'another writer'" in caplog.text
    with pytest.raises(LeaseLostError):
        leases[1].check()
    assert len(keeper) == 3
    time.sleep(0.8)
    for lease in leases[2:]:
        lease.check()
    keeper.close()
    assert _lease_threads() == before
    for lease in leases[1:]:
        lease.release()
    thief.release()
    assert os.path.exists(stolen)  # (not ours: left alone)
    assert not any(
        os.path.exists(os.path.join(loc, "replica.lease"))
        for loc in locations
        if loc != locations[1]
    )


@pytest.mark.unit
def test_local_foreign_lease_file_is_refused(tmp_path):
    location = tmp_path / "t"
    location.mkdir()
    (location / "replica.lease").write_text(json.dumps({"holder": "?"}))
    with pytest.raises(Exception, match="is not one lance-cdf wrote"):
        Lease.acquire(str(location), "replica")


def test_s3_second_writer_refused_and_killed_holder_taken_over_after_ttl(s3_server, caplog):
    """On the S3 server (conditional PUTs): a second writer is refused; a SIGKILLed
    holder of this machine is taken over at once (its process is gone), a holder that
    cannot be checked is taken over after its TTL (test_s3_expired_lease_taken_over)."""
    options = s3_server.storage_options()
    base = f"s3://lance-cdf-tests/{uuid.uuid4().hex}/t.lance/_lance_cdf"
    _two_writers(base, options)
    proc = hold_in_child(base, 2.0, options)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    with caplog.at_level("WARNING", logger="lance_cdf.ops.lease"):
        lease = Lease.acquire(base, "replica", options, command="after the kill")
    assert "'holder-process'" in caplog.text
    lease.release()


def test_s3_expired_lease_taken_over(s3_server, caplog):
    options = s3_server.storage_options()
    base = f"s3://lance-cdf-tests/{uuid.uuid4().hex}/t.lance/_lance_cdf"
    _expired_is_taken_over(base, options, caplog)
