"""Interval rules judged absolutely where the relative test cannot see: in a sustained mixing stretch every
interval holds as much prefill work as the ones that did not spike, so "more work than the usual" fails. The
engine's own iteration histogram (a step of batch + chunk_min tokens or more in the interval, or a large chunk
just ahead) then decides: mixing, and never a graph fallback for a batch whose steps all carried that chunk.
Basis: vLLM V1 schedules the running decodes and the prompt chunk in one step (docs/analyze.md, wave 6)."""
from __future__ import annotations

import pandas as pd
import pytest

from mixdiag.diagnosis.config import AttributionConfig
from mixdiag.diagnosis.detection.context import InstanceContext
from mixdiag.diagnosis.rules.interval_rules import attribute_interval

MIN = AttributionConfig().chunk_min_tokens
CTX = InstanceContext(quality={"token_allocation": "absent", "graph_mode": "absent", "sm_active": "absent",
                               "host_time": "absent"}, graph_norm=None, period={},
                      relation={"work_median": 2000.0, "work_sigma": 400.0})
# an interval at the usual prefill work (2000 tokens near it, the median of the quiet intervals), 20 running
ROW = dict(latency_s=0.060, baseline_s=0.012, granularity="interval", running_reqs=20.0, running_reqs_start=20.0,
           prefill_work_near=2000.0, prefill_tokens=2000.0, itl_count=400.0)


@pytest.mark.parametrize("case, extra, cause", [
    ("usual work, no chunk measured: the usual intervals held as much", {}, "unknown"),
    ("usual work, a large chunk ran (prompt ahead)", {"prompt_chunk_ahead_tokens": 4 * MIN}, "mixing"),
    ("usual work, a step of batch + 2 chunk_min tokens", {"iteration_tokens_floor": 20.0 + 2 * MIN}, "mixing"),
    ("usual work, only short prompts ran", {"prompt_chunk_ahead_tokens": MIN / 4,
                                            "iteration_tokens_floor": 20.0 + MIN / 4}, "unknown"),
    # the bucket edge bounds the step's tokens from below: a step in the chunk_min bucket beside 8 decodes held
    # >= chunk_min - 8 prompt tokens, a chunk_min chunk within the ridge estimate's spread (chunk_step.py) ...
    ("usual work, a step in the chunk_min bucket beside 8 decodes",
     {"prompt_chunk_ahead_tokens": MIN - 8.0, "iteration_tokens_floor": MIN, "running_reqs": 8.0,
      "running_reqs_start": 8.0}, "mixing"),
    # ... beside 20 decodes the prompt part may be well under the ridge
    ("usual work, a step in the chunk_min bucket beside 20 decodes",
     {"prompt_chunk_ahead_tokens": MIN - 20.0, "iteration_tokens_floor": MIN}, "unknown"),
    ("batch past the graph sizes, decode-only steps, no chunk", {"graph_none_min_tokens": 16.0}, "graph_fallback"),
    ("batch past the graph sizes, every step carried a large chunk",
     {"graph_none_min_tokens": 16.0, "iteration_tokens_floor": 20.0 + 2 * MIN, "large_step_share": 1.0}, "mixing"),
    ("batch past the graph sizes, a large chunk but decode-only steps too",
     {"graph_none_min_tokens": 16.0, "iteration_tokens_floor": 20.0 + 2 * MIN, "large_step_share": 0.5},
     "graph_fallback"),
])
def test_interval_absolute_chunk_evidence(case, extra, cause):
    a = attribute_interval(pd.Series(ROW | extra), CTX)
    assert a.cause == cause, (case, a)
    if cause == "mixing":
        assert "iteration histogram" in a.evidence["reason"]


@pytest.mark.parametrize("case, extra, cause", [
    ("spiked by one token after a preemption counted the interval before", {"preempted_tail": True,
                                                                            "graph_none_min_tokens": 16.0}, "kv_pressure"),
    ("the same batch past the graph sizes without that token", {"graph_none_min_tokens": 16.0}, "graph_fallback"),
])
def test_a_preempted_tail_is_named_by_its_preemption(case, extra, cause):
    """An interval that spiked only because the request preempted in the interval before came back (its next
    token's ITL spans the recompute) is named by that preemption, not by whatever else its counters hold
    (before, only a preemption counted in the interval itself was read; e2 tuning 10-29 kv_pressure recall
    0.84 -> 0.88 on vllm/scrapes)."""
    a = attribute_interval(pd.Series(ROW | extra), CTX)
    assert a.cause == cause, (case, a)
