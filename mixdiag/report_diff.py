"""``mixdiag diff``'s outputs: the text report, the ``--json`` document and the ``--html`` page, all read
off one :class:`~mixdiag.diagnosis.diff.Diff` (nothing is recomputed here).

The headline says what moved and which cause moved it, e.g. "P99 ITL 401 -> 120 ms (down); the
spikes' excess 75.5 -> 20.1 s (down, -73 %): mixing's 29.0 -> 1.2 s (-96 %), 50 % of the fall"; and
"no change" when nothing moved beyond noise, with the noise basis.
"""
from __future__ import annotations

import html
import math
from pathlib import Path

import pandas as pd

from mixdiag.causes import CAUSE_COLORS
from mixdiag.diagnosis.diff.compare import NOISE_BASIS, CauseMove, Diff, finite
from mixdiag.fmt import duration
from mixdiag.html_page import page

_LABEL = {"itl_p50_s": "P50 ITL", "itl_p99_s": "P99 ITL", "ttft_p50_s": "P50 TTFT", "ttft_p99_s": "P99 TTFT"}
_TABLE_WORDS = {"budget": "the spikes' excess (budget)", "regimes": "the excess over the healthy reference (regimes)"}


def _s(v) -> str:
    return f"{v:.1f} s" if finite(v) else "-"


def _pct(v) -> str:
    return f"{v:+.0f} %" if finite(v) else "-"


def _cause_sentence(m: CauseMove) -> str:
    word = "fall" if m.total_after_s < m.total_before_s else "rise"
    total = {"up": "up", "down": "down", "no change": "within noise"}.get(m.total_verdict, "no noise estimate")
    own = {"up": "up", "down": "down", "no change": "within noise"}.get(m.verdict, "no noise estimate")
    words = _TABLE_WORDS[m.table]
    return (f"{words[0].upper()}{words[1:]} {_s(m.total_before_s)} -> {_s(m.total_after_s)} ({total}): "
            f"{m.cause}'s {_s(m.before_s)} -> {_s(m.after_s)} ({_pct(m.change_pct)}, {own}), "
            f"{100 * m.share:.0f} % of the {word}")


def headline(d: Diff) -> str:
    """One paragraph: what moved (beyond noise) and which cause moved it, or 'no change'."""
    if not d.comparable:
        lead = "Not comparable (" + "; ".join(c for c in d.caveats if c.startswith("different")) + "). "
    else:
        lead = ""
    if not d.measurable:
        return lead + ("Nothing to compare: neither capture measures ITL, TTFT or excess (no token events, step "
                       "latencies or ITL histograms).")
    if d.no_change:
        return lead + ("No change: ITL, TTFT and every cause's excess are within noise "
                       f"({NOISE_BASIS.split(';')[0].removeprefix('noise: ')}).")
    parts = []
    for r in d.metrics.itertuples(index=False):
        if r.verdict in ("up", "down"):
            why = ""
            if r.metric == "itl_p99_s" and d.p99_moved_by is not None:
                m = d.p99_moved_by
                why = f"; {m.cause}'s part of it {duration(m.before_s)} -> {duration(m.after_s)}"
            parts.append(f"{_LABEL[r.metric]} {duration(r.before)} -> {duration(r.after)} ({r.verdict}{why})")
    unchanged = [_LABEL[r.metric] for r in d.metrics.itertuples(index=False) if r.verdict == "no change"]
    text = "; ".join(parts) + ("; " if parts else "")
    for m in (d.moved_by, d.moved_by_regimes):
        if m is not None:
            text += _cause_sentence(m) + ". "
    for table, m in (("budget", d.moved_by), ("regimes", d.moved_by_regimes)):
        if m is None:
            tot = (d.budget if table == "budget" else d.regimes).iloc[-1]
            text += (f"{_TABLE_WORDS[table][0].upper()}{_TABLE_WORDS[table][1:]}: {_s(tot.before_s)} -> "
                     f"{_s(tot.after_s)}, {tot.verdict}. ")
    if unchanged:
        text += f"No change in {', '.join(unchanged)}. "
    if d.normalised:
        text += "(AFTER's excess is scaled to BEFORE's stream-seconds: the captures differ in stream time.) "
    return lead + text.strip()


