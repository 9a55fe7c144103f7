"""The interval relation reads ``prefill_work_tokens`` (vLLM prompt tokens spread back over their prefill
time) before ``prefill_tokens``, identically in the batch (interval_views) and per-instance pipelines."""
from __future__ import annotations

import json

import pandas as pd

from mixdiag.diagnosis import diagnose, part
from mixdiag.diagnosis.detection.interval_batch import RELATION_WORK



def _mixed_fleet():
    """test_interval_batch's fleet (loaded by path: the test directories are not packages)."""
    import importlib.util
    from pathlib import Path
    spec = importlib.util.spec_from_file_location("_interval_batch_fleet", Path(__file__).with_name("test_interval_batch.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod._mixed_fleet()


def _late_counted_fleet() -> tuple:
    """The mixed fleet with vLLM's trap on e-00/e-03/...: the slow intervals' prompt tokens are counted one
    interval late (at first token); on e-00 and e-06 the spread-back column puts them where they ran."""
    tl = _mixed_fleet()
    st = tl.steps.copy()
    slow = st["instance"].isin(["e-00", "e-03", "e-06", "e-09", "e-12"]) & (st["step"] % 4 == 1)
    late = st["instance"].isin(["e-00", "e-03", "e-06", "e-09", "e-12"]) & (st["step"] % 4 == 2)
    st.loc[slow, "prefill_tokens"] = 0.0
    st.loc[late, "prefill_tokens"] = 9000.0
    spread = st["instance"].isin(["e-00", "e-06"])
    st["prefill_work_tokens"] = float("nan")
    st.loc[spread, "prefill_work_tokens"] = 100.0
    st.loc[spread & slow, "prefill_work_tokens"] = 9000.0
    return type(tl)(steps=st, series=None, meta=tl.meta), st


def test_spread_column_first_and_batch_equals_per_instance(monkeypatch):
    assert RELATION_WORK[:2] == ("prefill_work_tokens", "prefill_tokens")
    tl, _ = _late_counted_fleet()
    a = diagnose(tl)
    rel = {k: v["prefill_itl_relation"] for k, v in a.to_json()["instances"].items()}
    # where the column exists the relation follows the intervals the prefill slowed; where only the
    # late counter exists it does not (the slow intervals show no prompt tokens)
    assert rel["e-00"]["rho"] > 0.5 and rel["e-00"]["p_value"] < 0.01
    assert rel["e-03"]["rho"] < 0.3
    monkeypatch.setattr(part, "interval_views", lambda *args: None)  # the per-instance pipeline
    b = diagnose(tl)
    pd.testing.assert_frame_equal(a.spikes, b.spikes)
    pd.testing.assert_frame_equal(a.steps, b.steps)
    assert json.dumps(a.to_json(), default=str) == json.dumps(b.to_json(), default=str)
