"""prom_http's fleet path: Prometheus aggregates (PromQL per column) over a backfilled vLLM fleet."""
from __future__ import annotations

import importlib.util
import json
import math
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from helpers.prometheus_server import PrometheusServer
from mixdiag.collectors.prometheus import server_reader

ROOT = Path(__file__).resolve().parents[2]
N_INST, BURST_EVERY, MINUTES = 24, 4, 3


def _bench():
    spec = importlib.util.spec_from_file_location("bench_fleet", ROOT / "benchmarks" / "bench_fleet.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def fleet(tmp_path_factory):
    """A real Prometheus (127.0.0.1) holding N_INST vLLM instances x MINUTES at a 15 s step."""
    assert shutil.which("promtool"), "promtool missing: bash scripts/setup_system.sh"
    bench = _bench()
    work = tmp_path_factory.mktemp("fleet")
    points = MINUTES * 4 + 1
    t0 = (int(time.time()) - 3 * 3600) // 15 * 15
    bench.openmetrics(work / "fleet.om", N_INST, t0, points, BURST_EVERY)
    (work / "tsdb").mkdir()
    subprocess.run(["promtool", "tsdb", "create-blocks-from", "openmetrics", str(work / "fleet.om"),
                    str(work / "tsdb")], check=True, capture_output=True, timeout=120)
    with PrometheusServer([], work) as prom:
        yield prom.url, t0, t0 + (points - 1) * 15


@pytest.mark.prometheus
def test_aggregated_rows_match_raw_rows(fleet):
    url, start, end = fleet
    agg = server_reader.read(f"{url}/?start={start}&end={end}&step=15")
    assert any("aggregated in Prometheus" in n for n in agg.meta["notes"])  # auto: >= 20 targets
    raw = server_reader.read(f"{url}/?start={start}&end={end}&step=15&aggregate=no")
    assert len(agg.instances) == N_INST and sorted(agg.instances) == sorted(raw.instances)
    a = agg.steps.set_index(["instance", "t_end_s"]).sort_index()
    r = raw.steps.set_index(["instance", "t_end_s"]).sort_index()
    common = a.index.intersection(r.index)
    assert len(common) >= N_INST * (MINUTES * 4 - 1)
    for col, tol in [("output_tokens", 1e-3), ("prefill_tokens", 1e-3), ("running_reqs", 0),
                     ("itl_p50_s", 1e-3), ("itl_p99_s", 1e-3), ("itl_mean_s", 1e-3), ("large_step_share", 1e-3)]:
        x, y = a.loc[common, col].to_numpy(), r.loc[common, col].to_numpy()
        assert x == pytest.approx(y, rel=tol, nan_ok=True), col
    # the dialect rule (steps larger than the running batch -> mixed) reads the same on both paths
    assert (a.loc[common, "kind"] == r.loc[common, "kind"]).all() and set(a["kind"]) == {"mixed"}


@pytest.mark.prometheus
def test_burst_instances_show_prompt_spikes_and_itl_rises(fleet):
    url, start, end = fleet
    st = server_reader.read(f"{url}/?start={start}&end={end}&step=15&aggregate=yes").steps
    burst = st["instance"].str.extract(r"vllm-(\d+)")[0].astype(int) % BURST_EVERY == 0
    big = st["prefill_tokens"] > 10_000
    assert big[burst].sum() >= MINUTES and big[~burst].sum() == 0
    assert (st.loc[big, "itl_p50_s"] > 0.05).all() and (st.loc[~big, "itl_p50_s"] < 0.03).all()
    assert set(st["granularity"]) == {"interval"}


@pytest.mark.parametrize("value", ["maybe", "1"])
def test_bad_aggregate_parameter(value):
    from mixdiag.errors import UserError

    with pytest.raises(UserError, match="aggregate="):
        server_reader.read(f"http://127.0.0.1:1/?window=60&aggregate={value}")


@pytest.mark.prometheus
def test_itl_quantiles_are_prometheus_histogram_quantile_to_the_bit(fleet):
    """P50/P99 computed from the bucket increases equal what PromQL's histogram_quantile answers
    for the same sums (the query the fleet path replaced), value for value."""
    from mixdiag.collectors.prometheus import prom_aggregate as agg

    url, start, end = fleet
    st = server_reader.read(f"{url}/?start={start}&end={end}&step=15&aggregate=yes").steps
    for col, q in agg.ITL_QUANTILES:
        inner = "sum by (instance, engine, le) (increase(vllm:inter_token_latency_seconds_bucket[15001ms]))"
        got = agg.query_matrix(url, f"histogram_quantile({q}, {inner})", start + 15, end, 15, 30.0)
        want = {(m["instance"], float(t)): v for _, m, ts, vs in got for t, v in zip(ts, vs)}
        mine = {(i, t): v for i, t, v in zip(st["instance"], st["t_end_s"], st[col])}
        assert len(want) == len(mine) == N_INST * MINUTES * 4
        assert all(mine[k] == v or (math.isnan(mine[k]) and math.isnan(v)) for k, v in want.items()), col


@pytest.mark.prometheus
def test_fast_parse_equals_json_parse_of_a_fleet_answer(fleet):
    from mixdiag.collectors.prometheus import prom_aggregate as agg
    from mixdiag.collectors.prometheus.prom_http import post

    url, start, end = fleet
    raw = post(url, "/api/v1/query_range", {"query": "increase(vllm:iteration_tokens_total_bucket[15001ms])",
                                              "start": start + 15, "end": end, "step": 15}, 30.0)
    fast = agg.parse_matrix(raw)
    slow = json.loads(raw)["data"]["result"]
    assert fast is not None and len(fast) == len(slow) == N_INST * 14
    for (m, t, v), s in zip(fast, slow):
        assert m == s["metric"]
        assert t.tolist() == [float(x) for x, _ in s["values"]] and v.tolist() == [float(y) for _, y in s["values"]]
