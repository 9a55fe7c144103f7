"""``mixdiag run --metrics-dialect vllm|sglang``: /metrics and scrapes hold exactly that engine's series.

Names, labels and buckets are checked against reference/formats.md §1.1 / §2.3 (written out here);
the unit tests feed hand-made step records to check the traps each engine really has.
"""
import math
from types import SimpleNamespace as NS

import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from mixdiag.cli import main
from mixdiag.engine.telemetry.dialects import VLLM_ITERATION_TOKENS, VLLM_ITL_S, VllmMetrics
from mixdiag.engine.telemetry.sglang_dialect import SGLANG_ITL_S, SglangMetrics

# formats.md §1.1 (vLLM V1) and §2.3 (SGLang): family -> (type, labels every sample carries)
VLLM = {
    "vllm:num_requests_running": ("gauge", {"model_name", "engine"}),
    "vllm:num_requests_waiting": ("gauge", {"model_name", "engine"}),
    "vllm:kv_cache_usage_perc": ("gauge", {"model_name", "engine"}),
    "vllm:prefix_cache_queries": ("counter", {"model_name", "engine"}),
    "vllm:prefix_cache_hits": ("counter", {"model_name", "engine"}),
    "vllm:num_preemptions": ("counter", {"model_name", "engine"}),
    "vllm:prompt_tokens": ("counter", {"model_name", "engine"}),
    "vllm:generation_tokens": ("counter", {"model_name", "engine"}),
    "vllm:spec_decode_num_drafts": ("counter", {"model_name", "engine"}),
    "vllm:spec_decode_num_draft_tokens": ("counter", {"model_name", "engine"}),
    "vllm:spec_decode_num_accepted_tokens": ("counter", {"model_name", "engine"}),
    "vllm:iteration_tokens_total": ("histogram", {"model_name", "engine"}),
    "vllm:time_to_first_token_seconds": ("histogram", {"model_name", "engine"}),
    "vllm:inter_token_latency_seconds": ("histogram", {"model_name", "engine"}),
    "vllm:nixl_xfer_time_seconds": ("histogram", {"model_name", "engine"}),
    "vllm:nixl_bytes_transferred": ("histogram", {"model_name", "engine"}),
    "vllm:request_success": ("counter", {"model_name", "engine", "finished_reason"}),
    **{f"vllm:{n}": ("histogram", {"model_name", "engine"}) for n in (
        "e2e_request_latency_seconds", "request_queue_time_seconds", "request_inference_time_seconds",
        "request_prefill_time_seconds", "request_decode_time_seconds", "request_time_per_output_token_seconds",
        "request_prompt_tokens", "request_generation_tokens", "request_max_num_generation_tokens",
        "request_params_max_tokens", "request_params_n")},
}
# formats.md §1.1 bucket lists (written out, not imported from the code under test)
_REQ_LATENCY = [0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0,
                480.0, 960.0, 1920.0, 7680.0]
VLLM_BUCKETS = {
    **{f"vllm:{n}": _REQ_LATENCY for n in ("e2e_request_latency_seconds", "request_queue_time_seconds",
                                           "request_inference_time_seconds", "request_prefill_time_seconds",
                                           "request_decode_time_seconds")},
    "vllm:request_params_n": [1, 2, 5, 10, 20],
    "vllm:iteration_tokens_total": [1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384],
}
VLLM_FINISH_LABELS = {"stop", "length", "abort"}
SCHED = {"model_name", "engine_type", "tp_rank", "pp_rank", "moe_ep_rank", "dp_rank"}
SGLANG = {
    "sglang:num_running_reqs": ("gauge", SCHED), "sglang:num_queue_reqs": ("gauge", SCHED),
    "sglang:token_usage": ("gauge", SCHED), "sglang:gen_throughput": ("gauge", SCHED),
    "sglang:cache_hit_rate": ("gauge", SCHED),
    "sglang:prompt_tokens": ("counter", {"model_name"}), "sglang:generation_tokens": ("counter", {"model_name"}),
    "sglang:realtime_tokens": ("counter", SCHED | {"mode"}),
    "sglang:cuda_graph_passes": ("counter", SCHED | {"mode"}),
    "sglang:num_retracted_requests": ("counter", SCHED),
    "sglang:inter_token_latency_seconds": ("histogram", {"model_name"}),
    "sglang:time_to_first_token_seconds": ("histogram", {"model_name"}),
    "sglang:eplb_balancedness": ("summary", SCHED | {"forward_mode"}),
    "sglang:kv_transfer_latency_ms": ("histogram", SCHED), "sglang:kv_transfer_total_mb": ("histogram", SCHED),
}
MODES = {"sglang:realtime_tokens": {"prefill_compute", "prefill_cache", "decode"},
         "sglang:cuda_graph_passes": {"decode_cuda_graph", "decode_none", "prefill_cuda_graph", "prefill_none"}}


