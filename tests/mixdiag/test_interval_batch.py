"""Interval-only instances diagnosed in one pass (interval_batch.interval_views) give, field by field, what the
per-instance pipeline gives each instance alone; the grouped helpers equal their plain pandas forms."""
from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from mixdiag.diagnosis import DiagnosisConfig, diagnose, groupwise as gw, part
from mixdiag.diagnosis.config import SignalConfig
from mixdiag.diagnosis.detection import interval_batch
from mixdiag.diagnosis.detection.signals import average_ranks, rank_relation
from mixdiag.diagnosis.detection.spikes import grouped_baseline, rolling_baseline
from mixdiag.schema import Timeline


def _mixed_fleet(seed: int = 1, extras: bool = True, modes=(0, 4, 8)) -> Timeline:
    """Interval rows with the variety a fleet shows: bursts, arrivals on some instances, graph
    modes on some (the first among them), KV transfers, preemptions, expert imbalance, a short
    instance, one without ITL, gaps in the ITL."""
    rng = np.random.default_rng(seed)
    rows = []
    for i in range(14):
        n = 6 if i == 5 else 30 + i
        for k in range(n):
            slow = i % 3 == 0 and k % 4 == 1
            p50 = 0.02 * (1 + rng.uniform(-0.1, 0.1))
            r = {"instance": f"e-{i:02d}", "t_start_s": 100.0 + 10 * k, "t_end_s": 110.0 + 10 * k,
                 "granularity": "interval", "step": k, "kind": rng.choice(["unknown", "mixed", "decode"]),
                 "prefill_tokens": 9000.0 if slow else float(rng.integers(0, 300)), "output_tokens": 900.0,
                 "itl_count": 900.0, "running_reqs": 16.0,
                 "itl_p50_s": p50 * (2.5 if slow else 1), "itl_p99_s": p50 * (3.4 if slow else 1.4),
                 "itl_mean_s": p50}
            if i == 7:
                r["itl_p50_s"] = r["itl_p99_s"] = r["itl_mean_s"] = np.nan
                r["itl_count"] = r["output_tokens"] = 0.0
            if i % 4 == 1 and k % 7 == 3:
                r["itl_p99_s"] = np.nan
            if extras and i % 2 == 0:
                r["arrivals"] = float(rng.integers(0, 3)) if not slow else 5.0
            if extras and i in modes:
                r.update(graph_full_steps=50.0, graph_piecewise_steps=float(slow) * 4, graph_none_steps=0.0,
                         large_step_share=0.3 if slow else 0.01)
            if extras and i == 11 and k in (10, 11):  # starved: prefill ran alone, nobody got a token
                r.update(itl_p50_s=np.nan, itl_p99_s=np.nan, itl_mean_s=np.nan, itl_count=0.0, prefill_tokens=4096.0)
            if extras and i == 11 and k == 12:  # ... and the waiters logged the wait on resuming
                r["itl_p99_s"] = 25.0
            if extras and i == 12 and 15 <= k <= 18:  # the typical token slowed (P50 shift)
                r["itl_p50_s"] = r["itl_p99_s"] = 0.036
            if extras and i == 13:  # a hotspot window and its diluted edges
                r["expert_imbalance"] = {9: 1.3, 10: 4.0, 11: 4.0, 12: 1.3}.get(k, 1.05)
                if 9 <= k <= 12:
                    r["itl_p50_s"], r["itl_p99_s"] = 0.04, 0.07
            if extras and i == 10 and k >= 2:  # KV transfers nearly throughout: too few fault-free intervals
                r["kv_transfer_bytes"] = 1e6
            if extras and i == 9:
                r.update(kv_transfer_bytes=1e6 * (k % 5 == 0), preempted_reqs=float(k % 11 == 0),
                         expert_imbalance=1.1 + 0.5 * (k % 9 == 0))
            rows.append(r)
    insts = sorted({r["instance"] for r in rows})
    meta = {"source": "test", "clock": "unix",
            "signals": {i: ({"expert_imbalance": "inferred"} if i == "e-09" else {}) for i in insts}}
    return Timeline(steps=pd.DataFrame(rows), series=None, meta=meta)


def _plain_fleet() -> Timeline:
    return _mixed_fleet(seed=2, extras=False)


@pytest.mark.parametrize("make", [_mixed_fleet, _plain_fleet], ids=["mixed", "plain"])
def test_batch_equals_per_instance(make, monkeypatch):
    tl = make()
    a = diagnose(tl)
    monkeypatch.setattr(part, "interval_views", lambda *args: None)  # the per-instance pipeline
    b = diagnose(tl)
    assert len(a.spikes) > 0
    pd.testing.assert_frame_equal(a.spikes, b.spikes)
    pd.testing.assert_frame_equal(a.steps, b.steps)
    pd.testing.assert_frame_equal(a.budget.units, b.budget.units)
    assert json.dumps(a.to_json(), default=str) == json.dumps(b.to_json(), default=str)


