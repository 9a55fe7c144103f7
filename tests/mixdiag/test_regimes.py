"""Regimes (issue 23): a healthy reference a sustained fault cannot move, episodes, the split of excess by
cause, saturation. Hand-built inputs whose answers are known (diag_cases.py's decode stream)."""
from __future__ import annotations

import itertools
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
import diag_cases as dc  # noqa: E402

from mixdiag.diagnosis import diagnose  # noqa: E402
from mixdiag.diagnosis.config import RegimeConfig  # noqa: E402
from mixdiag.diagnosis.detection.regimes import find_episodes, low_side_reference, reference  # noqa: E402
from mixdiag.diagnosis.rules.decomposition import SPLIT_CAUSES, features, nnls, split  # noqa: E402
from mixdiag.schema import Timeline  # noqa: E402


def _hotspot(n=700, start=300, length=150):
    faults = {k: dict(expert_imbalance=4.0, dur=0.050) for k in range(start, start + length)}
    faults[100] = dict(kind="mixed", prefill_tokens=512, prefill_reqs=1, dur=0.110, graph_mode="PIECEWISE", sm_active=0.95)
    faults[550] = dict(gap=0.100)
    return dc.build(n, faults)


def test_a_150_step_ep_hotspot_is_one_episode_with_ep_as_its_cause():
    d = diagnose(_hotspot())
    ep = d.regimes.episodes
    assert len(ep) == 1
    e = ep.iloc[0]
    assert e["cause"] == "ep_hotspot" and e["shares"]["ep_hotspot"] > 0.8
    assert abs(e["step_start"] - 300) <= 3 and abs(e["step_end"] - 449) <= 3
    assert "episode" in d.verdict and "ep_hotspot" in d.verdict
    doc = d.to_json()["regimes"]
    assert doc["episodes"][0]["cause"] == "ep_hotspot"
    assert max(doc["excess"]["shares"], key=doc["excess"]["shares"].get) == "ep_hotspot"


def test_a_host_stall_inside_an_ep_hotspot_is_an_episode_of_its_own():
    """Faults overlap: a 40-step host stall (100 ms before each step, measured) in the middle of a 200-step EP
    hotspot. The elevated stretch is one episode named by its largest cause; the stall's rows, where the host
    gap carries most of each row's excess, are an episode of their own inside it (nested_episodes.py)."""
    faults = {k: dict(expert_imbalance=4.0, dur=0.050) for k in range(300, 500)}
    for k in range(380, 420):
        faults[k] = dict(expert_imbalance=4.0, dur=0.050, gap=0.100)
    ep = diagnose(dc.build(700, faults)).regimes.episodes
    outer = ep[ep["cause"] == "ep_hotspot"]
    inner = ep[ep["cause"] == "host_stall"]
    assert len(outer) == 1 and len(inner) == 1
    i = inner.iloc[0]
    assert abs(i["step_start"] - 380) <= 3 and abs(i["step_end"] - 419) <= 3
    assert i["shares"]["host_stall"] >= 0.5 and "inside episode" in i["why"]
    assert outer.iloc[0]["step_start"] <= i["step_start"] and i["step_end"] <= outer.iloc[0]["step_end"]


def test_nested_runs_need_min_rows_and_bridge_short_gaps():
    from mixdiag.diagnosis.rules.nested_episodes import nested_runs
    # columns: cause 0, cause 1, unknown; cause 1 leads rows 10-17 but for row 13 (a gap of 1, bridged), then
    # rows 22-25 after a gap of 4 rows (too long to bridge): 4 rows, too short for an episode
    parts = np.zeros((30, 3))
    parts[:, 0] = 1.0
    parts[[10, 11, 12, 14, 15, 16, 17, 22, 23, 24, 25], 1] = 3.0
    runs = nested_runs(parts, 0, 29, parent=0, name_share=0.25, cfg=RegimeConfig(min_rows=5, merge_gap_rows=3))
    assert runs == [(10, 17, 1)]


