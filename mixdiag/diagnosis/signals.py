"""The signals attribution looks at, per step: the article's four (two-segment token allocation,
TPOT spikes and their period, the SM-activity sawtooth, CUDA-graph mode) and the evidence of the
other causes (expert imbalance, KV transfer, preemptions, inter-step gaps).

Every signal is computed relative to the step's own instance and neighbourhood, so one threshold
setting serves every model size and load. Which signals a source could not provide is decided
once, here (:func:`signal_quality`), from ``meta["signals"]`` and from which columns are empty.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from mixdiag.causes import SIGNAL_COLUMNS, SIGNALS  # noqa: F401  (SIGNALS re-exported)


@dataclass(frozen=True)
class SignalConfig:
    """Neighbourhood sizes for the relative signals."""

    neighbour_window: int = 11   # centred window (steps) for SM activity / imbalance references
    gap_window: int = 41         # centred window (steps) for the typical inter-step gap

    def __post_init__(self):
        if self.neighbour_window < 3 or self.gap_window < 3:
            raise ValueError("SignalConfig windows must be >= 3")


def _has_data(df: pd.DataFrame, col: str) -> bool:
    if col not in df.columns or not len(df):
        return False
    s = df[col]
    if col == "graph_mode":
        return bool((s != "unknown").any())
    return bool(s.notna().any())


def signal_quality(meta: dict, instance: str, steps: pd.DataFrame, has_tokens: bool) -> dict[str, str]:
    """Quality of each signal for one instance: measured | estimated | inferred | absent.

    Data decides presence (an all-NaN column is absent whatever meta claims); meta refines the
    quality of present data (e.g. ``sm_active: estimated`` on CPU).
    """
    declared = (meta or {}).get("signals", {}).get(instance, {}) or {}
    out = {}
    for sig in SIGNALS:
        if sig == "itl":
            present = has_tokens or any(_has_data(steps, c) for c in SIGNAL_COLUMNS["itl"])
        elif sig == "host_time":
            present = bool(len(steps)) and bool((steps["granularity"] == "step").any())
        elif sig == "token_allocation":
            present = _has_data(steps, "prefill_tokens") and (_has_data(steps, "decode_rows")
                                                              or _has_data(steps, "decode_reqs"))
        else:
            present = any(_has_data(steps, c) for c in SIGNAL_COLUMNS[sig])
        if not present:
            out[sig] = "absent"
            continue
        q = declared.get(sig)
        for c in SIGNAL_COLUMNS.get(sig, ()):
            q = q or declared.get(c)
        out[sig] = q if q in ("measured", "estimated", "inferred") else "measured"
    return out


def _rolling_ref_median(values: pd.Series, ref: pd.Series, window: int) -> pd.Series:
    x = values.where(ref & values.notna())
    med = x.rolling(window, center=True, min_periods=1).median().ffill().bfill()
    if med.isna().all() and values.notna().any():
        med = pd.Series(float(values.median()), index=values.index)
    return med


def step_signals(steps: pd.DataFrame, cfg: SignalConfig = SignalConfig()) -> pd.DataFrame:
    """Per-step signal columns for one instance's rows (sorted by step, with ``gap_before_s``).

    Adds: ``has_prefill``, ``has_decode``, ``decodes_around`` (a neighbour step held decode
    rows), ``decodes_before`` (decodes were running when the step began), ``decode_only``, ``graph_off`` (PIECEWISE or NONE), ``sm_delta`` (SM activity minus
    that of neighbouring decode-only steps), ``imbalance_rel`` (expert imbalance over its
    decode-only neighbourhood), ``kv_xfer``, ``preempt``, ``gap_excess_s`` (gap minus the
    typical gap).
    """
    s = steps.copy()
    kind = s["kind"]
    pt, dr = s["prefill_tokens"], s["decode_rows"].fillna(s["decode_reqs"])
    s["has_prefill"] = np.where(pt.notna(), pt > 0, kind.isin(["prefill", "mixed"]))
    s["has_decode"] = np.where(dr.notna(), dr > 0, kind.isin(["decode", "mixed"]))
    s["has_prefill"] = s["has_prefill"].astype(bool)
    s["has_decode"] = s["has_decode"].astype(bool)
    hd = s["has_decode"]
    s["decodes_around"] = (hd.shift(1, fill_value=False) | hd.shift(-1, fill_value=False)).astype(bool)
    # Decodes were running before this step: the last step that was not prefill-only held decode
    # rows (a multi-chunk prefill keeps them waiting across several steps).
    prefill_only = s["has_prefill"] & ~hd
    last = hd.astype(float).where(~prefill_only).ffill().shift(1)
    s["decodes_before"] = last.fillna(0.0).astype(bool)
    s["decode_only"] = hd & ~s["has_prefill"]
    s["graph_off"] = s["graph_mode"].isin(["PIECEWISE", "NONE"])
    w = cfg.neighbour_window
    ref = s["decode_only"]
    s["sm_delta"] = s["sm_active"] - _rolling_ref_median(s["sm_active"], ref, w)
    # a wide window: hotspot windows last tens of steps and must not become their own reference
    imb_ref = _rolling_ref_median(s["expert_imbalance"], ref, max(w, 201))
    s["imbalance_rel"] = s["expert_imbalance"] / imb_ref.where(imb_ref > 0)
    s["kv_xfer"] = (s["kv_transfer_bytes"].fillna(0) > 0) | (s["kv_transfer_s"].fillna(0) > 0)
    s["preempt"] = s["preempted_reqs"].fillna(0) > 0
    gap = s["gap_before_s"] if "gap_before_s" in s.columns else pd.Series(0.0, index=s.index)
    s["gap_excess_s"] = gap - gap.rolling(cfg.gap_window, center=True, min_periods=1).median()
    return s


def decode_graph_norm(sig: pd.DataFrame) -> str:
    """The graph mode most decode-only steps of the instance ran in ('unknown' if none known)."""
    m = sig.loc[sig["decode_only"] & (sig["graph_mode"] != "unknown"), "graph_mode"]
    return str(m.mode().iloc[0]) if len(m) else "unknown"


def periodicity(sig: pd.DataFrame, spike_mask: pd.Series) -> dict:
    """Spike period vs prefill-chunk arrival period (median spacing of start times), and phase
    alignment (share of spikes that fell on a step holding prefill tokens)."""
    t = sig["t_start_s"]
    visible_prefill = sig["has_prefill"] & (sig["has_decode"] | sig["decodes_before"])
    tp = t[visible_prefill].to_numpy()
    ts = t[spike_mask & sig["has_prefill"]].to_numpy()  # spikes that fell on prefill chunks
    spike_p = float(np.median(np.diff(ts))) if len(ts) >= 3 else float("nan")
    prefill_p = float(np.median(np.diff(tp))) if len(tp) >= 3 else float("nan")
    ratio = spike_p / prefill_p if np.isfinite(spike_p) and np.isfinite(prefill_p) and prefill_p > 0 else float("nan")
    aligned = float(sig.loc[spike_mask, "has_prefill"].mean()) if spike_mask.any() else float("nan")
    return {"spike_period_s": spike_p, "prefill_period_s": prefill_p, "period_ratio": ratio,
            "aligned_share": aligned}
