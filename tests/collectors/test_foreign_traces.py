"""Foreign engines' traces (simulator, tests/helpers/foreign_trace) -> steps, kind, KV transfer, rank skew.

Seeds here were not used while writing the heuristics (those used 101-106). Acceptance (issue 12):
boundaries within one step of truth >= 98 %, kind >= 95 %, KV transfer found on >= 90 % of
transfer-affected steps, rank skew high on >= 90 % of hotspot steps where it is observable.
"""
from __future__ import annotations

import numpy as np
import pytest

from mixdiag.collectors.traces.kineto import reader as kineto
from mixdiag.collectors.traces.nsys import reader as nsys
from mixdiag.diagnosis import DiagnosisConfig
from tests.helpers.foreign_trace import simulate

CASES = [(e, nvtx, gt, seed) for e, seed in (("vllm", 7), ("sglang", 11), ("ep2", 13))
         for nvtx in (True, False) for gt in ("graph", "node")]
#: Kineto: one JSON per rank, always node level (Kineto has no graph-level rows); <= 150 steps.
KINETO_CASES = [(e, nvtx, seed) for e, seed in (("vllm", 17), ("sglang", 19), ("ep2", 23)) for nvtx in (True, False)]


@pytest.mark.parametrize("engine,nvtx,graph_trace,seed", CASES)
def test_foreign_trace_accuracy(tmp_path, engine, nvtx, graph_trace, seed):
    truth = simulate(engine, seed, 250, None, nvtx, graph_trace, "nsys", tmp_path / "t.sqlite")
    tl = nsys.read(truth.path)
    assert tl.meta["sources"][0]["step_source"] == ("nvtx-engine-naming" if nvtx else "sync-pattern")
    _check(truth, tl, nvtx, graph_trace)


@pytest.mark.parametrize("engine,nvtx,seed", KINETO_CASES)
def test_foreign_kineto_accuracy(tmp_path, engine, nvtx, seed):
    truth = simulate(engine, seed, 150, None, nvtx, "node", "kineto", tmp_path / "t.json")
    tl = kineto.read(list(truth.paths))  # per-rank files of one job, read together
    assert tl.meta["sources"][0]["step_source"] == ("kineto-engine-naming" if nvtx else "sync-pattern")
    assert len(tl.instances) == len(truth.paths)
    _check(truth, tl, nvtx, "node")
    if engine == "ep2":
        assert tl.meta["signals"][tl.instances[0]]["expert_imbalance"] == "inferred"
        # one rank file alone: named by its distributedInfo rank (so `ingest a.json a.rank1.json` does
        # not clash), no rank skew without the other ranks
        alone = kineto.read(truth.paths[1])
        assert alone.instances == ["t:rank1"] and alone.steps["rank_skew"].isna().all()
    else:  # one file alone reads the same as the list of one
        assert kineto.read(truth.path).steps["kind"].tolist() == tl.steps["kind"].tolist()


def _check(truth, tl, nvtx: bool, graph_trace: str) -> None:
    steps = tl.steps
    for inst in steps["instance"].unique():
        s = steps[steps["instance"] == inst].reset_index(drop=True)
        pid = int(inst.split("pid")[1]) if "pid" in inst else truth.steps["pid"].iloc[0]
        tt = truth.steps[truth.steps["pid"] == pid].reset_index(drop=True)
        # match by the step's GPU window: truth midpoint -> detected step containing it (order index)
        starts = np.sort(s["t_start_s"].to_numpy())
        mid = (tt["t_start_ns"] + tt["t_end_ns"]).to_numpy() / 2
        base = truth.steps["t_start_ns"].min() / 1e9
        k = np.searchsorted(starts - starts[0] + base, mid / 1e9, side="right") - 1
        d = k - np.arange(len(tt))
        assert np.mean(np.abs(d - np.median(d)) <= 1) >= 0.98
        kk = np.clip(k, 0, len(s) - 1)
        assert np.mean(s["kind"].to_numpy()[kk] == tt["kind"].to_numpy()) >= 0.95
        assert np.mean(s["graph_mode"].to_numpy()[kk] == tt["graph_mode"].to_numpy()) >= 0.95
        xfer = (tt["kv_transfer_bytes"] > 0).to_numpy()
        if xfer.any():
            assert np.mean(s["kv_transfer_s"].to_numpy()[kk][xfer] > 0) >= 0.9
        hot = (tt["cause"] == "ep_hotspot").to_numpy()
        skew = s["rank_skew"].to_numpy()[kk]
        seen = hot & ~np.isnan(skew)
        if seen.any():
            # the collector measures rank_skew; what counts as high is the diagnosis's threshold
            assert np.mean(skew[seen] >= DiagnosisConfig().attribution.rank_skew) >= 0.9
        if graph_trace == "node" and hot.any():  # node-level trace: every hotspot step observable
            assert seen.sum() == hot.sum()
        assert set(s["step_source"]) == {"range" if nvtx else "sync"}
