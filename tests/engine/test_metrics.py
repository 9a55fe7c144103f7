"""EngineMetrics: contract §3 names and labels, counts from step records, vLLM buckets, SM source honesty."""
import math

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from mixdiag.engine.telemetry.metrics import ITL_BUCKETS_S, TTFT_BUCKETS_S, EngineMetrics
from mixdiag.engine.core.records import StepRecord, TokenEvent

CONTRACT = {  # docs/contracts.md §3: family name -> (type, label names)
    "mixdiag_engine_steps": ("counter", {"kind"}),
    "mixdiag_engine_scheduled_tokens": ("counter", {"segment"}),
    "mixdiag_engine_prompt_tokens": ("counter", set()),
    "mixdiag_engine_generation_tokens": ("counter", set()),
    "mixdiag_engine_graph_dispatch": ("counter", {"mode"}),
    "mixdiag_engine_graph_replays": ("counter", {"mode"}),
    "mixdiag_engine_step_duration_seconds": ("histogram", {"kind"}),
    "mixdiag_engine_inter_token_latency_seconds": ("histogram", set()),
    "mixdiag_engine_time_to_first_token_seconds": ("histogram", set()),
    "mixdiag_engine_requests_running": ("gauge", set()),
    "mixdiag_engine_requests_waiting": ("gauge", set()),
    "mixdiag_engine_kv_usage_ratio": ("gauge", set()),
    "mixdiag_engine_prefix_cache_queries": ("counter", set()),
    "mixdiag_engine_prefix_cache_hits": ("counter", set()),
    "mixdiag_engine_preemptions": ("counter", set()),
    "mixdiag_engine_expert_imbalance_ratio": ("gauge", set()),
    "mixdiag_engine_kv_transfer_bytes": ("counter", set()),
    "mixdiag_engine_kv_transfer_seconds": ("counter", set()),
    "mixdiag_engine_sm_active_ratio": ("gauge", {"source"}),
}


def rec(step, kind, t0, dur, **kw):
    return StepRecord(step=step, t_start_s=t0, t_end_s=t0 + dur, kind=kind, **kw)


RECORDS = [
    rec(0, "prefill", 100.0, 0.050, prefill_tokens=512, prefill_reqs=1, graph_mode="PIECEWISE", running_reqs=1,
        waiting_reqs=3, kv_usage=0.1, prefix_hit_tokens=16, output_tokens=1,
        token_events=[TokenEvent("a", 100.05, 1, True)]),
    rec(1, "mixed", 100.05, 0.040, prefill_tokens=256, prefill_reqs=1, decode_reqs=1, decode_rows=1,
        graph_mode="PIECEWISE", output_tokens=2, running_reqs=2, waiting_reqs=2, kv_usage=0.2,
        token_events=[TokenEvent("a", 100.09, 1, False), TokenEvent("b", 100.09, 1, True)]),
    rec(2, "decode", 100.09, 0.005, decode_reqs=2, decode_rows=2, graph_mode="FULL", output_tokens=2,
        running_reqs=2, waiting_reqs=2, kv_usage=0.25, expert_imbalance=2.5, preempted_reqs=1,
        kv_transfer_bytes=4096.0, kv_transfer_s=0.002,
        token_events=[TokenEvent("a", 100.095, 1, False), TokenEvent("b", 100.095, 1, False)]),
    rec(3, "idle", 100.095, 0.001, running_reqs=2, waiting_reqs=2, kv_usage=0.25),
]


@pytest.fixture
def metrics():
    m = EngineMetrics(CollectorRegistry(), arrival_s={"a": 100.0, "b": 100.02}.get)
    for r in RECORDS:
        m(r)
    return m


def value(m, name, **labels):
    v = m.registry.get_sample_value(name, labels)
    return v


def test_names_types_and_labels_follow_the_contract(metrics):
    metrics.graph_replays.labels(mode="FULL")  # would appear after a real replay
    fams = {f.name: f for f in text_string_to_metric_families(generate_latest(metrics.registry).decode())}
    for name, (typ, labels) in CONTRACT.items():
        assert name in fams, name
        assert fams[name].type == typ, name
        got = {k for s in fams[name].samples for k in s.labels if k != "le"}
        assert got <= labels, (name, got)
    assert {n for n in fams if not n.endswith("_created")} == set(CONTRACT)


