"""Sources page: load a run or capture from the data directory, upload a capture, follow a live source.

Owns the loading and live-mode callbacks. Their results go to the frame's stores
(``app-dataset-key``, ``app-status``), so the other pages update and the status survives
navigation; the live refresh ticks on the frame's ``app-live-interval`` on every page.
"""
from __future__ import annotations

import time

from dash import Input, Output, State, ctx, dcc, html, no_update
from dash.exceptions import PreventUpdate

from mixdiag.dashboard.components import HINT, PAGE
from mixdiag.dashboard.pages import state
from mixdiag.dashboard.shell import key_of
from mixdiag.dashboard.store import DataStore
from mixdiag.errors import UserError

PATH = "/sources"
NAME = "Sources"


def layout(**_query) -> html.Div:
    """The page; the data directory's entries are listed afresh on every visit."""
    st = state()
    config = st.config
    cap = config.upload_max_bytes
    root = str(config.data_root) if config.data_root else "(none: start with --data PATH)"
    return html.Div([
        html.H4("From the data directory"),
        html.Div(f"data directory: {root}", style=HINT),
        dcc.Dropdown(id="sources-data-choice", options=st.store.entries(),
                     placeholder="a run directory or a capture file",
                     style={"width": "520px", "display": "inline-block", "verticalAlign": "middle"}),
        html.Button("Load", id="sources-load-btn", n_clicks=0, style={"marginLeft": "8px"}),
        html.H4("Upload a capture"),
        html.Div("Nsight .sqlite, Kineto .json, vLLM/SGLang log, /metrics dump "
                 f"(at most {cap / 2**20:.0f} MiB; parsed in a separate process)", style=HINT),
        dcc.Upload(id="sources-upload", max_size=cap, multiple=False,
                   children=html.Div(["drop a file here or ", html.A("choose one")]),
                   style={"width": "520px", "height": "50px", "lineHeight": "50px", "borderWidth": "1px",
                          "borderStyle": "dashed", "borderRadius": "6px", "textAlign": "center"}),
        html.H4("Live"),
        html.Div("a Prometheus server (http://host:9090) or an engine's /metrics URL", style=HINT),
        dcc.Input(id="sources-live-url", type="url", value=config.prometheus_url or "", debounce=True,
                  placeholder="http://127.0.0.1:9090", style={"width": "360px"}),
        html.Label(" refresh every (s) ", htmlFor="sources-live-refresh"),
        dcc.Input(id="sources-live-refresh", type="number", min=0.5, max=3600, step=0.5, value=config.refresh_s,
                  style={"width": "70px"}),
        html.Button("Connect", id="sources-live-btn", n_clicks=0, style={"marginLeft": "8px"}),
        html.Button("Stop", id="sources-live-stop", n_clicks=0, style={"marginLeft": "4px"}),
        html.Div(id="sources-status", style={"marginTop": "14px", "whiteSpace": "pre-wrap"}),
    ], style=PAGE)


def on_load(store: DataStore, trigger: str | None, choice: str | None, upload: str | None,
            filename: str | None):
    """Load from the data directory or an upload; returns (dataset key or no_update, status message)."""
    try:
        if trigger == "sources-upload":
            if not upload:
                raise PreventUpdate
            ds = store.load_upload(filename or "upload", upload)
        elif trigger == "sources-load-btn":
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


def on_live_toggle(live, trigger: str | None, url: str | None, refresh):
    """Start or stop following ``url``; returns (interval disabled, interval ms, status)."""
    if trigger == "sources-live-stop":
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


def user_trigger(values: dict[str, object]) -> str | None:
    """The id among ``values`` (id -> its input's value) that really fired the callback, or None.

    Dash fires a callback whose inputs a page mount inserts, prevent_initial_call or not, when its
    outputs (the frame's stores) are already on the page, and reports every inserted input as
    changed. A button at 0 clicks or an empty upload is such a mount, never a user's action.
    """
    for cid in ctx.triggered_prop_ids.values():
        if cid in values and values[cid]:
            return cid
    return None


def register(app, store: DataStore, live=None) -> None:
    """Bind the Sources page's callbacks (loading; live mode when ``live`` is given) to ``app``."""
    @app.callback(Output("app-dataset-key", "data"), Output("app-status", "data"),
                  Input("sources-load-btn", "n_clicks"), Input("sources-upload", "contents"),
                  State("sources-data-choice", "value"), State("sources-upload", "filename"),
                  prevent_initial_call=True)
    def _load(_n, upload, choice, filename):
        return on_load(store, user_trigger({"sources-load-btn": _n, "sources-upload": upload}), choice,
                       upload, filename)

    @app.callback(Output("sources-status", "children"), Input("app-status", "data"))
    def _status(message):
        return message or ""

    if live is None:
        return

    @app.callback(Output("app-live-interval", "disabled"), Output("app-live-interval", "interval"),
                  Output("app-status", "data", allow_duplicate=True),
                  Input("sources-live-btn", "n_clicks"), Input("sources-live-stop", "n_clicks"),
                  State("sources-live-url", "value"), State("sources-live-refresh", "value"),
                  prevent_initial_call=True)
    def _live_toggle(_go, _stop, url, refresh):
        trigger = user_trigger({"sources-live-btn": _go, "sources-live-stop": _stop})
        if trigger is None:
            raise PreventUpdate  # the page was mounted, no button pressed
        return on_live_toggle(live, trigger, url, refresh)

    @app.callback(Output("app-dataset-key", "data", allow_duplicate=True),
                  Output("app-status", "data", allow_duplicate=True),
                  Input("app-live-interval", "n_intervals"), prevent_initial_call=True)
    def _live_tick(_n):
        return on_live_tick(store, live)
