"""prom_http against a real Prometheus server scraping real prometheus_client registries."""
import json
import time
import urllib.parse

import pytest
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from mixdiag.cli import main
from mixdiag.collectors.prometheus import prom_http, server_reader
from mixdiag.errors import UserError


def _registry():
    reg = CollectorRegistry()
    m = {
        "steps": Counter("mixdiag_engine_steps", "steps by kind", ["kind"], registry=reg),
        "tok": Counter("mixdiag_engine_scheduled_tokens", "tokens by segment", ["segment"], registry=reg),
        "gen": Counter("mixdiag_engine_generation_tokens", "output tokens", registry=reg),
        "itl": Histogram("mixdiag_engine_inter_token_latency_seconds", "itl", buckets=(0.01, 0.05, 0.1, 1.0),
                         registry=reg),
        "run": Gauge("mixdiag_engine_requests_running", "running", registry=reg),
    }
    for k in ("prefill", "decode", "mixed", "idle"):
        m["steps"].labels(k)
    for s in ("prefill", "decode"):
        m["tok"].labels(s)
    return reg, m


@pytest.mark.prometheus
def test_query_range_reads_back_counts_of_two_targets(prometheus_server, metrics_endpoint, capsys):
    (reg_a, a), (reg_b, b) = _registry(), _registry()
    ta, tb = metrics_endpoint(reg_a), metrics_endpoint(reg_b)
    prom = prometheus_server([ta, tb], scrape_interval_s=0.5)
    prom.wait_for_samples("up", min_samples=2)
    t0 = time.time() - 1.0  # the window opens while every counter is still 0
    # Drive real counters in three bursts, a scrape or two apart.
    for burst in range(3):
        a["steps"].labels("decode").inc(5)
        a["tok"].labels("decode").inc(40)
        a["gen"].inc(40)
        for _ in range(7):
            a["itl"].observe(0.03)
        if burst == 1:
            a["steps"].labels("mixed").inc(2)
            a["tok"].labels("prefill").inc(256)
        b["steps"].labels("prefill").inc(1)
        b["tok"].labels("prefill").inc(128)
        a["run"].set(8 + burst)
        time.sleep(1.1)
    prom.wait_until("mixdiag_engine_generation_tokens_total", lambda r: len(r) == 2 and
                    {x["metric"]["instance"]: float(x["value"][1]) for x in r} == {ta: 120.0, tb: 0.0})
    time.sleep(1.0)
    tl = server_reader.read(prom.url, selector='{job="mixdiag"}', start=t0, end=time.time(), step_s=0.5)
    assert tl.meta["targets"] == sorted([ta, tb]) and sorted(tl.steps["instance"].unique()) == sorted([ta, tb])
    sa = tl.steps[tl.steps["instance"] == ta]
    sb = tl.steps[tl.steps["instance"] == tb]
    assert sa["decode_steps"].sum() == 15 and sa["mixed_steps"].sum() == 2
    assert sa["output_tokens"].sum() == 120 and sa["decode_rows"].sum() == 120
    assert sa["prefill_tokens"].sum() == 256 and sa["itl_count"].sum() == 21
    assert (sa["kind"] == "mixed").sum() == 1
    assert sb["prefill_steps"].sum() == 3 and sb["prefill_tokens"].sum() == 384
    assert set(sb["kind"]) <= {"prefill", "idle"}
    assert sa["running_reqs"].iloc[-1] == 10.0
    src = tl.meta["sources"][0]
    assert src["format"] == "prom-http" and src["lines_parsed"] == src["lines_total"] > 0
    # the same read through the CLI: the window and selector ride in the URL's query
    q = urllib.parse.urlencode({"selector": f'{{instance="{ta}"}}', "start": f"{t0:.3f}", "end": f"{time.time():.3f}",
                                "step": "0.5"})
    assert main(["ingest", f"{prom.url}/?{q}", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["instances"] == [ta] and doc["steps_by_kind"].get("mixed") == 1


@pytest.mark.prometheus
def test_bad_query_and_unreachable_server_are_user_errors(prometheus_server):
    prom = prometheus_server([], scrape_interval_s=1.0)
    with pytest.raises(UserError, match="Prometheus at"):
        server_reader.read(prom.url, selector='{job=~"("}', start=0, end=10, step_s=1)
    tl = server_reader.read(prom.url, selector='{job="nothing"}', start=time.time() - 60, end=time.time(), step_s=5)
    assert len(tl.steps) == 0 and tl.meta["partial"] is True


@pytest.mark.parametrize("kwargs,msg", [
    ({"source": "localhost:9090"}, "needs a Prometheus URL"),
    ({"source": "http://127.0.0.1:9", "step_s": 0}, "step_s"),
    ({"source": "http://127.0.0.1:9", "start": 10, "end": 5}, "empty window"),
    ({"source": "http://127.0.0.1:9", "selector": "up{job='x'}"}, "label matchers only"),
    ({"source": "http://127.0.0.1:9", "start": 0, "end": 10}, "cannot reach"),
])
def test_argument_errors(kwargs, msg):
    with pytest.raises(UserError, match=msg):
        server_reader.read(**kwargs)


@pytest.mark.parametrize("url,base,params", [
    ("http://h:9090", "http://h:9090", {}),
    ('http://h:9090/prom/?selector={job="v"}&window=600&step=5', "http://h:9090/prom",
     {"selector": '{job="v"}', "window": 600.0, "step": 5.0}),
    ("https://h/?start=2025-11-30T05:00:00Z&end=1764480000", "https://h",
     {"start": 1764478800.0, "end": 1764480000.0}),
])
def test_split_url(url, base, params):
    assert prom_http.split_url(url) == (base, params)


@pytest.mark.parametrize("url,msg", [("http://h/?window=10m", "expected seconds"), ("http://h/?stepp=5", "unknown URL")])
def test_split_url_errors(url, msg):
    with pytest.raises(UserError, match=msg):
        prom_http.split_url(url)


def test_queries_cover_prefixes_and_itl_buckets():
    q = prom_http.queries('{job="vllm"}')
    assert q[0].startswith('{__name__=~"vllm:.*|') and 'job="vllm"' in q[0] and '!~".*_bucket"' in q[0]
    assert "vllm:inter_token_latency_seconds_bucket" in q[1] and "sglang_inter_token_latency_seconds_bucket" in q[1]


@pytest.mark.prometheus
def test_itl_quantiles_equal_promql_histogram_quantile(prometheus_server, metrics_endpoint):
    reg = CollectorRegistry()
    h = Histogram("mixdiag_engine_inter_token_latency_seconds", "itl", buckets=(0.01, 0.025, 0.05, 0.1, 0.5, 1.0),
                  registry=reg)
    target = metrics_endpoint(reg)
    prom = prometheus_server([target], scrape_interval_s=0.5)
    prom.wait_for_samples("up", min_samples=4)
    t0 = time.time()
    for v, n in ((0.004, 3), (0.02, 40), (0.04, 25), (0.07, 9), (0.3, 4), (2.0, 1)):
        for _ in range(n):
            h.observe(v)
    prom.wait_until("mixdiag_engine_inter_token_latency_seconds_count", lambda r: r and r[0]["value"][1] == "82")
    time.sleep(1.0)
    t1 = time.time()
    start = round(t0 - 0.5, 3)  # scrapes of the empty histogram exist before t0
    step = round(t1 - start, 3)
    tl = server_reader.read(prom.url, start=start, end=start + step, step_s=step)  # one interval: the burst
    row = tl.steps.iloc[0]
    assert row["itl_count"] == 82
    for col, q in (("itl_p50_s", 0.5), ("itl_p90_s", 0.9), ("itl_p99_s", 0.99)):
        ref = prom.query(f"histogram_quantile({q}, mixdiag_engine_inter_token_latency_seconds_bucket)", t=start + step)
        assert row[col] == pytest.approx(float(ref[0]["value"][1]), rel=1e-9), col