@pytest.mark.parametrize("sample,labels,expected", [
    ("mixdiag_engine_steps_total", {"kind": "prefill"}, 1),
    ("mixdiag_engine_steps_total", {"kind": "mixed"}, 1),
    ("mixdiag_engine_steps_total", {"kind": "decode"}, 1),
    ("mixdiag_engine_steps_total", {"kind": "idle"}, 1),
    ("mixdiag_engine_scheduled_tokens_total", {"segment": "prefill"}, 768),
    ("mixdiag_engine_scheduled_tokens_total", {"segment": "decode"}, 3),
    ("mixdiag_engine_prompt_tokens_total", {}, 784),
    ("mixdiag_engine_generation_tokens_total", {}, 5),
    ("mixdiag_engine_graph_dispatch_total", {"mode": "PIECEWISE"}, 2),
    ("mixdiag_engine_graph_dispatch_total", {"mode": "FULL"}, 1),
    ("mixdiag_engine_graph_dispatch_total", {"mode": "NONE"}, 0),  # idle steps dispatch nothing
    ("mixdiag_engine_step_duration_seconds_count", {"kind": "decode"}, 1),
    ("mixdiag_engine_requests_running", {}, 2),
    ("mixdiag_engine_requests_waiting", {}, 2),
    ("mixdiag_engine_kv_usage_ratio", {}, 0.25),
    ("mixdiag_engine_prefix_cache_hits_total", {}, 16),
    ("mixdiag_engine_preemptions_total", {}, 1),
    ("mixdiag_engine_expert_imbalance_ratio", {}, 2.5),
    ("mixdiag_engine_kv_transfer_bytes_total", {}, 4096),
    ("mixdiag_engine_kv_transfer_seconds_total", {}, 0.002),
    ("mixdiag_engine_time_to_first_token_seconds_count", {}, 2),
    ("mixdiag_engine_inter_token_latency_seconds_count", {}, 3),
])
def test_counts_from_records(metrics, sample, labels, expected):
    assert value(metrics, sample, **labels) == pytest.approx(expected)


def test_latency_histograms(metrics):
    # a: 100.0 -> 100.05 (TTFT 0.05), then 0.04 and 0.005 gaps; b: 100.02 -> 100.09 (TTFT 0.07), then 0.005
    assert value(metrics, "mixdiag_engine_time_to_first_token_seconds_sum") == pytest.approx(0.12)
    assert value(metrics, "mixdiag_engine_inter_token_latency_seconds_sum") == pytest.approx(0.05)
    assert value(metrics, "mixdiag_engine_inter_token_latency_seconds_bucket", le="0.01") == 2
    assert value(metrics, "mixdiag_engine_step_duration_seconds_sum", kind="prefill") == pytest.approx(0.05)


def test_vllm_buckets():
    assert ITL_BUCKETS_S[0] == 0.01 and ITL_BUCKETS_S[-1] == 80.0 and len(ITL_BUCKETS_S) == 19
    assert TTFT_BUCKETS_S[0] == 0.001 and TTFT_BUCKETS_S[-1] == 2560.0 and len(TTFT_BUCKETS_S) == 22


def test_replays_only_where_they_happened():
    m = EngineMetrics()
    m(rec(0, "decode", 1.0, 0.01, decode_reqs=1, decode_rows=1, graph_mode="FULL"))
    assert value(m, "mixdiag_engine_graph_replays_total", mode="FULL") is None
    m(rec(1, "decode", 1.01, 0.01, decode_reqs=1, decode_rows=1, graph_mode="FULL", graph_replayed=True))
    assert value(m, "mixdiag_engine_graph_replays_total", mode="FULL") == 1
    assert value(m, "mixdiag_engine_graph_dispatch_total", mode="FULL") == 2


def test_sm_gauge_carries_its_source_and_skips_unlabelled():
    m = EngineMetrics()
    r = rec(0, "decode", 1.0, 0.01, decode_reqs=1, decode_rows=1, sm_active=0.3)
    m(r)  # no sm_active_source: not exported (cannot say measured or estimated)
    assert value(m, "mixdiag_engine_sm_active_ratio", source="estimated") is None
    r.sm_active_source = "estimated"
    m(r)
    assert value(m, "mixdiag_engine_sm_active_ratio", source="estimated") == pytest.approx(0.3)
    assert value(m, "mixdiag_engine_sm_active_ratio", source="measured") is None
    r.sm_active_source = "inferred"  # NVML utilization fallback: weaker, not the SM gauge
    r.sm_active = 0.9
    m(r)
    assert value(m, "mixdiag_engine_sm_active_ratio", source="estimated") == pytest.approx(0.3)
    with pytest.raises(ValueError):
        m.observe_sm_active(0.5, "guessed")


def test_missing_values_are_not_invented():
    m = EngineMetrics()
    m(rec(0, "decode", 1.0, 0.01, decode_reqs=1, decode_rows=1, expert_imbalance=math.nan))
    assert math.isnan(value(m, "mixdiag_engine_expert_imbalance_ratio"))  # unknown stays unknown, not 0
    m(rec(1, "unknown", 1.0, 0.01))
    assert m.steps_seen == 1


@pytest.mark.parametrize("values", [[], [0.01], [0.0, 0.01, 0.010001, 80.0, 80.5, 1e9], [0.3] * 50])
def test_batch_histogram_matches_prometheus_client(values):
    from prometheus_client import Histogram

    from mixdiag.engine.telemetry.metrics import BatchHistogram

    ours, ref = CollectorRegistry(), CollectorRegistry()
    BatchHistogram("x_seconds", "x", ITL_BUCKETS_S, ours).observe_many(values)
    h = Histogram("x_seconds", "x", buckets=ITL_BUCKETS_S, registry=ref)
    for v in values:
        h.observe(v)

    def samples(reg):
        return sorted((s.name, tuple(sorted(s.labels.items())), s.value) for f in reg.collect() for s in f.samples
                      if not s.name.endswith("_created"))

    a, b = samples(ours), samples(ref)
    assert [x[:2] for x in a] == [x[:2] for x in b]
    assert [x[2] for x in a] == pytest.approx([x[2] for x in b])
