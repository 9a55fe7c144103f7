"""Host time on interval rows from the engine's own count of GPU idle time between forwards
(``gpu_wait_s``: SGLang's GPU overlap-wait counter, collectors/prometheus/dialect_columns.py - a
``GapTimer`` on the forward stream: the time the GPU waited for the host to launch the next forward, from the
end of one forward to the start of the next; a gap the server spent idle is discarded, ``GapTimer.cancel``).

With the overlap scheduler the host's work hides behind the previous forward, so the GPU waits only
briefly between forwards; the instance's **usual rate** of waiting is the median of ``gpu_wait_s / dt``
over its intervals with requests running. What an interval waited beyond that usual share of its time
is ``gap_excess_s`` - the interval's measured host gap above the usual one, the quantity a trace's
step rows carry under the same name (time between kernels), here counted by the engine per interval.
``gap_excess_sigma_s`` is its robust spread (1.4826 x MAD) over the same intervals: the noise the
interval rule stands a stall above. Both NaN without the counter.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from mixdiag.diagnosis import groupwise as gw


def _running(sig: pd.DataFrame) -> np.ndarray:
    """Intervals in which requests ran: the running gauge above 0 or ITL samples counted."""
    run = np.zeros(len(sig), dtype=bool)
    for c in ("running_reqs", "itl_count", "output_tokens"):
        if c in sig.columns:
            run |= (pd.to_numeric(sig[c], errors="coerce").fillna(0.0) > 0).to_numpy(dtype=bool)
    return run


def wait_excess(sig: pd.DataFrame, groups: np.ndarray | None) -> tuple[np.ndarray, np.ndarray]:
    """(``gap_excess_s``, ``gap_excess_sigma_s``) per row of ``sig`` (one instance, or several numbered
    by ``groups``); NaN where the row has no GPU wait count or no request ran."""
    nan = np.full(len(sig), np.nan)
    if "gpu_wait_s" not in sig.columns:
        return nan, nan.copy()
    wait = pd.to_numeric(sig["gpu_wait_s"], errors="coerce").to_numpy(dtype=float)
    dt = (sig["t_end_s"] - sig["t_start_s"]).to_numpy(dtype=float)
    ok = np.isfinite(wait) & (dt > 0) & _running(sig)
    if not ok.any():
        return nan, nan.copy()
    with np.errstate(invalid="ignore", divide="ignore"):
        rate = pd.Series(np.where(ok, wait / dt, np.nan), index=sig.index)
    usual = gw.median(rate, groups).to_numpy(dtype=float)
    excess = np.where(ok, np.clip(wait - usual * dt, 0.0, None), np.nan)
    ex = pd.Series(excess, index=sig.index)
    sigma = 1.4826 * gw.median((ex - gw.median(ex, groups)).abs(), groups).to_numpy(dtype=float)
    return excess, np.where(ok, sigma, np.nan)
