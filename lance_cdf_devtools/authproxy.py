"""`python -m lance_cdf_devtools.authproxy`: a small HTTPS reverse proxy with HTTP basic
auth, in front of a plain-HTTP service on 127.0.0.1 (the Apicurio registry, which has no
basic auth of its own without an OIDC server such as Keycloak).

Arguments name files, never secrets: `--users FILE` holds `user:password` lines (mode
0600), so no password sits in this process's argv. Every request without the right
`Authorization: Basic` header gets 401; others are forwarded as they are (method, path,
headers, body) and the upstream's answer returned."""

from __future__ import annotations

import argparse
import base64
import hmac
import http.client
import ssl
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import urlsplit

_HOP = {
    "connection",
    "keep-alive",
    "proxy-authorization",
    "te",
    "trailers",
    "transfer-encoding",
    "upgrade",
    "authorization",
    "host",
    "content-length",
}


def _handler(upstream: str, users: set[bytes]) -> type[BaseHTTPRequestHandler]:
    target = urlsplit(upstream)

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: object) -> None:  # noqa: A002
            pass  # no access log: it would name users

        def _authorized(self) -> bool:
            header = self.headers.get("Authorization", "")
            if not header.startswith("Basic "):
                return False
            try:
                given = base64.b64decode(header[6:].strip(), validate=True)
            except ValueError:
                return False
            return any(hmac.compare_digest(given, u) for u in users)

        def _forward(self) -> None:
            if not self._authorized():
                denied = b'{"error_code":401,"message":"Unauthorized"}'
                self.send_response(401)
                self.send_header("WWW-Authenticate", 'Basic realm="registry"')
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(denied)))
                self.end_headers()
                self.wfile.write(denied)
                return
            length = int(self.headers.get("Content-Length") or 0)
            body: bytes | None = self.rfile.read(length) if length else None
            headers = {k: v for k, v in self.headers.items() if k.lower() not in _HOP}
            conn = http.client.HTTPConnection(
                target.hostname or "127.0.0.1", target.port, timeout=30
            )
            try:
                conn.request(self.command, self.path, body=body, headers=headers)
                resp = conn.getresponse()
                data = resp.read()
            except OSError:
                self.send_error(502, "upstream unreachable")
                return
            finally:
                conn.close()
            self.send_response(resp.status)
            for k, v in resp.getheaders():
                if k.lower() not in _HOP:
                    self.send_header(k, v)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        do_GET = do_POST = do_PUT = do_DELETE = do_HEAD = _forward

    return Handler


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m lance_cdf_devtools.authproxy")
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--upstream", required=True, help="http://127.0.0.1:PORT")
    ap.add_argument("--cert", required=True, help="PEM chain")
    ap.add_argument("--key", required=True, help="PEM private key")
    ap.add_argument("--users", required=True, help="file of user:password lines")
    args = ap.parse_args(argv)
    with open(args.users, "rb") as f:
        users = {line.strip() for line in f if line.strip()}
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(args.cert, args.key)
    server = ThreadingHTTPServer(("127.0.0.1", args.port), _handler(args.upstream, users))
    server.daemon_threads = True
    server.socket = ctx.wrap_socket(server.socket, server_side=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