def test_isolated_spikes_make_no_episode():
    faults = {k: dict(kind="mixed", prefill_tokens=512, prefill_reqs=1, dur=0.110) for k in range(20, 600, 7)}
    d = diagnose(dc.build(620, faults))
    assert len(d.regimes.episodes) == 0
    assert d.by_cause["mixing"] > 50


@pytest.mark.parametrize("fault_share", [0.0, 0.3, 0.6])
def test_the_reference_is_not_moved_by_a_sustained_fault(fault_share):
    rng = np.random.default_rng(3)
    lat = rng.normal(0.020, 0.001, 2000)
    lat[: int(fault_share * len(lat))] *= 2.5
    centre, sigma = low_side_reference(lat)
    assert centre == pytest.approx(0.020, rel=0.03)
    assert sigma == pytest.approx(0.001, rel=0.35)


def test_strata_get_their_own_reference():
    lat = np.r_[np.full(100, 0.010), np.full(100, 0.030)] + np.tile([0, 1e-4], 100)
    centre, _ = reference(lat, np.r_[np.zeros(100), np.ones(100)], cfg=RegimeConfig(min_stratum_rows=30))
    assert centre[0] == pytest.approx(0.010, rel=0.02) and centre[-1] == pytest.approx(0.030, rel=0.02)


@pytest.mark.parametrize("big_batch_s, capped", [
    (0.030, False),   # 15 -> 33 running, 10 -> 30 ms: within what the batch explains (x2.2 x 1.5 margin)
    (0.150, True),    # 15 -> 33 running, 10 -> 150 ms: a fault as long as the stratum (a long-prompt stream)
])
def test_a_stratum_reference_grows_at_most_with_its_batch(big_batch_s, capped):
    """A healthy decode step reads the weights once per batch and each row's KV: its time grows at most
    linearly with the batch. A larger-batch stratum whose every row is slower than that is no reference."""
    lat = np.r_[np.full(100, 0.010), np.full(100, big_batch_s)] + np.tile([0, 1e-4], 100)
    batch = np.r_[np.full(100, 15.0), np.full(100, 33.0)]
    strata = np.floor(np.log2(batch)).astype(int)
    centre, _ = reference(lat, strata, cfg=RegimeConfig(min_stratum_rows=30), batch=batch)
    assert centre[0] == pytest.approx(0.010, rel=0.02)
    bound = 0.010 * 33 / 15 * RegimeConfig().stratum_growth_margin
    assert centre[-1] == pytest.approx(bound if capped else big_batch_s, rel=0.02)
    no_batch, _ = reference(lat, strata, cfg=RegimeConfig(min_stratum_rows=30))   # without the batch: its own
    assert no_batch[-1] == pytest.approx(big_batch_s, rel=0.02)


def test_episode_excess_is_weighted_token_time():
    lat = np.r_[np.full(50, 0.01), np.full(20, 0.03), np.full(50, 0.01)]
    ep = find_episodes("e", np.arange(120.0), lat, np.full(120, 0.01), np.full(120, 1e-4), weight=np.full(120, 4.0))
    assert len(ep) == 1 and ep.iloc[0]["rows"] == 20
    assert ep.iloc[0]["excess_s"] == pytest.approx(20 * 0.02 * 4)


def test_nnls_matches_a_brute_force_search():
    rng = np.random.default_rng(0)
    x = np.abs(rng.normal(size=(60, 3)))
    y = x @ np.array([0.5, 0.0, 2.0]) + rng.normal(0, 0.05, 60)
    w = rng.uniform(1, 3, 60)
    b = nnls(x, y, w)
    best = None  # every active set, solved by weighted least squares, kept where feasible
    for k in range(1, 4):
        for cols in itertools.combinations(range(3), k):
            sw = np.sqrt(w)
            sol, *_ = np.linalg.lstsq(x[:, cols] * sw[:, None], y * sw, rcond=None)
            if (sol >= 0).all():
                full = np.zeros(3)
                full[list(cols)] = sol
                cost = float(np.sum(w * (x @ full - y) ** 2))
                best = (cost, full) if best is None or cost < best[0] else best
    assert np.allclose(b, best[1], atol=1e-6)


