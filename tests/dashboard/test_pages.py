"""Page callback bodies, called without a browser: load, overview, zoom re-sampling, spike click, live toggle."""
import pytest
from dash import no_update
from dash.exceptions import PreventUpdate

from mixdiag.dashboard import shell
from mixdiag.dashboard.pages import overview, sources, spike, timeline
from mixdiag.dashboard.settings import DashboardConfig
from mixdiag.dashboard.store import DataStore
from mixdiag.exporter import DiagnosisExporter


@pytest.fixture
def store(faulty_run):
    s = DataStore(DashboardConfig.from_data_path(faulty_run.parent), DiagnosisExporter())
    return s


@pytest.fixture
def key(store):
    return sources.on_load(store, "sources-load-btn", "run1", None, None)[0]


@pytest.mark.parametrize("relayout,want", [
    (None, False),
    ({"autosize": True}, False),
    ({"xaxis.range[0]": 1.5, "xaxis.range[1]": 2.5}, (1.5, 2.5)),
    ({"xaxis3.range[0]": 0, "xaxis3.range[1]": 4}, (0.0, 4.0)),  # zoom on a lower panel
    ({"xaxis.range": [3, 1]}, (3.0, 1.0)),
    ({"xaxis.autorange": True, "xaxis2.autorange": True}, None),  # double-click: everything
    ({"yaxis.range[0]": 0, "yaxis.range[1]": 1}, False),  # y zoom only
    ({"xaxis.range[0]": "a", "xaxis.range[1]": 2}, False),
])
def test_x_range_from_relayout(relayout, want):
    assert timeline.x_range_from_relayout(relayout) == want


def test_load_then_overview_and_instance_choice(store, key):
    ds = store.get(key["id"])
    verdict, cards, fig, src, sig = overview.on_dataset(store, key)
    assert verdict == ds.diagnosis.verdict
    assert list(fig.data[0].x) == [ds.diagnosis.by_cause[c] for c in fig.data[0].y]
    assert store.exporter.snapshot.spikes_total == ds.diagnosis.by_cause
    assert timeline.on_instances(store, key) == ([{"label": "engine0", "value": "engine0"}], "engine0")
    with pytest.raises(PreventUpdate):  # nothing loaded: pages keep their placeholders
        overview.on_dataset(store, None)


def test_overview_budget_agrees_with_the_diagnosis_and_exporter(store, key):
    ds = store.get(key["id"])
    fig, lines = overview.on_budget(store, key)
    total = ds.diagnosis.budget.excess_by_cause()
    assert dict(zip(fig.data[0].y, fig.data[0].x)) == {c: v for c, v in total.items() if v > 0}
    assert lines and "P99" in lines[0].children and "without" in lines[0].children
    with pytest.raises(PreventUpdate):
        overview.on_budget(store, None)


def test_overview_regimes_and_timeline_bands_agree_with_the_diagnosis_and_exporter(hotspot_run):
    store = DataStore(DashboardConfig.from_data_path(hotspot_run.parent), DiagnosisExporter())
    key = sources.on_load(store, "sources-load-btn", "hot", None, None)[0]
    ds = store.get(key["id"])
    fig, saturation = overview.on_regimes(store, key)
    total = ds.diagnosis.regimes.excess_by_cause()
    whole = sum(total.values())
    bars = dict(zip(fig.data[0].y, fig.data[0].customdata))
    assert bars == pytest.approx({c: v for c, v in total.items() if v > 0})
    assert dict(zip(fig.data[0].y, fig.data[0].x)) == pytest.approx({c: v / whole for c, v in total.items() if v > 0})
    assert store.exporter.snapshot.itl_excess_total_s == pytest.approx(total)  # the watcher's counter says the same
    assert "(1 sustained episode)" in fig.layout.title.text and saturation == []
    assert "ep_hotspot" in ds.diagnosis.verdict
    tfig = timeline.on_timeline(store, key, "engine0", None, 400, trigger="timeline-instance")
    bands = [s for s in tfig.layout.shapes if s.type == "rect"]
    assert [b.name for b in bands] == ["episode: ep_hotspot"]
    with pytest.raises(PreventUpdate):
        overview.on_regimes(store, None)


