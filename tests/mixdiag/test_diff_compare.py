"""`mixdiag diff`'s compute (mixdiag/diagnosis/diff/capture.py, compare.py): one side's facts agree with its
diagnosis, identical captures are "no change", and what moved - and which cause moved it - is arithmetic on the
two sides' figures, beyond their noise. Real captures: two tiny runs of the reference engine (helpers/diff_runs)."""
import dataclasses
import math

import pytest

from mixdiag.collectors import load
from mixdiag.diagnosis import diagnose
from mixdiag.diagnosis.budget import BUDGET_CAUSES
from mixdiag.diagnosis.diff import capture_facts, diff
from mixdiag.diagnosis.diff.capture import Figure
from mixdiag.report_diff import headline


@pytest.fixture(scope="module")
def sides(small_chunk_runs):
    out = {}
    for chunk, path in small_chunk_runs.items():
        tl = load(str(path))
        d = diagnose(tl)
        out[chunk] = (tl, d, capture_facts(tl, d, (str(path),)))
    return out


def test_facts_are_the_diagnosis_figures(sides):
    from mixdiag.tuning.sweep import measured_p99
    from mixdiag.tuning.traffic import from_timeline

    tl, d, f = sides[128]
    assert f.itl_p50_s.value == d.itl["p50_s"] and f.itl_p99_s.value == d.itl["p99_s"]
    assert f.budget_s == d.budget.excess_by_cause()
    assert f.regimes_s == d.regimes.excess_by_cause()
    assert f.stream_s == pytest.approx(sum(ib.token_time_s for ib in d.budget.instances.values()))
    assert f.spikes == d.by_cause and f.itl_source == "token_events" and f.ttft_source == "token_events"
    # TTFT measured as `mixdiag tune` measures it (first token - arrival), so its prediction is checked like for like
    assert f.ttft_p99_s.value == pytest.approx(measured_p99(tl, from_timeline(tl))["ttft_p99_s"])
    assert f.requests == 9 and f.duration_s > 0
    assert all(math.isfinite(x.noise) and x.noise >= 0 for x in (f.itl_p50_s, f.itl_p99_s, f.ttft_p99_s))


def test_identical_captures_are_no_change(sides):
    f = sides[128][2]
    dd = diff(f, f)
    assert dd.no_change and dd.measurable and dd.comparable and not dd.caveats
    assert set(dd.metrics["verdict"]) == {"no change"}
    assert set(dd.budget["verdict"]) <= {"no change"} and dd.moved_by is None and dd.moved_by_regimes is None
    assert headline(dd).startswith("No change:")


def test_two_chunk_sizes_side_by_side_add_up(sides):
    b, a = sides[128][2], sides[64][2]
    dd = diff(b, a)
    t = dd.budget.set_index("cause")
    named = [c for c in BUDGET_CAUSES if c != "none"]
    assert t.loc["total", "before_s"] == pytest.approx(sum(b.budget_s[c] for c in named))
    assert t.loc["total", "after_raw_s"] == pytest.approx(sum(a.budget_s[c] for c in named))
    scale = b.stream_s / a.stream_s if dd.normalised else 1.0
    assert t.loc[named, "after_s"].to_numpy() == pytest.approx(t.loc[named, "after_raw_s"].to_numpy() * scale)
    if t.loc["total", "after_s"] != t.loc["total", "before_s"]:  # shares of the change add up to the whole
        assert t.loc[named, "share_of_change"].sum() == pytest.approx(1.0)
    assert (t["spikes_before"].loc[named].sum(), t["spikes_after"].loc[named].sum()) == \
        (sum(b.spikes.values()), sum(a.spikes.values()))


def _with(f, **budget):
    """``f`` with some causes' budget excess replaced, and noise small enough that a halving moves."""
    return dataclasses.replace(f, budget_s={**f.budget_s, **budget},
                               budget_noise={k: 1e-4 for k in f.budget_noise})


@pytest.mark.parametrize("before, after, cause, share, words", [
    # mixing falls 41.2 -> 7.9 s while unknown falls 10 -> 0.8: mixing carries 33.3 / 42.5 of the fall
    ({"mixing": 41.2, "unknown": 10.0}, {"mixing": 7.9, "unknown": 0.8}, "mixing", 33.3 / 42.5,
     "mixing's 41.2 s -> 7.9 s (-81 %, down), 78 % of the fall"),
    # a rise: ep_hotspot doubles, mixing unchanged
    ({"mixing": 5.0, "ep_hotspot": 4.0}, {"mixing": 5.0, "ep_hotspot": 8.0}, "ep_hotspot", 1.0,
     "ep_hotspot's 4.0 s -> 8.0 s (+100 %, up), 100 % of the rise"),
])
def test_which_cause_moved_the_excess(sides, before, after, cause, share, words):
    f = sides[128][2]
    zero = {c: 0.0 for c in BUDGET_CAUSES}
    dd = diff(_with(f, **{**zero, **before}), _with(f, **{**zero, **after}))
    assert dd.moved_by is not None and dd.moved_by.cause == cause
    assert dd.moved_by.share == pytest.approx(share)
    assert words in headline(dd)


@pytest.mark.parametrize("change, caveat, comparable", [
    ({"itl_source": "interval_quantiles"}, "different views", False),
    ({"budget_sources": ("interval_itl",)}, "different budget units", False),
    ({"instances": ("engine0", "engine1")}, "different servers", False),
    ({"duration_s": None}, "durations differ", True),   # None: 3x BEFORE's, set below
    ({"requests": None}, "request rate differs", True),  # None: 2x BEFORE's
])
def test_captures_that_measure_different_things_say_so(sides, change, caveat, comparable):
    f = sides[128][2]
    if change.get("duration_s", 0) is None:
        change = {"duration_s": 3 * f.duration_s}
    if change.get("requests", 0) is None:
        change = {"requests": 2 * f.requests}
    dd = diff(f, dataclasses.replace(f, **change))
    assert any(c.startswith(caveat) for c in dd.caveats), dd.caveats
    assert dd.comparable is comparable
    assert headline(dd).startswith("Not comparable") is (not comparable)


def test_a_figure_without_noise_is_unknown_not_a_change(sides):
    f = sides[128][2]
    g = dataclasses.replace(f, itl_p99_s=Figure(f.itl_p99_s.value * 2, math.nan))
    row = diff(f, g).metrics.set_index("metric").loc["itl_p99_s"]
    assert row["verdict"] == "unknown" and row["change_pct"] == pytest.approx(100.0)