def _row(**kw):
    base = dict(has_prefill=False, has_decode=True, decodes_before=True, prefill_tokens=0.0, graph_off=False,
                preempted_reqs=0.0, gap_excess_s=0.0, expert_imbalance=1.1, kv_transfer_s=0.0, kv_transfer_bytes=0.0)
    base.update(kw)
    return base


def test_a_row_with_a_host_stall_and_a_mixed_step_names_both_with_shares():
    rows = [_row() for _ in range(40)]
    for i in range(5, 40, 5):  # mixed steps cost 0.1 ms per prompt token; stalls cost their gap
        rows[i] = _row(has_prefill=True, prefill_tokens=512.0)
    for i in range(7, 40, 6):
        rows[i] = _row(gap_excess_s=0.040)
    rows[20] = _row(has_prefill=True, prefill_tokens=512.0, gap_excess_s=0.040)
    frame = pd.DataFrame(rows)
    f = features(frame, "step")
    lat = 0.020 + 0.0001 * frame["prefill_tokens"].to_numpy() * frame["has_prefill"] + frame["gap_excess_s"].to_numpy()
    parts = split(lat, np.full(len(lat), 0.020), np.ones(len(lat)), f)
    both = parts[20]
    names = SPLIT_CAUSES + ("unknown",)
    share = dict(zip(names, both / both.sum()))
    assert share["mixing"] == pytest.approx(0.0512 / 0.0912, abs=0.02)
    assert share["host_stall"] == pytest.approx(0.040 / 0.0912, abs=0.02)
    assert parts.sum() == pytest.approx(np.clip(lat - 0.020, 0, None).sum())  # never more than the excess


@pytest.mark.parametrize("granularity", ["step", "interval"])
def test_routed_token_imbalance_counts_beside_a_prompt_chunk_but_timing_skew_does_not(granularity):
    """A rank slower than its peers while it holds a prompt chunk is mixing's cost (DP attention): that timing
    skew adds no EP feature. The engine's count of routed tokens per EP rank (vLLM's EPLB line, SGLang's
    balancedness) is no timing, and an interval of 1 s nearly always admits some prompt: it counts there too."""
    rows = [_row(has_prefill=(i % 2 == 0), prefill_tokens=64.0 * (i % 2 == 0), t_start_s=float(i), t_end_s=i + 1.0)
            for i in range(20)]
    frame = pd.DataFrame(rows)
    frame.loc[10, "expert_imbalance"] = 3.3   # a prompt row (i even) with a hot expert rank
    frame["rank_skew"] = 1.0
    frame.loc[12, "rank_skew"] = 2.0          # a prompt row whose rank was merely slower
    frame.loc[13, "rank_skew"] = 2.0          # a decode-only row whose rank was slower
    f = features(frame, granularity)[:, SPLIT_CAUSES.index("ep_hotspot")]
    assert f[10] == pytest.approx(3.3 / 1.1 - 1.0)
    assert f[12] == 0 and f[13] == pytest.approx(1.0)
    assert (np.delete(f, [10, 13]) == 0).all()


def test_an_estimated_signal_adds_no_feature():
    frame = pd.DataFrame([_row(has_prefill=True, prefill_tokens=512.0, rq_token_allocation="estimated"),
                          _row(has_prefill=True, prefill_tokens=512.0, rq_token_allocation="measured")])
    f = features(frame, "step")
    assert f[0, SPLIT_CAUSES.index("mixing")] == 0 and f[1, SPLIT_CAUSES.index("mixing")] == 512


def _saturated() -> Timeline:
    tl = dc.build(300)
    st = tl.steps.copy()
    st["running_reqs"] = 8.0
    st["waiting_reqs"] = np.where(np.arange(len(st)) > 30, 5.0, 0.0)
    return Timeline(st, tl.tokens, meta=tl.meta)


def test_a_saturated_server_is_the_headline():
    d = diagnose(_saturated())
    assert d.verdict.startswith("Saturated")
    assert d.regimes.saturation["engine0"]["saturated"]


