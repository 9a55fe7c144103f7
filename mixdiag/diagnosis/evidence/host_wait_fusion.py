"""The GPU's measured wait on the host (detection/host_wait.py, interval rows) handed to the step rows of the
same engine's log view, for the fused rules (rules/fused_rules.py)."""
from __future__ import annotations

import numpy as np
import pandas as pd

from mixdiag.diagnosis.detection.host_wait import forward_passes, stands_out


def fuse_host_wait(f: pd.DataFrame, st_mask: pd.Series, iv: pd.DataFrame, k: float) -> None:
    """``fused_interval_host_wait_per_pass_s`` of step rows: the GPU's wait on the host per forward beyond
    the usual (``gap_excess_s`` / forward passes, detection/host_wait.py) in the scrape intervals the
    step's span overlaps, where it stood ``k`` sigmas out in every one of them - the smallest of them
    (a log window row spans 40 forwards and may straddle a scrape; a wait measured in one part only is
    not pinned on the whole row); 0 where one did not stand out; NaN where nothing counted the wait."""
    fuse_host_pause(f, st_mask, iv)
    if "gap_excess_s" not in iv.columns or not iv["gap_excess_s"].notna().any():
        return
    ivs = iv.sort_values("t_end_s")
    passes = forward_passes(ivs)
    if not np.isfinite(passes).any():
        return
    gap = pd.to_numeric(ivs["gap_excess_s"], errors="coerce").to_numpy(dtype=float)
    with np.errstate(invalid="ignore", divide="ignore"):
        per = np.where(passes > 0, gap / passes, np.nan)
    per = np.where(stands_out(gap, pd.to_numeric(ivs["gap_excess_sigma_s"], errors="coerce"), k), per,
                   np.where(np.isfinite(per), 0.0, np.nan))
    st = f[st_mask]
    n, lo, hi = _spans(ivs, st)
    out = np.full(len(st), np.nan)
    for i, (a, b) in enumerate(zip(lo, hi)):
        if b < n:
            out[i] = np.min(per[min(a, b):b + 1])  # NaN in any part: not measured throughout
    f.loc[st.index, "fused_interval_host_wait_per_pass_s"] = out


def fuse_host_pause(f: pd.DataFrame, st_mask: pd.Series, iv: pd.DataFrame) -> None:
    """``fused_interval_host_pause_s`` of step rows: the measured pauses where the step ran - the engine's own
    timed pauses (``host_pause_s``: vLLM's GC debugger) in the intervals the step's span overlaps, summed, plus the
    stand-stills the OS saw on the step's own span (its ``host_stopped_s``: the host sampler's stops placed by time,
    collectors/join_cells.py ``fill_overlaps``) - and ``fused_interval_host_stopped_s`` that OS part; NaN where
    nothing measured pauses. Unlike the per-forward wait, a pause is one gap: it lands whole on the one step that
    spanned it, so the OS's events are read on the step itself, never an interval's (a busy host's many short CPU
    waits in one interval are no one step's wait)."""
    st = f[st_mask]
    own = pd.to_numeric(st["host_stopped_s"], errors="coerce").to_numpy(dtype=float) \
        if "host_stopped_s" in st.columns else np.full(len(st), np.nan)
    gc = np.full(len(st), np.nan)
    if "host_pause_s" in iv.columns and iv["host_pause_s"].notna().any():
        ivs = iv.sort_values("t_end_s")
        pause = pd.to_numeric(ivs["host_pause_s"], errors="coerce").to_numpy(dtype=float)
        n, lo, hi = _spans(ivs, st)
        for i, (a, b) in enumerate(zip(lo, hi)):
            part = pause[min(a, b):min(b, n - 1) + 1] if a < n else pause[:0]
            if np.isfinite(part).any():
                gc[i] = np.nansum(part)
    if not (np.isfinite(gc).any() or np.isfinite(own).any()):
        return
    f.loc[st.index, "fused_interval_host_pause_s"] = np.where(np.isfinite(gc) | np.isfinite(own),
                                                              np.nan_to_num(gc) + np.nan_to_num(own), np.nan)
    f.loc[st.index, "fused_interval_host_stopped_s"] = own


def _spans(ivs: pd.DataFrame, st: pd.DataFrame) -> tuple[int, np.ndarray, np.ndarray]:
    """For step rows ``st`` against intervals ``ivs`` (sorted by end): the interval count, and per step the
    first interval ending at or after its start and the one holding its end (== count past the last)."""
    ends = ivs["t_end_s"].to_numpy(dtype=float)
    lo = np.searchsorted(ends, st["t_start_s"].to_numpy(dtype=float), side="left")
    hi = np.searchsorted(ends, st["t_end_s"].to_numpy(dtype=float), side="left")
    return len(ends), lo, hi