@pytest.mark.parametrize("trigger,choice,msg", [
    ("sources-load-btn", None, "pick a run or a file first"),
    ("sources-load-btn", "../../etc", "error: '../../etc' is outside the data directory"),
    ("sources-load-btn", "nope", "error: 'nope' does not exist in the data directory"),
])
def test_load_errors_are_one_line_messages(store, trigger, choice, msg):
    assert sources.on_load(store, trigger, choice, None, None) == (no_update, msg)


def test_timeline_full_then_zoomed(store, key):
    full = timeline.on_timeline(store, key, "engine0", None, 400, trigger="timeline-instance")
    zoomed = timeline.on_timeline(store, key, "engine0", {"xaxis.range[0]": 1.0, "xaxis.range[1]": 2.0}, 400,
                                  trigger="timeline-graph")
    assert list(zoomed.layout.xaxis.range) == [1.0, 2.0] and full.layout.xaxis.range is None
    assert full.layout.uirevision == zoomed.layout.uirevision == f"{key['id']}:engine0"  # zoom kept per dataset
    itl = lambda f: [t for t in f.data if t.name == "ITL"][0]  # noqa: E731
    data = timeline.view(store.get(key["id"]), "engine0").itl["t_rel_s"]
    assert len(itl(full).x) < len(data)  # the whole run: min/max per bucket
    in_window = int(((data >= 1.0) & (data <= 2.0)).sum())
    assert len(itl(zoomed).x) == in_window + 2  # zoomed in: every point of the window (+ one neighbour each side)
    with pytest.raises(PreventUpdate):  # a relayout that is not an x zoom does not redraw
        timeline.on_timeline(store, key, "engine0", {"autosize": True}, 400, trigger="timeline-graph")
    with pytest.raises(PreventUpdate):
        timeline.on_timeline(store, key, "ghost", None, 400, trigger="timeline-instance")


@pytest.mark.parametrize("triggers,relayout,zoomed", [
    (("timeline-xrange",), {"xaxis.range": [1.0, 2.0]}, True),           # a zoom alone re-samples
    (("timeline-xrange", "timeline-instance"), {"autosize": True}, False),  # mount: Dash merged the triggers
    (("timeline-xrange",), None, False),                                   # the empty store's mount: everything
    ((), None, False),                                                     # initial call
])
def test_timeline_zooms_only_when_a_zoom_alone_fired(store, key, triggers, relayout, zoomed):
    fig = timeline.on_timeline(store, key, "engine0", relayout, 400, trigger=triggers)
    assert (fig.layout.xaxis.range is not None) == zoomed


def test_click_on_a_spike_opens_the_spike_page_on_it(store, key):
    ds = store.get(key["id"])
    options, value = spike.on_choices(store, key, None)
    # nothing clicked yet: the page opens on the largest spike, the dropdown's first option
    assert len(options) == len(ds.diagnosis.spikes) and value == options[0]["value"] == spike.largest_spike(ds.diagnosis)
    sp = ds.diagnosis.spikes.iloc[2]
    want = {"key": key, "spike": f"engine0|{int(sp['step'])}"}
    click = {"points": [{"curveNumber": 2, "customdata": ["engine0", int(sp["step"])]}]}
    assert timeline.on_click(store, key, click) == (want, spike.PATH)
    with pytest.raises(PreventUpdate):  # a click on the ITL line away from any spike is ignored
        timeline.on_click(store, key, {"points": [{"curveNumber": 0, "x": 0.0123}]}, instance="engine0")
    x = float(sp["t_s"]) - timeline.view(ds, "engine0").t0_s  # the line's point under the spike marker
    assert timeline.on_click(store, key, {"points": [{"curveNumber": 0, "x": x}]}, instance="engine0") == \
        (want, spike.PATH)
    # the Spike page opens on the clicked spike; once another dataset (or revision) shows, it does not
    assert spike.on_choices(store, key, want)[1] == want["spike"]
    assert spike.on_choices(store, {**key, "rev": key["rev"] + 1}, want)[1] == value
    summary, fig, evidence, neighbours = spike.on_spike(store, key, want["spike"])
    assert sp["cause"] in str(summary) and "predicted height" in str(summary)
    assert evidence.id == "spike-evidence-table" and neighbours.id == "spike-neighbours-table"
    assert fig.layout.title.text == f"Steps around spike {int(sp['step'])} ({sp['cause']})"


