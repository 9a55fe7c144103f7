"""Dash callbacks: wire the layout's components to the data store and the figure builders.

Each callback body is a plain function of its inputs (``on_*``) so tests call it without a
browser; :func:`register` binds them to an app.
"""
from __future__ import annotations

import re
import time

import pandas as pd
from dash import Input, Output, State, ctx, html, no_update
from dash.exceptions import PreventUpdate

from mixdiag.dashboard import figures, layout
from mixdiag.dashboard.stats import signals_frame, sources_frame
from mixdiag.dashboard.store import DataStore, fmt_seconds
from mixdiag.dashboard.page_data import LedgerChoice, default_instance, spike_detail
from mixdiag.errors import UserError

_RANGE_KEY = re.compile(r"^xaxis\d*\.range\[(0|1)\]$")
#: Spikes offered in the Spike page's dropdown (largest first).
SPIKE_CHOICES = 300


def key_of(ds) -> dict:
    """What the browser holds for a dataset: its id and a revision that changes on every reload."""
    return {"id": ds.id, "rev": float(ds.loaded_unix_s)}


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


def on_load(store: DataStore, trigger: str | None, choice: str | None, upload: str | None,
            filename: str | None):
    """Load from the data directory or an upload; returns (dataset key or no_update, status message)."""
    try:
        if trigger == "upload":
            if not upload:
                raise PreventUpdate
            ds = store.load_upload(filename or "upload", upload)
        elif trigger == "load-btn":
            if not choice:
                return no_update, "pick a run or a file first"
            ds = store.load_path(choice)
        else:
            raise PreventUpdate
    except UserError as e:
        return no_update, f"error: {e}"
    h = ds.headline
    return key_of(ds), (f"loaded {ds.label}: {h.n_steps:,} steps, {h.n_spikes:,} spikes, "
                        f"diagnosed in {ds.analysis_s:.2f} s")


def on_dataset(store: DataStore, key: dict | None):
    """Overview contents and the instance choice for the dataset ``key``."""
    ds = store.get(key["id"]) if key else None
    if ds is None:
        raise PreventUpdate
    h = ds.headline
    src = layout.table(sources_frame(ds.timeline))
    # one row per signal, one column per instance: stays narrow with many signals
    sig_df = signals_frame(ds.timeline, ds.diagnosis).set_index("instance").T
    sig = layout.table(sig_df.rename_axis("signal").reset_index())
    insts = ds.timeline.instances
    options = [{"label": i, "value": i} for i in insts]
    return (h.verdict, layout.headline_cards(h), figures.by_cause_figure(h.by_cause), src, sig, options,
            default_instance(ds.timeline, ds.diagnosis), f"{ds.label}")


def on_timeline(store: DataStore, key: dict | None, instance: str | None, relayout: dict | None, max_points: int,
                trigger: str | None = None):
    """The Timeline figure, re-sampled to the zoomed x-range when the trigger was a zoom."""
    ds = store.get(key["id"]) if key else None
    if ds is None or not instance or instance not in ds.timeline.instances:
        raise PreventUpdate
    x_range = None
    if trigger == "timeline-graph":
        x_range = x_range_from_relayout(relayout)
        if x_range is False:
            raise PreventUpdate
    return figures.timeline_figure(store.view(ds, instance), x_range=x_range, max_points=max_points,
                                   revision=f"{ds.id}:{instance}")


def spike_options(ds) -> list[dict]:
    sp = ds.diagnosis.spikes
    if sp is None or not len(sp):
        return []
    top = sp.sort_values("itl_s", ascending=False).head(SPIKE_CHOICES)
    return [{"label": f"{r.instance} step {int(r.step)}: {r.cause}, ITL {fmt_seconds(float(r.itl_s))}",
             "value": f"{r.instance}|{int(r.step)}"} for r in top.itertuples(index=False)]


