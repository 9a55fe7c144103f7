"""collectors/prometheus/dialect_columns.py: two scrapes of each dialect (written from formats.md §1.1/§2.3,
version drift included) -> the evidence columns of the interval row, with honest qualities."""
import math

import pytest

from mixdiag.collectors.prometheus import scrape_reader
from mixdiag.collectors.prometheus.dialect_columns import share_above

import numpy as np


def _hist(name, labels, bounds, counts, total):
    """Exposition lines of a histogram with cumulative ``counts`` at ``bounds`` (+Inf last)."""
    lab = ",".join(f'{k}="{v}"' for k, v in labels.items())
    sep = "," if lab else ""
    out = [f"# TYPE {name} histogram"]
    for b, c in zip(list(bounds) + ["+Inf"], counts):
        out.append(f'{name}_bucket{{{lab}{sep}le="{b}"}} {c}')
    out += [f"{name}_count{{{lab}}} {counts[-1]}", f"{name}_sum{{{lab}}} {total}"]
    return "\n".join(out)


ITER = [1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384]
TTFT = [0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5]
V = {"model_name": "m", "engine": "0"}


def vllm_scrape(steps_small, steps_large, ttft_n, running=32, labels=V, kv_name="vllm:kv_cache_usage_perc",
                iter_bounds=ITER):
    small_idx = next(i for i, b in enumerate(iter_bounds) if b >= 32)
    it = [0] * small_idx + [steps_small] * (len(iter_bounds) - small_idx) + [steps_small + steps_large]
    for i, b in enumerate(iter_bounds):
        if b >= 4096:
            it[i] = steps_small + steps_large
    lab = ",".join(f'{k}="{v}"' for k, v in labels.items())
    return "\n".join([
        f"# TYPE vllm:num_requests_running gauge", f"vllm:num_requests_running{{{lab}}} {running}",
        f"vllm:num_requests_waiting{{{lab}}} 0", f"{kv_name}{{{lab}}} 0.5",
        "# TYPE vllm:prompt_tokens_total counter", f"vllm:prompt_tokens_total{{{lab}}} {4096 * steps_large}",
        "# TYPE vllm:generation_tokens_total counter", f"vllm:generation_tokens_total{{{lab}}} {32 * steps_small}",
        _hist("vllm:iteration_tokens_total", labels, iter_bounds, it, 0),
        _hist("vllm:time_to_first_token_seconds", labels, TTFT, [0] * 9 + [ttft_n] * 5, 0.3 * ttft_n),
    ]) + "\n"


SG = {"model_name": "m", "engine_type": "unified", "tp_rank": "0", "pp_rank": "0", "moe_ep_rank": "0"}


def sglang_scrape(passes: dict, bal_n=0, bal_sum=0.0, kv_ms=0.0, kv_mb=0.0, gpu_s=0.0):
    lab = ",".join(f'{k}="{v}"' for k, v in SG.items())
    lines = ["# TYPE sglang:cuda_graph_passes_total counter"]
    lines += [f'sglang:cuda_graph_passes_total{{{lab},mode="{m}"}} {v}' for m, v in passes.items()]
    lines += [f"sglang:num_running_reqs{{{lab}}} 8", f"sglang:num_queue_reqs{{{lab}}} 0",
              "# TYPE sglang:eplb_balancedness summary",
              f'sglang:eplb_balancedness_count{{{lab},forward_mode="decode"}} {bal_n}',
              f'sglang:eplb_balancedness_sum{{{lab},forward_mode="decode"}} {bal_sum}',
              _hist("sglang:kv_transfer_latency_ms", SG, [1, 10, 100], [0, 0, 0, 0], kv_ms),
              _hist("sglang:kv_transfer_total_mb", SG, [1, 10, 100], [0, 0, 0, 0], kv_mb),
              "# TYPE sglang:gpu_execution_seconds_total counter",
              f'sglang:gpu_execution_seconds_total{{{lab},category="forward_decode"}} {gpu_s}']
    return "\n".join(lines) + "\n"


def _row(a: str, b: str, **kw):
    tl = scrape_reader.read_scrapes([(100.0, a), (101.0, b)], **kw)
    assert len(tl.steps) == 1
    return tl.steps.iloc[0].to_dict(), tl.meta["signals"]


