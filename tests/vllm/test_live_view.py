"""The testbed's live view (tier g5): `mixdiag analyze <url>/metrics` run beside the load, over a real
socket, serving the real vLLM 0.32 scrapes of tests/fixtures/vllm032 one per request."""
from __future__ import annotations

import http.server
import json
import socket
import threading
from pathlib import Path

import pytest

from mixdiag.vllm_testbed import live_view
from mixdiag.vllm_testbed.process_guard import ProcessGuard

SCRAPES = sorted((Path(__file__).resolve().parents[1] / "fixtures" / "vllm032" / "scrapes").glob("*.prom"))


@pytest.fixture
def replay_server():
    """/metrics answers with the next real scrape each time (the last one once they run out)."""
    bodies = [p.read_bytes() for p in SCRAPES]
    served = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 (http.server's name)
            if self.path != "/metrics":
                self.send_error(404)
                return
            body = bodies[min(len(served), len(bodies) - 1)]
            served.append(self.path)
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *a):
            pass

    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{srv.server_address[1]}", served
    finally:
        srv.shutdown()
        srv.server_close()


def test_argv_polls_the_metrics_path_for_the_run():
    argv = live_view.argv("http://127.0.0.1:8000/", 45.0, 0.5)
    assert argv[3:] == ["analyze", "http://127.0.0.1:8000/metrics", "--duration", "45", "--interval", "0.5", "--json"]


def test_live_view_writes_the_analyzers_json(replay_server, tmp_path):
    url, served = replay_server
    guard = ProcessGuard()
    try:
        view = live_view.start(guard, url, duration_s=3.0, interval_s=1.0, run_dir=tmp_path)
        assert view.finish(guard, timeout_s=300.0) is None, view.err.read_text()
    finally:
        guard.stop_all()
    doc = json.loads((tmp_path / live_view.LIVE_JSON).read_text())
    assert len(served) >= 2                      # it polled, not one dump
    assert doc["sources"] and doc["verdict"]
    for s in doc["spikes"]:                      # the window tier g5 scores
        assert s["t_start_s"] <= s["t_end_s"]


def test_a_failed_analyzer_is_reported_in_one_line(tmp_path):
    with socket.socket() as s:                   # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    guard = ProcessGuard()
    try:
        view = live_view.start(guard, f"http://127.0.0.1:{port}", duration_s=2.0, interval_s=1.0, run_dir=tmp_path)
        err = view.finish(guard, timeout_s=300.0)
    finally:
        guard.stop_all()
    assert err is not None and err.startswith("live analyze exited ") and "\n" not in err
