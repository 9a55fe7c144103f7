"""Figure builders: pure functions from prepared frames (the pages' page data, :mod:`.stats`) to plotly figures.

No figure builder reads files, holds state or knows about Dash; the callbacks call them.
"""
from __future__ import annotations

import math

import numpy as np
import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from mixdiag.causes import CAUSES, GRAPH_MODE_COLORS, color
from mixdiag.dashboard.downsample import DEFAULT_MAX_POINTS, bucket_first_of_each, minmax_indices
from mixdiag.dashboard.page_data import SpikeDetail, TimelineView
from mixdiag.fmt import ms

#: Graph-mode band, bottom to top.
GRAPH_MODE_ORDER = ["unknown", "NONE", "PIECEWISE", "FULL"]
#: Panel ids in the order they are stacked; the browser tests look for these titles.
PANEL_TITLES = {"itl": "Inter-token latency", "alloc": "Token allocation per step",
                "sm": "SM activity", "graph": "CUDA-graph mode per step",
                "expert": "Expert imbalance (max/mean per EP rank)", "kv": "PD KV transfer per step",
                "pause": "Host pause (engine-timed GC; the OS saw the process stopped)"}


#: Episode bands drawn at most (largest excess first): one shape each, and the browser redraws them all on zoom.
MAX_BANDS = 300


def timeline_panels(view: TimelineView) -> list[str]:
    """Panel ids the Timeline figure of ``view`` has: the four signals, plus expert/KV/host pause when present."""
    panels = ["itl", "alloc", "sm", "graph"]
    if view.has_expert:
        panels.append("expert")
    if view.has_kv:
        panels.append("kv")
    if view.has_pause:
        panels.append("pause")
    return panels


def _take(df: pd.DataFrame, idx: np.ndarray) -> pd.DataFrame:
    return df.iloc[idx] if len(idx) != len(df) else df


