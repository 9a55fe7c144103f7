"""``mixdiag tune``'s prediction against what AFTER measured.

The tune document (``mixdiag tune --json`` or ``--save FILE``; docs/tune.md) holds, for the capture it
was made on (BEFORE), the replay of the current setting (``current``), the input's own P99s
(``measured_current``) and the recommended setting's predicted P99 ITL / TTFT (``recommended``). The
check: predicted vs AFTER's measured P99 ITL and TTFT, error = (predicted - measured) / measured. The
replay of the current setting against BEFORE's measurement is shown beside it - the model's error on
the data it was fitted on, the floor the recommendation's error can be read against.

The replay reuses BEFORE's traffic: when AFTER served other traffic (request count or rate off by more
than ``TRAFFIC_X``) the comparison is flagged, since the prediction is for BEFORE's requests.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from mixdiag.errors import UserError

#: AFTER's request count or rate off BEFORE's by more than this factor: the traffic differs
TRAFFIC_X = 1.25


@dataclass(frozen=True)
class PredictionRow:
    """One quantity: predicted at the recommended setting vs measured on AFTER."""

    metric: str                # itl_p99_s | ttft_p99_s
    predicted: float
    measured: float
    error_pct: float           # 100 x (predicted - measured) / measured
    current_predicted: float   # the replay of BEFORE's own setting
    current_measured: float    # BEFORE's measurement (tune's measured_current)
    current_error_pct: float


@dataclass(frozen=True)
class PredictionCheck:
    """The recommendation's prediction against AFTER."""

    recommendation: str        # the setting's label, e.g. "chunk_size=128"
    current: str               # BEFORE's setting label
    rows: tuple[PredictionRow, ...]
    notes: tuple[str, ...]


def _num(v) -> float:
    try:
        x = float(v)
    except (TypeError, ValueError):
        return math.nan
    return x if math.isfinite(x) else math.nan


def _err(pred: float, meas: float) -> float:
    return 100 * (pred - meas) / meas if meas > 0 and math.isfinite(pred) else math.nan


def check_prediction(doc: dict, after_itl_p99_s: float, after_ttft_p99_s: float, *, before_requests: float = math.nan,
                     after_requests: float = math.nan, before_duration_s: float = math.nan,
                     after_duration_s: float = math.nan) -> PredictionCheck:
    """Compare a tune document's recommendation with AFTER's measured P99s (UserError: not a tune document)."""
    if not isinstance(doc, dict) or not {"settings", "current", "recommended"} <= set(doc):
        raise UserError("--tuned: not a 'mixdiag tune --json' document (needs settings, current, recommended)")
    rec, cur = doc.get("recommended"), doc.get("current") or {}
    notes = []
    if rec is None:
        raise UserError(f"--tuned: the tune run recommended no setting ({doc.get('reason') or 'no reason given'})")
    measured_cur = doc.get("measured_current") or {}
    rows = []
    for metric, meas_after in (("itl_p99_s", after_itl_p99_s), ("ttft_p99_s", after_ttft_p99_s)):
        pred, cpred, cmeas = _num(rec.get(metric)), _num(cur.get(metric)), _num(measured_cur.get(metric))
        rows.append(PredictionRow(metric, pred, _num(meas_after), _err(pred, _num(meas_after)), cpred, cmeas,
                                  _err(cpred, cmeas)))
    wl = doc.get("workload") or {}
    tuned_reqs = _num(wl.get("requests"))
    if math.isfinite(tuned_reqs) and math.isfinite(before_requests) and tuned_reqs != before_requests:
        notes.append(f"the tune document replayed {tuned_reqs:.0f} requests, BEFORE holds {before_requests:.0f}: "
                     "it may not have been made on BEFORE")
    rb = before_requests / before_duration_s if before_duration_s > 0 else math.nan
    ra = after_requests / after_duration_s if after_duration_s > 0 else math.nan
    for what, b, a in (("requests", before_requests, after_requests), ("request rate", rb, ra)):
        if math.isfinite(b) and math.isfinite(a) and min(a, b) > 0 and max(a, b) / min(a, b) > TRAFFIC_X:
            notes.append(f"AFTER's {what} ({a:.2f}) differs from BEFORE's ({b:.2f}) by more than {TRAFFIC_X}x: the "
                         "prediction is for BEFORE's traffic")
    if any(not math.isfinite(r.measured) for r in rows):
        notes.append("AFTER does not measure every predicted quantity (TTFT needs request arrivals)")
    return PredictionCheck(recommendation=str(doc.get("recommendation") or rec.get("label") or "?"),
                           current=str(cur.get("label") or "current"), rows=tuple(rows), notes=tuple(notes))
