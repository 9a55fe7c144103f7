"""Page layouts: four tabs (Overview, Timeline, Spike, Sources) and small rendering helpers.

Layout only: no data access, no callbacks. Component ids used by callbacks and browser tests are
the ``ID_*`` constants' values.
"""
from __future__ import annotations

import math

import pandas as pd
from dash import dcc, html

from mixdiag.dashboard.settings import DashboardConfig
from mixdiag.dashboard.stats import Headline
from mixdiag.dashboard.store import fmt_seconds

CARD = {"display": "inline-block", "padding": "8px 14px", "margin": "0 10px 10px 0", "border": "1px solid #ddd",
        "borderRadius": "6px", "minWidth": "120px", "verticalAlign": "top", "background": "#fafafa"}
TABLE = {"borderCollapse": "collapse", "fontSize": "13px", "margin": "6px 0 16px 0"}
CELL = {"border": "1px solid #ddd", "padding": "3px 8px", "textAlign": "left"}
GRAPH_CONFIG = {"displaylogo": False, "responsive": True}


def table(df: pd.DataFrame, id: str | None = None, max_rows: int = 200) -> html.Table:
    """A plain HTML table of ``df`` (first ``max_rows`` rows); floats shown with 6 significant digits."""
    def cell(v):
        if isinstance(v, float):
            return "-" if not math.isfinite(v) else f"{v:.6g}"
        return "" if v is None else str(v)

    head = html.Thead(html.Tr([html.Th(str(c), style=CELL) for c in df.columns]))
    body = html.Tbody([html.Tr([html.Td(cell(v), style=CELL) for v in row])
                       for row in df.head(max_rows).itertuples(index=False)])
    kw = {"id": id} if id else {}
    return html.Table([head, body], style=TABLE, **kw)


def headline_cards(h: Headline) -> list:
    """The Overview's number cards."""
    def card(label, value, id):
        return html.Div([html.Div(label, style={"fontSize": "11px", "color": "#666"}),
                         html.Div(value, id=id, style={"fontSize": "20px", "fontWeight": 600})], style=CARD)

    share = "-" if not math.isfinite(h.mixed_share) else f"{100 * h.mixed_share:.1f} %"
    src = {"tokens": "per output event", "steps": "step to step", "intervals": "per interval",
           "none": "no latency data"}.get(h.itl_source, h.itl_source)
    return [card("spikes", f"{h.n_spikes:,}", "stat-spikes"),
            card(f"ITL P50 ({src})", fmt_seconds(h.itl_p50_s), "stat-itl-p50"),
            card("ITL P99", fmt_seconds(h.itl_p99_s), "stat-itl-p99"),
            card("ITL max", fmt_seconds(h.itl_max_s), "stat-itl-max"),
            card("mixed steps", share, "stat-mixed-share"),
            card("steps", f"{h.n_steps:,}", "stat-steps"),
            card("instances", ", ".join(h.instances) or "-", "stat-instances")]


def overview_tab() -> dcc.Tab:
    return dcc.Tab(label="Overview", value="overview", children=html.Div([
        html.H3(id="verdict", children="No data loaded yet: pick a run on the Sources page.",
                style={"fontWeight": 500}),
        html.Div(id="headline-stats"),
        html.Div([dcc.Graph(id="by-cause-graph", config=GRAPH_CONFIG)],
                 style={"width": "48%", "display": "inline-block", "verticalAlign": "top"}),
        html.Div([html.H4("Sources"), html.Div(id="sources-table", style={"overflowX": "auto"}),
                  html.H4("Signals each instance provides"),
                  html.Div(id="signals-table", style={"overflowX": "auto"})],
                 style={"width": "50%", "display": "inline-block", "verticalAlign": "top", "paddingLeft": "2%"}),
    ], style={"padding": "12px"}))


def timeline_tab() -> dcc.Tab:
    return dcc.Tab(label="Timeline", value="timeline", children=html.Div([
        html.Div([html.Label("instance ", htmlFor="instance"),
                  dcc.Dropdown(id="instance", clearable=False, style={"width": "260px", "display": "inline-block",
                                                                       "verticalAlign": "middle"})]),
        html.Div("Zoom on any panel zooms all; click a spike marker for its evidence.",
                 style={"fontSize": "12px", "color": "#666", "margin": "4px 0"}),
        dcc.Loading(dcc.Graph(id="timeline-graph", config=GRAPH_CONFIG), type="circle", delay_show=300),
    ], style={"padding": "12px"}))


