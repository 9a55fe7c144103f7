"""The tuning plot: the frontier figure (shared with the dashboard's Tune page) and ``tune --html``
(a self-contained page in the shell of :mod:`mixdiag.html_page`, like ``analyze --html``)."""
from __future__ import annotations

import html
from pathlib import Path

from mixdiag.fmt import ms
from mixdiag.html_page import page


def frontier_figure(result: dict):
    """P99 TTFT vs P99 ITL of every setting (marker size ~ throughput); frontier joined, current and
    recommended marked, SLOs as dashed lines. Pure: a plotly Figure from ``sweep.run``'s result."""
    import plotly.graph_objects as go

    rows = result["settings"]
    front = [r for r in rows if r["pareto"]]
    front.sort(key=lambda r: r["itl_p99_s"])
    tp = [r["throughput_tok_s"] for r in rows]
    top = max(tp) if tp else 1.0
    fig = go.Figure()
    fig.add_trace(go.Scatter(
        x=[r["itl_p99_s"] * 1e3 for r in rows], y=[r["ttft_p99_s"] for r in rows], mode="markers+text",
        text=[r["label"] for r in rows], textposition="top center", name="settings",
        marker=dict(size=[8 + 14 * (r["throughput_tok_s"] / top) for r in rows], color="#8888aa"),
        customdata=[[r["throughput_tok_s"]] for r in rows],
        hovertemplate="%{text}<br>P99 ITL %{x:.1f} ms<br>P99 TTFT %{y:.2f} s<br>%{customdata[0]:.0f} tok/s"))
    fig.add_trace(go.Scatter(x=[r["itl_p99_s"] * 1e3 for r in front], y=[r["ttft_p99_s"] for r in front],
                             mode="lines", name="Pareto frontier", line=dict(color="#1f77b4")))
    for key, name, color, sym in (("current", "current", "#d62728", "x"), ("recommended", "recommended", "#2ca02c", "star")):
        r = result.get(key)
        if r:
            fig.add_trace(go.Scatter(x=[r["itl_p99_s"] * 1e3], y=[r["ttft_p99_s"]], mode="markers", name=name,
                                     marker=dict(size=16, color=color, symbol=sym)))
    slo = result.get("slo") or {}
    if slo.get("itl_p99_s"):
        fig.add_vline(x=slo["itl_p99_s"] * 1e3, line_dash="dash", annotation_text="ITL SLO")
    if slo.get("ttft_p99_s"):
        fig.add_hline(y=slo["ttft_p99_s"], line_dash="dash", annotation_text="TTFT SLO")
    fig.update_layout(template="plotly_white", height=520, xaxis_title="predicted P99 ITL (ms)",
                      yaxis_title="predicted P99 TTFT (s)", title="Knob sweep: P99 ITL vs P99 TTFT (size = throughput)")
    return fig


def write_html(result: dict, path: str | Path, title: str = "mixdiag tune") -> Path:
    """Write the tuning report to ``path`` (refuses to overwrite)."""
    p = Path(path)
    if p.exists():
        raise FileExistsError(f"{p} exists; choose another path (mixdiag never overwrites your files)")
    div = frontier_figure(result).to_html(full_html=False, include_plotlyjs=False, div_id="frontier")
    sec = lambda v: "-" if v is None else f"{v:.2f} s"  # noqa: E731
    rows = "".join(
        f"<tr><td>{html.escape(r['label'])}</td><td>{ms(r['itl_p99_s'])}</td><td>{sec(r['ttft_p99_s'])}</td>"
        f"<td>{r['throughput_tok_s']:.0f}</td><td>{'yes' if r['pareto'] else ''}</td>"
        f"<td>{'current' if r['current'] else ''}</td></tr>" for r in result["settings"])
    cm = result["cost_model"]
    fit = (f"fitted on {cm['steps']} steps, R² {cm['r2']:.3f}, held-out MAPE {100 * cm['mape_heldout']:.1f} %, "
           f"context {cm['context']}, a chunk's own attention counted {cm['triangle']:g} x k²"
           if cm["kind"] == "fitted" else html.escape(cm["note"]))
    notes = "".join(f"<li>{html.escape(n)}</li>" for n in result["notes"])
    body = f"""<p>Workload: {result['workload']['requests']} requests over {result['workload']['span_s']:.0f} s from
{html.escape(result['workload']['source'])} (quality: {html.escape(str(result['workload']['quality']))}).
Step-cost model: {fit}.</p>
{div}
<table><tr><th>setting</th><th>P99 ITL</th><th>P99 TTFT</th><th>tok/s</th><th>frontier</th><th></th></tr>{rows}</table>
<ul>{notes}</ul>"""
    p.write_text(page(title, headline(result), body), encoding="utf-8")
    return p


def headline(result: dict) -> str:
    """One sentence: the recommendation and its predicted change, or why there is none."""
    ch = result.get("predicted_change")
    if result["recommendation"] is None or ch is None:
        return f"No recommendation: {result['reason']}."
    i, t = ch["itl_p99_s"], ch["ttft_p99_s"]
    return (f"Set {result['recommendation']}: P99 ITL {ms(i['current'], 0)} -> {ms(i['recommended'], 0)}, "
            f"P99 TTFT {t['current']:.2f} s -> {t['recommended']:.2f} s, throughput "
            f"{ch['throughput_tok_s']['current']:.0f} -> {ch['throughput_tok_s']['recommended']:.0f} tok/s "
            f"({result['reason']}).")
