"""A real Prometheus server scrapes the engine's /metrics during a run; its API returns the engine's step counts."""
import time

import pytest

from mixdiag.engine.config import EngineConfig
from mixdiag.engine.core.engine import Engine
from mixdiag.engine.telemetry.instrumentation import Instrumentation, InstrumentationConfig
from mixdiag.engine.core.request import SamplingParams

pytestmark = pytest.mark.prometheus


def step_counts(prom):
    return {r["metric"]["kind"]: float(r["value"][1]) for r in prom.query("mixdiag_engine_steps_total")}


def test_prometheus_reads_the_step_counters(prometheus_server, tmp_path):
    eng = Engine(EngineConfig(num_threads=1))  # 1 thread: steady on shared cores
    for i in range(8):
        eng.add_request(list(range(2, 40 + 24 * i)), SamplingParams(max_tokens=150))
    inst = Instrumentation(InstrumentationConfig(serve_port=0), eng, tmp_path)
    prom = prometheus_server([f"127.0.0.1:{inst.server.port}"], scrape_interval_s=0.25)
    prom.wait_for_samples("up", min_samples=1)

    records, seen_mid_run, last_check = [], False, 0.0
    while eng.has_unfinished():
        records.append(eng.step())
        if not seen_mid_run and time.monotonic() - last_check > 0.2:
            last_check = time.monotonic()
            seen_mid_run = sum(step_counts(prom).values()) > 0
    assert seen_mid_run, "no scrape landed while the engine was running"

    expected = {k: float(sum(r.kind == k for r in records)) for k in ("prefill", "decode", "mixed", "idle")}
    got = prom.wait_until("mixdiag_engine_steps_total",
                          lambda res: {r["metric"]["kind"]: float(r["value"][1]) for r in res} == expected)
    assert {r["metric"]["kind"] for r in got} == set(expected)
    assert expected["decode"] > 0 and expected["prefill"] + expected["mixed"] > 0
    tokens = prom.query('mixdiag_engine_scheduled_tokens_total{segment="decode"}')
    assert float(tokens[0]["value"][1]) == sum(r.decode_rows for r in records)
    itl = prom.query("mixdiag_engine_inter_token_latency_seconds_count")
    assert float(itl[0]["value"][1]) == sum(len(r.token_events) for r in records) - 8  # first tokens are TTFT
    assert float(prom.query("mixdiag_engine_time_to_first_token_seconds_count")[0]["value"][1]) == 8
    summary = inst.close()
    assert summary["metrics_url"].startswith("http://127.0.0.1:")
    assert (tmp_path / "metrics.prom").exists()
