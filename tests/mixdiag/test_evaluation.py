import sys
from pathlib import Path

import pandas as pd
import pytest

from mixdiag.diagnosis import diagnose
from mixdiag.diagnosis.evaluation import score, visible_truth

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