def _check(text: str, expected: dict) -> set[str]:
    assert "mixdiag_" not in text
    seen = set()
    for fam in text_string_to_metric_families(text):
        if fam.name.endswith("_created"):
            continue  # prometheus_client's counter creation times, which vLLM/SGLang expose too
        assert fam.name in expected, f"{fam.name} is not a series that engine exposes"
        typ, labels = expected[fam.name]
        assert fam.type == typ, fam.name
        seen.add(fam.name)
        for s in fam.samples:
            if s.name.endswith("_created"):
                continue
            assert labels <= set(s.labels), (s.name, s.labels)
            if fam.name in MODES:
                assert s.labels["mode"] in MODES[fam.name]
            if fam.name == "vllm:request_success":
                assert s.labels["finished_reason"] in VLLM_FINISH_LABELS
        if fam.name in VLLM_BUCKETS:
            les = sorted(float(s.labels["le"]) for s in fam.samples if s.name.endswith("_bucket"))
            assert les[:-1] == [float(b) for b in VLLM_BUCKETS[fam.name]] and math.isinf(les[-1]), fam.name
    return seen


@pytest.mark.parametrize("dialect,expected,must", [
    ("vllm", VLLM, {"vllm:iteration_tokens_total", "vllm:inter_token_latency_seconds", "vllm:prompt_tokens",
                    "vllm:request_success", "vllm:request_prefill_time_seconds", "vllm:e2e_request_latency_seconds"}),
    ("sglang", SGLANG, {"sglang:cuda_graph_passes", "sglang:inter_token_latency_seconds", "sglang:num_running_reqs"}),
])
def test_run_exposes_only_the_engines_series(tmp_path, dialect, expected, must):
    out = tmp_path / "run"
    rc = main(["run", "--scenario", "mixed-default", "--max-steps", "25", "--out", str(out), "-q",
               "--metrics-dialect", dialect, "--scrape-interval", "0.05", "--log-format", dialect])
    assert rc in (0, None)
    final = (out / "metrics.prom").read_text()
    assert must <= _check(final, expected)
    scrapes = sorted((out / "scrapes").glob("*.prom"))
    assert scrapes
    for p in scrapes:
        _check(p.read_text(), expected)
    log = (out / "engine.log").read_text()
    assert ("Iteration(" in log) if dialect == "vllm" else ("Prefill batch, #new-seq" in log)


def _ev(rid, t, first=False, n=1):
    return NS(request_id=rid, t_s=t, is_first=first, n_tokens=n)


def _step(kind, t, sched, events, **kw):
    base = dict(kind=kind, t_start_s=t - 0.01, t_end_s=t, num_scheduled_tokens=sched, token_events=events,
                running_reqs=1, waiting_reqs=0, kv_usage=0.1, prefill_tokens=0, decode_rows=0,
                graph_mode="NONE")
    base.update(kw)
    return NS(**base)