def test_spike_page_without_a_choice_explains_what_to_do(store, key):
    summary, *_ = spike.on_spike(store, key, None)
    assert "Click a spike marker" in str(summary)


def test_the_spike_page_opens_on_the_largest_spike(store, key):
    """Largest = most ITL above its own baseline (a slow instance's every step does not outrank a
    real spike); ITL itself where the baseline is unknown."""
    import math
    import types

    import pandas as pd

    sp = pd.DataFrame({"instance": ["slow", "fast", "nobase"], "step": [3, 8, 5], "itl_s": [1.0, 0.5, 0.3],
                       "baseline_s": [0.9, 0.1, math.nan]})
    assert spike.largest_spike(types.SimpleNamespace(spikes=sp)) == "fast|8"
    sp.loc[2, "itl_s"] = 0.45  # no baseline: its whole ITL counts, 0.45 > 0.4
    assert spike.largest_spike(types.SimpleNamespace(spikes=sp)) == "nobase|5"
    assert spike.largest_spike(types.SimpleNamespace(spikes=sp.iloc[:0])) is None
    # on a loaded run the first render already shows a spike's cause, evidence and neighbours
    ds = store.get(key["id"])
    _, value = spike.on_choices(store, key, None)
    summary, fig, evidence, neighbours = spike.on_spike(store, key, value)
    inst, step = value.split("|")
    top = ds.diagnosis.spikes
    top = top[(top["instance"] == inst) & (top["step"] == int(step))].iloc[0]
    assert top["cause"] in str(summary) and f"step {step}" in str(summary)
    assert evidence.id == "spike-evidence-table" and neighbours.id == "spike-neighbours-table"
    excess = ds.diagnosis.spikes["itl_s"] - ds.diagnosis.spikes["baseline_s"]
    assert top["itl_s"] - top["baseline_s"] == excess.max()


def test_live_toggle_validates_input():
    from mixdiag.collectors.prometheus.live import LiveFollower

    live = LiveFollower()
    assert sources.on_live_toggle(live, "sources-live-btn", "file:///etc/passwd", 5)[2].startswith(
        "error: live URL must be")
    assert sources.on_live_toggle(live, "sources-live-btn", "http://127.0.0.1:9/metrics", 0.1)[2].startswith(
        "error: refresh")
    assert sources.on_live_toggle(live, "sources-live-btn", "http://127.0.0.1:9/metrics", 2) == \
        (False, 2000, "following http://127.0.0.1:9/metrics (engine) every 2 s")
    assert sources.on_live_toggle(live, "sources-live-stop", None, None)[0] is True and not live.active


@pytest.mark.parametrize("pathname,current", [("/", "/"), (None, "/"), ("/spike", "/spike"), ("/timeline/", "/timeline"),
                                              ("/nowhere", None)])
def test_the_current_pages_link_is_marked(pathname, current):
    paths = ["/", "/timeline", "/spike", "/sources"]
    styles = shell.link_styles(pathname, paths)
    assert [p for p, s in zip(paths, styles) if s == shell.LINK_ACTIVE] == ([current] if current else [])
