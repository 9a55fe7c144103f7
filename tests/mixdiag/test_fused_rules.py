"""mixdiag/diagnosis/rules/fused_rules.py: waits between steps read from an interval's ITL sum."""
import math

import pytest

from mixdiag.diagnosis.rules.fused_rules import attribute_between_steps


def _row(recent_stall):
    return {"fused_host_gap_excess_s": 0.6, "fused_host_gap_threshold_s": 0.05, "fused_host_gap_per_request_s": 0.62,
            "baseline_s": 0.05, "fused_recent_stall_steps": recent_stall, "preempted_reqs": 0.0,
            "kv_transfer_bytes": 0.0}


@pytest.mark.parametrize("recent_stall,want", [(0.0, "host_stall"), (math.nan, "host_stall"), (3.0, None)])
def test_waits_after_prefill_only_steps_are_not_host_time(recent_stall, want):
    """A decode that waited through prefill-only steps straddling the scrape logs the whole wait in
    the later interval: its ITL sum exceeds its steps' time, which is no host stall."""
    a = attribute_between_steps(_row(recent_stall))
    assert (a.cause if a else None) == want
