"""The testbed's live view (tier g5): `mixdiag analyze <url>/metrics` run beside the load, over a real
socket, serving the real vLLM 0.32 scrapes of tests/fixtures/vllm032 one per request."""
from __future__ import annotations

import json
import socket
from pathlib import Path

import pytest

from helpers.metrics_http import serve_metrics
from mixdiag.vllm_testbed import live_view
from mixdiag.vllm_testbed.process_guard import ProcessGuard

SCRAPES = sorted((Path(__file__).resolve().parents[1] / "fixtures" / "vllm032" / "scrapes").glob("*.prom"))


@pytest.fixture
def replay_server():
    """/metrics answers with the next real scrape each time (the last one once they run out)."""
    bodies = [p.read_bytes() for p in SCRAPES]
    with serve_metrics(lambda n: bodies[min(n, len(bodies)) - 1]) as (url, state):
        yield url, state


def test_argv_polls_the_metrics_path_for_the_run():
    argv = live_view.argv("http://127.0.0.1:8000/", 45.0, 0.5)
    assert argv[3:] == ["analyze", "http://127.0.0.1:8000/metrics", "--duration", "45", "--interval", "0.5", "--json"]


def test_live_view_writes_the_analyzers_json(replay_server, tmp_path):
    url, state = replay_server
    guard = ProcessGuard()
    try:
        view = live_view.start(guard, url, duration_s=3.0, interval_s=1.0, run_dir=tmp_path)
        assert view.finish(guard, timeout_s=300.0) is None, view.err.read_text()
    finally:
        guard.stop_all()
    doc = json.loads((tmp_path / live_view.LIVE_JSON).read_text())
    assert state["n"] >= 2                      # it polled, not one dump
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
