"""benchmarks/step_scoring.py (tiers d and d2) on hand-built truth and results: the expected numbers are
worked out by hand in the comments."""
from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pandas as pd
import pytest

from helpers.trace_gen2 import Episode

ROOT = Path(__file__).resolve().parents[2]
spec = importlib.util.spec_from_file_location("step_scoring", ROOT / "benchmarks" / "step_scoring.py")
sc = importlib.util.module_from_spec(spec)
sys.modules["step_scoring"] = sc   # dataclasses look their module up
spec.loader.exec_module(sc)


def truth(n, causes: dict, healthy_ns: dict, pid=5):
    """One rank; step s runs [s + 0.5, s + 1] s, so every latency is 1 s."""
    return pd.DataFrame({"step": range(n), "rank": 0, "pid": pid, "t_start_ns": [int((s + 0.5) * 1e9) for s in range(n)],
                         "t_end_ns": [int((s + 1) * 1e9) for s in range(n)],
                         "healthy_ns": [healthy_ns.get(s, 1e9) for s in range(n)],
                         "causes": [causes.get(s, "") for s in range(n)]})


def spikes(calls):
    return pd.DataFrame([{"instance": "trace:pid5", "t_start_s": s + 0.6, "t_end_s": s + 0.9, "cause": c,
                          "confidence": 0.7} for s, c in calls])


@pytest.fixture
def scored():
    causes = {2: "mixing", 3: "mixing", 5: "ep_hotspot", 6: "ep_hotspot;mixing", 8: "host_stall"}
    # fault steps are visible (latency 1 s >= 1.5 x 0.5 s) except step 8 (healthy 1 s)
    tv = sc.step_truth(truth(10, causes, {2: 5e8, 3: 5e8, 5: 5e8, 6: 5e8}), 0.0)
    placed = sc.place_spikes(spikes([(2, "mixing"), (3, "unknown"), (5, "mixing"), (6, "ep_hotspot"),
                                     (0, "host_stall")]), tv)
    return placed, sc.score_steps(placed, tv, ("mixing", "ep_hotspot", "host_stall"))


def test_a_spike_is_placed_on_its_own_step_only(scored):
    placed, _ = scored
    assert placed["step"].tolist() == [2, 3, 5, 6, 0]
    assert placed["right"].tolist() == [True, False, False, True, False]


def test_per_cause_numbers(scored):
    _, r = scored
    p = r["per_cause"]
    # mixing: called on 2 (right) and 5 (wrong): P 1/2; visible mixing steps 2, 3 (6 was found as EP): R 1/2
    assert (p["mixing"]["precision"], p["mixing"]["recall"], p["mixing"]["f1"]) == (0.5, 0.5, 0.5)
    # ep: called once, right; visible 5 (missed) and 6 (found): P 1, R 1/2, F1 2/3
    assert p["ep_hotspot"]["precision"] == 1.0 and p["ep_hotspot"]["recall"] == 0.5
    assert p["ep_hotspot"]["f1"] == pytest.approx(2 / 3)
    # host_stall: one wrong call on a cause-free step; its only truth step (8) is not visible
    assert p["host_stall"]["precision"] == 0.0 and p["host_stall"]["recall"] is None and p["host_stall"]["f1"] == 0.0
    assert r["macro_f1"] == pytest.approx((0.5 + 2 / 3 + 0.0) / 3)
    # spikes without mixing in their step: 5 and 0; one of them called mixing
    assert (r["mixing_fp"], r["non_mixing_spikes"], r["mixing_fp_rate"]) == (1, 2, 0.5)
    assert (r["spikes"], r["unknown"]) == (5, 1)


def test_no_window_a_neighbouring_truth_does_not_count():
    tv = sc.step_truth(truth(6, {3: "mixing"}, {3: 5e8}), 0.0)
    r = sc.score_steps(sc.place_spikes(spikes([(2, "mixing"), (4, "mixing")]), tv), tv, ("mixing",))
    assert r["per_cause"]["mixing"]["precision"] == 0.0 and r["per_cause"]["mixing"]["recall"] == 0.0


def test_episode_recall_and_precision():
    tv = sc.step_truth(truth(100, {}, {}), 0.0)
    sched = (Episode("ep_hotspot", 10, 50, 3.0), Episode("mixing", 70, 20, 2048.0), Episode("host_stall", 95, 5, 30.0))
    # EP stretch spans [10.5, 60] s; mixing [70.5, 90] s; the 5-step host stall is no sustained stretch
    res = pd.DataFrame({"instance": "trace:pid5", "cause": ["ep_hotspot", "ep_hotspot", "mixing", "host_stall", "unknown"],
                        "t_start_s": [10.5, 25.0, 85.0, 0.0, 40.0], "t_end_s": [30.0, 40.0, 95.0, 5.0, 50.0]})
    r = sc.score_episodes(res, sched, tv, ("mixing", "ep_hotspot", "host_stall"))
    # EP: union [10.5, 40] covers 29.5 / 49.5 = 0.6 >= 0.5, found; mixing: [85, 90] covers 5 / 19.5, not found
    assert r["stretches"]["ep_hotspot"] == {"found": 1, "of": 1}
    assert r["stretches"]["mixing"] == {"found": 0, "of": 1}
    assert r["stretches"]["host_stall"] == {"found": 0, "of": 0}
    assert r["recall"] == 0.5
    # named episodes: 4 (unknown is not named); the host_stall one overlaps no host_stall stretch
    assert (r["named_episodes"], r["precision"]) == (4, 0.75)
    # an episode on the 5-step stall is right (precision), though so short a fault need not be found (recall)
    on_short = pd.concat([res, pd.DataFrame({"instance": ["trace:pid5"], "cause": ["host_stall"],
                                             "t_start_s": [95.2], "t_end_s": [99.0]})], ignore_index=True)
    r = sc.score_episodes(on_short, sched, tv, ("mixing", "ep_hotspot", "host_stall"))
    assert (r["named_episodes"], r["precision"], r["recall"]) == (5, 0.8, 0.5)
