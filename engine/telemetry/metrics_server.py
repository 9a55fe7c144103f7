"""Serve one engine's registry on ``http://127.0.0.1:PORT/metrics`` from a background thread.

prometheus_client's WSGI server in a daemon thread; :meth:`MetricsServer.stop` shuts it down
with the engine. ``port=0`` picks a free port (read it back from :attr:`MetricsServer.port`).
"""
from __future__ import annotations

from prometheus_client import CollectorRegistry, start_http_server

from mixdiag.errors import UserError


class MetricsServer:
    """``/metrics`` for ``registry`` on ``host:port`` until :meth:`stop` (also a context manager)."""

    def __init__(self, registry: CollectorRegistry, port: int, host: str = "127.0.0.1"):
        if not 0 <= int(port) <= 65535:
            raise UserError(f"--serve port must be in 0..65535, got {port}")
        try:
            self._server, self._thread = start_http_server(int(port), addr=host, registry=registry)
        except OSError as e:
            raise UserError(f"cannot serve /metrics on {host}:{port}: {e.strerror or e}") from None
        self.host = host
        self.port = int(self._server.server_port)

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}/metrics"

    def stop(self) -> None:
        """Stop serving and release the port (idempotent)."""
        if self._server is None:
            return
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)
        self._server = None

    def __enter__(self) -> "MetricsServer":
        return self

    def __exit__(self, *exc) -> None:
        self.stop()
