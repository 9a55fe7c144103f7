import sys
from pathlib import Path

import pandas as pd
import pytest

from mixdiag.diagnosis import diagnose
from mixdiag.diagnosis.evaluation import (MISSED, calibration, foreign_truth, judge, map_to_truth_steps, score,
                                          visible_truth)

sys.path.insert(0, str(Path(__file__).parent))
from diag_cases import EXPECTED, FAULTS, build  # noqa: E402


def _truth(rows):
    return pd.DataFrame(rows, columns=["instance", "step", "cause"])


def test_perfect_diagnosis_scores_one():
    tl = build()
    # step 10 is a tiny mixed step that does not spike: labelled, not visible, not required
    truth = _truth([("engine0", s, c) for s, c in EXPECTED.items()] + [("engine0", 10, "mixing")])
    tv = visible_truth(tl.steps, truth)
    assert tv.set_index("step").loc[10, "visible"] == False  # noqa: E712
    assert tv.loc[tv["step"] != 10, "visible"].all()
    r = score(diagnose(tl).spikes, tv)
    assert r["macro_f1"] == pytest.approx(1.0)
    assert r["mixing_false_alarm_rate"] == 0.0
    assert r["visible_truth_detected"] == r["visible_truth_steps"] == len(EXPECTED)


def test_wrong_and_missed_causes_lower_the_scores():
    tl = build()
    truth = _truth([("engine0", s, c) for s, c in EXPECTED.items()])
    sp = diagnose(tl).spikes.copy()
    sp.loc[sp["step"] == 70, "cause"] = "mixing"         # a non-mixing spike called mixing
    sp = sp[sp["step"] != 100]                           # a missed host stall
    r = score(sp, visible_truth(tl.steps, truth))
    per = r["per_cause"]
    assert per["mixing"]["precision"] == 0.5 and per["ep_hotspot"]["recall"] == 0.0
    assert per["host_stall"]["recall"] == 0.0 and per["host_stall"]["precision"] is None
    assert r["mixing_false_alarm_rate"] == pytest.approx(1 / 5)  # 5 non-mixing spikes remain
    assert r["macro_f1"] < 0.8


def test_multi_cause_step_is_right_when_any_cause_is_named():
    tl = build()
    truth = _truth([("engine0", 40, "mixing"), ("engine0", 40, "ep_hotspot")])
    r = score(diagnose(build(faults={40: FAULTS[40]})).spikes, visible_truth(tl.steps, truth))
    assert r["per_cause"]["mixing"]["recall"] == 1.0
    assert r["per_cause"]["ep_hotspot"]["truth_visible"] == 0


def test_interval_predictions_match_by_time():
    tl = build()
    truth = _truth([("engine0", 40, "mixing")])
    tv = visible_truth(tl.steps, truth)
    t = tl.steps.set_index("step").loc[40]
    sp = pd.DataFrame([dict(instance="engine0", step=3, t_s=t.t_end_s, itl_s=0.1, baseline_s=0.02, cause="mixing",
                            confidence=0.6, evidence={}, missing_signals=[], t_start_s=t.t_start_s - 0.5,
                            t_end_s=t.t_end_s + 0.5, granularity="interval")])
    r = score(sp, tv)
    assert r["per_cause"]["mixing"]["f1"] == 1.0


def _spikes(rows, tl=None):
    """Spike frames by hand: (step, cause, confidence); times from ``tl``'s steps when given."""
    st = tl.steps.set_index("step") if tl is not None else None
    out = []
    for step, cause, conf in rows:
        t0, t1 = (st.loc[step, "t_start_s"], st.loc[step, "t_end_s"]) if st is not None else (step * 0.02, step * 0.02)
        out.append(dict(instance="engine0", step=step, t_start_s=t0, t_end_s=t1, cause=cause, confidence=conf,
                        granularity="step"))
    return pd.DataFrame(out)


@pytest.mark.parametrize("spike_step,tolerance,right", [(40, 0, True), (41, 0, False), (41, 1, True),
                                                        (42, 1, False)])
def test_tolerance_lets_a_spike_name_its_neighbour(spike_step, tolerance, right):
    tl = build()
    tv = visible_truth(tl.steps, _truth([("engine0", 40, "mixing")]))
    j = judge(_spikes([(spike_step, "mixing", 0.9)], tl), tv, tolerance=tolerance)
    assert bool(j["right"].iloc[0]) is right
    r = score(_spikes([(spike_step, "mixing", 0.9)], tl), tv, tolerance=tolerance)
    assert r["per_cause"]["mixing"]["recall"] == (1.0 if right else 0.0)


