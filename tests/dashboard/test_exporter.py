"""The diagnosis exporter: Prometheus naming, bounded labels, counters that only count new spikes."""
import math

import pytest
from prometheus_client import REGISTRY
from prometheus_client.parser import text_string_to_metric_families

from mixdiag.causes import CAUSES
from mixdiag.diagnosis import diagnose
from mixdiag.exporter import DiagnosisExporter
from mixdiag.schema import Timeline


def scrape(exporter) -> dict:
    """{(metric name, labels tuple): value} from the text exposition, via prometheus_client's parser."""
    out, types = {}, {}
    for fam in text_string_to_metric_families(exporter.render().decode()):
        types[fam.name] = fam.type
        for s in fam.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    out["__types__"] = types
    return out


def spikes_total(m) -> dict:
    return {c: m[("mixdiag_spikes_total", (("cause", c),))] for c in CAUSES}


def test_counts_equal_the_report(faulty_timeline):
    d = diagnose(faulty_timeline)
    ex = DiagnosisExporter()
    ex.publish(faulty_timeline, d, duration_s=0.5, now=faulty_timeline.span()[1] + 2.0)
    m = scrape(ex)
    assert spikes_total(m) == {c: float(n) for c, n in d.to_json()["by_cause"].items()}
    last = d.spikes.loc[d.spikes["t_s"].idxmax()]
    assert m[("mixdiag_last_spike_cause", (("cause", last["cause"]),))] == 1.0
    assert sum(m[("mixdiag_last_spike_cause", (("cause", c),))] for c in CAUSES) == 1.0
    assert m[("mixdiag_last_spike_itl_seconds", ())] == pytest.approx(last["itl_s"])
    assert m[("mixdiag_analysis_lag_seconds", ())] == pytest.approx(2.0)
    assert m[("mixdiag_analysis_duration_seconds", ())] == 0.5
    assert m[("mixdiag_mixed_steps_ratio", ())] == pytest.approx((faulty_timeline.steps["kind"] == "mixed").mean())
    assert m[("mixdiag_itl_seconds", (("quantile", "0.99"),))] == pytest.approx(d.itl["p99_s"])
    assert m[("mixdiag_analyses_total", ())] == 1.0
    types = m["__types__"]
    assert types["mixdiag_spikes"] == "counter" and types["mixdiag_analyses"] == "counter"
    assert types["mixdiag_last_spike_itl_seconds"] == "gauge"


def excess_total(m) -> dict:
    return {c: m[("mixdiag_itl_excess_seconds_total", (("cause", c),))] for c in CAUSES}


def episodes_total(m) -> dict:
    return {c: m[("mixdiag_episodes_total", (("cause", c),))] for c in CAUSES}


def test_excess_and_episodes_equal_the_regimes(hotspot_timeline):
    d = diagnose(hotspot_timeline)
    ex = DiagnosisExporter()
    ex.publish(hotspot_timeline, d)
    m = scrape(ex)
    doc = d.to_json()["regimes"]
    assert m["__types__"]["mixdiag_itl_excess_seconds"] == "counter"
    assert m["__types__"]["mixdiag_episodes"] == "counter"
    # exact token-seconds: the decomposition's own numbers, every cause a label
    assert excess_total(m) == pytest.approx(d.regimes.excess_by_cause())
    assert {c: v for c, v in excess_total(m).items() if round(v, 6) > 0} == pytest.approx(doc["excess"]["token_seconds"])
    assert excess_total(m)["ep_hotspot"] > excess_total(m)["mixing"] > 0
    assert episodes_total(m) == {c: float(c == "ep_hotspot") for c in CAUSES}
    ex.publish(hotspot_timeline, d)  # the same data again adds nothing
    assert excess_total(scrape(ex)) == pytest.approx(excess_total(m))
    assert episodes_total(scrape(ex)) == episodes_total(m)


def _window(tl, last_step):
    return Timeline(tl.steps[tl.steps["step"] <= last_step], tl.tokens[tl.tokens["step"] <= last_step], meta=tl.meta)


def test_a_watcher_counts_an_episode_once_and_excess_never_goes_down(hotspot_timeline):
    ex = DiagnosisExporter()
    seen_excess, seen_eps = [], []
    # growing windows: the hotspot (steps 200-349) is under way in the second and over in the third
    for last in (150, 280, 499, 499):
        w = _window(hotspot_timeline, last)
        ex.publish(w, diagnose(w))
        m = scrape(ex)
        seen_excess.append(excess_total(m))
        seen_eps.append(episodes_total(m))
    for a, b in zip(seen_excess, seen_excess[1:]):
        assert all(b[c] >= a[c] for c in CAUSES)
    assert seen_eps[0]["ep_hotspot"] == 0 and seen_eps[1]["ep_hotspot"] == 1
    assert seen_eps[-1] == {c: float(c == "ep_hotspot") for c in CAUSES}  # the grown episode is not new
    assert seen_excess[-1] == seen_excess[-2]
    ex.publish(hotspot_timeline, diagnose(hotspot_timeline), reset=True)  # another dataset: start over
    assert excess_total(scrape(ex)) == pytest.approx(diagnose(hotspot_timeline).regimes.excess_by_cause())


def test_regime_counters_exist_at_zero_before_any_diagnosis():
    m = scrape(DiagnosisExporter())
    assert set(excess_total(m).values()) == {0.0} and set(episodes_total(m).values()) == {0.0}


def test_labels_are_bounded_and_the_registry_is_private(faulty_timeline):
    ex1, ex2 = DiagnosisExporter(), DiagnosisExporter()
    ex1.publish(faulty_timeline, diagnose(faulty_timeline))
    labels = {lab for key in scrape(ex1) if key != "__types__" for lab in key[1]}
    assert {v for k, v in labels if k == "cause"} == set(CAUSES)
    assert {k for k, _ in labels} <= {"cause", "quantile"}
    assert scrape(ex2)[("mixdiag_analyses_total", ())] == 0.0
    assert REGISTRY.get_sample_value("mixdiag_analyses_total") is None


def test_overlapping_windows_count_each_spike_once(make_timeline):
    full = make_timeline(n_steps=300, period=30)
    d_full = diagnose(full)
    first = Timeline(full.steps[full.steps["step"] < 150], full.tokens[full.tokens["step"] < 150], meta=full.meta)
    ex = DiagnosisExporter()
    ex.publish(first, diagnose(first))
    n_first = sum(spikes_total(scrape(ex)).values())
    ex.publish(first, diagnose(first))  # the same window again: nothing new
    assert sum(spikes_total(scrape(ex)).values()) == n_first
    ex.publish(full, d_full)  # the window grew: only the newer spikes are added
    assert sum(spikes_total(scrape(ex)).values()) == len(d_full.spikes)
    ex.publish(first, diagnose(first), reset=True)  # a different dataset: counters start over
    assert sum(spikes_total(scrape(ex)).values()) == n_first


def test_empty_exporter_and_relative_clock(make_timeline):
    ex = DiagnosisExporter()
    m = scrape(ex)
    assert all(v == 0 for v in spikes_total(m).values())
    assert math.isnan(m[("mixdiag_last_spike_itl_seconds", ())])
    tl = make_timeline(period=0)
    tl = Timeline(tl.steps, tl.tokens, meta=dict(tl.meta, clock="relative"))
    ex.publish(tl, diagnose(tl))
    assert math.isnan(scrape(ex)[("mixdiag_analysis_lag_seconds", ())])  # no wall clock: no lag
