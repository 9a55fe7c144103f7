"""Figure builders: linked panels, spike markers by cause, downsampling at 200 000 steps."""
import math

import numpy as np
import pandas as pd
import pytest

from mixdiag.causes import CAUSE_COLORS, CAUSES
from mixdiag.dashboard import figures
from mixdiag.dashboard.page_data import SpikeDetail, TimelineView
from mixdiag.dashboard.pages.spike import spike_detail
from mixdiag.dashboard.pages.timeline import timeline_view
from mixdiag.diagnosis import diagnose

N = 200_000


def big_view(n=N, expert=False, kv=False) -> TimelineView:
    """A 200k-step view built directly from frames (what timeline_view returns), one spike per 10k steps."""
    rng = np.random.default_rng(0)
    t = np.arange(n) * 0.021
    itl = 0.02 + 0.0005 * rng.standard_normal(n)
    spike_steps = np.arange(5_000, n, 10_000)
    itl[spike_steps] = 0.11
    kind = np.where(np.isin(np.arange(n), spike_steps), "mixed", "decode")
    steps = pd.DataFrame({"t_rel_s": t, "step": np.arange(n), "t_start_s": t, "t_end_s": t + 0.02, "kind": kind,
                          "prefill_tokens": np.where(kind == "mixed", 512.0, 0.0), "decode_rows": 8.0,
                          "sm_active": np.where(kind == "mixed", 0.95, 0.3),
                          "graph_mode": np.where(kind == "mixed", "PIECEWISE", "FULL"),
                          "expert_imbalance": 1.2 if expert else np.nan,
                          "kv_transfer_bytes": np.where(kind == "mixed", 1e6, 0.0) if kv else np.nan,
                          "kv_transfer_s": np.nan})
    causes = np.array(CAUSES[:7])[np.arange(len(spike_steps)) % 7]
    spikes = pd.DataFrame({"t_rel_s": t[spike_steps], "itl_s": itl[spike_steps], "cause": causes,
                           "confidence": 0.9, "instance": "engine0", "step": spike_steps})
    return TimelineView(instance="engine0", t0_s=0.0, itl=pd.DataFrame({"t_rel_s": t, "itl_s": itl}),
                        itl_label="ITL", spikes=spikes, steps=steps, sm_quality="estimated",
                        has_expert=expert, has_kv=kv)


@pytest.fixture(scope="module")
def view():
    return big_view()


def traces(fig, prefix):
    return [t for t in fig.data if (t.name or "").startswith(prefix)]


def test_four_linked_panels_share_one_x_axis(view):
    fig = figures.timeline_figure(view)
    titles = [a.text for a in fig.layout.annotations if a.text in figures.PANEL_TITLES.values()]
    assert titles == [figures.PANEL_TITLES[p] for p in ("itl", "alloc", "sm", "graph")]
    # make_subplots(shared_xaxes=True): every lower x-axis matches the first, so zoom on one zooms all
    axes = {k: fig.layout[k].matches for k in fig.layout if k.startswith("xaxis")}
    assert axes == {"xaxis": "x4", "xaxis2": "x4", "xaxis3": "x4", "xaxis4": None}  # all follow the bottom axis


@pytest.mark.parametrize("expert,kv,n_panels", [(False, False, 4), (True, False, 5), (False, True, 5), (True, True, 6)])
def test_expert_and_kv_panels_only_when_present(expert, kv, n_panels):
    v = big_view(2_000, expert=expert, kv=kv)
    assert len(figures.timeline_panels(v)) == n_panels
    assert len([k for k in figures.timeline_figure(v).layout if k.startswith("yaxis")]) == n_panels


def test_200k_steps_downsampled_with_spikes_visible(view):
    fig = figures.timeline_figure(view, max_points=2000)
    assert fig.layout.meta["points_total"] == 2 * N and fig.layout.meta["points_shown"] <= 2 * 4000
    for t in fig.data:
        assert len(t.x) <= 2000 + 2, t.name
    itl = traces(fig, "ITL")[0]
    assert max(itl.y) == pytest.approx(0.11)
    assert sum(1 for y in itl.y if y > 0.1) == len(view.spikes)  # each spike's peak drawn in the line
    markers = [t for t in fig.data if t.meta == "spike"]
    assert sum(len(t.x) for t in markers) == len(view.spikes)
    prefill = traces(fig, "prefill tokens")[0]
    assert max(prefill.y) == 512  # every mixed step's chunk stays visible
    assert "PIECEWISE" in set(traces(fig, "graph PIECEWISE")[0].y)


