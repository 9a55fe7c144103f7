"""Rendering helpers the pages share: plain tables, card and graph styles (no data access, no callbacks)."""
from __future__ import annotations

import math

import pandas as pd
from dash import html

CARD = {"display": "inline-block", "padding": "8px 14px", "margin": "0 10px 10px 0", "border": "1px solid #ddd",
        "borderRadius": "6px", "minWidth": "120px", "verticalAlign": "top", "background": "#fafafa"}
TABLE = {"borderCollapse": "collapse", "fontSize": "13px", "margin": "6px 0 16px 0"}
CELL = {"border": "1px solid #ddd", "padding": "3px 8px", "textAlign": "left"}
GRAPH_CONFIG = {"displaylogo": False, "responsive": True}
PAGE = {"padding": "12px"}
HINT = {"fontSize": "12px", "color": "#666"}


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
