"""Spike detection: a robust, slowly moving baseline of the latency decodes see, and the steps
(or intervals) whose latency stands far above it.

Two latency views, one per granularity:

* **step rows** - ``latency_s = t_end[n] - t_end[n-1]``: the time step ``n`` added to the gap
  between two output tokens of a request that decodes every step (its own duration plus the
  idle gap before it). It exists whenever steps are timed (per-step records, a profiler trace),
  even without token events. When token events exist, every inter-token latency (ITL) is charged
  to the *culprit* step - the step with the largest ``latency_s`` among the steps the gap spans -
  so a prefill-only step that held decodes back carries the ITL its victims saw (``itl_max_s``).
* **interval rows** (log/scrape intervals) - ``itl_p99_s`` against a baseline built from
  ``itl_p50_s``.

The baseline is a centred rolling median over pure-decode steps (robust to up to half of them
spiking, and it follows slow load changes); the noise scale is the rolling MAD. A row spikes when
its latency exceeds ``ratio x baseline`` *and* ``baseline + mad_k x sigma``.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd


@dataclass(frozen=True)
class SpikeConfig:
    """Thresholds of spike detection; one setting for every workload (see docs/analyze.md)."""

    ratio: float = 1.5          # spike: latency > ratio x baseline ...
    mad_k: float = 2.0          # ... and > baseline + mad_k x robust sigma (noise guard)
    window_steps: int = 41      # centred rolling window of the step baseline (rows)
    window_intervals: int = 15  # centred rolling window of the interval baseline (rows)
    min_periods: int = 3        # reference rows needed inside a window before it gives a baseline

    def __post_init__(self):
        if not self.ratio > 1.0:
            raise ValueError(f"SpikeConfig.ratio must be > 1, got {self.ratio}")
        if self.mad_k < 0:
            raise ValueError(f"SpikeConfig.mad_k must be >= 0, got {self.mad_k}")
        for name in ("window_steps", "window_intervals", "min_periods"):
            if getattr(self, name) < 1:
                raise ValueError(f"SpikeConfig.{name} must be >= 1")


def step_timing(steps: pd.DataFrame) -> pd.DataFrame:
    """Per-instance ``gap_before_s`` and ``latency_s`` of step rows (sorted by instance, step).

    ``gap_before_s`` is the idle time since the previous step ended (0 for the first step);
    ``latency_s`` is ``gap_before_s + duration``.
    """
    s = steps.sort_values(["instance", "step"], kind="stable")
    prev_end = s.groupby("instance", sort=False)["t_end_s"].shift(1)
    gap = (s["t_start_s"] - prev_end).clip(lower=0.0).fillna(0.0)
    out = s.assign(gap_before_s=gap, duration_s=s["t_end_s"] - s["t_start_s"])
    out["latency_s"] = out["gap_before_s"] + out["duration_s"]
    return out


def itl_events(tokens: pd.DataFrame) -> pd.DataFrame:
    """ITL events of one instance's tokens with the previous event's time and step per request."""
    tok = tokens.sort_values(["request_id", "t_s"], kind="stable")
    g = tok.groupby("request_id", sort=False)
    out = tok.assign(prev_t_s=g["t_s"].shift(1), prev_step=g["step"].shift(1))
    out = out[out["prev_t_s"].notna()].copy()
    out["itl_s"] = out["t_s"] - out["prev_t_s"]
    return out


def charge_itl(steps: pd.DataFrame, itl: pd.DataFrame) -> pd.DataFrame:
    """Charge each inter-token latency to the steps it spans.

    ``steps``: one instance's step rows with ``latency_s`` (sorted by step). ``itl``: that
    instance's ITL events (``itl_s``, ``t_s``, ``step``) plus ``prev_step``/``prev_t_s`` of the
    request's previous event. The gap (previous event, this event] spans one or more steps; each
    of them is charged the ITL (the user waited through all of them). Returns per step:
    ``itl_max_s`` (largest ITL charged, NaN when none), ``itl_events`` (count) and
    ``stall_max_s``: the largest ITL of a request that sat out steps (its gap spans several
    steps) and whose wait *began* at this step - a preemption, a stall that skipped it.
    """
    n = len(steps)
    itl_max = np.full(n, np.nan)
    stall_max = np.full(n, np.nan)
    events = np.zeros(n, dtype=np.int64)
    if n == 0 or len(itl) == 0:
        return pd.DataFrame({"itl_max_s": itl_max, "itl_events": events, "stall_max_s": stall_max},
                            index=steps.index)
    step_ids = steps["step"].to_numpy()
    ends = steps["t_end_s"].to_numpy()
    have_step = (itl["step"].notna() & itl["prev_step"].notna()).to_numpy()
    # Positions of the covered step range [lo, hi) in the steps frame.
    lo = np.empty(len(itl), dtype=np.int64)
    hi = np.empty(len(itl), dtype=np.int64)
    lo[have_step] = np.searchsorted(step_ids, itl["prev_step"].to_numpy()[have_step], side="right")
    hi[have_step] = np.searchsorted(step_ids, itl["step"].to_numpy()[have_step], side="right")
    # Without step ids: the steps that ended within (previous event, this event], with 1 ms of
    # slack for tokens stamped just before the step's end was recorded.
    if (~have_step).any():
        tol = 1e-3
        lo[~have_step] = np.searchsorted(ends, itl["prev_t_s"].to_numpy()[~have_step] + tol, side="right")
        hi[~have_step] = np.searchsorted(ends, itl["t_s"].to_numpy()[~have_step] + tol, side="right")
    vals = itl["itl_s"].to_numpy()
    width = hi - lo
    one = width == 1
    np.add.at(events, lo[one], 1)
    order = np.argsort(vals[one], kind="stable")  # later writes win: the max lands last
    itl_max[lo[one][order]] = vals[one][order]
    for i in np.flatnonzero(width > 1):  # rare: the request sat out steps (stall, preemption)
        a, b, v = lo[i], hi[i], vals[i]
        events[a:b] += 1
        itl_max[a:b] = np.fmax(itl_max[a:b], v)
        stall_max[a] = np.fmax(stall_max[a], v)
    return pd.DataFrame({"itl_max_s": itl_max, "itl_events": events, "stall_max_s": stall_max}, index=steps.index)


def rolling_baseline(values: pd.Series, reference: pd.Series, window: int, min_periods: int
                     ) -> tuple[pd.Series, pd.Series]:
    """Centred rolling median and robust sigma (1.4826 x MAD) of ``values`` over ``reference`` rows.

    Rows that are not reference rows get the baseline of the nearest reference rows; when too
    few reference rows exist, all rows serve as reference.
    """
    v = values.astype("float64")
    ref = reference.fillna(False).astype(bool) & v.notna()
    if ref.sum() < min_periods:
        ref = v.notna()
    x = v.where(ref)
    base = x.rolling(window, center=True, min_periods=min(min_periods, max(int(ref.sum()), 1))).median()
    base = base.ffill().bfill()
    if base.isna().all():
        base = pd.Series(float(np.nanmedian(v)) if v.notna().any() else np.nan, index=v.index)
    dev = (x - base).abs()
    mad = dev.rolling(window, center=True, min_periods=min(min_periods, max(int(ref.sum()), 1))).median()
    sigma = (1.4826 * mad).ffill().bfill().fillna(0.0)
    return base, sigma


def is_spike(latency: pd.Series, baseline: pd.Series, sigma: pd.Series, cfg: SpikeConfig) -> pd.Series:
    """Latency above ``ratio x baseline`` and above ``baseline + mad_k x sigma``."""
    thr = np.maximum(cfg.ratio * baseline, baseline + cfg.mad_k * sigma)
    return (latency > thr) & latency.notna() & baseline.notna()
