"""Pauses the engine timed itself (``host_pause_s``: vLLM's GC debugger, ``VLLM_GC_DEBUG=1``, one line per
collection) as host-stall evidence: the spike a pause makes (one long token per running request, under every
quantile), the noise a pause must stand above, the client step that spanned it, and a real vLLM 0.32 capture
(tests/fixtures/vllm032/gc_pause) where scrapes + log name both injected pauses and scrapes alone name none."""
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from mixdiag.collectors import load
from mixdiag.diagnosis import diagnose
from mixdiag.diagnosis.config import SpikeConfig
from mixdiag.diagnosis.detection.host_wait import wait_excess
from mixdiag.diagnosis.detection.interval_spikes import interval_spikes
from mixdiag.diagnosis.rules.attribution import Attribution
from mixdiag.diagnosis.rules.fused_rules import attribute_fused
from mixdiag.vllm_testbed.truth import read_faults

FIX = Path(__file__).resolve().parents[1] / "fixtures" / "vllm032" / "gc_pause"
CALM = [0.02] * 8


def _rows(pause_at: dict[int, float], floor_s: float = 0.25) -> pd.DataFrame:
    n = 17
    return pd.DataFrame({
        "t_start_s": np.arange(n, dtype=float), "t_end_s": np.arange(n, dtype=float) + 1.0,
        "itl_p50_s": [0.02] * n, "itl_p99_s": [0.03] * n, "itl_count": [100.0] * n, "output_tokens": [100.0] * n,
        "running_reqs": [32.0] * n, "prefill_tokens": [0.0] * n,
        "itl_tail_floor_s": [0.025] * 8 + [floor_s] + [0.025] * 8,
        "host_pause_s": [pause_at.get(i, 0.0) for i in range(n)]})


@pytest.mark.parametrize("name,pause_at,floor_s,want", [
    ("a 0.27 s collection, each running request's next token waited as long", {8: 0.27}, 0.25, {8}),
    ("the collection ended in the interval before the token came back", {7: 0.27}, 0.25, {8}),
    ("two intervals before: not this token's wait", {6: 0.27}, 0.25, set()),
    ("a long token, no pause timed: no spike from one token", {}, 0.25, set()),
    ("a young collection (0.1 ms) beside a long token: it cannot explain it", {8: 0.0001}, 0.25, set()),
    ("a pause whose token waited under 2x the baseline", {8: 0.27}, 0.03, set()),
])
def test_a_timed_pause_spikes_its_interval(name, pause_at, floor_s, want):
    got = interval_spikes(_rows(pause_at, floor_s), 2.0, SpikeConfig())
    assert set(np.flatnonzero(got.is_spike.to_numpy())) == want, name
    assert set(np.flatnonzero(got.paused_tail.to_numpy())) == want, name
    assert not got.preempted_tail.any(), name


def test_a_pause_stands_out_only_above_the_typical_itl():
    """A young collection (well under a millisecond) is in every interval's noise; a full one is not."""
    sig = _rows({3: 0.00005, 8: 0.27, 12: 0.015})
    excess, sigma = wait_excess(sig, None)
    # the typical ITL is 20 ms: the noise floor is half of it, so k = 3 asks for 30 ms
    assert sigma[8] == pytest.approx(0.01)
    assert excess[8] >= 3 * sigma[8] and excess[3] < 3 * sigma[3] and excess[12] < 3 * sigma[12]


def _step(pause, lat, base=0.01, kind="decode", cause="unknown"):
    row = pd.Series({"granularity": "step", "fused_interval_host_pause_s": pause, "latency_s": lat, "baseline_s": base})
    return row, Attribution(cause, 0.3, {"kind": kind})


@pytest.mark.parametrize("pause,lat,base,kind,cause,want", [
    (0.27, 0.28, 0.01, "decode", "unknown", "host_stall"),  # the step spanned the whole pause
    (0.27, 0.28, 0.01, "mixed", "unknown", "host_stall"),   # requests that arrived in the pause joined the step ending it
    # a 60 ms chunk step that also waited out a 520 ms collection: the pause is most of it (tier g 4001 long_gc)
    (0.52, 0.59, 0.01, "mixed", "mixing", "host_stall"),
    (0.02, 0.08, 0.01, "mixed", "mixing", "mixing"),        # a 20 ms pause beside a 70 ms chunk excess: the chunk's
    (0.27, 0.06, 0.01, "decode", "unknown", "unknown"),     # 50 ms of excess did not span a 270 ms pause
    (0.02, 0.28, 0.01, "decode", "unknown", "unknown"),     # a 20 ms pause holds too little of a 270 ms excess
    (0.00004, 0.00405, 0.004, "decode", "unknown", "unknown"),  # a young collection: under one usual step
    (float("nan"), 0.28, 0.01, "decode", "unknown", "unknown"),  # nothing timed pauses there: never by elimination
])
def test_a_client_step_that_spanned_a_timed_pause(pause, lat, base, kind, cause, want):
    row, a = _step(pause, lat, base, kind=kind, cause=cause)
    assert attribute_fused(row, a).cause == want


def test_real_vllm_scrapes_and_gc_log_name_both_pauses_and_scrapes_alone_none():
    truth = [r for r in read_faults(FIX / "truth" / "faults.csv") if r.cause == "host_stall"]
    both = diagnose(load([str(FIX / "scrapes"), str(FIX / "vllm.log")])).spikes
    hs = both[both["cause"] == "host_stall"]
    for r in truth:
        assert ((hs["t_start_s"] <= r.t_end_s) & (hs["t_end_s"] >= r.t_start_s)).any()
    assert len(hs) == len(both) == 2
    assert all(ev.get("host_pause_s", 0) > 0.25 for ev in hs["evidence"])
    alone = diagnose(load(str(FIX / "scrapes"))).spikes
    assert not (alone["cause"] == "host_stall").any()


@pytest.mark.parametrize("ev,want", [
    ({"host_pause_s": 0.547, "gap_share_of_excess": 1.0}, "GC pause 547.0 ms (engine-timed) (100% of excess)"),
    ({"interval_host_pause_s": 0.27}, "GC pause 270.0 ms (engine-timed)"),
    ({"interval_host_wait_excess_s": 0.36, "gap_share_of_excess": 0.9}, "host wait 360.0 ms beyond usual (90% of excess)"),
    ({"gap_before_s": 0.2}, "gap before step 200.0 ms"),
])
def test_the_evidence_line_says_what_measured_the_stall(ev, want):
    from mixdiag.report import evidence_summary
    assert evidence_summary("host_stall", ev) == want
