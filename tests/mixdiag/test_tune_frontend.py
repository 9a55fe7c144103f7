"""The front-end delay (client token times over the engine's step stamps) and the step-row shapes at a
prompt boundary: hand-built captures, the real vLLM 0.32 excerpt (tests/fixtures/vllm032/tune)."""
import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from mixdiag.cli import main
from mixdiag.engine.config import CacheConfig, SchedulerConfig
from mixdiag.tuning import cost_model, frontend
from mixdiag.tuning.replay import ModelTiming, replay
from mixdiag.tuning.traffic import RequestSpec

FIX = Path(__file__).resolve().parents[1] / "fixtures" / "vllm032" / "tune"
STAMPS = 100.0 + 0.010 * np.arange(1, 101)      # a step ends every 10 ms


def tokens(rows):
    return pd.DataFrame(rows, columns=["request_id", "t_s"]).assign(n_tokens=1)


def steady(rid, first, n, delay=0.002):
    return [(rid, STAMPS[first + k] + delay) for k in range(n)]


@pytest.mark.parametrize("case, tok, want", [
    ("steady 2 ms", steady("a", 5, 20) + steady("b", 10, 20), {i: 0.002 for i in range(5, 30)}),
    # the front end holds steps 40-49 and sends them at once with step 50's token: steps 40-47 were
    # held over 3+ further steps (a stall: not carried, counted at the median delay), 48-49 are kept
    ("stall", [("a", STAMPS[k] + 0.002 if not 40 <= k < 50 else STAMPS[50] + 0.002) for k in range(30, 60)],
     {k: (STAMPS[50] - STAMPS[k] + 0.002 if 48 <= k < 50 else 0.002) for k in range(30, 60)}),
    # the budget skipped 'a' in step 20 (a chunk ran ahead of it): the tokens before are not charged that step
    ("skip", [("a", STAMPS[k] + 0.002) for k in list(range(10, 20)) + list(range(21, 30))],
     {k: 0.002 for k in list(range(10, 20)) + list(range(21, 30))}),
])
def test_delay_per_step(case, tok, want):
    fe = frontend.measure(tokens(tok), STAMPS, t0=100.0)
    got = {int(round(t / 0.010)) - 1: lag for t, lag in zip(fe.t_s, fe.lag_s)}   # t_s: STAMPS[k] - t0
    assert set(got) == set(want), case
    assert [got[k] for k in sorted(want)] == pytest.approx([want[k] for k in sorted(want)], abs=1e-9), case
    stalled = case == "stall"
    assert (fe.stalls, fe.stalled_s) == ((1, pytest.approx(STAMPS[50] + 0.002 - STAMPS[40])) if stalled else (0, 0.0))


@pytest.mark.parametrize("offset", [-50.0, 1000.0])
def test_clocks_that_are_not_one_give_no_delay(offset):
    tok = tokens([(r, t + offset) for r, t in steady("a", 5, 20) + steady("b", 10, 20)])
    assert frontend.measure(tok, STAMPS, t0=100.0) is None


def test_sampler_reads_the_series_by_time_and_shifts_it_for_other_seeds():
    fe = frontend.FrontEndDelay(np.array([0.0, 1.0, 2.0, 3.0]), np.array([0.001, 0.5, 0.001, 0.001]), 4, 1)
    f = fe.sampler(0)
    assert [f(t) for t in (0.5, 1.0, 1.9, 2.5)] == [0.001, 0.5, 0.5, 0.001]
    shifted = [fe.sampler(s)(1.5) for s in range(1, 30)]
    assert min(shifted) == 0.001 and max(shifted) == 0.5     # the burst lands elsewhere under other seeds


class Flat:
    gap_s = 0.0

    def step_s(self, shape):
        return 0.010


def test_replay_adds_the_delay_and_keeps_each_stream_in_order():
    req = [RequestSpec("a", 0.0, 10, 6)]
    cfg, cache = SchedulerConfig(max_num_batched_tokens=64), CacheConfig()
    base = replay(req, ModelTiming(Flat()), cfg, cache, 4096)
    const = replay(req, ModelTiming(Flat()), cfg, cache, 4096, frontend=lambda t: 0.005)
    assert const.ttft_s.tolist() == pytest.approx((base.ttft_s + 0.005).tolist())
    assert const.itl_s.tolist() == pytest.approx(base.itl_s.tolist())
    # tokens made at 20-40 ms are held until 45 ms: one 35 ms gap, then a burst, never a negative ITL
    burst = replay(req, ModelTiming(Flat()), cfg, cache, 4096,
                   frontend=lambda t: 0.045 - t if 0.015 < t < 0.045 else 0.0)
    assert burst.itl_s.tolist() == pytest.approx([0.035, 0.0, 0.0, 0.005, 0.010])


