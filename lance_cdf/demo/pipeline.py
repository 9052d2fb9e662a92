"""Start the whole pipeline, drive it with random commits, drain it, check the replica.

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

from lance_cdf.demo.progress import Probe, Snapshot, line, render
from lance_cdf.demo.sample import Writer, create
from lance_cdf.errors import LanceCdfError
from lance_cdf.replicate.replica import SOURCE_ROWID

TOPIC = "demo.cdf"


@dataclass
class Paths:
    root: str

    def __post_init__(self) -> None:
        self.root = os.path.abspath(self.root)
        self.source = os.path.join(self.root, "source.lance")
        self.replica = os.path.join(self.root, "replica.lance")
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


class Children:
    """The publisher and replicator processes."""

    def __init__(self, logs: str):
        self.logs = logs
        self.procs: dict[str, subprocess.Popen[bytes]] = {}

    def start(self, name: str, args: list[str]) -> None:
        from lance_cdf.devtools.process import _death_signal_prefix

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
    from confluent_kafka.admin import AdminClient, NewTopic

    from lance_cdf.devtools import KafkaBroker, SchemaRegistry, provision
    from lance_cdf.devtools.process import free_port

    out = out or sys.stdout
    paths = Paths(root)
    shutil.rmtree(paths.root, ignore_errors=True)
    os.makedirs(paths.logs)
    say = lambda text: print(text, file=out, flush=True)  # noqa: E731
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
        admin = AdminClient({"bootstrap.servers": broker.bootstrap_servers, "log_level": 0})
        admin.create_topics([NewTopic(TOPIC, partitions, 1)])[TOPIC].result(30)
        del admin  # its connections would complain when the broker stops
        create(paths.source)
        kafka = ["--bootstrap-servers", broker.bootstrap_servers, "--topic", TOPIC,
                 "--schema-registry", registry.url]  # fmt: skip
        pub_port, rep_port = free_port(), free_port()
        children.start("publisher", ["publish", "--table", paths.source, *kafka,
                                     "--checkpoint", paths.checkpoint, "--starting-version",
                                     "1", "--trigger-interval", "1 second",
                                     "--metrics-port", str(pub_port)])  # fmt: skip
        children.start("replicator", ["replicate", *kafka, "--target", paths.replica,
                                      "--dead-letter-topic", f"{TOPIC}.dlq",
                                      "--max-batch-interval", "500ms", "--source-table",
                                      paths.source, "--metrics-port", str(rep_port)])  # fmt: skip
        say(f"publisher and replicator started (logs in {paths.logs}); writing for {seconds:.0f}s")
        say(f"Prometheus metrics: publisher http://127.0.0.1:{pub_port}/metrics, "
            f"replicator http://127.0.0.1:{rep_port}/metrics")  # fmt: skip
        probe = Probe(
            paths.source, paths.checkpoint, paths.replica, broker.bootstrap_servers, TOPIC
        )
        writer = Writer(paths.source)
        _drive(writer, probe, children, seconds, commit_interval, out)
        equal, detail = compare(paths.source, paths.replica)
    finally:
        children.stop()
        if probe is not None:
            probe.close()
        registry.close()
        broker.close()
    latest = lance.dataset(paths.source).version
    say(
        f"\n{'OK' if equal else 'MISMATCH'}: replica {'equals' if equal else 'differs from'} "
        f"the source at version {latest} ({detail}); {writer.commits} random commits.\n\n"
        f"  source table   {paths.source}\n  replica table  {paths.replica}\n"
        f"  Kafka topic    {TOPIC} (Avro; the broker was stopped with the demo)\n"
        f"  logs           {paths.logs}\n\nExplore:\n"
        f"  .venv/bin/lance-cdf changes {paths.source} --from 2 --to 4\n"
        f"  .venv/bin/lance-cdf changes {paths.replica} --from 1 --to 2 --columns "
        f"id,city,price\n"
        f"  .venv/bin/lance-cdf status --table {paths.source} --checkpoint {paths.checkpoint} "
        f"--replica {paths.replica}\n"
        "  .venv/bin/python -m lance_cdf.devtools up   # a broker + registry of your own, then\n"
        "      kafka-avro-console-consumer / confluent_kafka.Consumer on the topic you publish"
    )
    return 0 if equal else 1


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
    last, last_line = "create 2000 rows", 0.0

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
            time.sleep(0.25)
        deadline = time.monotonic() + 240
        while True:  # drain: everything committed is published and replicated
            children.check()
            snap = show("draining")
            # every version published, every published record applied (commits that change
            # no rows, e.g. a compaction, publish nothing: the replica's version stays behind)
            published = snap.published_version == snap.source_version
            if published and snap.kafka_records and snap.lag_records == 0:
                show("done")
                break
            if time.monotonic() > deadline:
                raise LanceCdfError(f"the pipeline did not catch up within 240 s: {line(snap, '')}")
            time.sleep(0.25)
    finally:
        if live is not None:
            live.stop()
