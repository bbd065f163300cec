"""A fault injector for the Prometheus HTTP API: a proxy on loopback in front of the bed's real
Prometheus that, on demand, answers with broken replies instead.

    with FaultyPrometheus(upstream_url) as faulty:   # faulty.url goes where a Prometheus URL goes
        faulty.mode = "no-data"                      # every reply: HTTP 200 {"status": "success"}
        ...
        faulty.mode = "proxy"                        # the real Prometheus again

Modes (`MODES`): what a misbehaving Prometheus, a proxy in front of it, or a half-deployed
replacement does answer in practice. `slow` forwards each request after `delay_s`.
"""

from __future__ import annotations

import threading
import time
import urllib.error
import urllib.request
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import TracebackType

# mode -> (HTTP status, content type, body); "proxy" and "slow" forward to the real Prometheus.
BROKEN_REPLIES: dict[str, tuple[int, str, bytes]] = {
    "no-data": (200, "application/json", b'{"status":"success"}'),
    "not-json": (200, "text/html", b"<html><body>502 Bad Gateway</body></html>"),
    "result-not-a-list": (200, "application/json",
                          b'{"status":"success","data":{"resultType":"vector","result":"oops"}}'),
    "sample-without-value": (200, "application/json",
                             b'{"status":"success","data":{"resultType":"vector","result":[{"metric":{}}]}}'),
    "server-error": (500, "text/plain", b"internal server error"),
}
MODES = ("proxy", "slow", *BROKEN_REPLIES)


class FaultyPrometheus:
    """A loopback HTTP server forwarding to `upstream_url` (mode "proxy") or answering `BROKEN_REPLIES`."""

    def __init__(self, upstream_url: str, delay_s: float = 5.0) -> None:
        self.upstream_url = upstream_url.rstrip("/")
        self.mode = "proxy"
        self.delay_s = delay_s
        self.requests: Counter[str] = Counter()  # by the mode that answered
        faulty = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                faulty._answer(self)

            def do_POST(self) -> None:
                faulty._answer(self)

            def log_message(self, format: str, *args: object) -> None:
                pass  # quiet: the test reads `requests`

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        self._thread = threading.Thread(target=self._server.serve_forever, name="faulty-prometheus", daemon=True)

    def __enter__(self) -> FaultyPrometheus:
        self._thread.start()
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self._server.shutdown()
        self._server.server_close()

    def _answer(self, handler: BaseHTTPRequestHandler) -> None:
        mode = self.mode
        self.requests[mode] += 1
        if mode in BROKEN_REPLIES:
            status, content_type, body = BROKEN_REPLIES[mode]
        else:
            if mode == "slow":
                time.sleep(self.delay_s)
            status, content_type, body = self._forward(handler)
        handler.send_response(status)
        handler.send_header("Content-Type", content_type)
        handler.send_header("Content-Length", str(len(body)))
        handler.end_headers()
        handler.wfile.write(body)

    def _forward(self, handler: BaseHTTPRequestHandler) -> tuple[int, str, bytes]:
        length = int(handler.headers.get("Content-Length") or 0)
        data = handler.rfile.read(length) if length else None
        request = urllib.request.Request(self.upstream_url + handler.path, data=data, method=handler.command)
        if handler.headers.get("Content-Type"):
            request.add_header("Content-Type", handler.headers["Content-Type"])
        try:
            with urllib.request.urlopen(request, timeout=30) as resp:
                return resp.status, resp.headers.get("Content-Type", "application/json"), resp.read()
        except urllib.error.HTTPError as exc:
            return exc.code, exc.headers.get("Content-Type", "text/plain"), exc.read()
        except OSError as exc:  # the real Prometheus is down: what a reverse proxy answers then
            return 502, "text/plain", f"upstream unreachable: {exc}".encode()