def _sides(d: Diff) -> list[str]:
    out = []
    for name, f in (("BEFORE", d.before), ("AFTER", d.after)):
        req = f"{f.requests:.0f} requests, " if finite(f.requests) else ""
        out.append(f"{name}: {', '.join(f.inputs) or '-'} - {', '.join(f.instances) or 'no server'}; ITL from "
                   f"{f.itl_source}; {f.duration_s:.1f} s, {req}{f.tokens:.0f} decode tokens, {f.stream_s:.1f} "
                   f"stream-s; TTFT from {f.ttft_source}")
    return out


def _cause_lines(t: pd.DataFrame, with_parts: bool) -> list[str]:
    head = f"  {'cause':16} {'spikes':>9} {'before':>9} {'after':>9} {'change':>7} {'verdict':>10} {'share':>6}"
    if with_parts:
        head += f" {'P99 part (ms)':>16}"
    lines = [head]
    for r in t.itertuples(index=False):
        if r.cause not in ("total",) and r.before_s == 0 and r.after_s == 0 and r.spikes_before == 0 and r.spikes_after == 0:
            continue
        share = f"{100 * r.share_of_change:.0f}%" if finite(r.share_of_change) else "-"
        line = (f"  {r.cause:16} {f'{r.spikes_before}->{r.spikes_after}':>9} {_s(r.before_s):>9} {_s(r.after_s):>9} "
                f"{_pct(r.change_pct):>7} {r.verdict:>10} {share:>6}")
        if with_parts and r.cause != "total":
            pb, pa = r.p99_part_before_s, r.p99_part_after_s
            line += f" {(f'{pb * 1e3:.0f}->{pa * 1e3:.0f}' if finite(pb) and finite(pa) else '-'):>16}"
        lines.append(line)
    return lines


def _prediction_lines(d: Diff) -> list[str]:
    p = d.prediction
    if p is None:
        return []
    out = [f"Tuned: {p.current} -> {p.recommendation} (mixdiag tune's prediction vs AFTER)"]
    for r in p.rows:
        out.append(f"  {_LABEL[r.metric]}: predicted {duration(r.predicted)}, AFTER measured {duration(r.measured)}, "
                   f"error {_pct(r.error_pct)}   (replay of {p.current}: {duration(r.current_predicted)} vs BEFORE's "
                   f"{duration(r.current_measured)}, {_pct(r.current_error_pct)})")
    out += [f"  note: {n}" for n in p.notes]
    return out


def _kernel_lines(d: Diff, top: int) -> list[str]:
    if d.kernels is None:
        return [f"Step-class kernel times: {d.kernels_note}"] if d.kernels_note else []
    out = ["Step-class kernel times (seconds summed over ranks; share of the class's kernel time):"]
    for cls, g in d.kernels.groupby("step_class", sort=True):
        for r in g.head(top).itertuples(index=False):
            out.append(f"  {cls:10} {r.kernel[:40]:40} {r.time_before_s:9.4f} -> {r.time_after_s:9.4f} s  "
                       f"share {100 * r.share_before:4.1f} -> {100 * r.share_after:4.1f} %  {r.status}")
    return out


def render(d: Diff, top: int = 5) -> str:
    """The human report."""
    lines = [headline(d), ""]
    lines += _sides(d)
    lines += [f"caveat: {c}" for c in d.caveats]
    lines += ["", f"  {'metric':10} {'before':>10} {'after':>10} {'change':>8} {'noise':>10} verdict"]
    for r in d.metrics.itertuples(index=False):
        lines.append(f"  {_LABEL[r.metric]:10} {duration(r.before):>10} {duration(r.after):>10} {_pct(r.change_pct):>8} "
                     f"{('±' + duration(r.noise)) if finite(r.noise) else '-':>10} {r.verdict}")
    lines += ["", "Excess of the spikes by cause (budget: token-time above baseline of spiking steps; none = "
              "latency under the spike threshold, no cause):"]
    lines += _cause_lines(d.budget, with_parts=True)
    lines += ["", "Excess over the healthy reference by cause (regime decomposition: every row's excess split by "
              "evidence):"]
    lines += _cause_lines(d.regimes, with_parts=False)
    if len(d.episodes):
        lines += ["", "Episodes by cause:"]
        lines += [f"  {r.cause:16} {r.episodes_before} -> {r.episodes_after} episodes, {_s(r.excess_before_s)} -> "
                  f"{_s(r.excess_after_s)}" for r in d.episodes.itertuples(index=False)]
    else:
        lines += ["", "Episodes: none on either side."]
    extra = _kernel_lines(d, top) + _prediction_lines(d)
    if extra:
        lines += [""] + extra
    lines += ["", f"({NOISE_BASIS}; share: of the change of the causes' total (budget: without none); "
              "excess compared per stream-second" + (", AFTER scaled to BEFORE's stream-seconds)" if d.normalised else ")")]
    return "\n".join(lines)


