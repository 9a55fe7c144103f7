"""Workload estimation, the step-cost fit and the frontier logic of ``mixdiag tune`` (no engine runs)."""
import math

import numpy as np
import pandas as pd
import pytest

from mixdiag.errors import UserError
from mixdiag.schema import Timeline
from mixdiag.tuning import cost_model, frontier, traffic
from mixdiag.tuning.cost_model import StepShape


def tokens(arrival=True, prompt=True):
    rows = []
    for i, (a, p, n) in enumerate([(10.0, 100, 3), (10.5, 40, 2), (12.0, 900, 4)]):
        for k in range(n):
            rows.append({"instance": "e", "request_id": f"r{i}", "t_s": a + 0.2 + 0.05 * k, "n_tokens": 1,
                         "step": math.nan, "is_first": float(k == 0),
                         "arrival_s": a if arrival and k == 0 else math.nan,
                         "prompt_tokens": p if prompt and k == 0 else math.nan})
    return pd.DataFrame(rows)


def steps(n=3, granularity="step", **cols):
    base = {"instance": "e", "step": range(n), "t_start_s": [10.0 + i for i in range(n)],
            "t_end_s": [10.5 + i for i in range(n)], "granularity": granularity, "kind": "mixed",
            "prefill_tokens": [200.0] * n, "decode_rows": [4.0] * n}
    base.update(cols)
    return pd.DataFrame(base)


@pytest.mark.parametrize("arrival,prompt,quality", [
    (True, True, {"arrivals": "measured", "prompt_tokens": "measured"}),
    (False, True, {"arrivals": "inferred", "prompt_tokens": "measured"}),
    (True, False, {"arrivals": "measured", "prompt_tokens": "estimated"}),
])
def test_workload_from_token_events(arrival, prompt, quality):
    wl = traffic.from_timeline(Timeline(steps=steps(), tokens=tokens(arrival, prompt)))
    assert {k: wl.quality[k] for k in quality} == quality
    assert [r.output_tokens for r in wl.requests] == [3, 2, 4]
    if arrival:
        assert [r.arrival_s for r in wl.requests] == [10.0, 10.5, 12.0]
    if prompt:
        assert [r.prompt_tokens for r in wl.requests] == [100, 40, 900]
    else:   # the steps' 600 prefill tokens over 3 requests
        assert [r.prompt_tokens for r in wl.requests] == [200, 200, 200]
        assert any("mean" in n for n in wl.notes)


def test_workload_from_interval_counters_is_estimated():
    st = steps(4, "interval", arrivals=[2.0, 0.0, 3.0, 1.0], prefill_tokens=[400.0, 0.0, 900.0, 100.0],
               output_tokens=[120.0] * 4)
    wl = traffic.from_timeline(Timeline(steps=st))
    assert len(wl.requests) == 6 and wl.source == "interval counters"
    assert set(wl.quality.values()) == {"estimated"}
    assert [r.prompt_tokens for r in wl.requests] == [200, 200, 300, 300, 300, 100]
    assert all(r.output_tokens == 80 for r in wl.requests)       # 480 output tokens / 6 arrivals
    assert wl.requests[0].arrival_s == pytest.approx(10.125)      # 2 arrivals spread evenly over 10.0-10.5 s


def test_workload_refuses_inputs_without_requests():
    with pytest.raises(UserError, match="cannot estimate a workload"):
        traffic.from_timeline(Timeline(steps=steps()))


@pytest.mark.parametrize("triangle", cost_model.TRIANGLES)
def test_fit_recovers_a_linear_cost_and_its_attention_triangle(triangle):
    rng = np.random.default_rng(0)
    n = 200
    p = rng.integers(0, 600, n).astype(float) * (rng.random(n) < 0.6)    # 40 % decode-only steps
    d = rng.integers(1, 40, n).astype(float)
    cached, ctx = rng.integers(0, 4000, n), rng.integers(100, 3000, n)   # independent of the token counts
    shapes = [StepShape(int(a), int(b), a * c, a * a, b * x) for a, b, c, x in zip(p, d, cached, ctx)]
    true = np.array([0.002, 2e-5, 1e-4, 0.003, 0.01, 0.0004])
    dur = np.array([true @ s.features(triangle) for s in shapes])
    rows = pd.DataFrame({"t_start_s": np.arange(n) * 1.0, "prefill_tokens": p, "decode_rows": d})
    rows["t_end_s"] = rows["t_start_s"] + dur
    fit = cost_model.fit(rows, shapes, "exact")
    assert fit.triangle == triangle          # the kernel's causal handling, read off the data
    assert np.allclose(fit.coef, true, rtol=1e-6, atol=1e-9)
    assert fit.r2 == pytest.approx(1.0) and fit.mape_heldout < 1e-6
    assert fit.gap_s == pytest.approx(1.0 - dur[:-1].mean(), abs=0.2)
    # residual ratios are kept per class (decode-only, with prefill) with the fitted duration
    assert len(fit.jitter[0]) == int((p == 0).sum()) and len(fit.jitter[1]) == int((p > 0).sum())
    assert all(r == pytest.approx(1.0) for r, _ in fit.jitter[0] + fit.jitter[1])