def test_zoom_resamples_to_the_window(view):
    lo, hi = 1000.0, 1100.0
    fig = figures.timeline_figure(view, x_range=(lo, hi), max_points=500)
    itl = traces(fig, "ITL")[0]
    xs = np.asarray(itl.x)
    assert len(xs) <= 502 and xs[1:-1].min() >= lo and xs[1:-1].max() <= hi
    assert list(fig.layout.xaxis.range) == [lo, hi]
    full = figures.timeline_figure(view, max_points=500)
    assert np.median(np.diff(xs)) < np.median(np.diff(np.asarray(traces(full, "ITL")[0].x)))


def test_spike_markers_coloured_by_cause_carry_instance_and_step(view):
    fig = figures.timeline_figure(view)
    markers = {t.name: t for t in fig.data if t.meta == "spike"}
    assert set(markers) == {f"spike: {c}" for c in set(view.spikes["cause"])}
    for name, t in markers.items():
        cause = name.split(": ")[1]
        assert t.marker.color == CAUSE_COLORS[cause]
        for (inst, step), x in zip(t.customdata, t.x):
            row = view.spikes[view.spikes["step"] == int(step)].iloc[0]
            assert inst == "engine0" and row["cause"] == cause and row["t_rel_s"] == pytest.approx(x)


def test_sm_panel_says_how_sm_activity_was_obtained(view):
    fig = figures.timeline_figure(view)
    assert traces(fig, "SM active (estimated)")
    assert fig.layout.yaxis3.title.text == "ratio (estimated)"


def test_by_cause_figure_lists_every_cause():
    counts = {c: i for i, c in enumerate(CAUSES)}
    fig = figures.by_cause_figure(counts)
    assert list(fig.data[0].y) == list(CAUSES) and list(fig.data[0].x) == list(range(len(CAUSES)))
    assert list(fig.data[0].marker.color) == [CAUSE_COLORS[c] for c in CAUSES]


def test_real_diagnosis_end_to_end(make_timeline):
    tl = make_timeline(faults={70: dict(expert_imbalance=4.0, dur=0.080)})
    d = diagnose(tl)
    v = timeline_view(tl, d, "engine0")
    fig = figures.timeline_figure(v)
    shown = {t.name.split(": ")[1]: len(t.x) for t in fig.data if t.meta == "spike"}
    assert shown == {c: n for c, n in d.by_cause.items() if n}
    s = d.spikes.iloc[0]
    detail = spike_detail(d, "engine0", int(s["step"]))
    sf = figures.spike_figure(detail)
    assert str(int(s["step"])) in list(sf.data[0].x)
    assert sf.data[0].marker.color[list(sf.data[0].x).index(str(int(s["step"])))] == CAUSE_COLORS[s["cause"]]


def test_spike_figure_draws_the_ledger_prediction_when_given():
    nb = pd.DataFrame({"step": [9, 10, 11], "kind": ["decode", "mixed", "decode"], "t_start_s": [0, 1, 2.0],
                       "t_end_s": [0.02, 1.1, 2.02], "itl_max_s": [0.02, 0.1, 0.02]})
    base = dict(spike={"instance": "e", "step": 10, "cause": "mixing", "baseline_s": 0.02},
                evidence=pd.DataFrame(columns=["key", "value"]), missing_signals=(), neighbours=nb, measured_s=0.1)
    with_pred = figures.spike_figure(SpikeDetail(predicted_s=0.09, predicted_key="ledger", **base))
    without = figures.spike_figure(SpikeDetail(predicted_s=math.nan, predicted_key=None, **base))
    texts = lambda f: [a.text for a in f.layout.annotations]  # noqa: E731
    assert any("ledger predicted 0.0900s" in t for t in texts(with_pred))
    assert not any("predicted" in t for t in texts(without))
    assert any("baseline" in t for t in texts(without))


@pytest.mark.parametrize("excess,p99w,want_y", [
    ({"mixing": 3.0, "ep_hotspot": 1.0, "none": 0.5, "host_stall": 0.0}, {"mixing": 0.05}, ["mixing", "ep_hotspot", "none"]),
    ({c: 0.0 for c in CAUSES}, {}, []),
])
def test_budget_figure_bars_in_cause_order_and_palette(excess, p99w, want_y):
    fig = figures.budget_figure(excess, p99w, 0.2)
    assert list(fig.data[0].y) == want_y
    assert list(fig.data[0].x) == [excess[c] for c in want_y]
    assert [col for c, col in zip(want_y, fig.data[0].marker.color) if c != "none"] == \
        [CAUSE_COLORS[c] for c in want_y if c != "none"]
    if "mixing" in want_y:
        assert "P99 without 50 ms" in fig.data[0].text[0] and fig.data[0].text[0].startswith("67%")


