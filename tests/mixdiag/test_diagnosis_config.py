"""The diagnosis config holds every threshold and refuses nonsense; the rules apply the not-LLM cap."""
from __future__ import annotations

from dataclasses import replace

import pandas as pd
import pytest

from mixdiag.diagnosis import DiagnosisConfig
from mixdiag.diagnosis.config import AttributionConfig, FusionConfig, SignalConfig, SpikeConfig
from mixdiag.diagnosis.detection.context import InstanceContext
from mixdiag.diagnosis.rules.attribution import attribute_spike


@pytest.mark.parametrize("make", [
    lambda: SpikeConfig(starve_confirm=0.0), lambda: SpikeConfig(starve_confirm=1.5), lambda: SpikeConfig(ratio=1.0),
    lambda: SignalConfig(wide_window=2), lambda: SignalConfig(period_alpha=1.0), lambda: SignalConfig(llm_min_share=0),
    lambda: SignalConfig(relation_min_rows=0), lambda: SignalConfig(relation_perms=0),
    lambda: FusionConfig(rank_align=0), lambda: FusionConfig(host_gap_percentile=101),
    lambda: AttributionConfig(not_llm_cap=1.5), lambda: AttributionConfig(rank_skew=0.9),
    lambda: DiagnosisConfig(interval_ratio=1.0),
])
def test_bad_thresholds_are_refused(make):
    with pytest.raises(ValueError):
        make()


# a step spike the step rules call ep_hotspot at 0.55 (kernel-level rank skew on a FULL replay)
_CTX = InstanceContext(quality={"graph_mode": "measured", "sm_active": "measured", "expert_imbalance": "inferred",
                                "host_time": "measured", "token_allocation": "absent"}, graph_norm="FULL", period={})
_ROW = pd.Series(dict(latency_s=0.034, baseline_s=0.02, kind="unknown", granularity="step", graph_mode="FULL",
                      graph_replayed=1.0, has_prefill=False, has_decode=False, graph_off=False, gap_excess_s=0.0,
                      comm_share=0.0, comm_delta=0.0, sm_delta=0.0, rank_skew=1.5, rank_sm_skew=1.09,
                      sm_skew_delta=0.07))


@pytest.mark.parametrize("cap", [0.3, 0.5])
def test_rules_cap_confidence_without_decode_structure(cap):
    cfg = AttributionConfig(not_llm_cap=cap)
    llm = attribute_spike(_ROW, _CTX, cfg)
    assert llm.cause == "ep_hotspot" and llm.confidence == pytest.approx(0.55) and "llm_serving" not in llm.evidence
    capped = attribute_spike(_ROW, replace(_CTX, llm_like=False), cfg)
    assert capped.cause == "ep_hotspot" and capped.confidence == pytest.approx(cap)
    assert capped.evidence["llm_serving"] is False


def test_request_stall_wait_is_evidence():
    row = _ROW.copy()
    row["request_stall"], row["stall_max_s"] = True, 0.25
    assert attribute_spike(row, _CTX, AttributionConfig()).evidence["request_stall_s"] == 0.25