def _hist(text: str, name: str) -> tuple[dict[float, float], float, float]:
    for fam in text_string_to_metric_families(text):
        if fam.name == name:
            b = {float(s.labels["le"]): s.value for s in fam.samples if s.name.endswith("_bucket")}
            c = next(s.value for s in fam.samples if s.name.endswith("_count"))
            sm = next(s.value for s in fam.samples if s.name.endswith("_sum"))
            return b, c, sm
    raise KeyError(name)


def test_vllm_iteration_tokens_miss_output_less_prefill_chunks():
    # formats.md: a 10-token prompt in 4-token chunks records [11, 1], not [4, 4, 2, 1]
    m = VllmMetrics(prompt_len=lambda rid: 10)
    m(_step("prefill", 1.0, {"r": 4}, [], prefill_tokens=4))
    m(_step("prefill", 1.1, {"r": 4}, [], prefill_tokens=4))
    m(_step("prefill", 1.2, {"r": 2}, [_ev("r", 1.2, first=True)], prefill_tokens=2))
    m(_step("decode", 1.3, {"r": 1}, [_ev("r", 1.3)], decode_rows=1))
    text = generate_latest(m.registry).decode()
    buckets, count, total = _hist(text, "vllm:iteration_tokens_total")
    assert (count, total) == (2, 12) and buckets[1.0] == 1 and buckets[16.0] == 2
    assert sorted(buckets)[:-1] == list(map(float, VLLM_ITERATION_TOKENS))
    assert 'vllm:prompt_tokens_total{engine="0",model_name="mixdiag-ref"} 10.0' in text
    b, c, s = _hist(text, "vllm:inter_token_latency_seconds")
    assert c == 1 and s == pytest.approx(0.1) and sorted(b)[:-1] == list(VLLM_ITL_S)


def test_sglang_chunk_itl_and_gauges_only_on_logged_lines():
    m = SglangMetrics(decode_log_interval=3)
    m(_step("prefill", 1.0, {"r": 8}, [_ev("r", 1.0, first=True)], prefill_tokens=8, running_reqs=0))
    # a 4-token (speculative) output after 0.2 s: 4 counts of 0.05 s, but 0.2 s to _sum
    m(_step("decode", 1.2, {"r": 1}, [_ev("r", 1.2, n=4)], decode_rows=1, running_reqs=7))
    text = generate_latest(m.registry).decode()
    b, c, s = _hist(text, "sglang:inter_token_latency_seconds")
    assert c == 4 and s == pytest.approx(0.2) and b[0.06] == 4 and b[0.04] == 0
    assert sorted(b)[:-1] == list(SGLANG_ITL_S)
    assert "sglang:num_running_reqs{" in text and text.count(" 7.0") == 0  # decode #1 logs no line
    m(_step("decode", 1.3, {"r": 1}, [_ev("r", 1.3)], decode_rows=1, running_reqs=7))
    m(_step("decode", 1.4, {"r": 1}, [_ev("r", 1.4)], decode_rows=1, running_reqs=7))
    assert 'sglang:num_running_reqs{dp_rank="0"' in (t := generate_latest(m.registry).decode())
    running = [ln for ln in t.splitlines() if ln.startswith("sglang:num_running_reqs{")]
    assert running[0].endswith(" 7.0")  # the third decode step logs a Decode line


def test_sglang_balancedness_and_kv_transfer_appear_with_their_first_value():
    m = SglangMetrics()
    assert "eplb_balancedness" not in generate_latest(m.registry).decode()
    m(_step("decode", 1.0, {}, [], decode_rows=4, expert_imbalance=2.0, kv_transfer_s=0.02,
            kv_transfer_bytes=5e6))
    text = generate_latest(m.registry).decode()
    bal = [ln for ln in text.splitlines() if ln.startswith("sglang:eplb_balancedness_sum")]
    assert bal and math.isclose(float(bal[0].split()[-1]), 0.5)
    assert "sglang:kv_transfer_latency_ms_sum" in text and "sglang:kv_transfer_total_mb_sum" in text


