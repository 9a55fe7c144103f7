"""SM-based rank skew (``collectors/traces/steps/evidence.sm_rank_skew``): EP ranks whose compute
hides inside replayed CUDA graphs, compared by their SM-busy time over the step."""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from mixdiag.collectors.traces.nsys import reader as nsys
from mixdiag.collectors.traces.steps.evidence import sm_rank_skew


def _frame(n=8, sm=((0.8,) * 8, (0.8,) * 8), visible_ep=3, source="range", rank_skew=np.nan, drift_ns=0,
           late_ns=0):
    rows = []
    for g, vals in enumerate(sm):
        for i in range(n):
            eager = i < visible_ep  # the first steps ran eager (kernels visible), the rest replayed graphs
            # ``drift_ns``: rank g's steps end g * drift_ns later (ranks that do not meet every step);
            # ``late_ns``: rank 1 began its last three steps this much later (its host stalled)
            late = late_ns if g == 1 and i >= n - 3 else 0
            rows.append(dict(group=100 + g, step=i, gpu_start_ns=i * 10_000_000 + g + late,
                             gpu_end_ns=(i + 1) * 10_000_000 + g * drift_ns,
                             opaque_ns=0 if eager else 9_000_000, ep_kernels=12 if eager else 0,
                             step_source=source, sm_active=vals[i], rank_skew=rank_skew if eager else np.nan))
    return pd.DataFrame(rows)


@pytest.mark.parametrize("case, kwargs, expect", [
    ("balanced", {}, 1.0),
    ("rank 1 waits on 3 steps", {"sm": ((0.8,) * 8, (0.8,) * 5 + (0.4,) * 3)}, 2.0),
    ("GPU-gap windows do not match across ranks", {"source": "gap"}, None),
    ("too few eager steps to show the ranks exchange, steps drift apart", {"visible_ep": 2, "drift_ns": 3_000_000},
     None),
    # graph-level trace, every step a replay: the ranks' steps ending together is what shows they meet in an
    # all-to-all every step (DeepEP low-latency dispatch/combine inside the FULL graph)
    ("no eager step, co-terminating ranks", {"visible_ep": 0, "sm": ((0.8,) * 8, (0.8,) * 5 + (0.4,) * 3)}, 2.0),
    ("no eager step, ranks drift by a third of a step", {"visible_ep": 0, "drift_ns": 3_000_000}, None),
])
def test_sm_rank_skew_table(case, kwargs, expect):
    s = _frame(**kwargs)
    sm_rank_skew(s)
    graph = s["opaque_ns"] > 0
    if expect is None:
        assert s["rank_sm_skew"].isna().all(), case
    else:
        # only the steps whose compute a graph hid; the last steps carry the asymmetry
        assert s.loc[~graph, "rank_sm_skew"].isna().all(), case
        last = s[(s["step"] == 7)]
        assert np.allclose(last["rank_sm_skew"], expect, rtol=0.01), case
        assert np.allclose(s.loc[graph & (s["step"] < 5), "rank_sm_skew"], 1.0, rtol=0.01), case


def test_rank_that_began_late_is_a_host_not_a_hotspot():
    # rank 1's host launched its last three steps 4 ms late; the other rank waited in the all-to-all, so
    # its SM-busy time is lower - but the ranks did not start together, so no skew is claimed there
    s = _frame(visible_ep=0, sm=((0.8,) * 8, (0.8,) * 5 + (0.4,) * 3), late_ns=4_000_000)
    sm_rank_skew(s)
    assert s.loc[s["step"] >= 5, "rank_sm_skew"].isna().all()
    assert s.loc[s["step"] < 5, "rank_sm_skew"].notna().all()


def test_kernel_level_skew_wins_and_no_sm_means_nothing():
    s = _frame(rank_skew=1.0)
    sm_rank_skew(s)
    assert s.loc[s["opaque_ns"] == 0, "rank_sm_skew"].isna().all()
    s = _frame().assign(sm_active=np.nan)
    sm_rank_skew(s)
    assert s["rank_sm_skew"].isna().all()


