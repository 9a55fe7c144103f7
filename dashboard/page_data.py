"""Per-page data, prepared once per loaded dataset and instance (compute, not rendering).

:func:`timeline_view` turns a Timeline and its diagnosis into sorted numpy arrays the Timeline
page downsamples on every zoom; :func:`spike_detail` gathers what the Spike page shows.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pandas as pd

from mixdiag.schema import Timeline

#: Steps shown on each side of a clicked spike.
NEIGHBOURS = 5
#: Step columns the Timeline page draws (all on the steps frame of the contract).
STEP_PANEL_COLUMNS = ("step", "t_start_s", "t_end_s", "kind", "prefill_tokens", "decode_rows", "sm_active",
                      "graph_mode", "expert_imbalance", "kv_transfer_bytes", "kv_transfer_s")


@dataclass(frozen=True)
class TimelineView:
    """One instance's panels on a relative clock (seconds since ``t0_s``), sorted by time."""

    instance: str
    t0_s: float
    itl: pd.DataFrame      # t_rel_s, itl_s  (per output event, or per interval for coarse sources)
    itl_label: str         # what the ITL panel shows, for its axis title
    spikes: pd.DataFrame   # t_rel_s, itl_s, cause, confidence, instance, step
    steps: pd.DataFrame    # t_rel_s plus STEP_PANEL_COLUMNS
    sm_quality: str        # measured | estimated | inferred | absent | unlabelled
    has_expert: bool
    has_kv: bool

    @property
    def x_extent(self) -> tuple[float, float]:
        """Full x-range of the data (relative seconds)."""
        xs = [f["t_rel_s"] for f in (self.itl, self.spikes, self.steps) if len(f)]
        if not xs:
            return 0.0, 1.0
        return float(min(x.min() for x in xs)), float(max(x.max() for x in xs))


def default_instance(timeline: Timeline, diagnosis) -> str | None:
    """The instance with most spikes (first alphabetically on a tie), or the first instance."""
    insts = timeline.instances
    if not insts:
        return None
    sp = diagnosis.spikes
    if sp is not None and len(sp):
        counts = sp["instance"].value_counts()
        best = counts.max()
        return sorted(i for i, n in counts.items() if n == best)[0]
    return insts[0]


