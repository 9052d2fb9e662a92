"""Commit hints from an SQS queue that an S3 bucket sends its `ObjectCreated` notifications
to (`CommitHints` says what a hint is).

One thread long-polls the queue (`WAIT_S` seconds a call, up to 10 messages): an idle
database costs one request per `WAIT_S` whatever its number of tables. Each message's
commits of the database's tables (`storage_events`) go to the inbox, then the
messages are deleted: a message deleted before its table is looked at (the process stops
between the two) loses a hint, never a version (the listing at start and the slow safety
net find it). A call that fails marks the inbox not heard (the stream falls back to
listing, saying why) and is tried again after a growing pause (`PAUSES`), for as long as
the stream runs.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Mapping
from typing import Any

from lance_cdf.errors import in_words
from lance_cdf.format.storage_events import commit_of, root_location, s3_objects
from lance_cdf.ops.clientconfig import redact_url, scrub, sqs_client_arguments
from lance_cdf.ops.commit_hints import CommitHints
from lance_cdf.retry import RetryPolicy

log = logging.getLogger("lance_cdf.ops.commit_hints")

WAIT_S = 20  # SQS's longest long poll: a call returns at a message, or after this
BATCH = 10  # SQS's most messages a call returns
# the pauses before receiving again after a failed call (the last one repeats)
PAUSES = RetryPolicy(pauses=(1.0, 2.0, 5.0, 10.0, 30.0), deadline_s=float("inf"))
# a receiver that has not answered for this long is not heard (a call hangs past its
# read timeout: one long poll plus this margin)
STALE_AFTER_S = WAIT_S + 15.0


class SqsReceiver:
    """Receives the notifications of the queue at `queue_url` into `hints` from a daemon
    thread (`start`, `stop`), with the database's storage options' credentials."""

    def __init__(
        self,
        queue_url: str,
        database: str,
        storage_options: Mapping[str, str],
        hints: CommitHints,
    ):
        self.queue_url, self.hints = queue_url, hints
        self.root = root_location(database)
        self.client_arguments = sqs_client_arguments(queue_url, storage_options)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="lance-cdf-sqs", daemon=True)
        self.requests = 0  # calls made to the queue (receives and deletes)

    def start(self) -> SqsReceiver:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()

    def _run(self) -> None:
        failures = 0
        client: Any = None
        while not self._stop.is_set():
            try:
                if client is None:
                    client = self._client()
                self._receive(client)
                failures = 0
            except Exception as exc:  # noqa: BLE001 (any fault of the queue: listed instead)
                if self._stop.is_set():
                    return  # (stopped while a call was under way: no fault of the queue)
                why = f"queue unreachable: {scrub(in_words(exc))}"
                if failures == 0:
                    log.warning(
                        "commit events from %s: %s; tables are looked at by listing until "
                        "it answers",
                        redact_url(self.queue_url),
                        why,
                    )
                self.hints.failed(why)
                pause = PAUSES.pause(failures)
                failures += 1
                self._stop.wait(pause if pause is not None else 30.0)

    def _client(self) -> Any:
        import boto3
        from botocore.config import Config

        config = Config(
            connect_timeout=5,
            read_timeout=WAIT_S + 10,
            retries={"total_max_attempts": 1},  # (this loop retries, with its pauses)
        )
        client = boto3.session.Session().client("sqs", config=config, **self.client_arguments)
        client.get_queue_attributes(QueueUrl=self.queue_url, AttributeNames=["QueueArn"])
        self.requests += 1
        self.hints.answered()  # the queue is there: hints flow from now on
        return client

    def _receive(self, client: Any) -> None:
        """One long poll: its commits into the inbox, then its messages deleted."""
        got = client.receive_message(
            QueueUrl=self.queue_url, MaxNumberOfMessages=BATCH, WaitTimeSeconds=WAIT_S
        )
        self.requests += 1
        messages = got.get("Messages") or []
        dirs = set()
        for message in messages:
            for obj in s3_objects(message.get("Body") or ""):
                commit = commit_of(self.root, obj)
                if commit is not None:
                    dirs.add(commit.table_dir)
        self.hints.add(dirs)
        self.hints.answered()
        if messages:
            entries = [
                {"Id": str(i), "ReceiptHandle": m["ReceiptHandle"]} for i, m in enumerate(messages)
            ]
            client.delete_message_batch(QueueUrl=self.queue_url, Entries=entries)
            self.requests += 1
