"""Acceptance (issue 6): a real Prometheus scrapes the reference engine; prom_http reads back the
same step and token counts, per kind, as the engine recorded."""
import math
import time

import pytest

from helpers.prometheus_server import free_port
from mixdiag.collectors.prometheus import server_reader
from mixdiag.engine.config import EngineConfig
from mixdiag.engine.core.engine import Engine
from mixdiag.engine.telemetry.instrumentation import Instrumentation, InstrumentationConfig
from mixdiag.engine.core.request import SamplingParams

pytestmark = pytest.mark.prometheus
SCRAPE_S = 0.25


def test_prom_http_reads_back_the_engines_counts(prometheus_server, tmp_path):
    # Prometheus first, scraping a port where no engine listens yet (up == 0): the engine then
    # starts and steps at once, before any scrape of it; prom_http still counts every step,
    # because counters that appear after a down scrape started from zero.
    port = free_port()
    target = f"127.0.0.1:{port}"
    prom = prometheus_server([target], scrape_interval_s=SCRAPE_S)
    prom.wait_until(f'up{{instance="{target}"}}', lambda r: r and r[0]["value"][1] == "0")
    t0 = time.time() - SCRAPE_S
    time.sleep(3 * SCRAPE_S)  # several down scrapes inside the window, however fast the engine then starts

    eng = Engine(EngineConfig(num_threads=1))
    for i in range(6):
        eng.add_request(list(range(2, 40 + 24 * i)), SamplingParams(max_tokens=60))
    inst = Instrumentation(InstrumentationConfig(serve_port=port), eng, tmp_path)
    records = []
    while eng.has_unfinished():
        records.append(eng.step())
        time.sleep(0.002)  # let scrapes land mid-run on two shared cores
    expected = {k: float(sum(r.kind == k for r in records)) for k in ("prefill", "decode", "mixed", "idle")}
    prom.wait_until("sum(mixdiag_engine_steps_total)", lambda r: r and float(r[0]["value"][1]) == len(records))
    time.sleep(3 * SCRAPE_S)
    try:
        tl = server_reader.read(prom.url, selector=f'{{instance="{target}"}}', start=t0, end=time.time(),
                            step_s=SCRAPE_S, instance="engine0")
    finally:
        inst.close()

    s = tl.steps
    assert tl.instances == ["engine0"] and (s["granularity"] == "interval").all()
    got = {k: float(s[f"{k}_steps"].sum()) for k in expected}
    assert got == expected
    assert expected["decode"] > 0 and expected["prefill"] + expected["mixed"] > 0
    assert s["prefill_tokens"].sum() == sum(r.prefill_tokens for r in records)
    assert s["decode_rows"].sum() == sum(r.decode_rows for r in records)
    assert s["output_tokens"].sum() == sum(r.output_tokens for r in records)
    events = sum(len(r.token_events) for r in records)
    assert s["itl_count"].sum() == events - 6  # each request's first output is TTFT, not ITL
    # an interval holding a mixed step says so; intervals with steps have ITL quantiles
    assert (s["kind"] == "mixed").sum() == (s["mixed_steps"] > 0).sum()
    busy = s[s["itl_count"] > 0]
    assert len(busy) > 1 and busy["itl_p50_s"].map(math.isfinite).all()
    assert tl.meta["metric_sources"]["engine0"]["kind"] == "mixdiag_engine_steps_total"
    assert any("target was down" in n for n in tl.meta["notes"])  # the scrapes before the engine
    up = tl.series[tl.series["name"] == "up"]["value"]
    assert up.iloc[0] == 0 and up.iloc[-1] == 1
