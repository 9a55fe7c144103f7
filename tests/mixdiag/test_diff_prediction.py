"""A `mixdiag tune` recommendation against what AFTER measured (mixdiag/diagnosis/diff/prediction.py)."""
import math

import pytest

from mixdiag.diagnosis.diff.prediction import check_prediction
from mixdiag.errors import UserError

DOC = {"settings": [], "workload": {"requests": 30},
       "current": {"label": "chunk_size=512", "itl_p99_s": 0.36, "ttft_p99_s": 1.44},
       "measured_current": {"itl_p99_s": 0.40, "ttft_p99_s": 1.60},
       "recommendation": "chunk_size=128",
       "recommended": {"label": "chunk_size=128", "itl_p99_s": 0.31, "ttft_p99_s": 3.3}}


@pytest.mark.parametrize("metric, measured, error, current_error", [
    ("itl_p99_s", 0.25, 24.0, -10.0),     # predicted 0.31 vs 0.25 measured: +24 %; replay 0.36 vs 0.40: -10 %
    ("ttft_p99_s", 4.0, -17.5, -10.0),
])
def test_errors_against_after_and_the_replay_of_the_current_setting(metric, measured, error, current_error):
    kw = {"after_itl_p99_s": 0.25, "after_ttft_p99_s": 4.0}
    p = check_prediction(DOC, **kw, before_requests=30, after_requests=30, before_duration_s=20, after_duration_s=22)
    row = {r.metric: r for r in p.rows}[metric]
    assert row.measured == measured
    assert row.error_pct == pytest.approx(error) and row.current_error_pct == pytest.approx(current_error)
    assert (p.recommendation, p.current, p.notes) == ("chunk_size=128", "chunk_size=512", ())


@pytest.mark.parametrize("kw, note", [
    ({"before_requests": 29, "after_requests": 29}, "may not have been made on BEFORE"),
    ({"before_requests": 30, "after_requests": 60}, "differs from BEFORE's"),
    ({"before_requests": 30, "after_requests": 30, "before_duration_s": 10, "after_duration_s": 30}, "request rate"),
])
def test_other_traffic_is_flagged(kw, note):
    p = check_prediction(DOC, 0.25, 4.0, **kw)
    assert any(note in n for n in p.notes), p.notes


def test_after_without_ttft_is_said():
    p = check_prediction(DOC, 0.25, math.nan)
    assert math.isnan({r.metric: r for r in p.rows}["ttft_p99_s"].error_pct)
    assert any("TTFT needs request arrivals" in n for n in p.notes)


@pytest.mark.parametrize("doc, msg", [
    ({"verdict": "x"}, "not a 'mixdiag tune --json' document"),
    ([1, 2], "not a 'mixdiag tune --json' document"),
    ({**DOC, "recommended": None, "reason": "no setting meets P99 TTFT <= 1 s"}, "recommended no setting"),
])
def test_not_a_usable_tune_document(doc, msg):
    with pytest.raises(UserError, match=msg):
        check_prediction(doc, 0.25, 4.0)