def timeline_view(timeline: Timeline, diagnosis, instance: str) -> TimelineView:
    """The Timeline page's data for ``instance``.

    ITL comes from the tokens frame (one point per output event, ``itl_s``); sources without
    tokens fall back to the interval ``itl_p99_s`` column. Spike markers come from the
    diagnosis (their measured ``itl_s``), steps from the diagnosis' steps frame.
    """
    span = timeline.span()
    t0 = span[0] if span else 0.0
    itl = pd.DataFrame({"t_rel_s": pd.Series([], dtype="float64"), "itl_s": pd.Series([], dtype="float64")})
    label = "ITL (s)"
    if (timeline.tokens["instance"] == instance).any():
        it = timeline.itl()  # already validated and sorted: no second Timeline to build
        it = it[it["instance"] == instance]
        itl = pd.DataFrame({"t_rel_s": it["t_s"].to_numpy() - t0, "itl_s": it["itl_s"].to_numpy()})
        label = "ITL per output (s)"
    else:
        st = timeline.steps[timeline.steps["instance"] == instance]
        for col in ("itl_p99_s", "itl_mean_s"):
            if st[col].notna().any():
                itl = pd.DataFrame({"t_rel_s": st["t_end_s"].to_numpy() - t0, "itl_s": st[col].to_numpy()})
                label = f"ITL {col[4:-2].upper()} per interval (s)"
                break
    itl = itl.dropna().sort_values("t_rel_s", kind="stable").reset_index(drop=True)

    sp = diagnosis.spikes
    if sp is not None and len(sp):
        sp = sp[sp["instance"] == instance]
    if sp is None or not len(sp):
        spikes = pd.DataFrame({"t_rel_s": pd.Series([], dtype="float64"), "itl_s": pd.Series([], dtype="float64"),
                               "cause": pd.Series([], dtype=object), "confidence": pd.Series([], dtype="float64"),
                               "instance": pd.Series([], dtype=object), "step": pd.Series([], dtype="int64")})
    else:
        spikes = pd.DataFrame({"t_rel_s": sp["t_s"].to_numpy(dtype="float64") - t0,
                               "itl_s": sp["itl_s"].to_numpy(dtype="float64"),
                               "cause": sp["cause"].astype(str).to_numpy(),
                               "confidence": pd.to_numeric(sp["confidence"], errors="coerce").to_numpy(),
                               "instance": sp["instance"].astype(str).to_numpy(),
                               "step": sp["step"].astype("int64").to_numpy()})
        spikes = spikes.sort_values("t_rel_s", kind="stable").reset_index(drop=True)

    base = diagnosis.steps if getattr(diagnosis, "steps", None) is not None else timeline.steps
    st = base[base["instance"] == instance]
    steps = st[list(STEP_PANEL_COLUMNS)].copy()
    steps.insert(0, "t_rel_s", st["t_start_s"].to_numpy(dtype="float64") - t0)
    steps = steps.sort_values("t_rel_s", kind="stable").reset_index(drop=True)

    quality = timeline.signal_quality(instance, "sm_active")
    if quality == "absent" and steps["sm_active"].notna().any():
        quality = "unlabelled"
    return TimelineView(instance=instance, t0_s=float(t0), itl=itl, itl_label=label, spikes=spikes, steps=steps,
                        sm_quality=quality, has_expert=bool(steps["expert_imbalance"].notna().any()),
                        has_kv=bool((steps["kv_transfer_bytes"].fillna(0) > 0).any()
                                    or (steps["kv_transfer_s"].fillna(0) > 0).any()))


@dataclass(frozen=True)
class LedgerChoice:
    """Which model and device the Spike page's ledger prediction assumes (``mixdiag ledger`` presets)."""

    preset: str = "glm-5.3"
    device: str = "h200"
    context_len: int = 4096  # decode context assumed, as `mixdiag analyze --context-len` defaults


@dataclass(frozen=True)
class SpikeDetail:
    """What the Spike page shows for one spike."""

    spike: dict                # instance, step, t_s, itl_s, baseline_s, cause, confidence
    evidence: pd.DataFrame     # key, value (strings, in the diagnosis' order)
    missing_signals: tuple[str, ...]
    neighbours: pd.DataFrame   # the steps around the spike (diagnosis steps columns)
    measured_s: float
    predicted_s: float         # the predicted height in seconds, NaN when there is no prediction
    predicted_key: str | None  # where the prediction came from: an evidence key, or "ledger"
    measured_x: float = math.nan   # measured height / baseline
    predicted_x: float = math.nan  # predicted height / baseline (mixed over pure-decode step time)
    prediction_basis: str = ""     # one line: what the prediction assumes, or why there is none


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

    The same computation as the HTML report (``report_html.predicted_heights``) from the
    spike's evidence, so both show one number. Only a step holding a prefill chunk beside decode
    rows has a prediction: the ledger models what the chunk adds. Returns (NaN, reason) otherwise.
    """
    pre, rows = _num(evidence.get("prefill_tokens")), _num(evidence.get("decode_rows"))
    if not (math.isfinite(pre) and math.isfinite(rows)) or pre <= 0 or rows <= 0:
        return math.nan, "no ledger prediction: the step holds no prefill chunk beside decode rows"
    from mixdiag.ledger.device_model import device
    from mixdiag.ledger.shapes import resolve
    from mixdiag.report_html import predicted_heights

    one = pd.DataFrame({"evidence": [evidence]})
    h = float(predicted_heights(one, resolve(choice.preset), device(choice.device), choice.context_len).iloc[0])
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