def _bands(n):
    from mixdiag.dashboard.page_data import EPISODE_BAND_COLUMNS
    causes = ["ep_hotspot", "unknown", "pd_transfer"]
    rows = [dict(t_start_rel_s=100.0 * i, t_end_rel_s=100.0 * i + 40, median_latency_s=0.05, cause=causes[i % 3],
                 share=0.9 if i % 3 != 1 else 1.0, ratio=2.5, excess_s=float(i + 1), rows=150.0,
                 why="no measured evidence of any cause in its rows" if i % 3 == 1 else "") for i in range(n)]
    return pd.DataFrame(rows, columns=list(EPISODE_BAND_COLUMNS))


def _view_with_bands(n, n_steps=2_000):
    import dataclasses
    return dataclasses.replace(big_view(n=n_steps, expert=True), episodes=_bands(n))


def test_episode_bands_span_every_panel_coloured_by_cause():
    fig = figures.timeline_figure(_view_with_bands(4, 20_000))
    bands = [s for s in fig.layout.shapes if s.type == "rect"]
    assert len(bands) == 4 and all(b.yref == "paper" and (b.y0, b.y1) == (0, 1) and b.xref == "x" for b in bands)
    assert sorted((b.x0, b.fillcolor) for b in bands) == [
        (100.0 * i, CAUSE_COLORS[["ep_hotspot", "unknown", "pd_transfer"][i % 3]]) for i in range(4)]
    marks = {t.name: t for t in traces(fig, "episode: ")}
    assert set(marks) == {"episode: ep_hotspot", "episode: unknown", "episode: pd_transfer"}
    assert all(t.customdata is None for t in marks.values())  # a click on an episode opens no spike
    assert "no measured evidence" in marks["episode: unknown"].text[0]
    assert not [s for s in figures.timeline_figure(big_view(n=20_000)).layout.shapes if s.type == "rect"]


def test_episode_bands_are_capped_largest_excess_first():
    fig = figures.timeline_figure(_view_with_bands(figures.MAX_BANDS + 5))
    bands = [s for s in fig.layout.shapes if s.type == "rect"]
    assert len(bands) == figures.MAX_BANDS and min(b.x0 for b in bands) == 500.0  # the 5 smallest left out


def test_regime_figure_shares_in_the_palette_with_the_episode_count():
    fig = figures.regime_figure({"mixing": 3.0, "ep_hotspot": 1.0, "unknown": 0.0}, 2, {"ep_hotspot": 2})
    bar = fig.data[0]
    assert list(bar.y) == ["mixing", "ep_hotspot"] and list(bar.x) == [0.75, 0.25]
    assert list(bar.customdata) == [3.0, 1.0] and list(bar.marker.color) == [CAUSE_COLORS["mixing"], CAUSE_COLORS["ep_hotspot"]]
    assert list(bar.text) == ["75%", "25%, 2 episodes"] and "(2 sustained episodes)" in fig.layout.title.text
    assert len(figures.regime_figure({}, 0).data[0].y) == 0


def test_a_host_pause_panel_where_the_engine_timed_pauses():
    """vLLM's GC debugger lines (host_pause_s): a panel of their own, its trace the pauses."""
    import dataclasses
    v = big_view(2_000)
    steps = v.steps.assign(host_pause_s=np.where(np.arange(len(v.steps)) == 700, 0.31, 0.0))
    v = dataclasses.replace(v, steps=steps, has_pause=True)
    assert figures.timeline_panels(v)[-1] == "pause"
    fig = figures.timeline_figure(v)
    assert figures.PANEL_TITLES["pause"] in [a.text for a in fig.layout.annotations]
    assert max(traces(fig, "host pause")[0].y) == pytest.approx(0.31)


def test_the_pause_panel_draws_what_the_os_saw_beside_the_gc():
    """The host sampler's stand-stills (host_stopped_s) share the pause panel, as a trace of their own."""
    import dataclasses
    v = big_view(2_000)
    idx = np.arange(len(v.steps))
    steps = v.steps.assign(host_pause_s=0.0, host_stopped_s=np.where(idx == 900, 0.6, 0.0))
    fig = figures.timeline_figure(dataclasses.replace(v, steps=steps, has_pause=True))
    assert max(traces(fig, "process stopped (OS)")[0].y) == pytest.approx(0.6)
    assert max(traces(fig, "host pause")[0].y) == 0.0