CASES = [
    # name, scrape pair, expected columns, expected meta qualities
    ("vllm-v1: prefill burst while 32 run -> mixed (inferred)",
     (vllm_scrape(10, 0, 0), vllm_scrape(40, 2, 2)),
     {"kind": "mixed", "large_step_share": 2 / 32, "arrivals": 2.0, "q_token_allocation": "inferred"},
     {"large_step_share": "inferred", "arrivals": "inferred", "kind": "inferred", "ttft_p50_s": "measured"}),
    ("vllm-v1: decode only -> decode (inferred)",
     (vllm_scrape(10, 2, 2), vllm_scrape(50, 2, 2)),
     {"kind": "decode", "large_step_share": 0.0, "arrivals": 0.0},
     {"kind": "inferred"}),
    ("vllm V0: no engine label, old name, 8-token bucket ladder",
     (vllm_scrape(10, 0, 0, labels={"model_name": "m"}, kv_name="vllm:gpu_cache_usage_perc",
                  iter_bounds=[1, 2, 4, 8, 16, 24, 32, 40, 48, 56, 64, 4096, 8192]),
      vllm_scrape(30, 5, 5, labels={"model_name": "m"}, kv_name="vllm:gpu_cache_usage_perc",
                  iter_bounds=[1, 2, 4, 8, 16, 24, 32, 40, 48, 56, 64, 4096, 8192])),
     {"kind": "mixed", "large_step_share": 5 / 25, "kv_usage": 0.5}, {"kv_usage": "measured"}),
    ("sglang: decode passes only, FULL graphs; balancedness 0.5 -> imbalance 2; KV transfer",
     (sglang_scrape({"decode_cuda_graph": 10, "decode_none": 0}, 1, 0.5, 5.0, 1.0, 1.0),
      sglang_scrape({"decode_cuda_graph": 30, "decode_none": 5}, 3, 1.5, 25.0, 3.0, 1.5)),
     {"kind": "decode", "graph_full_steps": 20.0, "graph_none_steps": 5.0, "large_step_share": 0.0,
      "expert_imbalance": 2.0, "kv_transfer_s": 0.02, "kv_transfer_bytes": 2e6, "forward_s": 0.5,
      "q_expert_imbalance": "inferred", "q_kv_transfer": "measured", "q_graph_mode": "measured"},
     {"expert_imbalance": "inferred", "graph_full_steps": "measured", "kv_transfer_s": "measured"}),
    ("sglang: extend and decode passes -> share, kind stays unknown",
     (sglang_scrape({"prefill_none": 0, "decode_cuda_graph": 0}),
      sglang_scrape({"prefill_none": 3, "decode_cuda_graph": 9})),
     {"large_step_share": 0.25, "graph_none_steps": 3.0, "graph_full_steps": 9.0}, {"large_step_share": "measured"}),
]


@pytest.mark.parametrize("name,pair,want,sig", CASES, ids=[c[0] for c in CASES])
def test_dialect_interval_columns(name, pair, want, sig):
    row, signals = _row(*pair, instance="x")
    for col, v in want.items():
        if isinstance(v, float):
            assert row[col] == pytest.approx(v), col
        else:
            assert row[col] == v, col
    got = signals["x"]
    for col, q in sig.items():
        assert got[col] == q, col
    assert row["step_source"] == "scrape"


def test_ttft_quantiles_from_the_histogram_increase():
    row, _ = _row(vllm_scrape(10, 0, 0), vllm_scrape(40, 2, 4))
    # 4 first tokens, all in (0.25, 0.5]: PromQL interpolation inside that bucket
    assert row["ttft_p50_s"] == pytest.approx(0.375) and 0.375 < row["ttft_p99_s"] <= 0.5


@pytest.mark.parametrize("threshold,share", [(32, 0.5), (33, 0.5), (31, 0.5), (64, 0.25), (1e9, 0.0), (0.5, 1.0)])
def test_share_above_at_bucket_resolution(threshold, share):
    upper = np.array([1, 32, 64, 128, math.inf], dtype=float)
    cum = np.array([0, 2, 3, 4, 4], dtype=float)
    # a threshold inside a bucket counts that whole bucket as "not above" (never overstates)
    expect = {31: 0.5, 33: 0.25}.get(threshold, share)
    assert share_above(upper, cum, threshold) == pytest.approx(expect)


def test_large_steps_are_judged_against_the_larger_running_count():
    # 33 requests decoded (steps of 33 tokens: bucket (32, 64]); one finished before the later
    # scrape, which reports 32 running. Those steps are decode steps, not large ones.
    def scrape(n_steps, running):
        lab = ",".join(f'{k}="{v}"' for k, v in V.items())
        counts = [0, 0, 0, 0] + [n_steps] * (len(ITER) - 3)
        return "\n".join([f"vllm:num_requests_running{{{lab}}} {running}",
                          "# TYPE vllm:generation_tokens_total counter",
                          f"vllm:generation_tokens_total{{{lab}}} {33 * n_steps}",
                          _hist("vllm:iteration_tokens_total", V, ITER, counts, 33 * n_steps)]) + "\n"
    tl = scrape_reader.read_scrapes([(0.0, scrape(0, 33)), (1.0, scrape(20, 32))], instance="v")
    row = tl.steps.iloc[0]
    assert row["large_step_share"] == 0.0 and row["kind"] == "decode"


def test_every_interval_gets_its_own_kv_transfer():
    # one transfer per interval: each interval row counts its own bytes, not only the first
    passes = {"decode": 10}
    tl = scrape_reader.read_scrapes([(0.0, sglang_scrape(passes, kv_ms=0.0, kv_mb=0.0)),
                                 (1.0, sglang_scrape(passes, kv_ms=60.0, kv_mb=2.0)),
                                 (2.0, sglang_scrape(passes, kv_ms=60.0, kv_mb=2.0)),
                                 (3.0, sglang_scrape(passes, kv_ms=130.0, kv_mb=5.0))], instance="s")
    assert list(tl.steps["kv_transfer_bytes"]) == [2e6, 0.0, 3e6]
    assert list(tl.steps["kv_transfer_s"]) == pytest.approx([0.06, 0.0, 0.07])
