"""mixdiag/diagnosis/detection/interval_spikes.py and the interval rules that read it: tail, shift and
starved intervals on rows shaped like 1 s scrapes of a vLLM/SGLang server."""
import numpy as np
import pandas as pd
import pytest

from mixdiag.diagnosis.config import RegimeConfig, SpikeConfig
from mixdiag.diagnosis.detection.interval_spikes import interval_spikes, starved_rows
from mixdiag.diagnosis.rules.rule_context import off_graph_dominates


def rows(p50, p99, out=None, running=None, prefill=None):
    n = len(p50)
    return pd.DataFrame({
        "t_start_s": np.arange(n, dtype=float), "t_end_s": np.arange(n, dtype=float) + 1.0,
        "itl_p50_s": p50, "itl_p99_s": p99, "itl_count": [0.0 if np.isnan(x) else 100.0 for x in p50],
        "output_tokens": out if out is not None else [0.0 if np.isnan(x) else 100.0 for x in p50],
        "running_reqs": running if running is not None else [32.0] * n,
        "prefill_tokens": prefill if prefill is not None else [0.0] * n})


N = np.nan
CALM = [0.02] * 8


@pytest.mark.parametrize("name,p50,p99,prefill,want_spike,want_starved,want_shift", [
    ("tail: a few tokens waited 5x", CALM + [0.02] + CALM, CALM + [0.10] + CALM, None, {8}, set(), set()),
    ("shift: the typical token slowed 1.8x, P99 held under a bucket edge", CALM + [0.036] + CALM,
     [0.03] * 8 + [0.038] + [0.03] * 8, None, {8}, set(), set([8])),
    ("no spike: P50 1.2x", CALM + [0.024] + CALM, [0.03] * 17, None, set(), set(), set()),
    ("starved: no token for 2 s while prompts ran, resumed with a 2.5 s ITL", CALM + [N, N, 0.02] + CALM,
     CALM + [N, N, 2.5] + CALM, [0.0] * 8 + [2048.0, 2048.0, 100.0] + [0.0] * 8, {8, 9, 10}, {8, 9}, set()),
    ("not starved: nobody logged the wait (running requests were all prefilling)", CALM + [N, N, 0.02] + CALM,
     CALM + [N, N, 0.03] + CALM, [0.0] * 8 + [2048.0, 2048.0, 100.0] + [0.0] * 8, set(), set(), set()),
    ("not starved: idle (no prompt computed), stale running gauge", CALM + [N, N, 0.02] + CALM,
     CALM + [N, N, 2.5] + CALM, None, {10}, set(), set()),
])
def test_interval_spike_kinds(name, p50, p99, prefill, want_spike, want_starved, want_shift):
    sig = rows(np.array(p50, dtype=float), np.array(p99, dtype=float), prefill=prefill)
    got = interval_spikes(sig, 2.0, SpikeConfig())
    assert set(np.flatnonzero(got.is_spike.to_numpy())) == want_spike, name
    assert set(np.flatnonzero(got.starved.to_numpy())) == want_starved, name
    assert set(np.flatnonzero(got.shift.to_numpy())) == want_shift, name
    for i in want_starved:  # a starved interval is felt for its whole duration (a lower bound)
        assert got.latency_s.iloc[i] == 1.0


@pytest.mark.parametrize("name,preempted,floor_s,want", [
    ("a preemption, its request's next token waited 10 decode passes", {8}, 0.20, {8}),
    ("the preemption counted one interval before the token came back", {7}, 0.20, {8}),
    ("preempted two intervals before: not this token's wait", {6}, 0.20, set()),
    ("a long token but no preemption counted: no spike from one token", set(), 0.20, set()),
    ("a preemption whose token waited under 2x the baseline", {8}, 0.03, set()),
])
def test_a_preempted_requests_lone_long_token_spikes(name, preempted, floor_s, want):
    """vLLM V1 preempts by recompute and the request's next ITL spans the wait: one token among the
    interval's hundreds, under every quantile; the highest ITL bucket that grew shows it."""
    sig = rows(np.array(CALM + [0.02] + CALM), np.array([0.03] * 17))
    sig["itl_tail_floor_s"] = [0.025] * 17
    sig.loc[8, "itl_tail_floor_s"] = floor_s
    sig["preempt"] = [i in preempted for i in range(17)]
    got = interval_spikes(sig, 2.0, SpikeConfig())
    assert set(np.flatnonzero(got.is_spike.to_numpy())) == want, name
    for i in want:
        assert got.latency_s.iloc[i] == floor_s


