"""Overview page: the verdict, headline numbers, spikes by cause, the ITL excess budget by cause (with P99
without each cause), the regimes (share of excess over the healthy reference by cause, episode count,
saturation), sources and the signals each instance has."""
from __future__ import annotations

import math

from dash import Input, Output, dcc, html
from dash.exceptions import PreventUpdate

from mixdiag.dashboard import figures
from mixdiag.dashboard.components import CARD, GRAPH_CONFIG, PAGE, table
from mixdiag.dashboard.stats import Headline, regime_summary, signals_frame, sources_frame
from mixdiag.dashboard.store import DataStore
from mixdiag.fmt import duration

PATH = "/"
NAME = "Overview"


def headline_cards(h: Headline) -> list:
    """The Overview's number cards."""
    def card(label, value, id):
        return html.Div([html.Div(label, style={"fontSize": "11px", "color": "#666"}),
                         html.Div(value, id=id, style={"fontSize": "20px", "fontWeight": 600})], style=CARD)

    share = "-" if not math.isfinite(h.mixed_share) else f"{100 * h.mixed_share:.1f} %"
    src = {"tokens": "per output event", "steps": "step to step", "intervals": "per interval",
           "none": "no latency data"}.get(h.itl_source, h.itl_source)
    return [card("spikes", f"{h.n_spikes:,}", "overview-stat-spikes"),
            card(f"ITL P50 ({src})", duration(h.itl_p50_s), "overview-stat-itl-p50"),
            card("ITL P99", duration(h.itl_p99_s), "overview-stat-itl-p99"),
            card("ITL max", duration(h.itl_max_s), "overview-stat-itl-max"),
            card("mixed steps", share, "overview-stat-mixed-share"),
            card("steps", f"{h.n_steps:,}", "overview-stat-steps"),
            card("instances", ", ".join(h.instances) or "-", "overview-stat-instances")]


def layout(**_query) -> html.Div:
    return html.Div([
        html.H3(id="overview-verdict", children="No data loaded yet: pick a run on the Sources page.",
                style={"fontWeight": 500}),
        html.Div(id="overview-headline-stats"),
        html.Div([dcc.Graph(id="overview-by-cause-graph", config=GRAPH_CONFIG),
                  dcc.Graph(id="overview-budget-graph", config=GRAPH_CONFIG),
                  html.Div(id="overview-budget-p99", style={"fontSize": "13px"}),
                  dcc.Graph(id="overview-regimes-graph", config=GRAPH_CONFIG),
                  html.Div(id="overview-regimes-saturation", style={"fontSize": "13px"})],
                 style={"width": "48%", "display": "inline-block", "verticalAlign": "top"}),
        html.Div([html.H4("Sources"), html.Div(id="overview-sources-table", style={"overflowX": "auto"}),
                  html.H4("Signals each instance provides"),
                  html.Div(id="overview-signals-table", style={"overflowX": "auto"})],
                 style={"width": "50%", "display": "inline-block", "verticalAlign": "top", "paddingLeft": "2%"}),
    ], style=PAGE)


def on_dataset(store: DataStore, key: dict | None):
    """Verdict, headline cards, by-cause figure, sources and signals tables of the dataset ``key``."""
    ds = store.get(key["id"]) if key else None
    if ds is None:
        raise PreventUpdate
    h = ds.headline
    src = table(sources_frame(ds.timeline))
    # one row per signal, one column per instance: stays narrow with many signals
    sig_df = signals_frame(ds.timeline, ds.diagnosis).set_index("instance").T
    sig = table(sig_df.rename_axis("signal").reset_index())
    return h.verdict, headline_cards(h), figures.by_cause_figure(h.by_cause), src, sig


def budget_view(diagnosis) -> tuple[dict[str, float], dict[str, float], float, list[str]]:
    """Excess by cause over all instances; P99 and "P99 without" of the instance with the most
    excess (the figure's numbers); one line per instance and cause: "P99 without c: X (-Y)"."""
    b = diagnosis.budget
    excess = b.excess_by_cause()
    lines, top = [], None
    for inst, ib in b.instances.items():
        if top is None or ib.excess_s > b.instances[top].excess_s:
            top = inst
        parts = [f"{c} {duration(cb.p99_without_s)} (-{duration(cb.p99_reduction_s)})"
                 for c, cb in sorted(ib.by_cause.items(), key=lambda x: -x[1].p99_reduction_s)
                 if c != "none" and cb.excess_s > 0]
        if parts:
            lines.append(f"{inst}: P99 {duration(ib.p99_s)}; without " + ", ".join(parts))
    ib = b.instances.get(top) if top else None
    p99w = {c: cb.p99_without_s for c, cb in ib.by_cause.items()} if ib else {}
    return excess, p99w, (ib.p99_s if ib else math.nan), lines


def on_budget(store: DataStore, key: dict | None):
    """The budget figure and the "P99 without" lines of the dataset ``key``."""
    ds = store.get(key["id"]) if key else None
    if ds is None:
        raise PreventUpdate
    excess, p99w, p99, lines = budget_view(ds.diagnosis)
    return figures.budget_figure(excess, p99w, p99), [html.Div(line) for line in lines]


def on_regimes(store: DataStore, key: dict | None):
    """The regimes figure (excess shares by cause, episode count) and the saturation lines of ``key``."""
    ds = store.get(key["id"]) if key else None
    if ds is None:
        raise PreventUpdate
    r = regime_summary(ds.diagnosis)
    return (figures.regime_figure(r.excess_s, r.n_episodes, r.episodes_by_cause),
            [html.Div(line, style={"fontWeight": 600}) for line in r.saturated])


def register(app, store: DataStore, live=None) -> None:
    """Bind the Overview's callback to ``app``."""
    @app.callback(Output("overview-verdict", "children"), Output("overview-headline-stats", "children"),
                  Output("overview-by-cause-graph", "figure"), Output("overview-sources-table", "children"),
                  Output("overview-signals-table", "children"), Input("app-dataset-key", "data"))
    def _dataset(key):
        return on_dataset(store, key)

    @app.callback(Output("overview-budget-graph", "figure"), Output("overview-budget-p99", "children"),
                  Input("app-dataset-key", "data"))
    def _budget(key):
        return on_budget(store, key)

    @app.callback(Output("overview-regimes-graph", "figure"), Output("overview-regimes-saturation", "children"),
                  Input("app-dataset-key", "data"))
    def _regimes(key):
        return on_regimes(store, key)
