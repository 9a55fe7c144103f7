"""``analyze --html``: a self-contained HTML report (plotly.js inlined, works offline).

One shared time axis with the article's four signals - TPOT/ITL with spikes coloured by cause,
token allocation (prefill tokens vs decode rows), SM activity, CUDA-graph mode - plus a panel
with the other causes' evidence (expert imbalance, KV transfer, preemptions, inter-step gap),
and a table of the top spikes with the ledger's predicted spike height next to the measured one.
Sustained episodes (regimes) are shaded bands across every panel, coloured by cause, with a table of
saturation, excess by cause and the episodes.
"""
from __future__ import annotations

import html
import math
from pathlib import Path

import numpy as np
import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from mixdiag.report_breakdown import breakdown_html
from mixdiag.causes import CAUSE_COLORS, color
from mixdiag.fmt import ms
from mixdiag.html_page import page
from mixdiag.ledger.device_model import DeviceModel
from mixdiag.ledger.shapes import LedgerModel
from mixdiag.ledger.spike_height import predicted_height
from mixdiag.report import episode_label, excess_rows, saturation_lines, spikes_table

GRAPH_LEVEL = {"FULL": 2, "PIECEWISE": 1, "NONE": 0}
MAX_POINTS = 20000  # per trace; larger runs are decimated (spikes are always drawn)
MAX_BANDS = 300  # episode bands drawn (largest excess first): a shape each, and a page must stay light


def _decimate(df: pd.DataFrame) -> pd.DataFrame:
    if len(df) <= MAX_POINTS:
        return df
    step = int(math.ceil(len(df) / MAX_POINTS))
    keep = np.zeros(len(df), dtype=bool)
    keep[::step] = True
    if "is_spike" in df.columns:
        keep |= df["is_spike"].to_numpy(dtype=bool)
    return df[keep]


def figure(d) -> go.Figure:
    """The five stacked panels on one time axis (seconds since the first step)."""
    st = d.steps
    t0 = float(st["t_start_s"].min()) if len(st) else 0.0
    fig = make_subplots(rows=5, cols=1, shared_xaxes=True, vertical_spacing=0.03,
                        row_heights=[0.32, 0.18, 0.16, 0.14, 0.20],
                        subplot_titles=("TPOT / ITL per step, spikes coloured by cause", "token allocation",
                                        "SM activity", "CUDA-graph mode", "other evidence"))
    multi = st["instance"].nunique() > 1 if len(st) else False
    for inst, s in st.groupby("instance", sort=True) if len(st) else []:
        s = _decimate(s.sort_values("t_start_s"))
        x = s["t_end_s"] - t0
        tag = f" [{inst}]" if multi else ""
        lat = s["itl_max_s"].fillna(s["latency_s"]) if "itl_max_s" in s else s["latency_s"]
        fig.add_trace(go.Scattergl(x=x, y=lat * 1e3, mode="lines", name=f"ITL ms{tag}", line=dict(width=1)), 1, 1)
        fig.add_trace(go.Scattergl(x=x, y=s["baseline_s"] * 1e3, mode="lines", name=f"baseline ms{tag}",
                                   line=dict(width=1, dash="dash")), 1, 1)
        fig.add_trace(go.Scattergl(x=x, y=s["prefill_tokens"], mode="markers", name=f"prefill tokens{tag}",
                                   marker=dict(size=4)), 2, 1)
        fig.add_trace(go.Scattergl(x=x, y=s["decode_rows"], mode="lines", name=f"decode rows{tag}"), 2, 1)
        if s["sm_active"].notna().any():
            fig.add_trace(go.Scattergl(x=x, y=s["sm_active"], mode="lines", name=f"SM active{tag}"), 3, 1)
        g = s["graph_mode"].map(GRAPH_LEVEL)
        if g.notna().any():
            fig.add_trace(go.Scattergl(x=x, y=g, mode="lines", line=dict(shape="hv"), name=f"graph mode{tag}"), 4, 1)
        for col, name in (("expert_imbalance", "expert imbalance"), ("preempted_reqs", "preempted"),):
            if s[col].notna().any():
                fig.add_trace(go.Scattergl(x=x, y=s[col], mode="lines", name=f"{name}{tag}"), 5, 1)
        if s["kv_transfer_s"].fillna(0).gt(0).any():
            fig.add_trace(go.Scattergl(x=x, y=s["kv_transfer_s"] * 1e3, mode="lines", name=f"KV wait ms{tag}"), 5, 1)
        if "gap_before_s" in s and s["gap_before_s"].notna().any():
            fig.add_trace(go.Scattergl(x=x, y=s["gap_before_s"] * 1e3, mode="lines", name=f"gap ms{tag}"), 5, 1)
    sp = spikes_table(d)
    for cause, g in sp.groupby("cause", sort=False):
        hover = [f"{i} step {int(s)}<br>{cause} ({c:.2f})<br>{h:.1f}x baseline<br>{html.escape(e)}"
                 for i, s, c, h, e in zip(g["instance"], g["step"], g["confidence"], g["height_x"], g["evidence_summary"])]
        fig.add_trace(go.Scattergl(x=g["t_s"] - t0, y=g["itl_s"] * 1e3, mode="markers", name=f"spike: {cause}",
                                   marker=dict(size=9, color=CAUSE_COLORS.get(cause, "#000"), symbol="diamond"),
                                   text=hover, hoverinfo="text"), 1, 1)
    _episode_bands(fig, d, t0)
    fig.update_yaxes(title_text="ms", row=1, col=1)
    fig.update_yaxes(title_text="tokens / rows", row=2, col=1)
    fig.update_yaxes(title_text="ratio", range=[0, 1.05], row=3, col=1)
    fig.update_yaxes(tickvals=[0, 1, 2], ticktext=["NONE", "PIECEWISE", "FULL"], range=[-0.3, 2.3], row=4, col=1)
    fig.update_xaxes(title_text="seconds since the first step", row=5, col=1)
    fig.update_layout(height=1100, template="plotly_white", legend=dict(orientation="v"),
                      margin=dict(l=60, r=20, t=40, b=40), hovermode="closest")
    return fig