def test_fault_intervals_do_not_set_the_baseline():
    # a 5-interval EP hotspot window (P50 1.6x) inside 12 calm intervals: with the imbalance-flagged
    # intervals out of the baseline, every one of them stands out
    p50 = [0.02] * 6 + [0.032] * 5 + [0.02] * 6
    sig = rows(np.array(p50), np.array([0.038] * 17))
    faulty = pd.Series([False] * 6 + [True] * 5 + [False] * 6)
    assert set(np.flatnonzero(interval_spikes(sig, 2.0, SpikeConfig(), faulty).is_spike)) == set(range(6, 11))


def test_starved_confirmation_looks_past_idle_intervals():
    sig = rows(np.array([0.02, N, N, 0.02]), np.array([0.03, N, N, 1.8]), out=[100.0, 0.0, 0.0, 100.0],
               prefill=[0.0, 1000.0, 0.0, 0.0])
    sig.loc[2, "running_reqs"] = 0.0  # the second interval: nothing running, nothing computed
    assert list(starved_rows(sig, sig["itl_p99_s"].notna(), SpikeConfig().starve_confirm)) == [False, True, False, False]


@pytest.mark.parametrize("row,want", [
    ({"graph_off_decode_steps": 8.0, "fused_mixed_steps_in_interval": 2.0, "prefill_tokens": 30.0, "running_reqs": 16.0}, True),
    ({"graph_off_decode_steps": 8.0, "fused_mixed_steps_in_interval": 2.0, "prefill_tokens": 1024.0, "running_reqs": 16.0}, False),
    ({"graph_off_decode_steps": 1.0, "fused_mixed_steps_in_interval": 4.0, "prefill_tokens": 20.0, "running_reqs": 16.0}, False),
    ({"graph_off_decode_steps": 3.0, "mixed_steps": 0.0, "prefill_tokens": 0.0, "running_reqs": 16.0}, True),
    ({"graph_off_decode_steps": 3.0, "prefill_tokens": 20.0, "running_reqs": 16.0}, False),  # mixed steps unknown
    ({"graph_off_decode_steps": 0.0, "mixed_steps": 0.0}, False),
])
def test_off_graph_dominates(row, want):
    assert off_graph_dominates(row) is want


def test_starved_intervals_are_prefill_stalls_end_to_end():
    """Scrape rows of an SGLang server without mixed chunk: prefill batches ran alone for 2 s while
    32 requests waited (no token, no ITL), then the waiters resumed with a 2.4 s ITL."""
    from mixdiag.diagnosis import diagnose
    from mixdiag.schema import Timeline
    stalled = (10, 11)
    rows = [dict(instance="srv", step=i, t_start_s=float(i), t_end_s=i + 1.0, granularity="interval", kind="unknown",
                 prefill_tokens=2048.0 if i in stalled else 0.0, running_reqs=32.0,
                 output_tokens=0.0 if i in stalled else 600.0, itl_count=0.0 if i in stalled else 600.0,
                 itl_p50_s=np.nan if i in stalled else 0.03, itl_p99_s=np.nan if i in stalled else (2.4 if i == 12 else 0.04))
            for i in range(24)]
    d = diagnose(Timeline(pd.DataFrame(rows), None, meta={}))
    by_step = dict(zip(d.spikes["step"], d.spikes["cause"]))
    assert by_step[10] == by_step[11] == "prefill_stall"
    assert "mixing" not in by_step.values()


