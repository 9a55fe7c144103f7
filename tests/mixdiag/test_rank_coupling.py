"""Multi-rank step views of one EP engine (fusion.couple_ranks + step rule 6b): a decode step that
waited in the all-to-all for a peer rank's mixed step is mixing on the peer, never this rank's
graph fallback or EP hotspot; ranks that do not end their steps together are not coupled."""
import numpy as np
import pandas as pd
import pytest

from mixdiag.diagnosis import diagnose
from mixdiag.schema import Timeline

N, BASE, MIX = 200, 0.02, set(range(10, 200, 20))


def _rank(name, offset_s, mixed_here, skew_s=0.0, mix=MIX):
    rng = np.random.default_rng(len(name))
    rows, t = [], 100.0
    for i in range(N):
        dur = BASE * rng.uniform(0.98, 1.02) * (4.0 if i in mix else 1.0)
        mine = i in mix and mixed_here
        rows.append(dict(instance=name, step=i, t_start_s=t + offset_s + skew_s * i, t_end_s=t + dur + offset_s + skew_s * i,
                         granularity="step", kind="mixed" if mine else "decode",
                         prefill_tokens=1024.0 if mine else 0.0, decode_rows=64.0, decode_reqs=64.0,
                         graph_mode="NONE" if i in mix else "FULL", graph_replayed=0.0 if i in mix else 1.0,
                         comm_share=0.1 if i in mix else 0.02, q_token_allocation="inferred", q_graph_mode="measured"))
        t += dur + 0.0005
    return pd.DataFrame(rows)


@pytest.mark.parametrize("skew_s, coupled", [(0.0, True), (0.01, False)])
def test_waiting_rank_is_mixing_on_the_peer_only_when_coupled(skew_s, coupled):
    steps = pd.concat([_rank("r0", 0.0, True), _rank("r1", 1e-5, False, skew_s)], ignore_index=True)
    d = diagnose(Timeline(steps, None, meta={}))
    waiting = d.spikes[(d.spikes["instance"] == "r1") & d.spikes["step"].isin(MIX)]
    assert len(waiting) >= len(MIX) - 1
    if coupled:
        assert (waiting["cause"] == "mixing").all(), waiting[["step", "cause"]]
        assert all(e.get("peer_rank_prefill") for e in waiting["evidence"])
        assert (waiting["confidence"] <= 0.65).all()
    else:
        assert not (waiting["cause"] == "mixing").any()
    assert not set(waiting["cause"]) & ({"ep_hotspot"} if not coupled else {"ep_hotspot", "graph_fallback"})
    own = d.spikes[(d.spikes["instance"] == "r0") & d.spikes["step"].isin(MIX)]
    assert (own["cause"] == "mixing").all()


STALL = set(range(15, 200, 25))


def _stall_ranks(skew_s=0.0):
    """Two EP ranks: before each STALL step rank 0's engine thread stalls 60 ms (its GPU idles), rank 1
    starts on time and waits for it in the first all-to-all, so both steps end together."""
    rng = np.random.default_rng(3)
    rows, t = [], 100.0
    for i in range(N):
        dur = BASE * rng.uniform(0.98, 1.02)
        gap = 0.06 if i in STALL else 0.0
        for name, start, off in (("r0", t + gap, 0.0), ("r1", t, 1e-5 + skew_s * i)):
            rows.append(dict(instance=name, step=i, t_start_s=start + off, t_end_s=t + gap + dur + off,
                             granularity="step", kind="decode", prefill_tokens=0.0, decode_rows=64.0,
                             decode_reqs=64.0, graph_mode="FULL", graph_replayed=1.0, comm_share=0.3 if gap else 0.02,
                             q_token_allocation="inferred", q_graph_mode="measured"))
        t += gap + dur + 0.0005
    return pd.DataFrame(rows)


@pytest.mark.parametrize("skew_s, coupled", [(0.0, True), (0.01, False)])
def test_peer_host_stall_is_host_stall_on_the_waiting_rank(skew_s, coupled):
    # basis: an all-to-all ends when the last rank arrives, so a rank whose peer's host stalled waits it out
    d = diagnose(Timeline(_stall_ranks(skew_s), None, meta={}))
    own = d.spikes[(d.spikes["instance"] == "r0") & d.spikes["step"].isin(STALL)]
    assert len(own) >= len(STALL) - 1 and (own["cause"] == "host_stall").all()
    waiting = d.spikes[(d.spikes["instance"] == "r1") & d.spikes["step"].isin(STALL)]
    assert len(waiting) >= len(STALL) - 1
    if coupled:
        assert (waiting["cause"] == "host_stall").all(), waiting[["step", "cause"]]
        assert all(e["peer_gap_share_of_excess"] >= 0.9 for e in waiting["evidence"])
    else:  # not one engine's ranks: the peer's gap says nothing about this view (its comm-bound step may be EP)
        assert not (waiting["cause"] == "host_stall").any()


def test_waiting_rank_episode_is_mixing_not_ep_or_fallback():
    # a long prompt chunked over 40 steps on rank 0 (vLLM DP+EP: only the rank holding the prompt runs prefill
    # attention; both ranks leave the FULL graph because DP ranks share the graph mode): rank 1's slow
    # decode-only steps are the cost of rank 0's chunks - its episode is mixing, not a fallback or a hotspot
    mix = set(range(80, 120))
    steps = pd.concat([_rank("r0", 0.0, True, mix=mix), _rank("r1", 1e-5, False, mix=mix)], ignore_index=True)
    steps["rank_skew"] = np.where(steps["step"].isin(mix), 3.0, 1.0)  # rank 0 computes its chunk
    d = diagnose(Timeline(steps, None, meta={}))
    ep = d.regimes.episodes
    for inst in ("r0", "r1"):
        cov = ep[(ep["instance"] == inst) & (ep["step_end"] >= 80) & (ep["step_start"] <= 119)]
        assert len(cov) == 1 and cov.iloc[0]["cause"] == "mixing", (inst, cov)


def test_all_ranks_eager_with_no_counted_chunk_is_unknown_not_ep_or_fallback():
    # rule 6c: both ranks left the FULL graph on MIX steps whose batch size (64) replays FULL elsewhere, and
    # neither rank counted a prompt chunk (token inference missed the chunk holder's prefill: SGLang keeps its
    # inputs on the GPU). Ranks share one graph mode, so a peer's chunk is likely; the waiting rank's
    # comm-bound step names neither an expert hotspot nor a graph fallback
    steps = pd.concat([_rank("r0", 0.0, False), _rank("r1", 1e-5, False)], ignore_index=True)
    d = diagnose(Timeline(steps, None, meta={}))
    sp = d.spikes[d.spikes["step"].isin(MIX)]
    assert len(sp) >= 2 * (len(MIX) - 1)
    assert (sp["cause"] == "unknown").all(), sp[["instance", "step", "cause"]]
    assert all("peer rank's prompt chunk" in e["reason"] for e in sp["evidence"])
    # the same steps with a measured chunk on rank 0 are mixing (6b) - the rule only fills the gap
    counted = pd.concat([_rank("r0", 0.0, True), _rank("r1", 1e-5, False)], ignore_index=True)
    sp2 = diagnose(Timeline(counted, None, meta={})).spikes
    assert (sp2.loc[sp2["step"].isin(MIX), "cause"] == "mixing").all()