def _episode_bands(fig: go.Figure, d, t0: float) -> None:
    """Each episode as a band over every panel (one shape on the shared x-axis, paper-high), coloured by
    cause, and one marker per episode at its median latency whose hover says what the band is."""
    reg = getattr(d, "regimes", None)
    eps = reg.episodes if reg is not None else None
    if eps is None or not len(eps):
        return
    eps = eps.sort_values("excess_s", ascending=False, kind="stable").head(MAX_BANDS)
    for r in eps.itertuples(index=False):
        fig.add_shape(type="rect", xref="x", yref="paper", x0=r.t_start_s - t0, x1=r.t_end_s - t0, y0=0, y1=1,
                      fillcolor=color(r.cause), opacity=0.12, line_width=0, layer="below")
    for cause, g in eps.groupby("cause", sort=True):
        hover = [f"episode {i} [{html.escape(str(inst))}]<br>{html.escape(episode_label(c, sh))}<br>"
                 f"{rows} rows, {ratio:.2f}x reference {ms(ref)}<br>{ex:.3f} token-s over reference"
                 + (f"<br>{html.escape(w)}" if w else "")
                 for i, inst, c, sh, rows, ratio, ref, ex, w in zip(
                     g["episode"], g["instance"], g["cause"], g["shares"], g["rows"], g["ratio"], g["reference_s"],
                     g["excess_s"], g["why"])]
        fig.add_trace(go.Scattergl(x=(g["t_start_s"] + g["t_end_s"]) / 2 - t0, y=g["median_latency_s"] * 1e3,
                                   mode="markers", name=f"episode: {cause}", text=hover, hoverinfo="text",
                                   marker=dict(size=11, color=color(cause), symbol="square-open", line=dict(width=2))),
                      1, 1)


