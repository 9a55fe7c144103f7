"""Overview numbers agree with the diagnosis (the report's own numbers)."""
import math

import pandas as pd
import pytest

from mixdiag.causes import CAUSES
from mixdiag.dashboard.stats import by_cause, headline, signals_frame, sources_frame
from mixdiag.diagnosis import diagnose
from mixdiag.diagnosis.result import count_by_cause, mixed_share
from mixdiag.schema import Timeline


def test_headline_matches_the_diagnosis(make_timeline):
    tl = make_timeline(faults={70: dict(expert_imbalance=4.0, dur=0.080)})
    d = diagnose(tl)
    h = headline(tl, d)
    doc = d.to_json()
    assert h.verdict == doc["verdict"]
    assert h.by_cause == doc["by_cause"] and h.n_spikes == len(doc["spikes"])
    assert (h.itl_p50_s, h.itl_p99_s, h.itl_max_s) == (doc["itl"]["p50_s"], doc["itl"]["p99_s"], doc["itl"]["max_s"])
    assert h.itl_source == "tokens"
    assert h.mixed_share == pytest.approx((tl.steps["kind"] == "mixed").sum() / len(tl.steps))
    assert h.last_spike["t_s"] == d.spikes["t_s"].max()


@pytest.mark.parametrize("kinds,want", [
    (["decode", "mixed", "idle", "prefill"], 1 / 3),
    (["idle", "idle"], math.nan),
    (["mixed"], 1.0),
])
def test_mixed_share(kinds, want):
    s = pd.DataFrame({"kind": kinds, "granularity": "step"})
    got = mixed_share(s)
    assert (math.isnan(got) and math.isnan(want)) or got == pytest.approx(want)


def test_count_by_cause_fills_every_cause_and_folds_strangers_into_unknown():
    got = count_by_cause(["mixing", "cosmic_ray", "mixing"])
    assert list(got) == list(CAUSES) and got["mixing"] == 2 and got["unknown"] == 1


def test_stats_read_the_diagnosis_fields_without_recounting(make_timeline):
    tl = make_timeline(faults={70: dict(expert_imbalance=4.0, dur=0.080)})
    d = diagnose(tl)
    d.by_cause = {c: 7 for c in CAUSES}  # a stand-in count: stats must show it as is
    assert by_cause(d) == d.by_cause
    assert headline(tl, d) is d.headline


def test_sources_and_signals_frames(make_timeline):
    tl = make_timeline(meta_signals={"sm_active": "estimated"})
    meta = dict(tl.meta, sources=[{"format": "vllm-log", "path": "a.log", "lines_total": 10, "lines_parsed": 8,
                                   "lines_skipped": 2, "skipped_examples": [], "partial": False, "notes": ["x"]}])
    tl = Timeline(tl.steps.assign(expert_imbalance=float("nan")), tl.tokens, tl.series, meta)
    src = sources_frame(tl)
    assert src.iloc[0].to_dict() == {"format": "vllm-log", "path": "a.log", "lines_parsed": 8, "lines_skipped": 2,
                                     "partial": False, "notes": "x"}
    sig = signals_frame(tl).set_index("instance").loc["engine0"]
    assert sig["sm_active"] == "estimated" and sig["expert_imbalance"] == "absent" and sig["itl"] == "present"


def test_regime_summary_reads_the_decomposition(hotspot_timeline):
    from mixdiag.dashboard.stats import regime_summary

    d = diagnose(hotspot_timeline)
    r = regime_summary(d)
    total = {c: v for c, v in d.regimes.excess_by_cause().items() if v > 0}
    assert r.excess_s == total and list(r.excess_s) == sorted(total, key=total.get, reverse=True)
    assert sum(r.shares.values()) == pytest.approx(1.0) and r.shares["ep_hotspot"] > 0.5
    assert (r.n_episodes, r.episodes_by_cause, r.saturated) == (1, {"ep_hotspot": 1}, ())
    d.regimes.saturation = {"engine0": dict(saturated=True, waiting_share=0.7, running_at_limit_share=1.0,
                                            running_max=8.0)}
    assert regime_summary(d).saturated[0].startswith("saturated: engine0 - requests waited after 70%")
