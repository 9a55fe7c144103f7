"""Sustained EP hotspots and PD transfers in Nsight exports become episodes named by their cause (issue 24 with
the regimes of issue 23): the per-cause features of rules/decomposition.py carry the graph-hidden rank skew
(``rank_sm_skew``) and the side-stream transfer (``kv_overlap_s``)."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from helpers import side_stream_export, sustained_ep  # noqa: E402

from mixdiag.collectors import load  # noqa: E402
from mixdiag.diagnosis import diagnose  # noqa: E402


def _covering(ep, lo, hi):
    """Episodes overlapping steps [lo, hi]."""
    return ep[(ep["step_end"] >= lo) & (ep["step_start"] <= hi)]


@pytest.mark.parametrize("n_ranks", [2, 4])
def test_sustained_ep_hotspot_inside_full_graphs_is_one_ep_episode(tmp_path, n_ranks):
    out = tmp_path / f"ep{n_ranks}.sqlite"
    hot = range(50, 120)
    truth = sustained_ep.write(out, n_ranks=n_ranks, hot=hot)
    assert (truth.loc[truth["step"].isin(hot), "graph_mode"] == "FULL").all()  # every hot step a FULL replay
    d = diagnose(load(out))
    ep = d.regimes.episodes
    assert set(ep["instance"]) and len(set(ep["instance"])) == n_ranks  # every rank's view
    for inst, g in ep.groupby("instance"):
        cov = _covering(g, hot.start, hot.stop - 1)
        assert len(cov) == 1, (inst, g)  # one episode, not two edges
        row = cov.iloc[0]
        assert row["cause"] == "ep_hotspot", (inst, row.to_dict())
        assert row["step_start"] <= hot.start + 5 and row["step_end"] >= hot.stop - 6
        assert row["shares"]["ep_hotspot"] >= 0.5
    assert not (d.spikes["cause"] == "mixing").any()


def test_balanced_ranks_make_no_ep_episode(tmp_path):
    out = tmp_path / "ep_ok.sqlite"
    sustained_ep.write(out, n_ranks=2, hot=range(0))
    d = diagnose(load(out))
    assert not (d.regimes.episodes["cause"] == "ep_hotspot").any()
    assert not (d.spikes["cause"] == "ep_hotspot").any()


def test_sustained_side_stream_kv_load_is_a_pd_episode_and_pd_spikes(tmp_path):
    out = tmp_path / "pd.sqlite"
    case = side_stream_export.SideStreamCase()
    side_stream_export.write(out, case)
    d = diagnose(load(out))
    pd_steps = set(case.pd_steps)
    sp = d.spikes
    assert len(sp) and set(sp["step"]) <= pd_steps
    assert (sp["cause"] == "pd_transfer").all()
    assert all(e["kv_wait_s"] > 0 for e in sp["evidence"])
    cov = _covering(d.regimes.episodes, min(pd_steps), max(pd_steps))
    assert len(cov) == 1 and cov.iloc[0]["cause"] == "pd_transfer"


def test_rdma_transfer_without_cuda_rows_is_not_named(tmp_path):
    # NIXL moves KV by RDMA: no copy row, only an idle compute stream after a cudaStreamWaitEvent - the wait
    # alone does not say what was awaited, so no pd_transfer is named
    out = tmp_path / "nixl.sqlite"
    side_stream_export.write(out, side_stream_export.SideStreamCase(rdma=True))
    d = diagnose(load(out))
    assert not (d.spikes["cause"] == "pd_transfer").any()
    assert not (d.regimes.episodes["cause"] == "pd_transfer").any()


def test_sustained_host_stall_keeps_its_gap_excess_and_names_the_episode():
    # a host stall lasting 120 steps: a 41-step rolling median of the gaps would make it the usual gap (gap
    # excess 0 in its middle); the usual gap is capped at the instance's healthy band, so it stays a stall
    import numpy as np
    import pandas as pd
    from mixdiag.schema import Timeline
    rng = np.random.default_rng(5)
    rows, t = [], 100.0
    for i in range(400):
        gap = 0.0008 + (0.03 if 150 <= i < 270 else 0.0)
        dur = 0.02 * rng.uniform(0.98, 1.02)
        rows.append(dict(instance="e", step=i, t_start_s=t + gap, t_end_s=t + gap + dur, granularity="step",
                         kind="decode", prefill_tokens=0.0, decode_rows=64.0, decode_reqs=64.0, graph_mode="FULL",
                         graph_replayed=1.0, q_token_allocation="measured", q_graph_mode="measured"))
        t += gap + dur
    d = diagnose(Timeline(pd.DataFrame(rows), None, meta={}))
    cov = _covering(d.regimes.episodes, 150, 269)
    assert len(cov) == 1 and cov.iloc[0]["cause"] == "host_stall", cov
    assert cov.iloc[0]["shares"]["host_stall"] >= 0.8


def test_every_step_of_a_sustained_host_stall_spikes_as_host_stall():
    # the same 120-step stall: each of its steps is a spike named host_stall, not only the stretch's edges
    import numpy as np
    import pandas as pd
    from mixdiag.schema import Timeline
    rng = np.random.default_rng(5)
    rows, t = [], 100.0
    for i in range(400):
        gap = 0.0008 + (0.03 if 150 <= i < 270 else 0.0)
        dur = 0.02 * rng.uniform(0.98, 1.02)
        rows.append(dict(instance="e", step=i, t_start_s=t + gap, t_end_s=t + gap + dur, granularity="step",
                         kind="decode", prefill_tokens=0.0, decode_rows=64.0, decode_reqs=64.0, graph_mode="FULL",
                         graph_replayed=1.0, q_token_allocation="measured", q_graph_mode="measured"))
        t += gap + dur
    d = diagnose(Timeline(pd.DataFrame(rows), None, meta={}))
    sp = d.spikes.set_index("step")
    assert set(sp.index) == set(range(150, 270))
    assert (sp["cause"] == "host_stall").all()


@pytest.mark.parametrize("n_ranks", [2, 4])
def test_every_hot_step_inside_full_graphs_spikes_as_ep_hotspot(tmp_path, n_ranks):
    out = tmp_path / f"ep{n_ranks}.sqlite"
    hot = range(50, 120)
    sustained_ep.write(out, n_ranks=n_ranks, hot=hot)
    d = diagnose(load(out))
    sp = d.spikes
    assert len(sp) and not (sp["cause"] == "mixing").any()
    named = sp[sp["cause"] == "ep_hotspot"]
    assert set(named["step"]) <= set(hot)
    # the hot rank's steps last until it ends; every rank waits in the all-to-all: most hot steps spike on each
    for inst, g in named.groupby("instance"):
        assert len(g) >= 0.8 * len(hot), (inst, len(g))
