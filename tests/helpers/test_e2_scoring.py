"""benchmarks/e2_scoring.py (tier e2) on hand-built truth and results; expected numbers worked out
by hand in the comments."""
from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pandas as pd
import pytest

ROOT = Path(__file__).resolve().parents[2]
spec = importlib.util.spec_from_file_location("e2_scoring", ROOT / "benchmarks" / "e2_scoring.py")
sc = importlib.util.module_from_spec(spec)
sys.modules["e2_scoring"] = sc
spec.loader.exec_module(sc)

CAUSES = ("mixing", "host_stall")
# steps end at 0.5, 1.5, 2.5, 3.5: causes per step
STEPS = pd.DataFrame({"step": range(4), "t_start_s": [0.1, 1.1, 2.1, 3.1], "t_end_s": [0.5, 1.5, 2.5, 3.5],
                      "causes": ["mixing", "", "host_stall;mixing", "host_stall"]})
# units = four 1-s intervals; visible: mixing in 0 and 2, host_stall in 3 only (2's stall too small)
UNITS = pd.DataFrame({"t0_s": [0.0, 1.0, 2.0, 3.0], "t1_s": [1.0, 2.0, 3.0, 4.0],
                      "visible_mixing": [True, False, True, False], "visible_host_stall": [False, False, False, True]})


def spikes(rows):
    return pd.DataFrame(rows, columns=["t_start_s", "t_end_s", "cause"])


@pytest.mark.parametrize("t0,t1,cause,gold,right", [
    (0.0, 1.0, "mixing", "mixing", True),            # its own interval holds a mixed step
    (1.0, 2.0, "mixing", "", False),                 # a neighbour's mixing does not count
    (2.0, 3.0, "host_stall", "host_stall;mixing", True),   # either cause of a two-cause interval
    (3.0, 3.0, "mixing", "host_stall", False),       # a log stamp: its second [3, 4)
    (2.0, 2.0, "mixing", "host_stall;mixing", True),
    (1.0, 2.0, "unknown", "", None),                 # counted, never judged
    (0.0, 1.0, "prefill_stall", "mixing", False),    # a cause the generator never makes
])
def test_judge_uses_only_the_spikes_own_window(t0, t1, cause, gold, right):
    j = sc.judge(spikes([(t0, t1, cause)]), STEPS)
    assert j["gold"].iloc[0] == gold
    assert j["right"].iloc[0] == right


def test_score_precision_recall_f1_and_mixing_fp():
    j = sc.judge(spikes([(0.0, 1.0, "mixing"), (1.0, 2.0, "mixing"), (3.0, 4.0, "host_stall"),
                         (1.0, 2.0, "unknown"), (3.0, 4.0, "prefill_stall")]), STEPS)
    s = sc.score(j, UNITS, CAUSES)
    m = s["per_cause"]["mixing"]
    # mixing: 2 calls, 1 right -> P 0.5; visible units 0 and 2, found 0 -> R 0.5; F1 0.5
    assert (m["called"], m["right"], m["visible_units"], m["found"]) == (2, 1, 2, 1)
    assert m["f1"] == pytest.approx(0.5)
    h = s["per_cause"]["host_stall"]
    assert (h["precision"], h["recall"], h["f1"]) == (1.0, 1.0, 1.0)
    # prefill_stall: named, never true -> F1 0 and part of the macro mean: (0.5 + 1 + 0) / 3
    assert s["per_cause"]["prefill_stall"]["f1"] == 0.0
    assert s["macro_f1"] == pytest.approx(0.5)
    # windows without mixing: (1,2) mixing, (3,4) host_stall, (1,2) unknown, (3,4) prefill_stall -> 1 / 4
    assert (s["mixing_fp"], s["non_mixing_spikes"]) == (1, 4)
    assert s["spikes"] == 5 and s["unknown"] == 1


def test_cause_without_calls_or_truth_has_no_f1():
    s = sc.score(sc.judge(spikes([(3.0, 4.0, "host_stall")]), STEPS), UNITS.assign(visible_mixing=False), CAUSES)
    assert s["per_cause"]["mixing"]["f1"] is None
    assert s["macro_f1"] == 1.0


def test_episodes_need_half_their_span_covered_by_their_cause():
    steps = pd.DataFrame({"step": range(100), "t_start_s": [float(i) for i in range(100)],
                          "t_end_s": [i + 1.0 for i in range(100)]})
    sched = pd.DataFrame({"cause": ["host_stall", "mixing", "host_stall"], "start": [10, 50, 90],
                          "end": [40, 80, 95], "magnitude": [0.1, 3000, 0.1]})   # the last is too short to score
    res = pd.DataFrame({"t_start_s": [10.0, 50.0], "t_end_s": [26.0, 60.0], "cause": ["host_stall", "mixing"]})
    # host_stall 10..40: 16 of 30 s covered (>= 0.5) found; mixing 50..80: 10 of 30 s, missed
    assert sc.score_episodes(res, sched, steps) == {"host_stall": {"found": 1, "of": 1},
                                                    "mixing": {"found": 0, "of": 1}}


def test_episode_precision_counts_episodes_on_a_fault_of_their_cause_of_any_length():
    steps = pd.DataFrame({"step": range(100), "t_start_s": [float(i) for i in range(100)],
                          "t_end_s": [i + 1.0 for i in range(100)]})
    sched = pd.DataFrame({"cause": ["host_stall", "mixing"], "start": [10, 90], "end": [40, 95],
                          "magnitude": [0.1, 3000]})
    res = pd.DataFrame({"t_start_s": [12.0, 91.0, 50.0, 20.0], "t_end_s": [30.0, 94.0, 60.0, 25.0],
                        "cause": ["host_stall", "mixing", "mixing", "unknown"]})
    # the 5-step mixing fault is right to name (though too short to be owed); 50..60 holds no mixing
    assert sc.episode_precision(res, sched, steps) == {"named": 3, "right": 2}
