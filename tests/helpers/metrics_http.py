"""A /metrics endpoint on loopback for tests: each GET answers ``body(n)`` for the n-th request
(1-based), other paths 404; it stops when the context ends."""
from __future__ import annotations

import contextlib
import http.server
import threading
from typing import Callable, Iterator


@contextlib.contextmanager
def serve_metrics(body: Callable[[int], bytes]) -> Iterator[tuple[str, dict]]:
    """Yields (base URL, state) where ``state["n"]`` counts the /metrics requests answered so far."""
    state = {"n": 0}

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 (http.server's name)
            if self.path != "/metrics":
                self.send_error(404)
                return
            state["n"] += 1
            data = body(state["n"])
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *a):
            pass

    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    th = threading.Thread(target=srv.serve_forever, kwargs={"poll_interval": 0.1}, daemon=True)
    th.start()
    try:
        yield f"http://127.0.0.1:{srv.server_address[1]}", state
    finally:
        srv.shutdown()
        srv.server_close()
        th.join(timeout=5)
