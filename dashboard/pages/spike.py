"""Spike page: one spike's cause, measured and predicted height, evidence and neighbouring steps.

Owns its page data (:func:`spike_detail`, the ledger's predicted height), its layout and its
callbacks. A spike clicked on the Timeline page arrives through the frame's ``app-spike-choice``;
with none clicked the page opens on the largest spike (:func:`largest_spike`), not on an empty page.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pandas as pd
from dash import Input, Output, State, dcc, html

from mixdiag.dashboard import figures
from mixdiag.dashboard.components import GRAPH_CONFIG, PAGE, table
from mixdiag.dashboard.page_data import SpikeDetail
from mixdiag.dashboard.store import DataStore
from mixdiag.fmt import duration

PATH = "/spike"
NAME = "Spike"
#: Steps shown on each side of a clicked spike.
NEIGHBOURS = 5
#: Spikes offered in the page's dropdown (largest first).
SPIKE_CHOICES = 300


@dataclass(frozen=True)
class LedgerChoice:
    """Which model and device the Spike page's ledger prediction assumes (``mixdiag ledger`` presets)."""

    preset: str = "glm-5.3"
    device: str = "h200"
    context_len: int = 4096  # decode context assumed, as `mixdiag analyze --context-len` defaults


def _prediction(evidence: dict) -> tuple[float, str | None]:
    """A predicted height (s) the diagnosis put in the evidence: the first numeric key naming a prediction."""
    for key in sorted(evidence, key=lambda k: (not str(k).startswith("ledger"), str(k))):
        k = str(key).lower()
        if ("predict" in k or k.startswith("ledger")) and k.endswith("_s"):
            try:
                v = float(evidence[key])
            except (TypeError, ValueError):
                continue
            if math.isfinite(v):
                return v, str(key)
    return math.nan, None


def ledger_height(evidence: dict, choice: "LedgerChoice") -> tuple[float, str]:
    """The shape ledger's predicted spike height (mixed / pure-decode step time) for a mixed step.

    The same computation as the HTML report (:func:`mixdiag.ledger.spike_height.predicted_height`)
    from the spike's evidence, so both show one number. Only a step holding a prefill chunk beside decode
    rows has a prediction: the ledger models what the chunk adds. Returns (NaN, reason) otherwise.
    """
    pre, rows = _num(evidence.get("prefill_tokens")), _num(evidence.get("decode_rows"))
    if not (math.isfinite(pre) and math.isfinite(rows)) or pre <= 0 or rows <= 0:
        return math.nan, "no ledger prediction: the step holds no prefill chunk beside decode rows"
    from mixdiag.ledger.device_model import device
    from mixdiag.ledger.shapes import resolve
    from mixdiag.ledger.spike_height import predicted_height

    h = float(predicted_height(evidence, resolve(choice.preset), device(choice.device), choice.context_len))
    reqs = _num(evidence.get("decode_reqs"))
    basis = (f"ledger: {choice.preset} on {choice.device}, {int(pre)}-token chunk beside "
             f"{int(reqs if math.isfinite(reqs) and reqs > 0 else rows)} decode requests, context "
             f"{choice.context_len} (a roofline model of that deployment, as in the HTML report)")
    return h, basis


def _num(v) -> float:
    try:
        return float(v)
    except (TypeError, ValueError):
        return math.nan


def _fmt(v) -> str:
    if isinstance(v, float):
        return f"{v:.6g}"
    if isinstance(v, (list, tuple)):
        return ", ".join(_fmt(x) for x in v)
    if isinstance(v, dict):
        return ", ".join(f"{k}={_fmt(x)}" for k, x in v.items())
    return str(v)