def test_a_queue_that_clears_is_not_saturation():
    tl = dc.build(300)
    st = tl.steps.copy()
    st["running_reqs"] = 8.0
    st["waiting_reqs"] = np.where(np.arange(len(st)) % 10 == 0, 2.0, 0.0)
    d = diagnose(Timeline(st, tl.tokens, meta=tl.meta))
    assert not d.regimes.saturation["engine0"]["saturated"] and "Saturated" not in d.verdict


def test_spikes_carry_their_shares_in_json():
    doc = diagnose(dc.build()).to_json()
    mixing = [s for s in doc["spikes"] if s["cause"] == "mixing"]
    assert mixing and all("shares" in s for s in doc["spikes"])
    assert max(mixing[0]["shares"], key=mixing[0]["shares"].get) == "mixing"


def test_every_step_of_a_sustained_hotspot_spikes_with_its_cause():
    # 150 steps at 2.5x: a 41-step rolling median would take the stretch as its norm and leave its middle
    # unseen; rows of an episode are no baseline reference rows, so every step of it is judged against the
    # healthy steps around it (detection/step_view.py) and carries the evidence of its own row
    d = diagnose(_hotspot())
    st = d.steps.set_index("step")
    hot = st.loc[300:449]
    assert hot["is_spike"].all(), hot.index[~hot["is_spike"]].tolist()
    assert (hot["cause"] == "ep_hotspot").all(), hot["cause"].value_counts()
    assert st.loc[300:449, "baseline_s"].max() < 0.03   # the healthy level (20 ms), not the fault's 50 ms
    quiet = st.drop(index=list(range(300, 450)) + [100, 550])
    assert not quiet["is_spike"].any()


def test_a_sustained_fallback_at_a_batch_size_no_healthy_step_ran_is_a_fallback_episode():
    # decode batches above the largest captured size run eager (vLLM CudagraphDispatcher: no FULL key) for 150
    # steps; that batch-size stratum holds only fallback rows, so read as its own reference it would hide the
    # stretch - the regime reference comes from the spike baseline's healthy rows (decode, usual graph mode)
    rng = np.random.default_rng(4)
    rows, t = [], 100.0
    for i in range(500):
        fb = 200 <= i < 350
        reqs = 300.0 if fb else 100.0 + (i % 7)
        dur = (0.05 if fb else 0.02) * rng.uniform(0.98, 1.02)
        rows.append(dict(instance="e", step=i, t_start_s=t + 0.0005, t_end_s=t + 0.0005 + dur, granularity="step",
                         kind="decode", prefill_tokens=0.0, decode_rows=reqs, decode_reqs=reqs,
                         graph_mode="NONE" if fb else "FULL", graph_replayed=1.0, q_token_allocation="measured",
                         q_graph_mode="measured"))
        t += 0.0005 + dur
    d = diagnose(Timeline(pd.DataFrame(rows), None, meta={}))
    ep = d.regimes.episodes
    assert len(ep) == 1 and ep.iloc[0]["cause"] == "graph_fallback", ep
    assert abs(ep.iloc[0]["step_start"] - 200) <= 3 and abs(ep.iloc[0]["step_end"] - 349) <= 3


def _stretch_of_intervals(inside: dict, outside: dict) -> Timeline:
    """100 one-second intervals of 16 running requests; intervals 10-89 slower (P50 50 ms against 20 ms) with
    the columns ``inside``, the rest with ``outside``."""
    rows = []
    for i in range(100):
        slow = 10 <= i < 90
        rows.append(dict(instance="srv", step=i, t_start_s=float(i), t_end_s=i + 1.0, granularity="interval",
                         kind="unknown", running_reqs=16.0, itl_count=400.0, itl_mean_s=0.05 if slow else 0.02,
                         itl_p50_s=0.05 if slow else 0.02, itl_p99_s=0.06 if slow else 0.025,
                         **(inside if slow else outside)))
    return Timeline(pd.DataFrame(rows), None, meta={})