def on_spike_pick(store: DataStore, key: dict | None, click: dict | None, trigger: str | None = None,
                  instance: str | None = None):
    """Spike dropdown options/value and the active tab: a click on a spike opens the Spike page.

    A spike marker sits exactly on the ITL line's point of the same event, so plotly may report
    the line's point instead of the marker: a click on the line at a spike's time selects it too.
    """
    ds = store.get(key["id"]) if key else None
    if ds is None:
        raise PreventUpdate
    if trigger == "timeline-graph":
        pts = (click or {}).get("points") or []
        if not pts:
            raise PreventUpdate
        cd = pts[0].get("customdata")
        if isinstance(cd, (list, tuple)) and len(cd) == 2:
            return no_update, f"{cd[0]}|{int(cd[1])}", "spike"
        x = pts[0].get("x")
        if instance not in ds.timeline.instances or not isinstance(x, (int, float)):
            raise PreventUpdate
        sp = store.view(ds, instance).spikes
        hit = sp[(sp["t_rel_s"] - float(x)).abs() <= 1e-6]
        if not len(hit):
            raise PreventUpdate  # a click on the line away from any spike
        r = hit.iloc[0]
        return no_update, f"{r['instance']}|{int(r['step'])}", "spike"
    return spike_options(ds), None, no_update


def on_spike(store: DataStore, key: dict | None, choice: str | None, ledger: LedgerChoice | None = LedgerChoice()):
    """The Spike page for ``choice`` ('instance|step')."""
    ds = store.get(key["id"]) if key else None
    if ds is None or not choice or "|" not in choice:
        return (html.Div("Click a spike marker on the Timeline page (or pick one above) to see its evidence."),
                figures.empty_figure(), "", "")
    inst, step = choice.rsplit("|", 1)
    d = spike_detail(ds.diagnosis, inst, int(step), ledger=ledger)
    if d is None:
        return html.Div(f"no spike at {inst} step {step}"), figures.empty_figure(), "", ""
    s = d.spike
    conf = s.get("confidence")
    mx = f" ({d.measured_x:.1f}x baseline)" if d.measured_x == d.measured_x else ""
    if d.predicted_key is not None and d.predicted_x == d.predicted_x:
        pred = f"{fmt_seconds(d.predicted_s)} ({d.predicted_x:.1f}x baseline)"
    elif d.predicted_key is not None:
        pred = fmt_seconds(d.predicted_s)
    else:
        pred = "none"
    summary = html.Div([
        html.Div([html.B(f"{s['cause']}"), f" at {s['instance']} step {s['step']}",
                  f", confidence {float(conf):.2f}" if conf is not None else ""], id="spike-cause"),
        html.Div(f"measured ITL {fmt_seconds(d.measured_s)}{mx}; baseline "
                 f"{fmt_seconds(float(s.get('baseline_s', float('nan'))))}; predicted height {pred}",
                 id="spike-heights"),
        html.Div(d.prediction_basis, style={"color": "#666", "fontSize": "12px"}),
        html.Div(f"signals missing from the source: {', '.join(d.missing_signals)}" if d.missing_signals
                 else "no signal missing", style={"color": "#666", "fontSize": "12px"}),
    ])
    cols = [c for c in ("step", "kind", "t_start_s", "t_end_s", "prefill_tokens", "decode_rows", "graph_mode",
                        "sm_active", "expert_imbalance", "kv_transfer_s", "preempted_reqs", "gap_before_s",
                        "itl_max_s", "is_spike", "cause") if c in d.neighbours.columns]
    neigh = d.neighbours[cols]
    return (summary, figures.spike_figure(d), layout.table(d.evidence, id="evidence-table"),
            layout.table(pd.DataFrame(neigh), id="neighbours-table"))


