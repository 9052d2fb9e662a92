"""Start the whole pipeline, drive it with random commits, drain it, check the replica
database table by table.

Everything it starts is stopped on the way out, also on Ctrl-C: the publisher and the
replicator (child processes, SIGTERM then SIGKILL) and the Kafka broker and registry.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from typing import TextIO

import lance
import pyarrow as pa

from lance_cdf.errors import LanceCdfError
from lance_cdf.format.namespace import resolve_table
from lance_cdf.replicate.replica import SOURCE_ROWID
from lance_cdf_demo.live_view import Probe, Snapshot, line, render
from lance_cdf_demo.sample import TABLES, Writer, create

PREFIX = "demo"  # table sales.orders -> topic demo.sales.orders
DEAD_LETTERS = "demo-dead-letters"  # (not under the prefix: it would be taken for a table)


@dataclass
class Paths:
    root: str

    def __post_init__(self) -> None:
        self.root = os.path.abspath(self.root)
        self.source = os.path.join(self.root, "source")  # the database (a directory namespace)
        self.replica = os.path.join(self.root, "replica")  # the replica database
        self.checkpoint = os.path.join(self.root, "checkpoints", "publisher")
        self.logs = os.path.join(self.root, "logs")


def compare(source: str, replica: str) -> tuple[bool, str]:
    """Is the replica, keyed by _source_rowid, equal to the source on every column?"""
    src = lance.dataset(source).to_table(with_row_id=True)
    src = src.rename_columns([SOURCE_ROWID if c == "_rowid" else c for c in src.column_names])
    src = src.set_column(
        src.column_names.index(SOURCE_ROWID), SOURCE_ROWID, src[SOURCE_ROWID].cast(pa.int64())
    )
    rep = lance.dataset(replica).to_table(columns=src.column_names)
    if rep.num_rows != src.num_rows:
        return False, f"{rep.num_rows} rows in the replica, {src.num_rows} in the source"
    src, rep = (t.sort_by(SOURCE_ROWID) for t in (src, rep))
    for name in src.column_names:
        if not rep[name].cast(src[name].type).equals(src[name]):
            return False, f"column {name!r} differs"
    return True, f"{src.num_rows} rows, {len(src.column_names) - 1} columns equal"


def compare_databases(sources: dict[str, str], replica: str) -> list[tuple[str, bool, str]]:
    """Each source table (qualified name -> URI) against the replica database's table of
    the same name: (name, equal, detail)."""
    out = []
    for name, uri in sources.items():
        try:
            target = resolve_table(replica, name)
        except LanceCdfError:
            out.append((name, False, "no replica table of that name"))
            continue
        equal, detail = compare(uri, target)
        out.append((name, equal, f"version {lance.dataset(uri).version}: {detail}"))
    return out


class Children:
    """The publisher and replicator processes."""

    def __init__(self, logs: str):
        self.logs = logs
        self.procs: dict[str, subprocess.Popen[bytes]] = {}

    def start(self, name: str, args: list[str]) -> None:
        from lance_cdf_devtools.process import _death_signal_prefix

        log = open(os.path.join(self.logs, f"{name}.log"), "w")
        cmd = [*_death_signal_prefix(), sys.executable, "-m", "lance_cdf.cli", *args]
        self.procs[name] = subprocess.Popen(
            cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )

    def check(self) -> None:
        for name, proc in self.procs.items():
            if proc.poll() is not None:
                tail = open(os.path.join(self.logs, f"{name}.log")).read()[-3000:]
                raise LanceCdfError(f"the {name} exited with {proc.returncode}:\n{tail}")

    def stop(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
        deadline = time.monotonic() + 30
        for proc in self.procs.values():
            try:
                proc.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()


def run(
    root: str,
    seconds: float,
    commit_interval: float,
    partitions: int,
    out: TextIO | None = None,
) -> int:
    from lance_cdf_devtools import KafkaBroker, SchemaRegistry, provision

    out = out or sys.stdout
    paths = Paths(root)
    shutil.rmtree(paths.root, ignore_errors=True)
    os.makedirs(paths.logs)

    def say(text: str) -> None:
        print(text, file=out, flush=True)

    say("provisioning Kafka and the schema registry (cached after the first run)...")
    provision()
    broker = KafkaBroker(os.path.join(paths.root, "kafka"))
    registry = SchemaRegistry(os.path.join(paths.root, "registry"))
    children = Children(paths.logs)
    probe = None
    try:
        broker.start()
        registry.start()
        say(f"Kafka {broker.bootstrap_servers}, schema registry {registry.url}")
        sources = create(paths.source)
        say(f"database {paths.source}: tables {', '.join(sources)} (sales: a child namespace)")
        kafka = ["--bootstrap-servers", broker.bootstrap_servers, "--schema-registry", registry.url]
        pub_port, rep_port = _start_children(children, paths, kafka, partitions)
        say(
            f"one publisher (publish --database) and one replicator (replicate "
            f"--database-target) for the {len(sources)} tables, topics {PREFIX}.<table> "
            f"(logs in {paths.logs}); writing for {seconds:.0f}s"
        )
        say(
            f"Prometheus metrics: publisher http://127.0.0.1:{pub_port}/metrics, "
            f"replicator http://127.0.0.1:{rep_port}/metrics"
        )
        probe = Probe(sources, paths.checkpoint, paths.replica, broker.bootstrap_servers, PREFIX)
        writer = Writer(sources)
        _drive(writer, probe, children, seconds, commit_interval, out)
        results = compare_databases(sources, paths.replica)
    finally:
        children.stop()
        if probe is not None:
            probe.close()
        registry.close()
        broker.close()
    equal = all(ok for _, ok, _ in results)
    say(
        f"\n{'OK' if equal else 'MISMATCH'}: the replica database "
        f"{'equals' if equal else 'differs from'} the source, table by table; "
        f"{writer.commits} random commits."
    )
    for name, ok, detail in results:
        say(f"  {name:<14} {'equal' if ok else 'DIFFERS'} at {detail}")
    say(_explore(paths))
    return 0 if equal else 1


def _start_children(
    children: Children, paths: Paths, kafka: list[str], partitions: int
) -> tuple[int, int]:
    """The publisher of the source database and the replicator into the replica
    database, started; the ports of their metrics."""
    from lance_cdf_devtools.process import free_port

    pub_port, rep_port = free_port(), free_port()
    children.start(
        "publisher",
        [
            "publish",
            "--database",
            paths.source,
            "--topic-prefix",
            PREFIX,
            *kafka,
            "--checkpoint",
            paths.checkpoint,
            "--starting-version",
            "1",
            "--trigger-interval",
            "1 second",
            "--partitions",
            str(partitions),
            "--metrics-port",
            str(pub_port),
        ],
    )
    children.start(
        "replicator",
        [
            "replicate",
            *kafka,
            "--database-target",
            paths.replica,
            "--topic-prefix",
            PREFIX,
            "--dead-letter-topic",
            DEAD_LETTERS,
            "--max-batch-interval",
            "500ms",
            "--refresh-interval",
            "1",
            "--source-database",
            paths.source,
            "--metrics-port",
            str(rep_port),
        ],
    )
    return pub_port, rep_port


def _explore(paths: Paths) -> str:
    """Where the demo left its databases, topics and logs, and commands to look at them."""
    topics = [f"{PREFIX}.{spec.name}" for spec in TABLES]
    return (
        f"\n  source database   {paths.source}\n  replica database  {paths.replica}\n"
        f"  Kafka topics      {', '.join(topics)} (Avro; the broker was stopped with the demo)\n"
        f"  logs              {paths.logs}\n\nExplore:\n"
        f"  .venv/bin/lance-cdf changes --database {paths.source} sales.orders --from 2 --to 4\n"
        f"  .venv/bin/lance-cdf changes --database {paths.replica} items --from 1 --to 2 "
        "--columns id,city,price   # a replica has a change feed of its own\n"
        f"  .venv/bin/lance-cdf status --database {paths.source} --checkpoint "
        f"{paths.checkpoint}\n"
        f"  .venv/bin/lance-cdf status --database-target {paths.replica}\n"
        "  .venv/bin/python -m lance_cdf_devtools up   # a broker + registry of your own, then\n"
        "      kafka-avro-console-consumer / confluent_kafka.Consumer on the topic you publish"
    )


def _drive(
    writer: Writer,
    probe: Probe,
    children: Children,
    seconds: float,
    commit_interval: float,
    out: TextIO,
) -> None:
    live = None
    if out.isatty():
        from rich.live import Live

        live = Live(refresh_per_second=4, console=None)
        live.start()
    last, last_line = "create the tables", 0.0

    def show(phase: str) -> Snapshot:
        nonlocal last_line
        snap = probe.snapshot(last)
        if live is not None:
            live.update(render(snap, seconds, phase))
        elif time.monotonic() - last_line >= 5:
            print(line(snap, phase), file=out, flush=True)
            last_line = time.monotonic()
        return snap

    try:
        end = time.monotonic() + seconds
        next_commit = time.monotonic()
        while time.monotonic() < end:
            children.check()
            if time.monotonic() >= next_commit:
                last = writer.step()
                next_commit = time.monotonic() + commit_interval
            show("writing")
            time.sleep(0.5)  # (a snapshot reads 3 tables, the checkpoint and 3 topics)
        deadline = time.monotonic() + 240
        while True:  # drain: everything committed is published and replicated
            children.check()
            snap = show("draining")
            if snap.caught_up:  # every table: see TableSnapshot.caught_up
                show("done")
                break
            if time.monotonic() > deadline:
                raise LanceCdfError(f"the pipeline did not catch up within 240 s: {line(snap, '')}")
            time.sleep(0.5)  # (a snapshot reads 3 tables, the checkpoint and 3 topics)
    finally:
        if live is not None:
            live.stop()
