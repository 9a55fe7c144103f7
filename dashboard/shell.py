"""The frame around the pages: header, page links, the stores pages share, and its own callbacks.

Pages talk to each other only through the frame's stores: ``app-dataset-key`` (the dataset
shown), ``app-status`` (the last load/live message), ``app-spike-choice`` (a spike clicked on
the Timeline page, for the Spike page) and ``app-url`` (navigation from a callback).
"""
from __future__ import annotations

import dash
from dash.exceptions import PreventUpdate
from dash import Input, Output, dcc, html

#: Page links: plain look, the current page's underlined.
LINK = {"padding": "8px 16px", "display": "inline-block", "color": "#333", "textDecoration": "none",
        "borderBottom": "2px solid transparent"}
LINK_ACTIVE = {**LINK, "borderBottom": "2px solid #1f77b4", "fontWeight": 600}


def key_of(ds) -> dict:
    """What the browser holds for a dataset: its id and a revision that changes on every reload."""
    return {"id": ds.id, "rev": float(ds.loaded_unix_s)}


def nav_id(page: str) -> str:
    return f"app-nav-{page}"


def frame(config, dataset_key: dict | None, live: bool, pages: list) -> html.Div:
    """The whole page around ``dash.page_container``; ``dataset_key`` is the dataset shown first."""
    links = [dcc.Link(m.NAME, href=m.PATH, id=nav_id(m.__name__.rsplit(".", 1)[-1]), className="nav-tab",
                      style=LINK) for m in pages]
    return html.Div([
        html.Div([html.Span("mixdiag", style={"fontWeight": 700, "fontSize": "20px"}),
                  html.Span(" why did time-per-output-token spike?", style={"color": "#666"}),
                  html.Span(id="app-dataset-label", style={"float": "right", "color": "#444"})],
                 style={"padding": "10px 12px", "borderBottom": "1px solid #ddd"}),
        html.Div(links, style={"borderBottom": "1px solid #ddd", "padding": "0 12px"}),
        dcc.Location(id="app-url", refresh="callback-nav"),
        dcc.Store(id="app-dataset-key", data=dataset_key),
        dcc.Store(id="app-status", data=""),
        dcc.Store(id="app-spike-choice", data=None),
        dcc.Interval(id="app-live-interval", interval=int(config.refresh_s * 1000), disabled=not live),
        dash.page_container,
    ], style={"fontFamily": "system-ui, sans-serif"})


def link_styles(pathname: str | None, paths: list[str]) -> list[dict]:
    """The page links' styles: the one whose path is ``pathname`` marked current."""
    here = (pathname or "/").rstrip("/") or "/"
    return [LINK_ACTIVE if p == here else LINK for p in paths]


def register(app, store, pages: list) -> None:
    """The frame's callbacks: the dataset label and the current page's link."""
    @app.callback(Output("app-dataset-label", "children"), Input("app-dataset-key", "data"))
    def _label(key):
        ds = store.get(key["id"]) if key else None
        if ds is None:
            raise PreventUpdate
        return ds.label

    paths = [m.PATH for m in pages]

    @app.callback([Output(nav_id(m.__name__.rsplit(".", 1)[-1]), "style") for m in pages],
                  Input("app-url", "pathname"))
    def _links(pathname):
        return link_styles(pathname, paths)