def register(app, store: DataStore, live=None) -> None:
    """Bind the callbacks of the four pages to ``app`` using ``store`` (and the live follower)."""
    max_points = store.config.max_points

    @app.callback(Output("dataset-key", "data"), Output("source-status", "children"),
                  Input("load-btn", "n_clicks"), Input("upload", "contents"),
                  State("data-choice", "value"), State("upload", "filename"), prevent_initial_call=True)
    def _load(_n, upload, choice, filename):
        return on_load(store, ctx.triggered_id, choice, upload, filename)

    @app.callback(Output("data-choice", "options"), Input("tabs", "value"))
    def _entries(_tab):
        return store.entries()

    @app.callback(Output("verdict", "children"), Output("headline-stats", "children"),
                  Output("by-cause-graph", "figure"), Output("sources-table", "children"),
                  Output("signals-table", "children"), Output("instance", "options"), Output("instance", "value"),
                  Output("dataset-label", "children"), Input("dataset-key", "data"))
    def _dataset(key):
        return on_dataset(store, key)

    @app.callback(Output("timeline-graph", "figure"), Input("dataset-key", "data"), Input("instance", "value"),
                  Input("timeline-graph", "relayoutData"))
    def _timeline(key, instance, relayout):
        return on_timeline(store, key, instance, relayout, max_points, ctx.triggered_id)

    @app.callback(Output("spike-choice", "options"), Output("spike-choice", "value"), Output("tabs", "value"),
                  Input("dataset-key", "data"), Input("timeline-graph", "clickData"), State("instance", "value"))
    def _pick(key, click, instance):
        return on_spike_pick(store, key, click, ctx.triggered_id, instance)

    @app.callback(Output("spike-summary", "children"), Output("spike-graph", "figure"),
                  Output("spike-evidence", "children"), Output("spike-neighbours", "children"),
                  Input("spike-choice", "value"), State("dataset-key", "data"))
    def _spike(choice, key):
        return on_spike(store, key, choice, LedgerChoice(store.config.ledger_preset, store.config.ledger_device))

    if live is None:
        return

    @app.callback(Output("live-interval", "disabled"), Output("live-interval", "interval"),
                  Output("source-status", "children", allow_duplicate=True),
                  Input("live-btn", "n_clicks"), Input("live-stop", "n_clicks"),
                  State("live-url", "value"), State("live-refresh", "value"), prevent_initial_call=True)
    def _live_toggle(_go, _stop, url, refresh):
        return on_live_toggle(live, ctx.triggered_id, url, refresh)

    @app.callback(Output("dataset-key", "data", allow_duplicate=True),
                  Output("source-status", "children", allow_duplicate=True),
                  Input("live-interval", "n_intervals"), prevent_initial_call=True)
    def _live_tick(_n):
        return on_live_tick(store, live)


def on_live_toggle(live, trigger: str | None, url: str | None, refresh):
    """Start or stop following ``url``; returns (interval disabled, interval ms, status)."""
    if trigger == "live-stop":
        live.stop()
        return True, no_update, "live mode stopped"
    try:
        r = float(refresh) if refresh not in (None, "") else live.refresh_s
        if not 0.5 <= r <= 3600:
            raise UserError(f"refresh interval must be 0.5..3600 s, got {refresh}")
        if not url:
            raise UserError("give a Prometheus server or engine /metrics URL")
        live.start(url, refresh_s=r)
    except (UserError, ValueError, TypeError) as e:
        return True, no_update, f"error: {e}"
    return False, int(r * 1000), f"following {live.url} ({live.kind}) every {r:g} s"


def on_live_tick(store: DataStore, live):
    """One refresh: poll, re-diagnose the window, show it (same dataset id, new revision)."""
    if not live.active:
        raise PreventUpdate
    try:
        tl = live.poll()
    except UserError as e:
        return no_update, f"error: {e}"
    if tl is None or not len(tl.steps):
        return no_update, f"{live.label()}: waiting for a second scrape" if live.kind == "engine" else \
            f"{live.label()}: no samples yet"
    ds = store.replace_live(live.dataset_id, tl, live.label())
    live.dataset_id = ds.id
    h = ds.headline
    return key_of(ds), (f"{live.label()}: {h.n_steps:,} intervals/steps, {h.n_spikes} spikes; "
                        f"refreshed {time.strftime('%H:%M:%S')}")