def _records(frame: pd.DataFrame | None) -> list[dict] | None:
    if frame is None:
        return None
    return [{k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in r.items()}
            for r in frame.to_dict(orient="records")]


def _side_json(f) -> dict:
    fig = {k: {"value": getattr(f, k).value, "noise": getattr(f, k).noise}
           for k in ("itl_p50_s", "itl_p99_s", "ttft_p50_s", "ttft_p99_s")}
    return {"inputs": list(f.inputs), "formats": list(f.formats), "instances": list(f.instances),
            "itl_source": f.itl_source, "budget_sources": list(f.budget_sources), "ttft_source": f.ttft_source,
            "duration_s": f.duration_s, "stream_s": f.stream_s, "tokens": f.tokens, "requests": f.requests, **fig,
            "verdict": f.verdict, "spikes": dict(f.spikes), "partial": list(f.partial)}


def diff_json(d: Diff) -> dict:
    """The ``mixdiag diff --json`` document (docs/diff.md)."""
    def move(m):
        return None if m is None else dict(vars(m))
    p = d.prediction
    return {"headline": headline(d), "comparable": d.comparable, "caveats": list(d.caveats),
            "normalised": d.normalised, "measurable": d.measurable, "no_change": d.no_change, "noise_basis": NOISE_BASIS,
            "before": _side_json(d.before), "after": _side_json(d.after),
            "metrics": _records(d.metrics), "budget": _records(d.budget), "regimes": _records(d.regimes),
            "episodes": _records(d.episodes), "moved_by": move(d.moved_by), "moved_by_regimes": move(d.moved_by_regimes),
            "p99_moved_by": move(d.p99_moved_by),
            "kernels": _records(d.kernels), "kernels_note": d.kernels_note,
            "prediction": None if p is None else {"recommendation": p.recommendation, "current": p.current,
                                                   "rows": [dict(vars(r)) for r in p.rows], "notes": list(p.notes)}}


def _html_table(frame: pd.DataFrame) -> str:
    return frame.to_html(index=False, escape=True, na_rep="-", float_format=lambda v: f"{v:.4g}", border=0)


def _figure(d: Diff):
    import plotly.graph_objects as go  # plotly only when a page is written

    t = d.budget[(d.budget["cause"] != "total") & ((d.budget["before_s"] > 0) | (d.budget["after_s"] > 0))]
    fig = go.Figure()
    for col, name in (("before_s", "before"), ("after_s", "after")):
        fig.add_bar(x=list(t["cause"]), y=list(t[col]), name=name,
                    marker_color=[CAUSE_COLORS.get(c, "#999") for c in t["cause"]],
                    marker_pattern_shape="" if name == "before" else "/")
    fig.update_layout(barmode="group", height=360, margin=dict(l=40, r=20, t=30, b=40),
                      yaxis_title="excess (stream-seconds)", title="Spike excess by cause, before vs after")
    return fig


def write_html(d: Diff, path: str | Path, title: str = "mixdiag diff") -> Path:
    """Write the page to ``path`` (refuses to overwrite an existing file)."""
    p = Path(path)
    if p.exists():
        raise FileExistsError(f"{p} exists; choose another path (mixdiag never overwrites your files)")
    div = _figure(d).to_html(full_html=False, include_plotlyjs=False, div_id="excess")
    sides = "".join(f"<li>{html.escape(s)}</li>" for s in _sides(d) + [f"caveat: {c}" for c in d.caveats])
    extra = "<br>".join(html.escape(x) for x in _kernel_lines(d, 10) + _prediction_lines(d))
    kernels = _html_table(d.kernels) if d.kernels is not None else ""
    body = f"""<ul>{sides}</ul>
<h2>Latency</h2>{_html_table(d.metrics)}
<h2>Excess of the spikes by cause (budget)</h2>{div}{_html_table(d.budget)}
<h2>Excess over the healthy reference by cause (regimes)</h2>{_html_table(d.regimes)}
<h2>Episodes</h2>{_html_table(d.episodes) if len(d.episodes) else '<p>None on either side.</p>'}
<h2>Kernels and prediction</h2><p>{extra or 'No tune document given.'}</p>{kernels}
<p><i>{html.escape(NOISE_BASIS)}</i></p>"""
    p.write_text(page(title, headline(d), body), encoding="utf-8")
    return p
