"""The process behind `S3Server`: moto's S3-compatible server, plus a counter of the
requests it serves (GET/PUT/LIST/HEAD/...), read and reset over HTTP at
`/_lance_cdf/requests` (GET returns JSON counts, DELETE resets them); the same per table
(the object key or listed prefix up to a Lance table's own folders) at
`/_lance_cdf/requests/by-table` (`{"bucket/db/t.lance": {"list": 3, ...}}`). The server
also serves SQS (a queue S3 notifies: moto delivers the notifications itself): those
requests count as kind `sqs`, under `SQS_KEY` by table. Requests whose User-Agent holds
UNCOUNTED_AGENT are not counted.

    python -m lance_cdf_devtools.s3app --port 9000
"""

from __future__ import annotations

import argparse
import json
import logging
import threading
from collections import Counter
from collections.abc import Iterable
from urllib.parse import parse_qs
from wsgiref.types import StartResponse, WSGIApplication, WSGIEnvironment

COUNTS_PATH = "/_lance_cdf/requests"
BY_TABLE_PATH = COUNTS_PATH + "/by-table"
# a client whose User-Agent holds this is served but not counted (storage option
# `user_agent`): a benchmark's own writes beside the reads it measures
UNCOUNTED_AGENT = "lance-cdf-uncounted"
# the folders inside a Lance table: a key under one of them belongs to the table above it
TABLE_FOLDERS = ("_versions", "_transactions", "data", "_indices", "_deletions", "_refs")
SQS_KEY = "(sqs)"  # the per-table key of the SQS requests (receive, delete, ...)


def request_kind(method: str, path: str, query: str, headers: dict[str, str]) -> str:
    """The S3 operation a request is: list, get, get_range, head, put, delete, post, ...;
    an SQS request (boto3's JSON protocol names it in X-Amz-Target) is `sqs`."""
    if headers.get("HTTP_X_AMZ_TARGET", "").startswith("AmazonSQS"):
        return "sqs"
    params = parse_qs(query, keep_blank_values=True)
    parts = [p for p in path.split("/") if p]
    if method == "GET" and (len(parts) <= 1 or "list-type" in params):
        return "list"
    if method == "GET":
        return "get_range" if "HTTP_RANGE" in headers else "get"
    return method.lower()


def request_table(path: str, query: str) -> str:
    """`bucket/key` of a request (a listing: `bucket/prefix`), cut before the first of a
    Lance table's own folders: the table it concerns (else the whole key)."""
    parts = [p for p in path.split("/") if p]
    prefix = parse_qs(query).get("prefix", [""])[0]
    parts = parts[:1] + [p for p in prefix.split("/") if p] + parts[1:]
    for i, part in enumerate(parts[1:], 1):
        if part in TABLE_FOLDERS:
            return "/".join(parts[:i])
    return "/".join(parts)


class CountingApp:
    """WSGI middleware: counts each request by kind, serves the counts."""

    def __init__(self, app: WSGIApplication):
        self.app = app
        self.counts: Counter[str] = Counter()
        self.by_table: dict[str, Counter[str]] = {}
        self.lock = threading.Lock()

    def __call__(self, environ: WSGIEnvironment, start_response: StartResponse) -> Iterable[bytes]:
        path = environ.get("PATH_INFO", "")
        method = environ.get("REQUEST_METHOD", "GET")
        if path in (COUNTS_PATH, BY_TABLE_PATH):
            with self.lock:
                counts = self.counts if path == COUNTS_PATH else self.by_table
                body = json.dumps(counts).encode()
                if method == "DELETE":
                    self.counts.clear()
                    self.by_table.clear()
            start_response("200 OK", [("Content-Type", "application/json")])
            return [body]
        query = environ.get("QUERY_STRING", "")
        if UNCOUNTED_AGENT in environ.get("HTTP_USER_AGENT", ""):
            return self.app(environ, start_response)  # a client that asked not to be counted
        kind = request_kind(method, path, query, environ)
        table = SQS_KEY if kind == "sqs" else request_table(path, query)
        with self.lock:
            self.counts[kind] += 1
            self.by_table.setdefault(table, Counter())[kind] += 1
        return self.app(environ, start_response)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    args = parser.parse_args(argv)
    try:
        from moto.moto_server.werkzeug_app import (
            DomainDispatcherApplication,
            MotoRequestHandler,
            create_backend_app,
        )
        from werkzeug.serving import run_simple
    except ImportError as exc:
        raise SystemExit(
            f"the local S3 server needs moto's server extra ({exc}); "
            "install it with: pip install 'moto[s3,server]'"
        ) from None
    logging.getLogger("werkzeug").setLevel(logging.WARNING)  # no line per request
    app = CountingApp(DomainDispatcherApplication(create_backend_app))
    run_simple(args.host, args.port, app, threaded=True, request_handler=MotoRequestHandler)


if __name__ == "__main__":
    main()
