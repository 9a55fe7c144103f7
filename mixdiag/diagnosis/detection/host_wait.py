"""Host time on interval rows from the engine's own count of GPU idle time between forwards
(``gpu_wait_s``: SGLang's GPU overlap-wait counter, collectors/prometheus/dialect_columns.py - a
``GapTimer`` on the forward stream: the time the GPU waited for the host to launch the next forward, from the
end of one forward to the start of the next; a gap the server spent idle is discarded, ``GapTimer.cancel``).

With the overlap scheduler the host's work hides behind the previous forward, so the GPU waits only
briefly between forwards - a wait **per forward**. The instance's **usual wait** is a low quantile of
``gpu_wait_s / passes`` over its intervals with requests running (``passes``: the interval's forward
count; SGLang counts every forward by its graph mode, the collectors' ``graph_*_steps`` columns).
Per second it would not be usual: an interval of slow forwards (an EP hotspot, a KV transfer, long mixed
steps) holds fewer of them and waits less per second, one of fast decodes more - measured on tier (e2)
captures, fast decode intervals read 22 ms/s of "excess" against a median pulled down by slow ones.
Where the source counts no forwards, the rate per second of interval stands in.

What an interval waited beyond the usual is ``gap_excess_s`` - its measured host gap above the usual one,
the quantity a trace's step rows carry under the same name (time between kernels), here counted by the
engine per interval. ``gap_excess_sigma_s`` is the noise the interval rule stands a stall above, read on
the side a stall cannot reach (:func:`wait_excess`). Both NaN without the counter.

``host_pause_s`` (vLLM's GC debugger, SGLang's GC warning: each collection's time, collectors/logs/) is host
time the engine measured itself standing still; it is the wait where no GPU wait is counted (where one is,
that count holds the pause's idle already). A pause under the instance's typical inter-token
latency hides inside one step's spread (a young-generation collection takes well under a millisecond), so
where pauses are the measure the noise is at least half the typical ITL: a pause stands out (k = 3) only
at 1.5 typical ITLs or more. ``host_stopped_s`` (mixdiag's host sampler: the OS saw the engine process stopped,
collectors/host/proc_samples.py) is the same kind of measure, taken by the
kernel instead of the engine: :func:`measured_pause` is their sum.
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


def forward_passes(sig: pd.DataFrame) -> np.ndarray:
    """Forward passes per interval (the engine's per-mode pass counts summed); NaN where none counted."""
    cols = [c for c in ("graph_full_steps", "graph_piecewise_steps", "graph_none_steps") if c in sig.columns]
    if not cols:
        return np.full(len(sig), np.nan)
    return sig[cols].apply(pd.to_numeric, errors="coerce").sum(axis=1, min_count=1).to_numpy(dtype=float)


def wait_excess(sig: pd.DataFrame, groups: np.ndarray | None) -> tuple[np.ndarray, np.ndarray]:
    """(``gap_excess_s``, ``gap_excess_sigma_s``) per row of ``sig`` (one instance, or several numbered
    by ``groups``); NaN where the row has no GPU wait count or no request ran."""
    nan = np.full(len(sig), np.nan)
    if "gpu_wait_s" not in sig.columns and not PAUSE_COLUMNS & set(sig.columns):
        return nan, nan.copy()
    wait = _col(sig, "gpu_wait_s")
    # where the GPU's wait is counted it holds a pause's idle already (SGLang): the pause is the measure
    # only where nothing counts the wait (vLLM)
    pause = np.where(np.isfinite(wait), np.nan, measured_pause(sig))
    wait = np.where(np.isfinite(wait), wait, pause)
    dt = (sig["t_end_s"] - sig["t_start_s"]).to_numpy(dtype=float)
    ok = np.isfinite(wait) & (dt > 0) & _running(sig)
    if not ok.any():
        return nan, nan.copy()
    unit = dt
    passes = forward_passes(sig)
    if np.isfinite(passes[ok]).mean() >= 0.5:
        unit = passes
        ok = ok & (passes > 0)
        if not ok.any():
            return nan, nan.copy()
    with np.errstate(invalid="ignore", divide="ignore"):
        rate = pd.Series(np.where(ok, wait / unit, np.nan), index=sig.index)
    # a stall only adds wait, and a long one covers most of a capture (over half the intervals of some
    # tier (e2) captures): the usual wait is the low quartile of the rate, its noise the spread of the
    # rates below it read as a normal's (q25 - q05 = 0.97 sigma) - both from the side a stall cannot
    # reach, valid while a quarter of the intervals run clean. A floor of a tenth of the usual wait: a
    # rate that steady (a counter's rounding) makes no stall of a hair's difference
    usual = gw.quantile(rate, 0.25, groups).to_numpy(dtype=float)
    spread = (usual - gw.quantile(rate, 0.05, groups).to_numpy(dtype=float)) / 0.97
    sigma = np.fmax(spread, 0.1 * usual) * unit
    if np.isfinite(pause).any():
        sigma = np.where(np.isfinite(pause), np.fmax(sigma, 0.5 * _typical_itl(sig, groups)), sigma)
    excess = np.where(ok, np.clip(wait - usual * unit, 0.0, None), np.nan)
    return excess, np.where(ok, sigma, np.nan)


#: interval columns of host time measured standing still: the engine's own GC timing, the OS's view of the process
PAUSE_COLUMNS = frozenset({"host_pause_s", "host_stopped_s"})


def measured_pause(sig: pd.DataFrame) -> np.ndarray:
    """Per row: the host time measured standing still - ``host_pause_s`` (the engine timed it: GC) plus
    ``host_stopped_s`` (the OS saw the process stopped); NaN where neither was measured."""
    a, b = _col(sig, "host_pause_s"), _col(sig, "host_stopped_s")
    return np.where(np.isfinite(a) | np.isfinite(b), np.nan_to_num(a) + np.nan_to_num(b), np.nan)


def _col(sig: pd.DataFrame, c: str) -> np.ndarray:
    if c not in sig.columns:
        return np.full(len(sig), np.nan)
    return pd.to_numeric(sig[c], errors="coerce").to_numpy(dtype=float)


def _typical_itl(sig: pd.DataFrame, groups: np.ndarray | None) -> np.ndarray:
    """The instance's median ITL per row (median of the intervals' ITL medians, else means); 0 where none."""
    for c in ("itl_p50_s", "itl_mean_s"):
        v = _col(sig, c)
        if np.isfinite(v).any():
            med = gw.quantile(pd.Series(v, index=sig.index), 0.5, groups).to_numpy(dtype=float)
            return np.nan_to_num(med)
    return np.zeros(len(sig))


def stands_out(excess, sigma, k: float) -> np.ndarray:
    """Where a wait beyond the usual (``gap_excess_s``) stands ``k`` of its robust sigmas out, and above
    nothing: the test the interval rule, the baseline's fault mask and the log view's fusion share."""
    ex = np.asarray(excess, dtype=float)
    sg = np.nan_to_num(np.asarray(sigma, dtype=float))
    with np.errstate(invalid="ignore"):
        return np.isfinite(ex) & (ex > 0) & (ex >= k * sg)