def regimes_html(d, top: int = 50) -> str:
    """The regimes section: saturation, excess over the healthy reference by cause (token-seconds and
    share), the top ``top`` episodes by excess. Empty when there is none of these."""
    reg = getattr(d, "regimes", None)
    sat, rows = saturation_lines(reg), excess_rows(reg)
    eps = reg.episodes if reg is not None else None
    n_eps = 0 if eps is None else len(eps)
    if not sat and not rows and not n_eps:
        return ""
    parts = ["<h2>Regimes: sustained episodes and excess by cause</h2>"]
    parts += [f"<p><b>{html.escape(line)}</b></p>" for line in sat]
    if rows:
        body = "".join(f"<tr><td style='color:{color(c)}'><b>{c}</b></td><td>{v:.3f}</td><td>{sh:.0%}</td></tr>"
                       for c, v, sh in rows)
        parts.append("<p>Latency over each instance's healthy reference, split across causes by the evidence of each "
                     "row (token-seconds: seconds summed over every decode token that waited).</p>"
                     f"<table><tr><th>cause</th><th>token-seconds</th><th>share</th></tr>{body}</table>")
    if n_eps:
        t0 = float(d.steps["t_start_s"].min()) if len(d.steps) else 0.0
        shown = eps.sort_values("excess_s", ascending=False, kind="stable").head(top)
        body = "".join(
            f"<tr><td>{html.escape(str(r.instance))}</td><td>{r.t_start_s - t0:.3f}</td><td>{r.t_end_s - t0:.3f}</td>"
            f"<td>{int(r.rows)}</td><td>{ms(r.reference_s, unit='')}</td><td>{r.ratio:.2f}x</td><td>{r.excess_s:.3f}</td>"
            f"<td style='color:{color(r.cause)}'><b>{html.escape(episode_label(r.cause, r.shares))}</b></td>"
            f"<td>{html.escape(r.why or '')}</td></tr>" for r in shown.itertuples(index=False))
        more = f"<p>... and {n_eps - len(shown)} more episode(s) (analyze --json lists all).</p>" if n_eps > len(shown) else ""
        parts.append(f"<p>{n_eps} sustained episode(s) of elevated latency (shaded on the figure below), by excess:</p>"
                     "<table><tr><th>instance</th><th>start (s)</th><th>end (s)</th><th>rows</th><th>reference (ms)</th>"
                     "<th>ratio</th><th>token-seconds</th><th>cause (share)</th><th>why unknown</th></tr>"
                     f"{body}</table>{more}")
    else:
        parts.append("<p>No sustained episode of elevated latency.</p>")
    return "".join(parts)


def _table(sp: pd.DataFrame, t0: float) -> str:
    head = ("<tr><th>instance</th><th>step</th><th>t (s)</th><th>ITL (ms)</th><th>baseline (ms)</th>"
            "<th>measured height</th><th>predicted height</th><th>cause</th><th>confidence</th><th>evidence</th>"
            "<th>missing signals</th></tr>")
    rows = []
    for r in sp.itertuples(index=False):
        pred = "-" if not np.isfinite(r.predicted_height_x) else f"{r.predicted_height_x:.1f}x"
        rows.append(f"<tr><td>{html.escape(str(r.instance))}</td><td>{int(r.step)}</td><td>{r.t_s - t0:.3f}</td>"
                    f"<td>{ms(r.itl_s, unit='')}</td><td>{ms(r.baseline_s, unit='')}</td><td>{r.height_x:.1f}x</td>"
                    f"<td>{pred}</td><td style='color:{CAUSE_COLORS.get(r.cause, '#000')}'><b>{r.cause}</b></td>"
                    f"<td>{r.confidence:.2f}</td><td>{html.escape(r.evidence_summary)}</td>"
                    f"<td>{html.escape(', '.join(r.missing_signals))}</td></tr>")
    return f"<table>{head}{''.join(rows)}</table>"