def test_hotspot_window_edges_are_ep_hotspot_with_lower_confidence():
    """EPLB balancedness is a mean over the interval's forwards: a window that starts mid-interval
    reads diluted (1.4 against the usual 1.1) next to the full window (4.0)."""
    from mixdiag.diagnosis import diagnose
    from mixdiag.schema import Timeline
    imb = {9: 1.4, 10: 4.0, 11: 4.0, 12: 1.4, 18: 1.4}  # 18: raised, but no hotspot beside it
    rows = [dict(instance="srv", step=i, t_start_s=float(i), t_end_s=i + 1.0, granularity="interval", kind="decode",
                 prefill_tokens=0.0, running_reqs=32.0, output_tokens=600.0, itl_count=600.0,
                 itl_p50_s=0.03, itl_p99_s=0.2 if i in imb else 0.04, expert_imbalance=imb.get(i, 1.1))
            for i in range(24)]
    sp = diagnose(Timeline(pd.DataFrame(rows), None, meta={})).spikes.set_index("step")
    assert set(sp.loc[[9, 10, 11, 12], "cause"]) == {"ep_hotspot"}
    assert sp.loc[9, "confidence"] < sp.loc[10, "confidence"] and sp.loc[9, "confidence"] <= 0.5
    assert sp.loc[18, "cause"] == "unknown"


@pytest.mark.parametrize("regimes,want", [
    (RegimeConfig(), set(range(20, 30))),  # the stretch is judged against the healthy intervals around it
    (None, set()),                          # the rolling baseline alone learns it as the norm
])
def test_a_sustained_stretch_does_not_become_its_own_baseline(regimes, want):
    """Ten scrape intervals of a stream of long prompts (typical token 2.5x slower) among 40 calm ones
    (tier e2 tuning captures: 105 of 168 vLLM intervals with visible mixing got no spike)."""
    p50 = np.array([0.02 + 0.0005 * (i % 3) for i in range(50)])
    p50[20:30] = 0.05
    p99 = p50 * 1.3
    got = interval_spikes(rows(p50, p99), 2.0, SpikeConfig(), regimes=regimes)
    assert set(np.flatnonzero(got.is_spike.to_numpy())) == want


@pytest.mark.parametrize("row,want", [
    # SGLang counts passes by graph mode and kind (cuda_graph_passes_total): 25 of 27 forwards were eager
    # decodes beside 2 extend passes of 123 prompt tokens in all - the eager passes dominate
    ({"graph_off_decode_steps": 25.0, "graph_full_steps": 0.0, "graph_piecewise_steps": 0.0, "graph_none_steps": 27.0,
      "large_step_share": 2 / 27, "prefill_tokens": 123.0, "decode_rows": 1224.0}, True),
    # the same passes with a 3000-token prompt among them: the chunk is no small addition
    ({"graph_off_decode_steps": 25.0, "graph_full_steps": 0.0, "graph_piecewise_steps": 0.0, "graph_none_steps": 27.0,
      "large_step_share": 2 / 27, "prefill_tokens": 3000.0, "decode_rows": 1224.0}, False),
    # no kind split of the passes: nothing to weigh
    ({"graph_off_decode_steps": 25.0, "graph_none_steps": 27.0, "prefill_tokens": 123.0}, False),
    # prompt tokens counted but no extend pass: a counter of decode passes only (older SGLang), not 'no prefill'
    ({"graph_off_decode_steps": 25.0, "graph_full_steps": 0.0, "graph_piecewise_steps": 0.0, "graph_none_steps": 25.0,
      "large_step_share": 0.0, "prefill_tokens": 3000.0, "decode_rows": 1224.0}, False),
])
def test_off_graph_dominates_from_pass_counts(row, want):
    assert off_graph_dominates(row, chunk_min_tokens=256.0) is want


@pytest.mark.parametrize("prompt,want", [(200.0, "unknown"), (2000.0, "mixing")])
def test_prefill_work_under_one_chunk_is_no_mixing(prompt, want):
    """Prompt work far above the usual 20 tokens per interval beside a spike: 200 tokens in all cannot have
    formed a chunk of chunk_min_tokens (each short prompt costs about one decode pass), 2000 can."""
    from mixdiag.diagnosis import diagnose
    from mixdiag.schema import Timeline
    rows = [dict(instance="srv", step=i, t_start_s=float(i), t_end_s=i + 1.0, granularity="interval", kind="unknown",
                 prefill_tokens=prompt if i == 12 else 20.0, running_reqs=32.0, output_tokens=600.0, itl_count=600.0,
                 itl_p50_s=0.03, itl_p99_s=0.2 if i == 12 else 0.04)
            for i in range(24)]
    sp = diagnose(Timeline(pd.DataFrame(rows), None, meta={})).spikes.set_index("step")
    assert sp.loc[12, "cause"] == want