def _sim(tmp_path, faults):
    import sys
    from pathlib import Path
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from helpers.foreign_trace import simulate
    out = tmp_path / "ep2.sqlite"
    truth = simulate("ep2", seed=7, n_steps=160, faults=faults, graph_trace="graph", out=out, gpu_metrics_hz=1000)
    return truth, out


def test_graph_only_trace_ep_ranks_by_co_terminating_steps(tmp_path):
    # every decode step replays FULL (graph-level trace, DeepEP low-latency kernels inside the graph): no
    # exchange kernel is ever visible, but the ranks' steps end together, so their SM-busy asymmetry counts
    truth, out = _sim(tmp_path, ("ep_hotspot",))
    tl = nsys.read(out)
    s = tl.steps
    inst = sorted(s["instance"].unique())[0]
    g = s[s["instance"] == inst].sort_values("t_start_s").reset_index(drop=True)
    t = truth.steps[truth.steps["rank"] == 0].sort_values("step").reset_index(drop=True)
    hot = (t["cause"] == "ep_hotspot").to_numpy()
    assert hot.sum() >= 3 and g["rank_sm_skew"].notna().mean() > 0.9
    k = g["rank_sm_skew"].to_numpy()
    assert np.nanmedian(k[hot]) > np.nanmedian(k[~hot]) + 0.03


def test_simulated_ep_hotspots_in_a_graph_level_trace(tmp_path):
    # mixed steps run eager (their exchange kernels show); decode replays FULL graphs
    truth, out = _sim(tmp_path, ("ep_hotspot", "mixing"))
    tl = nsys.read(out)
    s = tl.steps
    assert s["rank_skew"].isna().all()  # FULL replays hide the compute
    inst = sorted(s["instance"].unique())[0]
    g = s[s["instance"] == inst].sort_values("t_start_s").reset_index(drop=True)
    t = truth.steps[truth.steps["rank"] == 0].sort_values("step").reset_index(drop=True)
    assert len(g) == len(t)
    hot = (t["cause"] == "ep_hotspot").to_numpy()
    assert hot.sum() >= 3
    k = g["rank_sm_skew"].to_numpy()
    assert np.nanmedian(k[hot]) > np.nanmedian(k[~hot]) + 0.03
    assert (g.loc[g["rank_sm_skew"].notna(), "q_expert_imbalance"] == "inferred").all()
    assert g.loc[(t["graph_mode"] != "FULL").to_numpy(), "rank_sm_skew"].isna().all()  # eager: kernels visible
    assert tl.meta["signals"][inst]["expert_imbalance"] == "inferred"


def test_graph_only_trace_names_how_the_ranks_were_found(tmp_path):
    _, out = _sim(tmp_path, ("ep_hotspot",))
    notes = " ".join(nsys.read(out).meta["sources"][0]["notes"])
    assert "EP ranks by co-terminating" in notes


def test_comm_spread_in_a_node_level_trace(tmp_path):
    # node-level trace (--cuda-graph-trace=node): every rank's kernels visible; during a sustained hotspot one
    # rank computes its experts longer while the other waits inside the all-to-all kernels
    sys_path = str(Path(__file__).resolve().parents[1])
    if sys_path not in sys.path:
        sys.path.insert(0, sys_path)
    from helpers import sustained_ep
    out = tmp_path / "ep_node.sqlite"
    hot = range(40, 80)
    sustained_ep.write(out, n_ranks=2, n_steps=100, hot=hot, graph_trace="node", gpu_metrics_hz=0)
    s = nsys.read(out).steps
    g = s[s["instance"] == sorted(s["instance"].unique())[0]].sort_values("step").reset_index(drop=True)
    spread = g["rank_comm_spread"].to_numpy()
    is_hot = g["step"].isin(hot).to_numpy()
    assert np.isfinite(spread).mean() > 0.9
    assert np.nanmedian(spread[is_hot]) > np.nanmedian(spread[~is_hot]) + 0.1