def budget_html(d) -> str:
    """The budget section: per instance, excess token-time and P99 without each cause."""
    b = getattr(d, "budget", None)
    parts = []
    for inst, ib in (b.instances.items() if b is not None else ()):
        if not ib.n_units:
            continue
        rows = "".join(
            f"<tr><td style='color:{CAUSE_COLORS.get(c, '#7F7F7F')}'><b>{c}</b></td><td>{cb.spikes}</td>"
            f"<td>{cb.excess_s:.3f}</td><td>{cb.share_of_excess:.0%}</td><td>{cb.tail_share:.0%}</td>"
            f"<td>{ms(cb.p99_without_s, unit='')}</td><td>{ms(cb.p99_reduction_s, unit='')}</td></tr>"
            for c, cb in ib.by_cause.items() if cb.spikes or cb.excess_s > 0)
        parts.append(
            f"<p><b>{html.escape(inst)}</b>: {ib.n_units} {ib.source.replace('_', ' ')}, baseline {ms(ib.baseline_s, unit='')} ms, "
            f"P99 {ms(ib.p99_s, unit='')} ms (every excess removed: {ms(ib.p99_floor_s, unit='')} ms), excess token-time "
            f"{ib.excess_s:.3f} s</p><table><tr><th>cause</th><th>spikes</th><th>excess (s)</th><th>share</th>"
            f"<th>tail share</th><th>P99 without (ms)</th><th>P99 reduction (ms)</th></tr>{rows}</table>")
    return "".join(parts) or "<p>No latency units to budget.</p>"


def write_html(d, path: str | Path, *, model: LedgerModel, device: DeviceModel, context_len: int = 4096,
               top: int = 50, title: str = "mixdiag analyze", breakdown=None) -> Path:
    """Write the report to ``path`` (refuses to overwrite an existing file); ``breakdown``: the device
    breakdown (:func:`mixdiag.diagnosis.breakdown.breakdown`) shown in a section of its own."""
    p = Path(path)
    if p.exists():
        raise FileExistsError(f"{p} exists; choose another path (mixdiag never overwrites your files)")
    sp = spikes_table(d)
    sp["predicted_height_x"] = (pd.Series([predicted_height(ev, model, device, context_len) for ev in sp["evidence"]],
                                          index=sp.index, dtype="float64") if len(sp) else pd.Series(dtype=float))
    top_sp = sp.sort_values("height_x", ascending=False, kind="stable").head(top)
    t0 = float(d.steps["t_start_s"].min()) if len(d.steps) else 0.0
    by_cause = "".join(f"<tr><td style='color:{CAUSE_COLORS[c]}'>{c}</td><td>{n}</td></tr>"
                       for c, n in d.by_cause.items() if n)
    regimes = regimes_html(d, top)
    regimes += "\n" if regimes else ""  # nothing regime-related: the page reads as it did before regimes
    fig_div = figure(d).to_html(full_html=False, include_plotlyjs=False, div_id="signals")
    itl = d.itl
    body = f"""<p>ITL ({html.escape(str(itl.get('source')))}): p50 {ms(itl.get('p50_s'))}, p99 {ms(itl.get('p99_s'))},
max {ms(itl.get('max_s'))}</p>
<h2>Spikes by cause</h2><table><tr><th>cause</th><th>spikes</th></tr>{by_cause}</table>
<h2>ITL excess budget by cause</h2>
<p>Every inter-token gap's latency above its baseline, charged to the cause of the step it waited on
(<i>none</i>: steps that did not spike); "P99 without" removes that cause's excess and recomputes P99.</p>
{budget_html(d)}
{regimes}<h2>Four signals on one time axis</h2>{fig_div}
<h2>Top spikes: measured vs predicted height</h2>
<p>Predicted height: the shape ledger's bytes and FLOPs for the spike step's batch shape (prefill tokens,
decode rows, context {context_len}) on model <b>{html.escape(model.name)}</b> and device
<b>{html.escape(device.name)}</b> (roofline, mixdiag.ledger.device_model): how tall a spike that shape would make on
that deployment if the prefill chunk were the cause. Steps without prefill tokens have no prediction.</p>
{_table(top_sp, t0)}
{breakdown_html(breakdown) if breakdown is not None else ''}"""
    p.write_text(page(title, d.verdict, body), encoding="utf-8")
    return p