def test_batch_is_used_for_interval_only_inputs(monkeypatch):
    calls = []
    real = interval_batch.interval_views
    monkeypatch.setattr(part, "interval_views", lambda *a: calls.append(real(*a)) or calls[-1])
    d = diagnose(_mixed_fleet())
    assert len(calls) == 1 and calls[0] is not None and len(calls[0][2]) == 14
    assert "graph_off_decode_steps" in d.steps.columns  # graph modes of e-00, e-04, e-08 went through fusion


@pytest.mark.parametrize("window", [3, 4, 15])
def test_grouped_helpers_equal_plain_ones_per_group(window):
    rng = np.random.default_rng(3)
    sizes = [1, 5, 17, 2, 40]
    groups = np.repeat(np.arange(len(sizes)), sizes)
    v = pd.Series(np.where(rng.random(len(groups)) < 0.3, np.nan, rng.random(len(groups))))
    ref = pd.Series(rng.random(len(groups)) < 0.5)
    b = gw.bounds(groups)
    base = grouped_baseline(v, ref, window, 2, groups)
    med = gw.rolling_median(v, window, 1, groups)
    fill = gw.bfill(gw.ffill(v, groups), groups)
    sh = gw.shift(ref, 1, False, groups)
    for g in range(len(sizes)):
        part, r = v.iloc[b[g]:b[g + 1]].reset_index(drop=True), ref.iloc[b[g]:b[g + 1]].reset_index(drop=True)
        np.testing.assert_array_equal(base.iloc[b[g]:b[g + 1]].to_numpy(), rolling_baseline(part, r, window, 2)[0])
        np.testing.assert_array_equal(med.iloc[b[g]:b[g + 1]].to_numpy(),
                                      part.rolling(window, center=True, min_periods=1).median())
        np.testing.assert_array_equal(fill.iloc[b[g]:b[g + 1]].to_numpy(), part.ffill().bfill())
        np.testing.assert_array_equal(sh.iloc[b[g]:b[g + 1]].to_numpy(), r.shift(1, fill_value=False))


def test_rank_relation_keeps_its_draws():
    """Cached shuffle orders give the p-values the per-call rng.permuted gave."""
    rng = np.random.default_rng(0)
    w, e = rng.random(40), rng.random(40)
    e[::5] += w[::5]
    rw, re_ = pd.Series(w).rank().to_numpy(), pd.Series(e).rank().to_numpy()
    np.testing.assert_array_equal(average_ranks(w), rw)
    rw, re_ = rw - rw.mean(), re_ - re_.mean()
    den = float(np.sqrt((rw ** 2).sum() * (re_ ** 2).sum()))
    perm = (np.random.default_rng(0).permuted(np.tile(rw, (999, 1)), axis=1) * re_).sum(axis=1) / den
    rho = float((rw * re_).sum() / den)
    out = rank_relation(pd.Series(w), pd.Series(e), SignalConfig())
    assert out["rho"] == rho and out["p_value"] == float((1 + (perm >= rho).sum()) / 1000)
    assert average_ranks(np.array([2.0, 1.0, 2.0, 2.0])).tolist() == [3.0, 1.0, 3.0, 3.0]


def test_graph_mode_column_only_on_later_instances_runs_per_instance():
    """The column graph_off_decode_column adds would stand last in the concatenated per-instance
    frames: the batch declines and the per-instance pipeline runs."""
    tl = _mixed_fleet(modes=(4, 8))
    assert interval_batch.interval_views(tl, DiagnosisConfig(), tl.instances) is None
    d = diagnose(tl)
    assert d.steps.columns[-1] == "graph_off_decode_steps" and len(d.instances) == 14


def test_groupwise_quantile_is_each_groups_own():
    """gw.quantile broadcasts each group's quantile of its non-missing values (a group with none: NaN),
    as a per-group ``Series.quantile`` would."""
    rng = np.random.default_rng(0)
    g = np.repeat(np.arange(30), 12)
    s = pd.Series(rng.normal(size=len(g)))
    s[rng.random(len(g)) < 0.2] = np.nan
    s[g == 7] = np.nan
    got = gw.quantile(s, 0.25, g).to_numpy()
    want = np.array([s[g == k].quantile(0.25) for k in g])
    assert np.allclose(got, want, equal_nan=True) and np.isnan(got[g == 7]).all()
    assert gw.quantile(s, 0.25, None).iloc[0] == s.quantile(0.25)