def test_a_step_with_several_prefill_requests_ends_the_chain():
    # budget 512: a long prompt chunked 500 + 500, its 100-token tail shares a cut step with a new
    # prompt (2 prefill requests), which then continues with a chain of its own
    rows = pd.DataFrame({"prefill_tokens": [500.0, 500.0, 500.0, 500.0, 300.0],
                         "prefill_reqs": [1.0, 1.0, 2.0, 1.0, 1.0],
                         "decode_rows": [12.0] * 5})
    shapes = cost_model.estimated_shapes(rows, kv_tokens=10_000)
    assert [s.prefill_ctx for s in shapes] == [0.0, 500 * 500, 1000 * 250, 250 * 500, 750 * 300]
    assert [s.prefill_sq for s in shapes] == [250000.0, 250000.0, 2 * 250.0 ** 2, 250000.0, 90000.0]


def test_tune_of_the_real_capture_reports_the_front_end_delay(capsys):
    assert main(["tune", str(FIX / "client.jsonl"), str(FIX / "iterations.log"), "--knob", "chunk_size=512,1024",
                 "--current", "chunk_size=512", "--json", "--jobs", "1"]) == 0
    doc = json.loads(capsys.readouterr().out)
    fe = doc["frontend_delay"]
    assert fe["requests"] == 22 and fe["tokens"] == 2537        # every request with tokens placed on the steps
    assert 0 <= fe["lag_p50_s"] < 0.05 and fe["lag_p99_s"] >= fe["lag_p50_s"]
    # the excerpt's front end stalled (a client-wide 1.6 s gap): reported, and not carried into the delay
    assert fe["stalls"] >= 1 and fe["stalled_s"] > 1.0 and fe["lag_max_s"] < 0.5
    assert any(n.startswith("client token times joined to the engine's steps") for n in doc["notes"])
    # the steps are vLLM's own records: a chunk's own attention is fitted as causal (cpu_attn's tiles)
    assert any(n.startswith("steps from vLLM's own records") for n in doc["notes"])
    assert doc["cost_model"]["triangle"] == 0.5


@pytest.mark.parametrize("meta, want", [
    ({"instance_sources": {"e": {"sources": [{"format": "client-load", "role": "client"},
                                             {"format": "vllm-log", "role": "log"}]}}}, "vllm-log"),
    ({"instance_sources": {"e": {"sources": [{"format": "vllm-log", "role": "log"},
                                             {"format": "sglang-log", "role": "log"}]}}}, None),   # which one: unknown
    ({"source": "mixdiag-run"}, "mixdiag-run"),    # the reference engine's own run: the dense prior stays
])
def test_step_format_names_where_the_fitted_steps_came_from(meta, want):
    from types import SimpleNamespace

    from mixdiag.tuning import sweep

    rows = pd.DataFrame({"instance": ["e"]})
    assert sweep._step_format(SimpleNamespace(meta=meta), rows) == want


def _steps(source: str, n: int = 12) -> pd.DataFrame:
    t = 10.0 + 0.02 * np.arange(n)
    return pd.DataFrame({"instance": "e", "granularity": "step", "kind": "decode", "t_start_s": t, "t_end_s": t + 0.01,
                         "prefill_tokens": 0.0, "decode_rows": 4.0, "step_source": source})


@pytest.mark.parametrize("joined_source, want_steps_from", [("client", "log"), ("log", "joined")])
def test_steps_come_from_the_engines_own_records_when_the_join_rebuilt_them_from_the_client(joined_source,
                                                                                        want_steps_from):
    from types import SimpleNamespace

    from mixdiag.tuning import sweep

    tokens = pd.DataFrame({"instance": "e", "request_id": "r", "t_s": [10.01], "n_tokens": 1})
    joined = SimpleNamespace(steps=_steps(joined_source), tokens=tokens, meta={})
    inputs = {"client.jsonl": SimpleNamespace(steps=_steps("client"), tokens=tokens, meta={}),
              "iterations.log": SimpleNamespace(steps=_steps("log"), tokens=tokens.iloc[:0], meta={})}
    step_tl, traffic_tl = sweep.sources(joined, inputs.__getitem__, list(inputs))
    if want_steps_from == "log":
        assert step_tl is inputs["iterations.log"] and traffic_tl is joined
    else:   # the log is the spine: nothing to change, requests from the joined tokens
        assert step_tl is joined and traffic_tl is None