def test_vllm_request_histograms_at_finish_from_the_requests_timestamps():
    # vLLM RequestStateStats: queue = first scheduled - arrival, prefill = first token - first
    # scheduled, decode = last - first token, inference = last token - first scheduled; all observed
    # when the request finishes (update_from_finished_request), with request_success{finished_reason}
    ends = {}
    m = VllmMetrics(arrival_s=lambda rid: 0.5, prompt_len=lambda rid: 10, request_end=ends.get, max_model_len=100)
    m(_step("prefill", 1.0, {"r": 4}, [], prefill_tokens=4))             # scheduled at 0.99
    m(_step("prefill", 1.5, {"r": 6}, [_ev("r", 1.5, first=True)], prefill_tokens=6))
    m(_step("decode", 2.0, {"r": 1}, [_ev("r", 2.0)], decode_rows=1))
    text = generate_latest(m.registry).decode()
    assert _hist(text, "vllm:request_prefill_time_seconds")[1] == 0  # not yet finished: nothing observed
    ends["r"] = ("length", 3)
    m(_step("decode", 2.5, {"r": 1}, [_ev("r", 2.5)], decode_rows=1))
    text = generate_latest(m.registry).decode()
    want = {"request_queue_time_seconds": 0.49, "request_prefill_time_seconds": 0.51,
            "request_decode_time_seconds": 1.0, "request_inference_time_seconds": 1.51,
            "e2e_request_latency_seconds": 2.0, "request_time_per_output_token_seconds": 0.5,
            "request_prompt_tokens": 10, "request_generation_tokens": 3, "request_params_max_tokens": 3}
    for name, v in want.items():
        _, c, total = _hist(text, "vllm:" + name)
        assert c == 1 and total == pytest.approx(v), name
    b, _, _ = _hist(text, "vllm:request_prompt_tokens")
    assert sorted(b)[:-1] == [1, 2, 5, 10, 20, 50, 100]  # build_1_2_5_buckets(max_model_len=100)
    assert 'vllm:request_success_total{engine="0",finished_reason="length",model_name="mixdiag-ref"} 1.0' in text
    assert 'vllm:request_success_total{engine="0",finished_reason="stop",model_name="mixdiag-ref"} 0.0' in text
    m(_step("decode", 3.0, {}, [], decode_rows=0))  # a finished request is observed once
    assert _hist(generate_latest(m.registry).decode(), "vllm:e2e_request_latency_seconds")[1] == 1


@pytest.mark.parametrize("case, kw, mode", [
    # the dispatcher planned FULL but nothing replayed (CPU): SGLang would count no graph pass
    ("planned FULL, no replay", {"graph_mode": "FULL", "graph_replayed": False}, "decode_none"),
    ("a real FULL replay", {"graph_mode": "FULL", "graph_replayed": True}, "decode_cuda_graph"),
    ("planned PIECEWISE extend, no replay", {"graph_mode": "PIECEWISE", "graph_replayed": False, "prefill_tokens": 64},
     "prefill_none"),
    ("a real PIECEWISE extend replay", {"graph_mode": "PIECEWISE", "graph_replayed": True, "prefill_tokens": 64},
     "prefill_cuda_graph"),
])
def test_sglang_graph_passes_count_replays_not_the_plan(case, kw, mode):
    m = SglangMetrics()
    kind = "mixed" if kw.get("prefill_tokens") else "decode"
    m(_step(kind, 1.0, {"r": 1}, [], decode_rows=1, **kw))
    fam = next(f for f in text_string_to_metric_families(generate_latest(m.registry).decode())
               if f.name == "sglang:cuda_graph_passes")
    counted = {s.labels["mode"]: s.value for s in fam.samples if s.name.endswith("_total")}
    assert counted[mode] == 1 and sum(counted.values()) == 1, (case, counted)