@pytest.mark.parametrize("name, floor_s, ahead, want", [
    ("a 512-token chunk beside 6 decodes: their 6 tokens waited 2.5x, under the P99", 0.025, 504.0, {8}),
    ("the same slow tokens, no large chunk in the iteration histogram", 0.025, 40.0, set()),
    ("a wait far beyond what this server's chunk intervals show: not the chunk's", 0.40, 504.0, set()),
    ("a chunk whose tokens stayed under 2x the baseline", 0.015, 504.0, set()),
])
def test_a_chunks_lone_slow_tokens_spike(name, floor_s, ahead, want):
    """vLLM V1 runs the chunk in one step with every running decode: one slow token per running request. With
    6 running, an interval of 300 tokens holds 6 of them (2 %), under its P99 - the highest ITL bucket that grew
    shows them (real vLLM tier g at 6 req/s). The instance's other chunk intervals (0.025 s tails) say what a
    chunk step costs here; a 0.4 s wait is not one."""
    sig = rows(np.array([0.01] * 17), np.array([0.01] * 17), running=[6.0] * 17)
    sig["itl_tail_floor_s"] = [0.01] * 17
    sig["prompt_chunk_ahead_tokens"] = [0.0] * 17
    for i in (2, 5, 12, 15):  # the instance's other chunk intervals, spiked by their P99 (more decodes waited)
        sig.loc[i, ["itl_tail_floor_s", "prompt_chunk_ahead_tokens", "itl_p99_s"]] = [0.025, 504.0, 0.03]
    sig.loc[8, ["itl_tail_floor_s", "prompt_chunk_ahead_tokens"]] = [floor_s, ahead]
    got = interval_spikes(sig, 2.0, SpikeConfig(), chunk_min=256.0)
    assert set(np.flatnonzero(got.chunk_tail.to_numpy())) == want, name
    assert 8 in set(np.flatnonzero(got.is_spike.to_numpy())) or not want, name
    for i in want:
        assert got.latency_s.iloc[i] == floor_s
    # without chunk_min (a caller that reads no iteration histogram) no chunk tail is looked for
    assert not interval_spikes(sig, 2.0, SpikeConfig()).is_spike.iloc[8]


def test_a_chunk_tail_is_a_mixing_spike_that_says_it_is_the_tail_alone():
    """End to end on scrape-shaped rows of a lightly loaded vLLM (4-6 running, P50 and P99 at the 10 ms bucket edge):
    the interval whose iteration histogram holds a 504-token chunk and whose slowest tokens reached the 25 ms bucket
    is a mixing spike, and its evidence says the P99 did not move; the same tail without a chunk is no spike."""
    from mixdiag.diagnosis import diagnose
    from mixdiag.schema import Timeline
    rows = []
    for i in range(30):
        chunk = i in (6, 14, 22)
        rows.append(dict(instance="srv", step=i, t_start_s=float(i), t_end_s=i + 1.0, granularity="interval",
                         kind="unknown", prefill_tokens=700.0 if chunk else 150.0, running_reqs=6.0, output_tokens=400.0,
                         itl_count=400.0, itl_p50_s=0.01, itl_p99_s=0.01, itl_mean_s=0.006,
                         itl_tail_floor_s=0.025 if chunk or i == 18 else 0.01,
                         iteration_tokens_floor=512.0 if chunk else 128.0,
                         prompt_chunk_ahead_tokens=504.0 if chunk else 120.0))
    sp = diagnose(Timeline(pd.DataFrame(rows), None, meta={})).spikes.set_index("step")
    for i in (6, 14, 22):
        assert sp.loc[i, "cause"] == "mixing", sp.loc[i, "evidence"]
        assert "tail_only" in sp.loc[i, "evidence"]
    assert 18 not in sp.index  # a slow token with no chunk measured near it: nothing says what it was
