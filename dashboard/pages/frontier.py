"""Tune page: sweep a scheduler knob on a replay of the loaded data and plot the Pareto frontier.

The sweep is :func:`mixdiag.tuning.sweep.run` (the same as ``mixdiag tune``); the figure is
:func:`frontier_figure`, a pure builder from its result (shared with ``tune --html``).

The page never opens on an empty axis: on first open (and when another dataset is loaded) it shows
the last sweep of that dataset, with the knob and SLOs it ran with, or else sweeps
:data:`DEFAULT_KNOB` (:func:`on_open`); Sweep runs what the inputs say (:func:`on_sweep`).
"""
from __future__ import annotations

import threading
from dataclasses import dataclass

from dash import Input, Output, State, ctx, dcc, html, no_update
from dash.exceptions import PreventUpdate

from mixdiag.dashboard.components import GRAPH_CONFIG, HINT, PAGE
from mixdiag.dashboard.store import DataStore
from mixdiag.errors import UserError

PATH = "/tune"
NAME = "Tune"
#: What the page sweeps when it opens on a dataset it has not swept yet: the chunk sizes vLLM and
#: SGLang deployments commonly pick between.
DEFAULT_KNOB = "chunk_size=256,512,1024,2048"


@dataclass(frozen=True)
class LastSweep:
    """A sweep the page showed: its inputs and its (headline, figure)."""

    knob: str
    slo_ttft: float | None
    slo_itl: float | None
    headline: str
    figure: object


class SweepMemory:
    """The last successful sweep per dataset (id and revision), so the page reopens on it."""

    def __init__(self):
        self._lock = threading.Lock()
        self._last: dict[tuple, LastSweep] = {}

    @staticmethod
    def _key(key: dict) -> tuple:
        return key.get("id"), key.get("rev")

    def get(self, key: dict | None) -> LastSweep | None:
        if not key:
            return None
        with self._lock:
            return self._last.get(self._key(key))

    def put(self, key: dict, last: LastSweep) -> None:
        with self._lock:
            self._last[self._key(key)] = last


def frontier_figure(result: dict):
    """The frontier figure of a tuning result (pure: plain data in, plotly Figure out)."""
    from mixdiag.tuning.frontier_report import frontier_figure as build

    return build(result)


def layout(**_query) -> html.Div:
    return html.Div([
        html.Div("Replay the loaded data through the engine's schedulers for each value of a knob "
                 "(NAME=V1,V2,...: chunk_size, max_batched_tokens, long_prefill_threshold, max_running, policy).",
                 style=HINT),
        dcc.Input(id="tune-knob", type="text", value=DEFAULT_KNOB, debounce=True,
                  style={"width": "360px"}),
        html.Label(" P99 TTFT SLO (s) ", htmlFor="tune-slo-ttft"),
        dcc.Input(id="tune-slo-ttft", type="number", min=0, step=0.1, value=None, style={"width": "70px"}),
        html.Label(" P99 ITL SLO (s) ", htmlFor="tune-slo-itl"),
        dcc.Input(id="tune-slo-itl", type="number", min=0, step=0.01, value=None, style={"width": "70px"}),
        html.Button("Sweep", id="tune-run-btn", n_clicks=0, style={"marginLeft": "8px"}),
        html.Div(id="tune-headline", style={"margin": "10px 0", "fontWeight": 600}),
        dcc.Loading(dcc.Graph(id="tune-frontier-graph", config=GRAPH_CONFIG)),
    ], style=PAGE)


def on_sweep(store: DataStore, key: dict | None, knob: str, slo_ttft, slo_itl, memory: SweepMemory | None = None):
    """(headline, figure) of a sweep of ``knob`` on the dataset ``key``; a UserError becomes the headline.
    A successful sweep is remembered in ``memory`` (the page reopens on it)."""
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
    head, fig = headline(res), frontier_figure(res)
    if memory is not None:
        memory.put(key, LastSweep(knob, slo_ttft or None, slo_itl or None, head, fig))
    return head, fig


def on_open(store: DataStore, key: dict | None, memory: SweepMemory):
    """(headline, figure, knob, slo_ttft, slo_itl) when the page opens on dataset ``key``: the last sweep
    of that dataset with the inputs it ran with, else a sweep of :data:`DEFAULT_KNOB` without SLOs."""
    last = memory.get(key)
    if last is not None:
        return last.headline, last.figure, last.knob, last.slo_ttft, last.slo_itl
    head, fig = on_sweep(store, key, DEFAULT_KNOB, None, None, memory)
    return head, fig, DEFAULT_KNOB, None, None


def register(app, store: DataStore, live=None) -> None:
    """Bind the Tune page's callback to ``app``."""
    memory = SweepMemory()

    @app.callback(Output("tune-headline", "children"), Output("tune-frontier-graph", "figure"),
                  Output("tune-knob", "value"), Output("tune-slo-ttft", "value"), Output("tune-slo-itl", "value"),
                  Input("tune-run-btn", "n_clicks"), Input("app-dataset-key", "data"), State("tune-knob", "value"),
                  State("tune-slo-ttft", "value"), State("tune-slo-itl", "value"))
    def _sweep(_n, key, knob, slo_ttft, slo_itl):
        if ctx.triggered_id == "tune-run-btn":
            return (*on_sweep(store, key, knob, slo_ttft, slo_itl, memory), no_update, no_update, no_update)
        return on_open(store, key, memory)  # the page's mount, or another dataset loaded
