"""An engine's /metrics URL: detection, sampling over a real socket, and the one-dump summary."""
from __future__ import annotations

import time

import pytest

from helpers.metrics_http import serve_metrics
from mixdiag.collectors import load, registry
from mixdiag.collectors.prometheus import endpoint, prom_http, scrape_reader
from mixdiag.errors import UserError
from mixdiag.report_since_start import summary_lines

ITL_LE = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3)


def vllm_exposition(n: int, start_s: float = 1_000.0) -> str:
    """vLLM-named counters after ``n`` scrapes' worth of work: 100 outputs per tick at ~20 ms,
    every 3rd tick a 4096-token prompt burst with outputs at ~60 ms."""
    prompt = gen = 0.0
    buckets = [0.0] * len(ITL_LE)
    itl_sum = 0.0
    for k in range(n):
        slow = k % 3 == 2
        prompt += 4096.0 if slow else 16.0
        gen += 100.0
        itl = 0.06 if slow else 0.02
        itl_sum += 100 * itl
        for i, le in enumerate(ITL_LE):
            if itl <= le:
                buckets[i] += 100
    lines = ["# TYPE vllm:prompt_tokens_total counter",
             f'vllm:prompt_tokens_total{{engine="0",model_name="m"}} {prompt}',
             "# TYPE vllm:generation_tokens_total counter",
             f'vllm:generation_tokens_total{{engine="0",model_name="m"}} {gen}',
             "# TYPE vllm:num_preemptions_total counter",
             f'vllm:num_preemptions_total{{engine="0",model_name="m"}} {n // 4}',
             "# TYPE vllm:num_requests_running gauge",
             f'vllm:num_requests_running{{engine="0",model_name="m"}} 32.0',
             "# TYPE vllm:inter_token_latency_seconds histogram"]
    for le, b in zip(ITL_LE, buckets):
        lines.append(f'vllm:inter_token_latency_seconds_bucket{{engine="0",le="{le}",model_name="m"}} {b}')
    lines += [f'vllm:inter_token_latency_seconds_bucket{{engine="0",le="+Inf",model_name="m"}} {100.0 * n}',
              f'vllm:inter_token_latency_seconds_count{{engine="0",model_name="m"}} {100.0 * n}',
              f'vllm:inter_token_latency_seconds_sum{{engine="0",model_name="m"}} {itl_sum}',
              "# TYPE process_start_time_seconds gauge", f"process_start_time_seconds {start_s}"]
    return "\n".join(lines) + "\n"


@pytest.fixture
def metrics_server():
    """A /metrics endpoint whose counters advance on every GET; stops by itself at teardown."""
    with serve_metrics(lambda n: vllm_exposition(n, start_s=time.time() - 100).encode()) as (url, state):
        yield url, state


def test_detects_endpoint_not_prometheus(metrics_server):
    base, _ = metrics_server
    assert registry.detect(base + "/metrics") == "prom-endpoint"
    with pytest.raises(UserError, match="neither a Prometheus server"):
        prom_http.url_kind(base + "/other")


def test_samples_endpoint_into_interval_rows(metrics_server):
    base, state = metrics_server
    tl = load(base + "/metrics", duration_s=3, interval_s=0.5, progress=False)
    # bounded by --duration / --interval (7 scrapes), not by the server
    assert state["n"] == 7 and tl.meta["endpoint"]["scrapes"] == 7
    st = tl.steps
    assert len(st) == 6 and set(st["granularity"]) == {"interval"}
    assert list(st["output_tokens"]) == [100.0] * 6
    # the burst ticks (every 3rd scrape) carry 4096 prompt tokens and the slower ITL
    burst = st["prefill_tokens"] == 4096.0
    assert burst.sum() == 2
    assert (st.loc[burst, "itl_p50_s"] > 0.05).all() and (st.loc[~burst, "itl_p50_s"] < 0.025).all()
    assert tl.meta["partial"] is False and tl.meta["clock"] == "unix"


def test_interrupt_keeps_what_was_collected(monkeypatch):
    calls = {"n": 0}

    def fetch(url):
        calls["n"] += 1
        if calls["n"] == 4:
            raise KeyboardInterrupt
        return vllm_exposition(calls["n"])

    pairs, interrupted = endpoint.sample("http://x/metrics", 10, 0.01, progress=False, fetch=fetch)
    assert interrupted and len(pairs) == 3


def test_single_dump_summary_since_start(metrics_server):
    base, _ = metrics_server
    tl = load(base + "/metrics", duration_s=0, progress=False)
    (row,) = tl.steps.to_dict("records")
    assert row["output_tokens"] == 100.0 and row["prefill_tokens"] == 16.0 and row["preempted_reqs"] == 0.0
    info = tl.meta["since_start"]
    assert info["start_known"] and 99 < info["t_end_s"] - info["t_start_s"] < 105
    text = "\n".join(summary_lines(tl))
    assert "ITL P50 0.0" in text and "P99" in text and "generation tokens 100" in text


def test_single_dump_file_since_start(tmp_path):
    p = tmp_path / "dump.prom"
    p.write_text(vllm_exposition(12))
    tl = scrape_reader.read(p)
    (row,) = tl.steps.to_dict("records")
    # 12 ticks: 4 bursts at 60 ms among 1200 outputs -> P50 in the 20 ms bucket, P99 in the 60 ms one
    assert row["output_tokens"] == 1200.0 and row["prefill_tokens"] == 4 * 4096 + 8 * 16
    assert 0.01 < row["itl_p50_s"] <= 0.025 and 0.05 < row["itl_p99_s"] <= 0.075
    assert row["preempted_reqs"] == 3.0
    assert not tl.meta["since_start"]["start_known"]  # a file has no scrape time: relative clock
    assert any("one scrape" in n for n in tl.meta["notes"])


@pytest.mark.parametrize("opts,msg", [({"duration_s": -1}, "--duration"), ({"interval_s": 0}, "--interval")])
def test_bad_options_are_one_line_errors(opts, msg):
    with pytest.raises(UserError, match=msg):
        endpoint.read("http://127.0.0.1:1/metrics", progress=False, **opts)


def _cli_json(argv):
    import io
    import json
    from contextlib import redirect_stdout

    from mixdiag.cli import main as cli_main

    out = io.StringIO()
    with redirect_stdout(out):
        rc = cli_main(argv + ["--json"])
    return rc, json.loads(out.getvalue())


def test_analyze_cli_samples_a_metrics_url(metrics_server):
    base, _ = metrics_server
    rc, doc = _cli_json(["analyze", base + "/metrics", "--duration", "3", "--interval", "0.5"])
    assert rc == 0 and "since_start" not in doc
    # the two burst intervals (ITL 60 ms against 20 ms) are the spikes
    assert len(doc["spikes"]) == 2


def test_analyze_cli_one_dump_prints_since_start(metrics_server):
    base, _ = metrics_server
    rc, doc = _cli_json(["analyze", base + "/metrics", "--duration", "0"])
    (row,) = doc["since_start"]["instances"].values()
    assert rc == 0 and row["output_tokens"] == 100.0 and 0.01 < row["itl_p50_s"] <= 0.025


def test_watch_follows_a_vllm_metrics_url(metrics_server):
    base, state = metrics_server
    rc, doc = _cli_json(["watch", "--engine", base + "/metrics", "--interval", "0.5", "--window", "30",
                         "--count", "7", "--no-serve"])
    assert rc == 0 and doc["polls"] == 7 and doc["diagnoses"] == 6 and state["n"] == 7
    assert sum(doc["spikes_total"].values()) >= 1  # the burst intervals are published as spikes