def timeline_figure(view: TimelineView, x_range: tuple[float, float] | None = None,
                    max_points: int = DEFAULT_MAX_POINTS, revision: str | None = None) -> go.Figure:
    """Linked panels on one shared x-axis (seconds since the first sample).

    Every line is downsampled to ``max_points`` over ``x_range`` (min and max per bucket, so
    spikes stay visible); spike markers carry ``customdata = [instance, step]`` for the Spike
    page. Zooming one panel zooms all (shared x-axis). ``revision`` keeps the user's zoom across
    redraws while it stays the same (the dashboard passes dataset id and instance).
    """
    panels = timeline_panels(view)
    heights = {"itl": 0.34, "alloc": 0.22, "sm": 0.16, "graph": 0.12, "expert": 0.12, "kv": 0.12, "pause": 0.12}
    fig = make_subplots(rows=len(panels), cols=1, shared_xaxes=True, vertical_spacing=0.035,
                        subplot_titles=[PANEL_TITLES[p] for p in panels],
                        row_heights=[heights[p] for p in panels])
    row = {p: i + 1 for i, p in enumerate(panels)}
    shown, total = 0, 0

    # ITL line plus spike markers, one trace per cause so the legend names the causes.
    itl = view.itl
    idx = minmax_indices(itl["t_rel_s"].to_numpy(), itl["itl_s"].to_numpy(), max_points, x_range)
    shown, total = shown + len(idx), total + len(itl)
    d = _take(itl, idx)
    fig.add_trace(go.Scatter(x=d["t_rel_s"], y=d["itl_s"], mode="lines", name="ITL",
                             line={"color": "#4D4D4D", "width": 1}, hovertemplate="%{x:.3f}s ITL %{y:.4f}s"),
                  row=row["itl"], col=1)
    sp = view.spikes
    for cause in CAUSES:
        s = sp[sp["cause"] == cause]
        if not len(s):
            continue
        k = minmax_indices(s["t_rel_s"].to_numpy(), s["itl_s"].to_numpy(), max_points, x_range)
        s = _take(s, k)
        fig.add_trace(go.Scatter(
            x=s["t_rel_s"], y=s["itl_s"], mode="markers", name=f"spike: {cause}",
            marker={"color": color(cause), "size": 9, "symbol": "diamond", "line": {"width": 1, "color": "#222"}},
            customdata=np.column_stack([s["instance"].to_numpy(), s["step"].to_numpy()]).tolist(),
            hovertemplate=f"{cause}<br>step %{{customdata[1]}}<br>ITL %{{y:.4f}}s<extra>click for evidence</extra>",
            meta="spike"), row=row["itl"], col=1)

    st = view.steps
    t = st["t_rel_s"].to_numpy()
    pre = st["prefill_tokens"].fillna(0).to_numpy()
    dec = st["decode_rows"].fillna(0).to_numpy()
    # Two series share one index set (stacked areas must align): half the budget each.
    half = max(max_points // 2, 2)
    ia = np.union1d(minmax_indices(t, pre, half, x_range), minmax_indices(t, dec, half, x_range))
    shown, total = shown + len(ia), total + len(st)
    a = _take(st, ia)
    for col, name, line_color in (("decode_rows", "decode rows", "#0072B2"), ("prefill_tokens", "prefill tokens", "#D55E00")):
        fig.add_trace(go.Scatter(x=a["t_rel_s"], y=a[col].fillna(0), mode="lines", name=name, stackgroup="alloc",
                                 line={"color": line_color, "width": 0.5, "shape": "hv"},
                                 hovertemplate=f"%{{x:.3f}}s {name} %{{y:.0f}}<extra></extra>"),
                      row=row["alloc"], col=1)

    sm = st["sm_active"].to_numpy(dtype="float64")
    im = minmax_indices(t, sm, max_points, x_range)
    m = _take(st, im)
    fig.add_trace(go.Scatter(x=m["t_rel_s"], y=m["sm_active"], mode="lines", name=f"SM active ({view.sm_quality})",
                             line={"color": "#CC79A7", "width": 1, "shape": "hv"},
                             hovertemplate="%{x:.3f}s SM active %{y:.2f}<extra></extra>"), row=row["sm"], col=1)
    fig.update_yaxes(title_text=f"ratio ({view.sm_quality})", range=[0, 1.05], row=row["sm"], col=1)

    ig = bucket_first_of_each(t, st["graph_mode"].to_numpy(), max_points, x_range)
    g = _take(st, ig)
    for mode in GRAPH_MODE_ORDER:
        gm = g[g["graph_mode"] == mode]
        if not len(gm):
            continue
        fig.add_trace(go.Scatter(x=gm["t_rel_s"], y=gm["graph_mode"], mode="markers", name=f"graph {mode}",
                                 marker={"color": GRAPH_MODE_COLORS[mode], "size": 6, "symbol": "line-ns-open",
                                         "line": {"width": 2, "color": GRAPH_MODE_COLORS[mode]}},
                                 hovertemplate=f"%{{x:.3f}}s graph {mode}<extra></extra>"), row=row["graph"], col=1)
    fig.update_yaxes(type="category", categoryorder="array", categoryarray=GRAPH_MODE_ORDER, row=row["graph"], col=1)

    if "expert" in row:
        ex = st["expert_imbalance"].to_numpy(dtype="float64")
        e = _take(st, minmax_indices(t, ex, max_points, x_range))
        fig.add_trace(go.Scatter(x=e["t_rel_s"], y=e["expert_imbalance"], mode="lines", name="expert imbalance",
                                 line={"color": "#CC79A7", "width": 1, "shape": "hv"}), row=row["expert"], col=1)
        fig.update_yaxes(title_text="max/mean", row=row["expert"], col=1)
    if "kv" in row:
        kv = st["kv_transfer_bytes"].fillna(0).to_numpy()
        k = _take(st, minmax_indices(t, kv, max_points, x_range))
        fig.add_trace(go.Scatter(x=k["t_rel_s"], y=k["kv_transfer_bytes"].fillna(0), mode="lines",
                                 name="KV transfer bytes", line={"color": "#0072B2", "width": 1, "shape": "hv"}),
                      row=row["kv"], col=1)
        fig.update_yaxes(title_text="bytes", row=row["kv"], col=1)

    if "pause" in row:
        hp = st["host_pause_s"].fillna(0).to_numpy()
        h = _take(st, minmax_indices(t, hp, max_points, x_range))
        fig.add_trace(go.Scatter(x=h["t_rel_s"], y=h["host_pause_s"].fillna(0), mode="lines", name="host pause",
                                 line={"color": "#D55E00", "width": 1, "shape": "hv"},
                                 hovertemplate="%{x:.3f}s host pause %{y:.3f} s<extra></extra>"),
                      row=row["pause"], col=1)
        if "host_stopped_s" in st.columns and (st["host_stopped_s"].fillna(0) >= 1e-3).any():
            hs = st["host_stopped_s"].fillna(0).to_numpy()
            o = _take(st, minmax_indices(t, hs, max_points, x_range))
            fig.add_trace(go.Scatter(x=o["t_rel_s"], y=o["host_stopped_s"].fillna(0), mode="lines",
                                     name="process stopped (OS)",
                                     line={"color": "#CC79A7", "width": 1, "shape": "hv"},
                                     hovertemplate="%{x:.3f}s stopped %{y:.3f} s<extra></extra>"),
                          row=row["pause"], col=1)
        fig.update_yaxes(title_text="s", row=row["pause"], col=1)

    episode_bands(fig, view.episodes)
    fig.update_yaxes(title_text="s", row=row["itl"], col=1)
    fig.update_yaxes(title_text="tokens / rows", row=row["alloc"], col=1)
    fig.update_xaxes(title_text=f"seconds since first sample ({view.instance})", row=len(panels), col=1)
    if x_range is not None:
        fig.update_xaxes(range=list(x_range))
    note = (f"{shown:,} of {total:,} points drawn (min/max per pixel bucket; zoom to re-sample)"
            if shown < total else f"all {total:,} points drawn")
    fig.update_layout(height=220 + 150 * len(panels), margin={"l": 60, "r": 20, "t": 40, "b": 50},
                      uirevision=revision or view.instance, hovermode="closest", template="plotly_white",
                      legend={"orientation": "v", "x": 1.01, "xanchor": "left", "y": 1, "yanchor": "top",
                              "font": {"size": 11}},
                      meta={"points_shown": int(shown), "points_total": int(total)})
    fig.add_annotation(text=note, xref="paper", yref="paper", x=1, y=-0.02, xanchor="right", yanchor="top",
                       showarrow=False, font={"size": 10, "color": "#777"})
    return fig


def episode_bands(fig: go.Figure, episodes: pd.DataFrame) -> None:
    """Each sustained episode as a band over every panel (one paper-high shape on the shared x-axis), coloured
    by its cause, and one hover marker per episode at its median latency on the ITL panel (``meta="episode"``,
    no customdata: a click on it opens no spike)."""
    if episodes is None or not len(episodes):
        return
    ep = episodes.sort_values("excess_s", ascending=False, kind="stable").head(MAX_BANDS)
    for r in ep.itertuples(index=False):
        fig.add_shape(type="rect", xref="x", yref="paper", x0=r.t_start_rel_s, x1=r.t_end_rel_s, y0=0, y1=1,
                      fillcolor=color(r.cause), opacity=0.12, line_width=0, layer="below", name=f"episode: {r.cause}")
    for cause, g in ep.groupby("cause", sort=True):
        text = [f"episode {a:.3f}-{b:.3f}s<br>{cause}" + (f" ({sh:.0%} of its excess)" if math.isfinite(sh) else "")
                + f"<br>{int(n)} rows, {x:.2f}x reference, {e:.3f} token-s over it" + (f"<br>{w}" if w else "")
                for a, b, sh, n, x, e, w in zip(g["t_start_rel_s"], g["t_end_rel_s"], g["share"], g["rows"],
                                                g["ratio"], g["excess_s"], g["why"])]
        fig.add_trace(go.Scatter(x=(g["t_start_rel_s"] + g["t_end_rel_s"]) / 2, y=g["median_latency_s"], mode="markers",
                                 name=f"episode: {cause}", text=text, hovertemplate="%{text}<extra></extra>",
                                 marker={"color": color(cause), "size": 11, "symbol": "square-open",
                                         "line": {"width": 2, "color": color(cause)}}, meta="episode"), row=1, col=1)


def empty_figure(text: str = "") -> go.Figure:
    """A blank figure (optionally with a centred message), for pages with nothing to show yet."""
    fig = go.Figure()
    fig.update_layout(height=200, template="plotly_white", xaxis={"visible": False}, yaxis={"visible": False},
                      margin={"l": 20, "r": 20, "t": 20, "b": 20})
    if text:
        fig.add_annotation(text=text, showarrow=False, xref="paper", yref="paper", x=0.5, y=0.5)
    return fig


def by_cause_figure(counts: dict[str, int]) -> go.Figure:
    """Horizontal bars: spikes per cause, every cause of the closed set listed."""
    causes = [c for c in CAUSES if c in counts] + [c for c in counts if c not in CAUSES]
    fig = go.Figure(go.Bar(x=[counts[c] for c in causes], y=causes, orientation="h",
                           marker={"color": [color(c) for c in causes]}, text=[counts[c] for c in causes],
                           textposition="auto", hovertemplate="%{y}: %{x} spikes<extra></extra>"))
    fig.update_layout(height=300, margin={"l": 110, "r": 20, "t": 30, "b": 40}, template="plotly_white",
                      title={"text": "Spikes by cause", "font": {"size": 14}},
                      yaxis={"autorange": "reversed"}, xaxis={"title": "spikes"})
    return fig


def budget_figure(excess_s: dict[str, float], p99_without_s: dict[str, float] | None = None,
                  p99_s: float = math.nan) -> go.Figure:
    """Horizontal bars: ITL excess token-time (s) charged to each cause (``none``: rows that did not
    spike), in the cause palette; the bar text says what P99 would be without the cause."""
    causes = [c for c in (*CAUSES, "none") if excess_s.get(c, 0) > 0]
    total = sum(excess_s.get(c, 0.0) for c in causes)
    p99w = p99_without_s or {}

    def label(c):
        share = f"{excess_s[c] / total:.0%}" if total > 0 else ""
        w = p99w.get(c, math.nan)
        return f"{share}, P99 without {ms(w, 0)}" if math.isfinite(w) and c != "none" else share

    fig = go.Figure(go.Bar(x=[excess_s[c] for c in causes], y=causes, orientation="h",
                           marker={"color": [color(c) if c != "none" else "#D9D9D9" for c in causes]},
                           text=[label(c) for c in causes], textposition="auto",
                           hovertemplate="%{y}: %{x:.3f} s of excess<extra></extra>"))
    title = "ITL excess over baseline by cause" + (f" (P99 {ms(p99_s, 0)})" if math.isfinite(p99_s) else "")
    fig.update_layout(height=300, margin={"l": 110, "r": 20, "t": 30, "b": 40}, template="plotly_white",
                      title={"text": title, "font": {"size": 14}},
                      yaxis={"autorange": "reversed"}, xaxis={"title": "excess token-time (s)"})
    return fig


def regime_figure(excess_s: dict[str, float], n_episodes: int, episodes_by_cause: dict[str, int] | None = None) -> go.Figure:
    """Horizontal bars: each cause's share of the latency over the healthy reference (token-seconds in the
    hover), in the cause palette; the bar text adds the cause's episodes, the title their count."""
    causes = [c for c in CAUSES if excess_s.get(c, 0) > 0] + [c for c in excess_s if c not in CAUSES and excess_s[c] > 0]
    total = sum(excess_s[c] for c in causes)
    eps = episodes_by_cause or {}
    shares = [excess_s[c] / total for c in causes] if total > 0 else []

    def label(c, sh):
        n = eps.get(c, 0)
        return f"{sh:.0%}" + (f", {n} episode{'s' if n != 1 else ''}" if n else "")

    fig = go.Figure(go.Bar(x=shares, y=causes, orientation="h", marker={"color": [color(c) for c in causes]},
                           text=[label(c, sh) for c, sh in zip(causes, shares)], textposition="auto",
                           customdata=[excess_s[c] for c in causes],
                           hovertemplate="%{y}: %{x:.0%} of the excess, %{customdata:.3f} token-s<extra></extra>"))
    title = f"Latency over the healthy reference by cause ({n_episodes} sustained episode{'s' if n_episodes != 1 else ''})"
    fig.update_layout(height=300, margin={"l": 110, "r": 20, "t": 30, "b": 40}, template="plotly_white",
                      title={"text": title, "font": {"size": 14}}, yaxis={"autorange": "reversed"},
                      xaxis={"title": "share of excess token-time", "tickformat": ".0%", "range": [0, 1]})
    return fig


def kernel_share_figure(kernels: pd.DataFrame, title: str = "") -> go.Figure:
    """Top kernels' share of device time, one bar group per step class (``kernels``: the breakdown's
    kernels frame rows of one instance and rank)."""
    if not len(kernels):
        return empty_figure("no kernels in these steps")
    fig = go.Figure()
    for cls, g in kernels.groupby("step_class", sort=False):
        fig.add_bar(y=[k[:70] for k in g["kernel"]], x=g["share"], orientation="h", name=str(cls),
                    customdata=np.stack([g["time_s"] * 1e3, g["calls"]], axis=1),
                    hovertemplate="%{y}<br>share %{x:.1%}<br>%{customdata[0]:.3f} ms, %{customdata[1]} calls")
    fig.update_layout(title=title, barmode="group", height=120 + 24 * kernels["kernel"].nunique(),
                      xaxis_tickformat=".0%", yaxis_autorange="reversed", margin={"l": 10, "r": 10, "t": 40, "b": 30})
    return fig


def spike_figure(detail: SpikeDetail) -> go.Figure:
    """The spike and its neighbouring steps: measured ITL per step, baseline, the ledger's prediction."""
    nb = detail.neighbours
    y_col = "itl_max_s" if "itl_max_s" in nb and nb["itl_max_s"].notna().any() else None
    y = nb[y_col] if y_col else nb["t_end_s"] - nb["t_start_s"]
    cause = str(detail.spike.get("cause", "unknown"))
    is_spike = (nb["step"] == detail.spike["step"]).to_numpy()
    colors = [color(cause) if s else "#9E9E9E" for s in is_spike]
    fig = go.Figure(go.Bar(x=nb["step"].astype(str), y=y, marker={"color": colors}, name="measured",
                           customdata=nb["kind"] if "kind" in nb else None,
                           hovertemplate="step %{x} (%{customdata})<br>%{y:.4f}s<extra></extra>"))
    base = detail.spike.get("baseline_s")
    if base is not None and np.isfinite(base):
        fig.add_hline(y=float(base), line_dash="dash", line_color="#555",
                      annotation_text=f"baseline {float(base):.4f}s", annotation_position="top left")
    if math.isfinite(detail.predicted_s):
        src = "ledger" if detail.predicted_key == "ledger" else "diagnosis"
        fig.add_hline(y=detail.predicted_s, line_dash="dot", line_color=color(cause),
                      annotation_text=f"{src} predicted {detail.predicted_s:.4f}s", annotation_position="top right")
    fig.update_layout(height=320, margin={"l": 60, "r": 20, "t": 40, "b": 40}, template="plotly_white",
                      title={"text": f"Steps around spike {detail.spike['step']} ({cause})", "font": {"size": 14}},
                      xaxis={"title": "step", "type": "category"},
                      yaxis={"title": "max ITL in step (s)" if y_col else "step duration (s)"}, showlegend=False)
    return fig