def spike_detail(diagnosis, instance: str, step: int, neighbours: int = NEIGHBOURS,
                 ledger: LedgerChoice | None = LedgerChoice()) -> SpikeDetail | None:
    """The spike of ``instance`` at ``step``, its evidence, its neighbouring steps and its predicted height.

    The prediction is the diagnosis' own when its evidence carries one; else, for a mixed
    step, the shape ledger's (``ledger`` chooses model and device; None: no prediction).
    None when there is no such spike.
    """
    sp = diagnosis.spikes
    if sp is None or not len(sp):
        return None
    hit = sp[(sp["instance"] == instance) & (sp["step"] == int(step))]
    if not len(hit):
        return None
    row = hit.iloc[0]
    evidence = row["evidence"] if isinstance(row.get("evidence"), dict) else {}
    missing = row.get("missing_signals")
    missing = tuple(str(m) for m in missing) if isinstance(missing, (list, tuple, np.ndarray)) else ()
    ev = pd.DataFrame({"key": [str(k) for k in evidence], "value": [_fmt(v) for v in evidence.values()]},
                      columns=["key", "value"])
    st = diagnosis.steps
    st = st[st["instance"] == instance].sort_values("step")
    pos = int(np.searchsorted(st["step"].to_numpy(), int(step)))
    neigh = st.iloc[max(pos - neighbours, 0): pos + neighbours + 1].reset_index(drop=True)
    measured, base = float(row["itl_s"]), _num(row.get("baseline_s"))
    measured_x = measured / base if math.isfinite(base) and base > 0 else math.nan
    predicted, key = _prediction(evidence)
    predicted_x, basis = math.nan, ""
    if key is not None:
        predicted_x = predicted / base if math.isfinite(base) and base > 0 else math.nan
        basis = f"diagnosis evidence '{key}'"
    elif ledger is not None:
        predicted_x, basis = ledger_height(evidence, ledger)
        if math.isfinite(predicted_x) and math.isfinite(base):
            predicted, key = predicted_x * base, "ledger"
    spike = {k: row[k] for k in ("instance", "step", "t_s", "itl_s", "baseline_s", "cause", "confidence")
             if k in row.index}
    spike["step"] = int(spike["step"])
    return SpikeDetail(spike=spike, evidence=ev, missing_signals=missing, neighbours=neigh, measured_s=measured,
                       predicted_s=predicted, predicted_key=key, measured_x=measured_x, predicted_x=predicted_x,
                       prediction_basis=basis)


def layout(**_query) -> html.Div:
    return html.Div([
        html.Div([html.Label("spike ", htmlFor="spike-choice"),
                  dcc.Dropdown(id="spike-choice", placeholder="click a spike on the Timeline page, or pick one",
                               style={"width": "520px", "display": "inline-block", "verticalAlign": "middle"})]),
        html.Div(id="spike-summary", style={"margin": "10px 0"}),
        dcc.Graph(id="spike-graph", config=GRAPH_CONFIG),
        html.H4("Evidence"), html.Div(id="spike-evidence"),
        html.H4("Neighbouring steps"), html.Div(id="spike-neighbours", style={"overflowX": "auto"}),
        html.H4("Device breakdown: spike steps beside the step's own kind"),
        html.Div(id="spike-breakdown", style={"overflowX": "auto"}),
    ], style=PAGE)


def _by_size(sp: pd.DataFrame) -> pd.DataFrame:
    """Spikes largest first: by ITL excess over their baseline, so an instance whose every step is
    slow does not outrank a real spike elsewhere; ITL itself where no baseline is known; then by ITL."""
    itl = pd.to_numeric(sp["itl_s"], errors="coerce")
    base = pd.to_numeric(sp["baseline_s"], errors="coerce")
    excess = (itl - base).where(np.isfinite(base), itl)
    order = np.lexsort((-itl.fillna(-np.inf).to_numpy(), -excess.fillna(-np.inf).to_numpy()))
    return sp.iloc[order]


def spike_options(ds) -> list[dict]:
    """The dropdown's spikes of ``ds``, largest first (ITL excess over baseline)."""
    sp = ds.diagnosis.spikes
    if sp is None or not len(sp):
        return []
    top = _by_size(sp).head(SPIKE_CHOICES)
    return [{"label": f"{r.instance} step {int(r.step)}: {r.cause}, ITL {duration(float(r.itl_s))}",
             "value": f"{r.instance}|{int(r.step)}"} for r in top.itertuples(index=False)]


def largest_spike(diagnosis) -> str | None:
    """'instance|step' of the largest spike (the first dropdown option), or None without spikes."""
    sp = diagnosis.spikes
    if sp is None or not len(sp):
        return None
    r = _by_size(sp).iloc[0]
    return f"{r['instance']}|{int(r['step'])}"


def on_choices(store: DataStore, key: dict | None, clicked: dict | None):
    """Dropdown options and value: the spike clicked on the Timeline when it belongs to this dataset,
    else the largest spike (a page that opens empty tells the user nothing)."""
    ds = store.get(key["id"]) if key else None
    if ds is None:
        return [], None
    if isinstance(clicked, dict) and clicked.get("key") == key:
        return spike_options(ds), clicked["spike"]
    return spike_options(ds), largest_spike(ds.diagnosis)


