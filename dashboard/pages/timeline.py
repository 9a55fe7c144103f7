"""Timeline page: ITL, batch composition, SM activity and graph mode of one instance, with spike markers.

Owns its page data (:func:`timeline_view`: sorted arrays on a relative clock, cached per dataset
and instance), its layout and its callbacks: the instance choice, re-sampling on zoom, and a click
on a spike, which opens the Spike page on it.
"""
from __future__ import annotations

import re

import pandas as pd
from dash import Input, Output, State, ctx, dcc, html
from dash.exceptions import PreventUpdate

from mixdiag.dashboard import figures
from mixdiag.dashboard.components import GRAPH_CONFIG, HINT, PAGE
from mixdiag.dashboard.page_data import TimelineView, no_episodes
from mixdiag.dashboard.store import DataStore
from mixdiag.schema import Timeline

PATH = "/timeline"
NAME = "Timeline"
#: Ids whose change alone means "re-sample the zoomed window" (the graph itself, or its x-range store).
ZOOM_TRIGGERS = frozenset({"timeline-graph", "timeline-xrange"})
#: Where a click on a spike goes.
SPIKE_PATH = "/spike"
_RANGE_KEY = re.compile(r"^xaxis\d*\.range\[(0|1)\]$")
#: Browser-side filter from the graph's relayoutData to ``timeline-xrange``: x zooms pass, the rest
#: (``{'autosize': true}`` after every redraw or resize, y zooms, modebar toggles) never reach the
#: server. Dash drops the answer of a callback still in flight when it fires again, so a server-side
#: "not a zoom" call right after a zoom threw the re-sampled figure away.
X_ZOOM_ONLY = """(r) => (r && Object.keys(r).some(k => /^xaxis\\d*\\.(range|autorange)/.test(k)))
    ? r : window.dash_clientside.no_update"""
#: Step columns the Timeline page draws (all on the steps frame of the contract).
STEP_PANEL_COLUMNS = ("step", "t_start_s", "t_end_s", "kind", "prefill_tokens", "decode_rows", "sm_active",
                      "graph_mode", "expert_imbalance", "kv_transfer_bytes", "kv_transfer_s", "host_pause_s",
                      "host_stopped_s")


def default_instance(timeline: Timeline, diagnosis) -> str | None:
    """The instance with most spikes (first alphabetically on a tie), or the first instance."""
    insts = timeline.instances
    if not insts:
        return None
    sp = diagnosis.spikes
    if sp is not None and len(sp):
        counts = sp["instance"].value_counts()
        best = counts.max()
        return sorted(i for i, n in counts.items() if n == best)[0]
    return insts[0]