def spike_tab() -> dcc.Tab:
    return dcc.Tab(label="Spike", value="spike", children=html.Div([
        html.Div([html.Label("spike ", htmlFor="spike-choice"),
                  dcc.Dropdown(id="spike-choice", placeholder="click a spike on the Timeline page, or pick one",
                               style={"width": "520px", "display": "inline-block", "verticalAlign": "middle"})]),
        html.Div(id="spike-summary", style={"margin": "10px 0"}),
        dcc.Graph(id="spike-graph", config=GRAPH_CONFIG),
        html.H4("Evidence"), html.Div(id="spike-evidence"),
        html.H4("Neighbouring steps"), html.Div(id="spike-neighbours", style={"overflowX": "auto"}),
    ], style={"padding": "12px"}))


def sources_tab(config: DashboardConfig) -> dcc.Tab:
    cap = config.upload_max_bytes
    root = str(config.data_root) if config.data_root else "(none: start with --data PATH)"
    return dcc.Tab(label="Sources", value="sources", children=html.Div([
        html.H4("From the data directory"),
        html.Div(f"data directory: {root}", style={"fontSize": "12px", "color": "#666"}),
        dcc.Dropdown(id="data-choice", placeholder="a run directory or a capture file",
                     style={"width": "520px", "display": "inline-block", "verticalAlign": "middle"}),
        html.Button("Load", id="load-btn", n_clicks=0, style={"marginLeft": "8px"}),
        html.H4("Upload a capture"),
        html.Div("Nsight .sqlite, Kineto .json, vLLM/SGLang log, /metrics dump "
                 f"(at most {cap / 2**20:.0f} MiB; parsed in a separate process)",
                 style={"fontSize": "12px", "color": "#666"}),
        dcc.Upload(id="upload", max_size=cap, multiple=False,
                   children=html.Div(["drop a file here or ", html.A("choose one")]),
                   style={"width": "520px", "height": "50px", "lineHeight": "50px", "borderWidth": "1px",
                          "borderStyle": "dashed", "borderRadius": "6px", "textAlign": "center"}),
        html.H4("Live"),
        html.Div("a Prometheus server (http://host:9090) or an engine's /metrics URL",
                 style={"fontSize": "12px", "color": "#666"}),
        dcc.Input(id="live-url", type="url", value=config.prometheus_url or "", debounce=True,
                  placeholder="http://127.0.0.1:9090", style={"width": "360px"}),
        html.Label(" refresh every (s) ", htmlFor="live-refresh"),
        dcc.Input(id="live-refresh", type="number", min=0.5, max=3600, step=0.5, value=config.refresh_s,
                  style={"width": "70px"}),
        html.Button("Connect", id="live-btn", n_clicks=0, style={"marginLeft": "8px"}),
        html.Button("Stop", id="live-stop", n_clicks=0, style={"marginLeft": "4px"}),
        html.Div(id="source-status", style={"marginTop": "14px", "whiteSpace": "pre-wrap"}),
    ], style={"padding": "12px"}))


def page(config: DashboardConfig, dataset_key: dict | None, live: bool) -> html.Div:
    """The whole page; ``dataset_key`` is the dataset shown first (None: nothing loaded)."""
    return html.Div([
        html.Div([html.Span("mixdiag", style={"fontWeight": 700, "fontSize": "20px"}),
                  html.Span(" why did time-per-output-token spike?", style={"color": "#666"}),
                  html.Span(id="dataset-label", style={"float": "right", "color": "#444"})],
                 style={"padding": "10px 12px", "borderBottom": "1px solid #ddd"}),
        dcc.Store(id="dataset-key", data=dataset_key),
        dcc.Interval(id="live-interval", interval=int(config.refresh_s * 1000), disabled=not live),
        dcc.Tabs(id="tabs", value="overview",
                 children=[overview_tab(), timeline_tab(), spike_tab(), sources_tab(config)]),
    ], style={"fontFamily": "system-ui, sans-serif"})
