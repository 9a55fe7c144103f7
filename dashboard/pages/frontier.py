"""Tune page: sweep a scheduler knob on a replay of the loaded data and plot the Pareto frontier.

The sweep is :func:`mixdiag.tuning.sweep.run` (the same as ``mixdiag tune``); the figure is
:func:`frontier_figure`, a pure builder from its result (shared with ``tune --html``).
"""
from __future__ import annotations

from dash import Input, Output, State, dcc, html
from dash.exceptions import PreventUpdate

from mixdiag.dashboard.components import GRAPH_CONFIG, HINT, PAGE
from mixdiag.dashboard.store import DataStore
from mixdiag.errors import UserError

PATH = "/tune"
NAME = "Tune"


def frontier_figure(result: dict):
    """The frontier figure of a tuning result (pure: plain data in, plotly Figure out)."""
    from mixdiag.tuning.frontier_report import frontier_figure as build

    return build(result)


def layout(**_query) -> html.Div:
    return html.Div([
        html.Div("Replay the loaded data through the engine's schedulers for each value of a knob "
                 "(NAME=V1,V2,...: chunk_size, max_batched_tokens, long_prefill_threshold, max_running, policy).",
                 style=HINT),
        dcc.Input(id="tune-knob", type="text", value="chunk_size=256,512,1024,2048", debounce=True,
                  style={"width": "360px"}),
        html.Label(" P99 TTFT SLO (s) ", htmlFor="tune-slo-ttft"),
        dcc.Input(id="tune-slo-ttft", type="number", min=0, step=0.1, value=None, style={"width": "70px"}),
        html.Label(" P99 ITL SLO (s) ", htmlFor="tune-slo-itl"),
        dcc.Input(id="tune-slo-itl", type="number", min=0, step=0.01, value=None, style={"width": "70px"}),
        html.Button("Sweep", id="tune-run-btn", n_clicks=0, style={"marginLeft": "8px"}),
        html.Div(id="tune-headline", style={"margin": "10px 0", "fontWeight": 600}),
        dcc.Loading(dcc.Graph(id="tune-frontier-graph", config=GRAPH_CONFIG)),
    ], style=PAGE)


def on_sweep(store: DataStore, key: dict | None, knob: str, slo_ttft, slo_itl):
    """(headline, figure) of a sweep of ``knob`` on the dataset ``key``; a UserError becomes the headline."""
    from mixdiag.tuning import frontier, sweep
    from mixdiag.tuning.frontier_report import headline

    ds = store.get(key["id"]) if key else None
    if ds is None:
        raise PreventUpdate
    try:
        res = sweep.run(ds.timeline, [frontier.parse_knob(knob or "")], slo_itl=slo_itl or None,
                       slo_ttft=slo_ttft or None)
    except UserError as e:
        return f"error: {e}", {}
    return headline(res), frontier_figure(res)


def register(app, store: DataStore, live=None) -> None:
    """Bind the Tune page's callback to ``app``."""
    @app.callback(Output("tune-headline", "children"), Output("tune-frontier-graph", "figure"),
                  Input("tune-run-btn", "n_clicks"), State("app-dataset-key", "data"), State("tune-knob", "value"),
                  State("tune-slo-ttft", "value"), State("tune-slo-itl", "value"), prevent_initial_call=True)
    def _sweep(_n, key, knob, slo_ttft, slo_itl):
        return on_sweep(store, key, knob, slo_ttft, slo_itl)