def test_cause_free_spikes_cost_precision_unknown_is_only_counted():
    tl = build()
    tv = visible_truth(tl.steps, _truth([("engine0", 40, "mixing")]))
    r = score(_spikes([(40, "mixing", 0.9), (10, "host_stall", 0.9), (12, "unknown", 0.2)], tl), tv)
    assert r["per_cause"]["host_stall"]["precision"] == 0.0
    assert r["spikes_without_truth"] == 2 and r["unknown_predicted"] == 1
    assert r["confusion"]["none"] == {"host_stall": 1, "unknown": 1}
    assert r["confusion"]["mixing"] == {"mixing": 1}
    assert r["mixing_false_alarm_rate"] == 0.0


def test_confusion_counts_missed_visible_steps_and_wrong_calls():
    tl = build()
    tv = visible_truth(tl.steps, _truth([("engine0", s, c) for s, c in EXPECTED.items()]))
    r = score(_spikes([(40, "mixing", 0.9), (70, "mixing", 0.6)], tl), tv, causes=("mixing", "ep_hotspot"))
    assert r["confusion"]["ep_hotspot"] == {"mixing": 1}
    assert r["confusion"]["host_stall"] == {MISSED: 1}
    assert r["mixing_false_alarm_rate"] == 1.0
    assert r["macro_f1_causes"] == ["mixing", "ep_hotspot"]


@pytest.mark.parametrize("conf,right,bin_i", [(0.2, False, 0), (0.5, True, 1), (0.79, False, 1), (0.8, True, 2),
                                              (1.0, True, 2)])
def test_calibration_bins(conf, right, bin_i):
    j = pd.DataFrame([dict(cause="mixing", confidence=conf, right=right),
                      dict(cause="unknown", confidence=0.9, right=False)])
    cal = calibration(j)
    assert [b["count"] for b in cal] == [int(i == bin_i) for i in range(3)]
    assert cal[bin_i]["accuracy"] == float(right)


def _sim_truth():
    """Two ranks, 60 steps of 10 ms, a 60 ms host stall before step 30 and a mixed step 45."""
    rows, t = [], 1_000_000_000
    for s in range(60):
        t += 60_000_000 if s == 30 else 1_000_000
        dur = 50_000_000 if s == 45 else 10_000_000
        cause = {30: "host_stall", 45: "mixing", 50: "pd_transfer"}.get(s, "none")
        for rank in (0, 1):
            rows.append(dict(step=s, rank=rank, t_start_ns=t + rank * 100, t_end_ns=t + dur + rank * 100,
                             decode_rows=8, cause=cause))
        t += dur
    return pd.DataFrame(rows)


def test_foreign_truth_one_row_per_step_with_felt_latency():
    tv = foreign_truth(_sim_truth(), offset_s=1000.0)
    assert len(tv) == 60 and tv["t_end_s"].min() > 1000.0
    vis = tv.set_index("step")["visible"]
    assert vis[30] and vis[45] and not vis[50] and not vis[10]  # step 50 was shaped, not felt
    assert tv.set_index("step").loc[10, "cause"] == "none"


def test_time_mapping_renumbers_foreign_steps():
    tv = foreign_truth(_sim_truth(), offset_s=0.0)
    row = tv.set_index("step").loc[45]
    sp = pd.DataFrame([dict(instance="trace:pid1", step=7, t_start_s=row.t_start_s, t_end_s=row.t_end_s,
                            cause="mixing", confidence=0.9, granularity="step")])
    m = map_to_truth_steps(sp, tv)
    assert m["step"].tolist() == [45] and m["instance"].tolist() == ["sim"]
    assert score(m, tv, tolerance=1)["per_cause"]["mixing"]["f1"] == 1.0


@pytest.mark.parametrize("offset_s,window_s,right", [(0.0, 1.0, True), (-0.5, 1.0, True), (-2.0, 1.0, False),
                                                    (-0.5, None, False)])
def test_step_window_matches_a_log_second(offset_s, window_s, right):
    tl = build()
    tv = visible_truth(tl.steps, _truth([("engine0", 40, "mixing")]))
    t = float(tl.steps.set_index("step").loc[40, "t_end_s"]) + offset_s
    sp = pd.DataFrame([dict(instance="engine0@log", step=3, t_start_s=t, t_end_s=t, cause="mixing", confidence=0.9,
                            granularity="step")])
    assert bool(judge(sp, tv, step_window_s=window_s)["right"].iloc[0]) is right