def timeline_view(timeline: Timeline, diagnosis, instance: str) -> TimelineView:
    """The Timeline page's data for ``instance``.

    ITL comes from the tokens frame (one point per output event, ``itl_s``); sources without
    tokens fall back to the interval ``itl_p99_s`` column. Spike markers come from the
    diagnosis (their measured ``itl_s``), steps from the diagnosis' steps frame.
    """
    span = timeline.span()
    t0 = span[0] if span else 0.0
    itl = pd.DataFrame({"t_rel_s": pd.Series([], dtype="float64"), "itl_s": pd.Series([], dtype="float64")})
    label = "ITL (s)"
    # numpy comparisons: the Series ones cost 4x more over a day of token events
    if (timeline.tokens["instance"].to_numpy() == instance).any():
        it = timeline.itl()  # already validated and sorted: no second Timeline to build
        mine = it["instance"].to_numpy() == instance
        it = it if mine.all() else it[mine]
        itl = pd.DataFrame({"t_rel_s": it["t_s"].to_numpy() - t0, "itl_s": it["itl_s"].to_numpy()})
        label = "ITL per output (s)"
    else:
        st = timeline.steps[timeline.steps["instance"] == instance]
        for col in ("itl_p99_s", "itl_mean_s"):
            if st[col].notna().any():
                itl = pd.DataFrame({"t_rel_s": st["t_end_s"].to_numpy() - t0, "itl_s": st[col].to_numpy()})
                label = f"ITL {col[4:-2].upper()} per interval (s)"
                break
    itl = itl.dropna().sort_values("t_rel_s", kind="stable").reset_index(drop=True)

    sp = diagnosis.spikes
    if sp is not None and len(sp):
        sp = sp[sp["instance"] == instance]
    if sp is None or not len(sp):
        spikes = pd.DataFrame({"t_rel_s": pd.Series([], dtype="float64"), "itl_s": pd.Series([], dtype="float64"),
                               "cause": pd.Series([], dtype=object), "confidence": pd.Series([], dtype="float64"),
                               "instance": pd.Series([], dtype=object), "step": pd.Series([], dtype="int64")})
    else:
        spikes = pd.DataFrame({"t_rel_s": sp["t_s"].to_numpy(dtype="float64") - t0,
                               "itl_s": sp["itl_s"].to_numpy(dtype="float64"),
                               "cause": sp["cause"].astype(str).to_numpy(),
                               "confidence": pd.to_numeric(sp["confidence"], errors="coerce").to_numpy(),
                               "instance": sp["instance"].astype(str).to_numpy(),
                               "step": sp["step"].astype("int64").to_numpy()})
        spikes = spikes.sort_values("t_rel_s", kind="stable").reset_index(drop=True)

    base = diagnosis.steps if getattr(diagnosis, "steps", None) is not None else timeline.steps
    st = base[base["instance"] == instance]
    steps = st.reindex(columns=list(STEP_PANEL_COLUMNS))   # a column the frame lacks (host_pause_s): empty
    steps.insert(0, "t_rel_s", st["t_start_s"].to_numpy(dtype="float64") - t0)
    steps = steps.sort_values("t_rel_s", kind="stable").reset_index(drop=True)

    quality = timeline.signal_quality(instance, "sm_active")
    episodes = episode_bands(diagnosis, instance, t0)
    if quality == "absent" and steps["sm_active"].notna().any():
        quality = "unlabelled"
    return TimelineView(instance=instance, t0_s=float(t0), itl=itl, itl_label=label, spikes=spikes, steps=steps,
                        sm_quality=quality, has_expert=bool(steps["expert_imbalance"].notna().any()),
                        has_kv=bool((steps["kv_transfer_bytes"].fillna(0) > 0).any()
                                    or (steps["kv_transfer_s"].fillna(0) > 0).any()),
                        has_pause=bool((steps[["host_pause_s", "host_stopped_s"]].fillna(0) >= 1e-3).any(axis=None)),
                        episodes=episodes)


def episode_bands(diagnosis, instance: str, t0: float) -> pd.DataFrame:
    """The diagnosis' episodes of ``instance`` on the view's relative clock (page_data.EPISODE_BAND_COLUMNS)."""
    reg = getattr(diagnosis, "regimes", None)
    ep = reg.episodes if reg is not None else None
    if ep is None or not len(ep):
        return no_episodes()
    ep = ep[ep["instance"].astype(str) == str(instance)]
    if not len(ep):
        return no_episodes()
    out = pd.DataFrame({"t_start_rel_s": ep["t_start_s"].to_numpy(dtype="float64") - t0,
                        "t_end_rel_s": ep["t_end_s"].to_numpy(dtype="float64") - t0,
                        "median_latency_s": ep["median_latency_s"].to_numpy(dtype="float64"),
                        "cause": ep["cause"].astype(str).to_numpy(),
                        "share": [float((sh or {}).get(c, float("nan"))) for c, sh in zip(ep["cause"], ep["shares"])],
                        "ratio": ep["ratio"].to_numpy(dtype="float64"), "excess_s": ep["excess_s"].to_numpy(dtype="float64"),
                        "rows": ep["rows"].to_numpy(dtype="float64"), "why": ep["why"].fillna("").astype(str).to_numpy()})
    return out.sort_values("t_start_rel_s", kind="stable").reset_index(drop=True)


def view(ds, instance: str) -> TimelineView:
    """The :class:`TimelineView` of ``instance`` in the dataset ``ds``, computed once per dataset."""
    v = ds.views.get(instance)
    if v is None:
        v = ds.views[instance] = timeline_view(ds.timeline, ds.diagnosis, instance)
    return v


def layout(**_query) -> html.Div:
    return html.Div([
        html.Div([html.Label("instance ", htmlFor="timeline-instance"),
                  dcc.Dropdown(id="timeline-instance", clearable=False,
                               style={"width": "260px", "display": "inline-block", "verticalAlign": "middle"})]),
        html.Div("Zoom on any panel zooms all; click a spike marker for its evidence.",
                 style={**HINT, "margin": "4px 0"}),
        dcc.Loading(dcc.Graph(id="timeline-graph", config=GRAPH_CONFIG), type="circle", delay_show=300),
        dcc.Store(id="timeline-xrange", data=None),  # the last x zoom's relayoutData (see X_ZOOM_ONLY)
    ], style=PAGE)


