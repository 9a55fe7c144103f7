"""Aborted streams leave nothing behind: /metrics' state gauges agree with /health once they are gone."""
from __future__ import annotations

from types import SimpleNamespace

import httpx
import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from mixdiag import wire
from helpers.polling import wait_until as _wait

MODEL = "mixdiag-tiny"


def _gauges(text: str, names) -> dict[str, float]:
    return {s.name: s.value for fam in text_string_to_metric_families(text) for s in fam.samples if s.name in names}



def test_gauges_return_to_zero_after_aborted_streams(server):
    names = (wire.REQUESTS_RUNNING, wire.REQUESTS_WAITING, wire.KV_USAGE_RATIO)
    total = server.health()["kv_total_blocks"]
    body = {"model": MODEL, "prompt": [4] * 60, "max_tokens": 400, "temperature": 0, "stream": True,
            "ignore_eos": True}
    with httpx.Client(timeout=30) as c:
        streams = [c.stream("POST", server.url + "/v1/completions", json=body) for _ in range(3)]
        lines = []
        for s in streams:
            lines.append(s.__enter__().iter_lines())
            next(lines[-1])
        mid = _gauges(httpx.get(server.url + "/metrics", timeout=5).text, names)
        assert mid[wire.REQUESTS_RUNNING] >= 1 and mid[wire.KV_USAGE_RATIO] > 0   # the gauges do move
        for s in streams:   # the clients go away mid-stream
            s.__exit__(None, None, None)
    assert _wait(lambda: (h := server.health())["in_flight"] == 0 and h["kv_free_blocks"] == total)
    # the engine went idle by aborts, not by a step: the gauges must follow all the same
    assert _wait(lambda: _gauges(httpx.get(server.url + "/metrics", timeout=5).text, names)
                 == {n: 0.0 for n in names}), _gauges(httpx.get(server.url + "/metrics", timeout=5).text, names)


@pytest.mark.parametrize("dialect, names", [
    ("vllm", ("vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc")),
    ("sglang", ("sglang:num_running_reqs", "sglang:num_queue_reqs", "sglang:token_usage")),
])
def test_refresh_gauges_covers_every_dialect(dialect, names):
    from mixdiag.engine.serving.launch import refresh_gauges
    from mixdiag.engine.telemetry.dialects import make_dialect_metrics

    m = make_dialect_metrics(dialect)
    engine = SimpleNamespace(scheduler=SimpleNamespace(num_running=2, num_waiting=1),
                             kv_manager=SimpleNamespace(usage=0.25))
    refresh_gauges(m, engine)
    assert _labelled(m.registry, names) == dict(zip(names, (2.0, 1.0, 0.25)))
    engine.scheduler.num_running = engine.scheduler.num_waiting = 0
    engine.kv_manager.usage = 0.0
    refresh_gauges(m, engine)
    assert set(_labelled(m.registry, names).values()) == {0.0}


def _labelled(registry, names) -> dict[str, float]:
    return _gauges(generate_latest(registry).decode(), names)


def test_refresh_gauges_refuses_an_object_without_them():
    from mixdiag.engine.serving.launch import refresh_gauges

    with pytest.raises(TypeError, match="no running"):
        refresh_gauges(SimpleNamespace(running=None), SimpleNamespace())
