"""A counting HTTP proxy in front of an S3 server: ``python bench/_s3_proxy.py LISTEN_PORT TARGET_PORT [LATENCY_MS]``.

Every request is forwarded unchanged and counted by method, table (the lake
folder its key names) and kind (log, data, LIST). With ``LATENCY_MS`` each
request waits that long before it is forwarded (requests in flight wait side by
side), as a round trip to a remote object store would: moto on 127.0.0.1 answers
in about a millisecond, S3 in tens of them. ``GET /__counts`` answers the
counts so far as JSON; nothing else of the proxy's own is exposed. Its own
process, so the engine's driver (whose delta-rs calls may hold the GIL while
they wait) never waits on it.
"""

from __future__ import annotations

import collections
import http.client
import http.server
import json
import socketserver
import sys
import threading
import time
import urllib.parse

COUNTS: collections.Counter[str] = collections.Counter()
LOCK = threading.Lock()


def kind(method: str, path: str) -> str:
    """``"GET retry log LIST"``: the method, the lake folder, log or data, and LIST for a listing."""
    full = urllib.parse.unquote(path)
    key = full.split("?", 1)[0] + ("?" + full.split("?", 1)[1] if "?" in full else "")
    table = "?"
    if "/lake/" in key:
        table = key.split("/lake/", 1)[1].split("/", 1)[0] or "?"
    elif "prefix=lake/" in key:
        table = key.split("prefix=lake/", 1)[1].split("/", 1)[0].split("&", 1)[0] or "?"
    where = "log" if "_delta_log" in key else "data"
    return f"{method} {table} {where}{' LIST' if 'list-type' in key else ''}"


def handler(target_port: int, latency_s: float = 0.0) -> type[http.server.BaseHTTPRequestHandler]:
    class Forward(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        # The headers and the body go out in two writes: with Nagle's algorithm the body then waits
        # for the client's delayed ACK (~40 ms a response), which the engine's requests would pay.
        disable_nagle_algorithm = True

        def log_message(self, *args: object) -> None:
            pass

        def _forward(self) -> None:
            if self.path == "/__counts":
                with LOCK:
                    body = json.dumps(dict(COUNTS)).encode()
                self.send_response(200)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)
                return
            n = int(self.headers.get("Content-Length") or 0)
            payload = self.rfile.read(n) if n else None
            with LOCK:
                COUNTS[kind(self.command, self.path)] += 1
            if latency_s:
                time.sleep(latency_s)
            upstream = http.client.HTTPConnection("127.0.0.1", target_port, timeout=120)
            headers = {k: v for k, v in self.headers.items() if k.lower() != "connection"}
            upstream.request(self.command, self.path, body=payload, headers=headers)
            answer = upstream.getresponse()
            data = answer.read()
            self.send_response(answer.status)
            for k, v in answer.getheaders():
                if k.lower() not in ("transfer-encoding", "connection", "content-length"):
                    self.send_header(k, v)
            length = answer.getheader("Content-Length", "0") if self.command == "HEAD" else str(len(data))
            self.send_header("Content-Length", length)
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(data)
            upstream.close()

        do_GET = do_PUT = do_POST = do_DELETE = do_HEAD = _forward

    return Forward


class _Server(socketserver.ThreadingMixIn, http.server.HTTPServer):
    daemon_threads = True

    def handle_error(self, request: object, client_address: object) -> None:
        # A client that hung up (an engine stopping mid-request) is not news.
        if not isinstance(sys.exc_info()[1], ConnectionError):
            super().handle_error(request, client_address)  # type: ignore[arg-type]


if __name__ == "__main__":
    listen, target = int(sys.argv[1]), int(sys.argv[2])
    latency_ms = float(sys.argv[3]) if len(sys.argv) > 3 else 0.0
    _Server(("127.0.0.1", listen), handler(target, latency_ms / 1000)).serve_forever()