def x_range_from_relayout(relayout: dict | None) -> tuple[float, float] | None | bool:
    """The x-range a zoom asked for, None for 'show everything', False when x did not change."""
    if not relayout:
        return False
    lo = hi = None
    for k, v in relayout.items():
        m = _RANGE_KEY.match(k)
        if m:
            if m.group(1) == "0":
                lo = v
            else:
                hi = v
        elif k.startswith("xaxis") and k.endswith(".range") and isinstance(v, (list, tuple)) and len(v) == 2:
            lo, hi = v
        elif k.startswith("xaxis") and k.endswith(".autorange") and v:
            return None
    if lo is None or hi is None:
        return False
    try:
        return float(lo), float(hi)
    except (TypeError, ValueError):
        return False


def on_instances(store: DataStore, key: dict | None):
    """The instance choice (options, default value) for the dataset ``key``."""
    ds = store.get(key["id"]) if key else None
    if ds is None:
        raise PreventUpdate
    options = [{"label": i, "value": i} for i in ds.timeline.instances]
    return options, default_instance(ds.timeline, ds.diagnosis)


def on_timeline(store: DataStore, key: dict | None, instance: str | None, relayout: dict | None, max_points: int,
                trigger: str | tuple | None = None):
    """The Timeline figure, re-sampled to the zoomed x-range when the only trigger was a zoom.

    ``trigger`` is the id (or the ids) that fired the callback. Dash merges triggers that arrive
    together: on page mount the graph's first ``relayoutData`` ({'autosize': True}) often comes
    with the instance choice, and that call must draw the full figure, not be dropped as a non-zoom.
    """
    ds = store.get(key["id"]) if key else None
    if ds is None or not instance or instance not in ds.timeline.instances:
        raise PreventUpdate
    triggers = set() if trigger is None else {trigger} if isinstance(trigger, str) else set(trigger)
    x_range = None
    # an empty x-range store as the only trigger is the page mounting it: draw everything
    if triggers and triggers <= ZOOM_TRIGGERS and relayout is not None:
        x_range = x_range_from_relayout(relayout)
        if x_range is False:
            raise PreventUpdate
    return figures.timeline_figure(view(ds, instance), x_range=x_range, max_points=max_points,
                                   revision=f"{ds.id}:{instance}")


def on_click(store: DataStore, key: dict | None, click: dict | None, instance: str | None = None):
    """A click on the Timeline: (the chosen spike for the Spike page, the Spike page's path).

    A spike marker sits exactly on the ITL line's point of the same event, so plotly may report
    the line's point instead of the marker: a click on the line at a spike's time selects it too.
    The choice carries the dataset key, so the Spike page ignores it once another dataset shows.
    """
    ds = store.get(key["id"]) if key else None
    pts = (click or {}).get("points") or []
    if ds is None or not pts:
        raise PreventUpdate
    cd = pts[0].get("customdata")
    if isinstance(cd, (list, tuple)) and len(cd) == 2:
        return {"key": key, "spike": f"{cd[0]}|{int(cd[1])}"}, SPIKE_PATH
    x = pts[0].get("x")
    if instance not in ds.timeline.instances or not isinstance(x, (int, float)):
        raise PreventUpdate
    sp = view(ds, instance).spikes
    hit = sp[(sp["t_rel_s"] - float(x)).abs() <= 1e-6]
    if not len(hit):
        raise PreventUpdate  # a click on the line away from any spike
    r = hit.iloc[0]
    return {"key": key, "spike": f"{r['instance']}|{int(r['step'])}"}, SPIKE_PATH


def register(app, store: DataStore, live=None) -> None:
    """Bind the Timeline's callbacks to ``app``."""
    max_points = store.config.max_points

    @app.callback(Output("timeline-instance", "options"), Output("timeline-instance", "value"),
                  Input("app-dataset-key", "data"))
    def _instances(key):
        return on_instances(store, key)

    @app.callback(Output("timeline-graph", "figure"), Input("app-dataset-key", "data"),
                  Input("timeline-instance", "value"), Input("timeline-xrange", "data"))
    def _timeline(key, instance, relayout):
        return on_timeline(store, key, instance, relayout, max_points, tuple(ctx.triggered_prop_ids.values()))

    app.clientside_callback(X_ZOOM_ONLY, Output("timeline-xrange", "data"), Input("timeline-graph", "relayoutData"),
                            prevent_initial_call=True)

    @app.callback(Output("app-spike-choice", "data"), Output("app-url", "pathname"),
                  Input("timeline-graph", "clickData"), State("app-dataset-key", "data"),
                  State("timeline-instance", "value"), prevent_initial_call=True)
    def _click(click, key, instance):
        return on_click(store, key, click, instance)