def test_interval_reference_skips_intervals_with_a_measured_fault():
    """Intervals where a counter measured a fault (here a KV transfer) are no healthy reference for the
    regime stage either: with transfers in 80 % of the intervals, the low side of all intervals would be
    the transfer level and the transfer stretch no episode."""
    d = diagnose(_stretch_of_intervals(dict(kv_transfer_bytes=4e6, kv_transfer_s=0.03),
                                       dict(kv_transfer_bytes=0.0, kv_transfer_s=0.0)))
    assert d.regimes.reference["srv"]["reference_s"] == pytest.approx(0.02, rel=0.05)
    eps = d.regimes.episodes
    assert len(eps) == 1 and eps.iloc[0]["rows"] >= 70 and eps.iloc[0]["cause"] == "pd_transfer"


@pytest.mark.parametrize("floor_tokens, want_ref", [(16.0 + 512.0, 0.02), (16.0 + 64.0, 0.05)])
def test_interval_reference_skips_intervals_where_a_large_chunk_ran(floor_tokens, want_ref):
    """vLLM's iteration-tokens histogram holding a step of batch + 256 tokens or more says a large prompt chunk
    ran beside the decodes in that interval: no healthy decode interval. A stream of long prompts in 80 % of the
    intervals made the mixed level the reference (e2 tuning seed 24: the first minute's mixing set the
    baseline, and the EP hotspot after it did not spike). Short prompts (batch + 64) leave the reference alone."""
    d = diagnose(_stretch_of_intervals(dict(iteration_tokens_floor=floor_tokens, prefill_tokens=2048.0),
                                       dict(iteration_tokens_floor=16.0, prefill_tokens=0.0)))
    assert d.regimes.reference["srv"]["reference_s"] == pytest.approx(want_ref, rel=0.05)


@pytest.mark.parametrize("name,inside,want", [
    # vLLM runs batches of 16 tokens or more without a graph here (its CUDA-graph table): 16 decoding -> eager
    ("the running batch ran eager, no chunk beside it", dict(graph_none_min_tokens=16.0, iteration_tokens_floor=16.0,
                                                               large_step_share=0.0), "graph_fallback"),
    # every step held a 512-token chunk: mixed steps leave the FULL graph by design, their cost is mixing's
    ("a large chunk in every step of the interval", dict(graph_none_min_tokens=16.0, iteration_tokens_floor=528.0,
                                                        large_step_share=1.0, prefill_tokens=2048.0), "mixing"),
])
def test_a_vllm_eager_stretch_is_a_graph_fallback_episode(name, inside, want):
    """vLLM's interval rows carry no count of eager decode passes (SGLang's do), only that the running batch is
    one vLLM dispatches without a graph; that evidence, with no large chunk beside it, is graph_fallback's in
    the decomposition too (e2 tuning 10-29, vllm/scrapes+log: fallback episodes 0 -> 15 of 20)."""
    d = diagnose(_stretch_of_intervals(dict(inside),
                                       dict(graph_none_min_tokens=64.0, iteration_tokens_floor=16.0,
                                            large_step_share=0.0)))
    eps = d.regimes.episodes
    assert len(eps) >= 1 and eps.iloc[0]["rows"] >= 70, name
    assert eps.iloc[0]["cause"] == want, (name, eps[["cause", "shares"]].to_dict("records"))


def test_a_watcher_counts_a_nested_episode_once():
    """The exporter counts episodes starting after the end of the last one counted; an episode inside another
    starts before its parent's end, so it is tracked apart (per instance and cause) and counted once."""
    from mixdiag.diagnosis.rules.decomposition import NESTED_WHY, Regimes

    def regimes(nested_end):
        return Regimes(episodes=pd.DataFrame({
            "instance": ["srv", "srv"], "t_start_s": [0.0, 40.0], "t_end_s": [100.0, nested_end],
            "cause": ["ep_hotspot", "host_stall"], "why": ["", f"{NESTED_WHY}0 (ep_hotspot): ..."]}))

    got, until = regimes(60.0).episodes_after({})
    assert (got["ep_hotspot"], got["host_stall"]) == (1, 1)
    again, until = regimes(70.0).episodes_after(until)  # the next window: both grew, neither is new
    assert sum(again.values()) == 0
