"""Rule 4 and the size of the prompt chunk: a mixed step whose prefill is *inferred* (a client's prompt
lengths spread over the steps before each first token) names mixing only for a chunk that can slow a step
(``chunk_min_tokens``, the roofline ridge); a measured allocation keeps rule 4 as it was (the step's own
counts, a tiny chunk only lowers confidence). Basis on real data: on the real-vLLM testbed's client view,
641 of 773 wrong mixing calls sat on steps a short prompt joined (docs/analyze.md, tier g)."""
from __future__ import annotations

import pandas as pd
import pytest

from mixdiag.diagnosis.config import AttributionConfig
from mixdiag.diagnosis.detection.context import InstanceContext
from mixdiag.diagnosis.rules.step_rules import attribute_step

MIN = AttributionConfig().chunk_min_tokens
ROW = dict(latency_s=0.12, baseline_s=0.012, kind="mixed", granularity="step", has_prefill=True, has_decode=True,
           decode_rows=12.0, decode_reqs=12.0)


def _ctx(q: str) -> InstanceContext:
    return InstanceContext(quality={"token_allocation": q, "graph_mode": "absent", "sm_active": "absent",
                                    "host_time": "absent"}, graph_norm=None, period={})


@pytest.mark.parametrize("case, quality, prefill, cause", [
    ("inferred long prompt chunk", "inferred", 4 * MIN, "mixing"),
    ("inferred chunk just at the floor", "inferred", MIN, "mixing"),
    ("inferred short prompt joining", "inferred", MIN / 2, "unknown"),
    ("inferred 20-token prompt", "inferred", 20.0, "unknown"),
    ("measured short chunk: the step's own counts, still too small", "measured", MIN / 2, "unknown"),
    ("measured long chunk", "measured", 4 * MIN, "mixing"),
])
def test_small_inferred_chunk_names_no_mixing(case, quality, prefill, cause):
    a = attribute_step(pd.Series(ROW | {"prefill_tokens": prefill, "q_token_allocation": quality}), _ctx(quality))
    assert a.cause == cause, (case, a)
    if cause == "unknown":
        assert "short prompt" in a.evidence["reason"] and a.evidence["prefill_tokens"] == prefill