@pytest.mark.parametrize("causal_kernel, want", [(False, 1.0), (True, 0.5)])
def test_when_the_data_cannot_tell_the_triangle_is_the_engines_kernel(causal_kernel, want):
    # every chunk the same size at the same cached context: k² is collinear with the chunk count and
    # both forms fit exactly; kept: the dense one (never under-predicts a larger chunk), or the causal
    # one for an engine whose kernels skip the masked blocks (cost_model.CAUSAL_KERNEL_SOURCES)
    n = 60
    p = np.where(np.arange(n) % 3 == 0, 512.0, 0.0)
    shapes = [StepShape(int(a), 8, a * 1000.0, a * a, 8 * 500.0) for a in p]
    dur = np.array([0.002 + 1e-5 * s.prefill_tokens + 0.01 * s.prefill_ctx / 1e6 + 1e-4 * 8 for s in shapes])
    rows = pd.DataFrame({"t_start_s": np.arange(n) * 1.0, "prefill_tokens": p, "decode_rows": 8.0})
    rows["t_end_s"] = rows["t_start_s"] + dur
    assert cost_model.fit(rows, shapes, "exact", causal_kernel=causal_kernel).triangle == want


@pytest.mark.parametrize("triangle", cost_model.TRIANGLES)
def test_a_causal_kernel_prior_still_yields_to_data_that_tell(triangle):
    rng = np.random.default_rng(1)
    n = 200
    p = rng.integers(0, 600, n).astype(float) * (rng.random(n) < 0.6)
    d = rng.integers(1, 40, n).astype(float)
    shapes = [StepShape(int(a), int(b), a * c, a * a, 0.0) for a, b, c in zip(p, d, rng.integers(0, 4000, n))]
    true = np.array([0.002, 2e-5, 1e-4, 0.003, 0.01, 0.0])
    rows = pd.DataFrame({"t_start_s": np.arange(n) * 1.0, "prefill_tokens": p, "decode_rows": d})
    rows["t_end_s"] = rows["t_start_s"] + np.array([true @ s.features(triangle) for s in shapes])
    assert cost_model.fit(rows, shapes, "exact", causal_kernel=True).triangle == triangle


def test_jitter_is_a_ratio_up_to_the_measured_length_and_an_excess_beyond():
    fit = cost_model.FittedCost((0.0,) * 6, 0.0, 0.001, 1.0, 0.0, 10, "x")
    assert fit.jittered_s(0.010, 1.5, 0.020) == pytest.approx(0.015)   # shorter step: 1.5x
    assert fit.jittered_s(0.200, 1.5, 0.020) == pytest.approx(0.210)   # longer: the same +10 ms
    assert fit.jittered_s(0.002, 0.1, 0.020) == pytest.approx(0.001)   # never below the fastest step seen


def test_fit_needs_enough_steps():
    rows = pd.DataFrame({"t_start_s": [0.0, 1.0], "t_end_s": [0.5, 1.5], "prefill_tokens": [1.0, 2.0],
                         "decode_rows": [1.0, 1.0]})
    with pytest.raises(UserError, match="too few"):
        cost_model.fit(rows, [StepShape(1, 1), StepShape(2, 1)], "x")


def test_ledger_fallback_charges_a_prefill_chunk():
    from mixdiag.ledger.device_model import device
    from mixdiag.ledger.shapes import resolve

    lc = cost_model.LedgerCost(resolve("glm-5.3", None), device("h200"))
    dec = lc.step_s(StepShape(0, 32, decode_ctx=32 * 4096))
    mix = lc.step_s(StepShape(8192, 32, prefill_sq=8192 ** 2, decode_ctx=32 * 4096))
    assert 0 < dec < mix
    assert lc.describe()["kind"] == "ledger"


@pytest.mark.parametrize("text,want", [
    ("chunk_size=256,512", ("chunk_size", [256, 512])),
    ("policy=token_budget,mix_running", ("policy", ["token_budget", "mix_running"])),
    ("mixed_chunk=on,off", ("mixed_chunk", [True, False])),
    ("max_running=8,8,16", ("max_running", [8, 16])),
])
def test_parse_knob(text, want):
    assert frontier.parse_knob(text) == want


