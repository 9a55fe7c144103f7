"""Callback bodies, called without a browser: load, overview, zoom re-sampling, spike click."""
import pytest
from dash import no_update
from dash.exceptions import PreventUpdate

from mixdiag.dashboard import callbacks
from mixdiag.dashboard.settings import DashboardConfig
from mixdiag.dashboard.store import DataStore
from mixdiag.exporter import DiagnosisExporter


@pytest.fixture
def store(faulty_run):
    s = DataStore(DashboardConfig.from_data_path(faulty_run.parent), DiagnosisExporter())
    return s


@pytest.fixture
def key(store):
    return callbacks.on_load(store, "load-btn", "run1", None, None)[0]


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
    assert callbacks.x_range_from_relayout(relayout) == want


def test_load_then_overview(store, key):
    ds = store.get(key["id"])
    verdict, cards, fig, src, sig, options, instance, label = callbacks.on_dataset(store, key)
    assert verdict == ds.diagnosis.verdict and label == "run1"
    assert options == [{"label": "engine0", "value": "engine0"}] and instance == "engine0"
    assert list(fig.data[0].x) == [ds.diagnosis.by_cause[c] for c in fig.data[0].y]
    assert store.exporter.snapshot.spikes_total == ds.diagnosis.by_cause


@pytest.mark.parametrize("trigger,choice,msg", [
    ("load-btn", None, "pick a run or a file first"),
    ("load-btn", "../../etc", "error: '../../etc' is outside the data directory"),
    ("load-btn", "nope", "error: 'nope' does not exist in the data directory"),
])
def test_load_errors_are_one_line_messages(store, trigger, choice, msg):
    assert callbacks.on_load(store, trigger, choice, None, None) == (no_update, msg)


def test_timeline_full_then_zoomed(store, key):
    full = callbacks.on_timeline(store, key, "engine0", None, 400, trigger="instance")
    zoomed = callbacks.on_timeline(store, key, "engine0", {"xaxis.range[0]": 1.0, "xaxis.range[1]": 2.0}, 400,
                                   trigger="timeline-graph")
    assert list(zoomed.layout.xaxis.range) == [1.0, 2.0] and full.layout.xaxis.range is None
    assert full.layout.uirevision == zoomed.layout.uirevision == f"{key['id']}:engine0"  # zoom kept per dataset
    itl = lambda f: [t for t in f.data if t.name == "ITL"][0]  # noqa: E731
    data = store.view(store.get(key["id"]), "engine0").itl["t_rel_s"]
    assert len(itl(full).x) < len(data)  # the whole run: min/max per bucket
    in_window = int(((data >= 1.0) & (data <= 2.0)).sum())
    assert len(itl(zoomed).x) == in_window + 2  # zoomed in: every point of the window (+ one neighbour each side)
    with pytest.raises(PreventUpdate):  # a relayout that is not an x zoom does not redraw
        callbacks.on_timeline(store, key, "engine0", {"autosize": True}, 400, trigger="timeline-graph")
    with pytest.raises(PreventUpdate):
        callbacks.on_timeline(store, key, "ghost", None, 400, trigger="instance")


def test_click_on_a_spike_opens_the_spike_page(store, key):
    ds = store.get(key["id"])
    options, value, tab = callbacks.on_spike_pick(store, key, None, trigger="dataset-key")
    assert len(options) == len(ds.diagnosis.spikes) and value is None and tab is no_update
    sp = ds.diagnosis.spikes.iloc[2]
    click = {"points": [{"curveNumber": 2, "customdata": ["engine0", int(sp["step"])]}]}
    assert callbacks.on_spike_pick(store, key, click, trigger="timeline-graph") == \
        (no_update, f"engine0|{int(sp['step'])}", "spike")
    with pytest.raises(PreventUpdate):  # a click on the ITL line away from any spike is ignored
        callbacks.on_spike_pick(store, key, {"points": [{"curveNumber": 0, "x": 0.0123}]}, trigger="timeline-graph",
                                instance="engine0")
    x = float(sp["t_s"]) - store.view(ds, "engine0").t0_s  # the line's point under the spike marker
    assert callbacks.on_spike_pick(store, key, {"points": [{"curveNumber": 0, "x": x}]}, trigger="timeline-graph",
                                   instance="engine0") == (no_update, f"engine0|{int(sp['step'])}", "spike")
    summary, fig, evidence, neighbours = callbacks.on_spike(store, key, f"engine0|{int(sp['step'])}")
    assert sp["cause"] in str(summary) and "predicted height" in str(summary)
    assert evidence.id == "evidence-table" and neighbours.id == "neighbours-table"
    assert fig.layout.title.text == f"Steps around spike {int(sp['step'])} ({sp['cause']})"


def test_spike_page_without_a_choice_explains_what_to_do(store, key):
    summary, *_ = callbacks.on_spike(store, key, None)
    assert "Click a spike marker" in str(summary)


def test_live_toggle_validates_input():
    from mixdiag.collectors.prometheus.live import LiveFollower

    live = LiveFollower()
    assert callbacks.on_live_toggle(live, "live-btn", "file:///etc/passwd", 5)[2].startswith("error: live URL must be")
    assert callbacks.on_live_toggle(live, "live-btn", "http://127.0.0.1:9/metrics", 0.1)[2].startswith("error: refresh")
    assert callbacks.on_live_toggle(live, "live-btn", "http://127.0.0.1:9/metrics", 2) == \
        (False, 2000, "following http://127.0.0.1:9/metrics (engine) every 2 s")
    assert callbacks.on_live_toggle(live, "live-stop", None, None)[0] is True and not live.active