def on_spike(store: DataStore, key: dict | None, choice: str | None, ledger: LedgerChoice | None = LedgerChoice()):
    """The Spike page for ``choice`` ('instance|step')."""
    ds = store.get(key["id"]) if key else None
    if ds is None or not choice or "|" not in choice:
        return (html.Div("Click a spike marker on the Timeline page (or pick one above) to see its evidence."),
                figures.empty_figure(), "", "")
    inst, step = choice.rsplit("|", 1)
    d = spike_detail(ds.diagnosis, inst, int(step), ledger=ledger)
    if d is None:
        return html.Div(f"no spike at {inst} step {step}"), figures.empty_figure(), "", ""
    s = d.spike
    conf = s.get("confidence")
    mx = f" ({d.measured_x:.1f}x baseline)" if d.measured_x == d.measured_x else ""
    if d.predicted_key is not None and d.predicted_x == d.predicted_x:
        pred = f"{duration(d.predicted_s)} ({d.predicted_x:.1f}x baseline)"
    elif d.predicted_key is not None:
        pred = duration(d.predicted_s)
    else:
        pred = "none"
    summary = html.Div([
        html.Div([html.B(f"{s['cause']}"), f" at {s['instance']} step {s['step']}",
                  f", confidence {float(conf):.2f}" if conf is not None else ""], id="spike-cause"),
        html.Div(f"measured ITL {duration(d.measured_s)}{mx}; baseline "
                 f"{duration(float(s.get('baseline_s', float('nan'))))}; predicted height {pred}",
                 id="spike-heights"),
        html.Div(d.prediction_basis, style={"color": "#666", "fontSize": "12px"}),
        html.Div(f"signals missing from the source: {', '.join(d.missing_signals)}" if d.missing_signals
                 else "no signal missing", style={"color": "#666", "fontSize": "12px"}),
    ])
    cols = [c for c in ("step", "kind", "t_start_s", "t_end_s", "prefill_tokens", "decode_rows", "graph_mode",
                        "sm_active", "expert_imbalance", "kv_transfer_s", "preempted_reqs", "gap_before_s", "host_pause_s",
                        "itl_max_s", "is_spike", "cause") if c in d.neighbours.columns]
    neigh = d.neighbours[cols]
    return (summary, figures.spike_figure(d), table(d.evidence, id="spike-evidence-table"),
            table(pd.DataFrame(neigh), id="spike-neighbours-table"))


def breakdown_detail(bd, instance: str, step: int, kind: str):
    """Page data of the breakdown panel: (utilisation rows, kernel rows, straggler rows) of ``instance``
    for the classes ``spike`` and the step's ``kind`` (utilisation also ``all``; kernels of ``all`` when
    neither class has rows), and the stragglers of ``step``."""
    classes = ["spike", kind, "all"]
    u = bd.utilisation[(bd.utilisation["instance"] == instance) & bd.utilisation["step_class"].isin(classes)]
    mine = bd.kernels[bd.kernels["instance"] == instance]
    k = mine[mine["step_class"].isin(classes[:2])]
    k = k if len(k) else mine[mine["step_class"] == "all"]  # neither class has steps here: the whole capture
    s = bd.stragglers[(bd.stragglers["step"] == int(step)) & (bd.stragglers["instance"] == instance)] \
        if len(bd.stragglers) else bd.stragglers
    return u, k, s


def on_breakdown(store: DataStore, key: dict | None, choice: str | None):
    """The device-breakdown panel for ``choice`` ('instance|step')."""
    ds = store.get(key["id"]) if key else None
    if ds is None or not choice or "|" not in choice:
        return ""
    bd = ds.breakdown()
    if not bd.has_device_activity:
        return html.Div(bd.notes[0] if bd.notes else "no device activity", id="spike-breakdown-none")
    inst, step = choice.rsplit("|", 1)
    st = ds.diagnosis.steps
    row = st[(st["instance"] == inst) & (st["step"] == int(step))]
    kind = str(row["kind"].iloc[0]) if len(row) else "unknown"
    u, k, s = breakdown_detail(bd, inst, int(step), kind)
    from mixdiag.report_breakdown import straggler_sentence

    parts = [table(u.drop(columns=["instance"]), id="spike-breakdown-table")]
    for rank, g in k.groupby("rank", sort=True):
        parts.append(dcc.Graph(figure=figures.kernel_share_figure(g, f"top kernels, rank {rank}"), config=GRAPH_CONFIG))
    parts += [html.Div(straggler_sentence(r), className="spike-straggler") for r in s.itertuples(index=False)]
    parts += [html.Div(n, style={"color": "#666", "fontSize": "12px"}) for n in bd.notes]
    return html.Div(parts)


def register(app, store: DataStore, live=None) -> None:
    """Bind the Spike page's callbacks to ``app``."""
    ledger = LedgerChoice(store.config.ledger_preset, store.config.ledger_device)

    @app.callback(Output("spike-choice", "options"), Output("spike-choice", "value"),
                  Input("app-dataset-key", "data"), State("app-spike-choice", "data"))
    def _choices(key, clicked):
        return on_choices(store, key, clicked)

    @app.callback(Output("spike-summary", "children"), Output("spike-graph", "figure"),
                  Output("spike-evidence", "children"), Output("spike-neighbours", "children"),
                  Input("spike-choice", "value"), State("app-dataset-key", "data"))
    def _spike(choice, key):
        return on_spike(store, key, choice, ledger)

    @app.callback(Output("spike-breakdown", "children"), Input("spike-choice", "value"),
                  State("app-dataset-key", "data"))
    def _breakdown(choice, key):
        return on_breakdown(store, key, choice)
