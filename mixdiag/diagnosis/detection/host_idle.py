"""Engine idle time per interval from the engine process's measured CPU time (``engine_cpu_s``,
collectors/host/process_cpu.py).

While requests run, an engine process uses CPU at a rate of its own (its busy loop, launches; on a
CPU backend the forward itself): the instance's **usual rate** is the median of ``engine_cpu_s / dt``
over its intervals with requests running. An interval in which the process got less is time it did
not run: ``engine_idle_s = dt - engine_cpu_s / usual rate`` (>= 0). A stopped or descheduled engine
(SIGSTOP, a throttled cgroup, a neighbour on its cores) shows here as the kernel counted it.

How much of that is noise is the instance's own spread: ``engine_idle_sigma_s`` is the robust sigma
(1.4826 x MAD) of ``engine_idle_s`` over the same intervals. Both are NaN without the counter.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from mixdiag.diagnosis import groupwise as gw

COLUMNS = ("engine_idle_s", "engine_idle_sigma_s")


def _running(sig: pd.DataFrame) -> np.ndarray:
    """Intervals in which requests ran: the running gauge above 0 or ITL samples counted."""
    run = np.zeros(len(sig), dtype=bool)
    for c in ("running_reqs", "itl_count", "output_tokens"):
        if c in sig.columns:
            run |= (pd.to_numeric(sig[c], errors="coerce").fillna(0.0) > 0).to_numpy(dtype=bool)
    return run


def engine_idle(sig: pd.DataFrame, groups: np.ndarray | None) -> pd.DataFrame:
    """``engine_idle_s`` and ``engine_idle_sigma_s`` per row of ``sig`` (one instance, or several
    numbered by ``groups``); NaN where the row has no engine CPU time or no requests ran."""
    out = pd.DataFrame(np.nan, index=sig.index, columns=list(COLUMNS))
    if "engine_cpu_s" not in sig.columns:
        return out
    cpu = pd.to_numeric(sig["engine_cpu_s"], errors="coerce").to_numpy(dtype=float)
    dt = (sig["t_end_s"] - sig["t_start_s"]).to_numpy(dtype=float)
    ok = np.isfinite(cpu) & (dt > 0) & _running(sig)
    if not ok.any():
        return out
    rate = pd.Series(np.where(ok, cpu / np.where(dt > 0, dt, np.nan), np.nan), index=sig.index)
    usual = gw.median(rate, groups).to_numpy(dtype=float)
    with np.errstate(invalid="ignore", divide="ignore"):
        idle = np.where(ok & (usual > 0), np.clip(dt - cpu / usual, 0.0, dt), np.nan)
    idle_s = pd.Series(idle, index=sig.index)
    dev = (idle_s - gw.median(idle_s, groups)).abs()
    sigma = 1.4826 * gw.median(dev, groups).to_numpy(dtype=float)
    out["engine_idle_s"] = idle
    out["engine_idle_sigma_s"] = np.where(np.isfinite(idle), sigma, np.nan)
    return out