@pytest.mark.parametrize("text", ["chunk_size", "bogus=1", "chunk_size=", "chunk_size=a,b", "mixed_chunk=maybe"])
def test_parse_knob_refuses(text):
    with pytest.raises(UserError):
        frontier.parse_knob(text)


def test_apply_maps_chunk_size_onto_both_budgets_and_validates():
    from mixdiag.engine.config import SchedulerConfig

    cfg = frontier.apply(SchedulerConfig(), {"chunk_size": 1024})
    assert (cfg.max_num_batched_tokens, cfg.chunked_prefill_size) == (1024, 1024)
    with pytest.raises(UserError, match="chunk_size=0"):
        frontier.apply(SchedulerConfig(), {"chunk_size": 0})


ROWS = [{"label": "a", "itl_p99_s": 0.05, "ttft_p99_s": 3.0, "throughput_tok_s": 900},
        {"label": "b", "itl_p99_s": 0.10, "ttft_p99_s": 1.5, "throughput_tok_s": 1000},
        {"label": "c", "itl_p99_s": 0.20, "ttft_p99_s": 1.2, "throughput_tok_s": 1050},
        {"label": "d", "itl_p99_s": 0.25, "ttft_p99_s": 1.6, "throughput_tok_s": 1000}]   # dominated by b


def test_pareto_drops_dominated_settings():
    assert [r["label"] for r in frontier.pareto(ROWS)] == ["a", "b", "c"]


@pytest.mark.parametrize("itl,ttft,want", [
    (None, 2.0, "b"),      # lowest ITL with TTFT <= 2
    (0.15, None, "b"),     # lowest TTFT with ITL <= 0.15
    (0.3, 2.0, "c"),       # both: highest throughput
    (0.01, None, None),    # nothing meets it
    (None, None, "b"),     # nearest both minima
])
def test_recommend_under_slos(itl, ttft, want):
    rec, why = frontier.recommend(ROWS, itl, ttft)
    assert (rec["label"] if rec else None) == want
    assert why


def test_recommendation_ranks_itl_by_its_run_bound():
    """A setting whose P99 ITL sits on the cliff of a ~1 % slow share (low P99, high 95 % run
    bound) loses to one whose tail is steady (bench_tune: chunk 4096 predicted 30 ms, real 200 ms)."""
    rows = [{"label": "cliff", "itl_p99_s": 0.030, "itl_p99_hi_s": 0.152, "ttft_p99_s": 0.41, "throughput_tok_s": 484},
            {"label": "steady", "itl_p99_s": 0.091, "itl_p99_hi_s": 0.100, "ttft_p99_s": 0.41, "throughput_tok_s": 487}]
    assert frontier.recommend(rows, None, 0.43)[0]["label"] == "steady"
    assert frontier.recommend(rows, 0.12, None)[0]["label"] == "steady"  # the cliff's bound misses the SLO


@pytest.mark.parametrize("n,lo,hi", [(100, 0.996, 0.997), (1000, 0.9935, 0.9942), (9000, 0.9914, 0.9919)])
def test_run_quantile_upper(n, lo, hi):
    from mixdiag.tuning.replay import run_quantile_upper
    assert lo < run_quantile_upper(n) < hi


def test_run_quantile_upper_is_a_95_percent_bound():
    """Simulated: the P99 of 2000 runs of n = 500 uniform samples exceeds U's bound ~5 % of the time."""
    import numpy as np

    from mixdiag.tuning.replay import run_quantile_upper
    rng = np.random.default_rng(0)
    x = run_quantile_upper(500)
    p99 = np.sort(rng.random((2000, 500)), axis=1)[:, int(np.ceil(0.99 * 500)) - 1]
    assert 0.03 < (p99 > x).mean() < 0.07


def test_settings_beyond_the_fitted_step_sizes_are_recommended_last():
    rows = [{"label": "inside", "itl_p99_s": 0.09, "ttft_p99_s": 0.41, "throughput_tok_s": 487, "extrapolation_x": 1.9},
            {"label": "beyond", "itl_p99_s": 0.03, "ttft_p99_s": 0.39, "throughput_tok_s": 484, "extrapolation_x": 7.4}]
    rec, why = frontier.recommend(rows, None, 0.43)
    assert rec["label"] == "inside" and "left out" in why
    rec, why = frontier.recommend(rows, None, 0.40)  # only the extrapolated one meets it: said so
    assert rec["label"] == "beyond" and "beyond your data" in why
