"""Interval cells a member of a joined server lends to the spine's rows by time, beyond the nearest row's value
(collectors/join.py ``_fill``): cells that hold for a longer row's whole window, per-step points averaged
over each spine row, and timed events summed into the row they ended in.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from mixdiag.collectors.join_spine import resolution

#: Interval columns that hold for every moment of a longer row's window (the smallest batch a
#: CUDA-graph table counted run without a graph): lent to every spine row ending inside it.
WINDOW = ("graph_none_min_tokens",)
#: Interval columns a member may also give per engine step, as a series at each step line's own stamp
#: (vLLM's ``EPLB step:`` line, every step by default): a spine row takes the mean of the points inside its
#: window rather than a longer row's mean (a 10 s stats window dilutes a 3 s hotspot to a third).
POINT_SERIES = {"expert_imbalance": "vllm_log:eplb_expert_imbalance"}
#: Interval columns a member gives as timed events, one series point each (vLLM's GC debugger: one line per
#: collection, stamped at its end; the host sampler's stops): a spine row takes the sum of the events that ended
#: in it, and 0 inside the member's span where none did (the debugger logs every collection: no line, no pause).
SUM_POINT_SERIES = {"host_pause_s": ("vllm_log:gc_pause_s", "sglang_log:gc_pause_s"),
                    # the OS's view of the engine process (collectors/host/proc_samples.py): stopped; zero events
                    # mark the sampled span. Its CPU starvations (host:cpu_starved_s) stay a series, not evidence:
                    # no testbed truth checks them yet (tier g 4301: 24-45 starvations a run on a loaded 2-core
                    # machine, none injected, 13 of 30 host_stall calls of the interval view on them)
                    "host_stopped_s": ("host:stopped_s",)}
#: Of those, columns that take the longest event instead of the sum: a token waits through one stand-still, and
#: ten 5 ms CPU waits of a busy host make no token wait 50 ms (the host sampler's events, stamped exactly: no
#: stamp window to spread them over; a GC is one event)
MAX_POINT_COLUMNS = frozenset({"host_stopped_s"})
#: Step columns a member gives as timed events with a length (value seconds, stamped at the end): a step row takes
#: how long the events overlapped its own span - on a clock fine enough to place them (``OVERLAP_MAX_RES_S``)
OVERLAP_SERIES = {"host_stopped_s": ("host:stopped_s",)}
OVERLAP_MAX_RES_S = 0.05


def fill_window(spine: pd.DataFrame, other: pd.DataFrame) -> pd.DataFrame:
    """``spine``'s empty :data:`WINDOW` cells from the row of ``other`` whose ``(t_start_s, t_end_s]``
    holds the spine row's end (the smallest such value where windows overlap)."""
    cols = [c for c in WINDOW if c in other.columns and other[c].notna().any()]
    if not cols or not len(spine):
        return spine
    out = spine.reset_index(drop=True).copy()
    t = out["t_end_s"].to_numpy(dtype=float)
    for c in cols:
        got = np.full(len(out), np.nan)
        for a, b, v in other[["t_start_s", "t_end_s", c]].dropna().itertuples(index=False):
            inside = (t > a) & (t <= b)
            got[inside] = np.fmin(got[inside], v)
        cur = out[c].to_numpy(dtype=float) if c in out.columns else np.full(len(out), np.nan)
        out[c] = np.where(np.isnan(cur), got, cur)
    return out


def fill_points(spine: pd.DataFrame, inp, empty: dict[str, np.ndarray], notes: list[str]) -> pd.DataFrame:
    """Of ``spine``'s rows that were empty in :data:`POINT_SERIES` columns before ``inp`` lent to them, those
    whose window ``inp``'s per-step points cover take the points' mean instead of the lent value; a row inside
    the points' span with no point of its own (no step logged in it) is left unmeasured. A point stamped
    on a clock of resolution r (whole seconds) is placed at stamp + r/2, the middle of when it happened."""
    ser = inp.timeline.series
    if not len(ser) or not len(spine):
        return spine
    out = spine
    for col, name in POINT_SERIES.items():
        pts = ser[ser["name"] == name]
        if len(pts) < 2:
            continue
        t = pts["t_s"].to_numpy(dtype=float)
        # the stamp clock's step: lines a minute or more apart tell no clock resolution, only their spacing
        res = resolution(pts["t_s"])
        t = t + (0.5 * res if np.isfinite(res) and res < 60 else 0.0)
        order = np.argsort(t)
        t, v = t[order], pts["value"].to_numpy(dtype=float)[order]
        csum = np.concatenate([[0.0], np.cumsum(v)])
        a, b = spine["t_start_s"].to_numpy(dtype=float), spine["t_end_s"].to_numpy(dtype=float)
        lo, hi = np.searchsorted(t, a, side="right"), np.searchsorted(t, b, side="right")
        n = hi - lo
        inside = empty[col] & (b >= t[0]) & (a <= t[-1]) & np.isfinite(a) & np.isfinite(b)
        if not inside.any():
            continue
        mean = np.where(n > 0, (csum[hi] - csum[lo]) / np.maximum(n, 1), np.nan)
        if out is spine:
            out = spine.copy()
        cur = out[col].to_numpy(dtype=float, copy=True) if col in out else np.full(len(out), np.nan)
        cur[inside] = mean[inside]
        out[col] = cur
        notes.append(f"{col} of {int((inside & (n > 0)).sum())} interval rows from {inp.given}'s {len(pts)} per-step "
                     f"lines in their own windows")
    return out


def fill_sums(spine: pd.DataFrame, inp, notes: list[str]) -> pd.DataFrame:
    """``spine``'s :data:`SUM_POINT_SERIES` columns from ``inp``'s timed events (module doc of the dict).

    An event stamped ``s`` on a clock of step ``r`` (whole seconds) ended in ``[s, s + r)``; where that window
    holds a spine boundary the stamp cannot say which row it ended in. A pause of d seconds stops every
    running request for d, so the row whose ITL histogram counted the latest token (``itl_tail_floor_s``,
    else ``itl_p99_s``) is the one that observed it; without either, the row holding ``s + r/2``."""
    ser = inp.timeline.series
    if not len(ser) or not len(spine):
        return spine
    out = spine
    a, b = spine["t_start_s"].to_numpy(dtype=float), spine["t_end_s"].to_numpy(dtype=float)
    tail = next((pd.to_numeric(spine[c], errors="coerce").to_numpy(dtype=float)
                 for c in ("itl_tail_floor_s", "itl_p99_s") if c in spine.columns), None)
    for col, names in SUM_POINT_SERIES.items():
        pts = ser[ser["name"].isin(names)]
        name = "/".join(sorted(set(pts["name"])))
        if not len(pts):
            continue
        rows = getattr(inp.timeline, "steps", None)
        rows = rows if rows is not None else pd.DataFrame({"t_start_s": [], "t_end_s": []})
        t, v = pts["t_s"].to_numpy(dtype=float), pts["value"].to_numpy(dtype=float)
        stamps = np.concatenate([ser["t_s"].to_numpy(dtype=float), rows["t_end_s"].to_numpy(dtype=float)])
        whole = bool(np.all(np.isfinite(t) & (np.mod(t, 1.0) == 0)))
        res = 1.0 if whole else resolution(pd.Series(stamps))
        res = res if np.isfinite(res) and res < 60 else 0.0
        if col in MAX_POINT_COLUMNS:
            res = 0.0   # the host sampler stamps each event at its end with the sample's unix time (microseconds)
        lo = np.nanmin(np.concatenate([t, rows["t_start_s"].to_numpy(dtype=float)]))
        hi = np.nanmax(np.concatenate([t + res, rows["t_end_s"].to_numpy(dtype=float)]))
        got = np.where((b > lo) & (a < hi), 0.0, np.nan)   # the member's span: a measured zero
        placed = 0
        for ti, vi in zip(t, v):
            if not (np.isfinite(ti) and np.isfinite(vi)):
                continue
            cand = np.flatnonzero((a < ti + max(res, 1e-9)) & (b > ti))   # rows (a, b] the window [s, s+r) touches
            if not len(cand):
                continue
            pick = cand[np.argmin(np.abs(0.5 * (a[cand] + b[cand]) - (ti + 0.5 * res)))]
            if len(cand) > 1 and tail is not None and np.isfinite(tail[cand]).any():
                tc = np.where(np.isfinite(tail[cand]), tail[cand], -np.inf)
                if (tc == tc.max()).sum() == 1:   # a tie says nothing: the stamp's middle decides
                    pick = cand[int(np.argmax(tc))]
            prev = 0.0 if np.isnan(got[pick]) else got[pick]
            got[pick] = max(prev, vi) if col in MAX_POINT_COLUMNS else prev + vi
            placed += 1
        if out is spine:
            out = spine.copy()
        cur = out[col].to_numpy(dtype=float, copy=True) if col in out else np.full(len(out), np.nan)
        out[col] = np.where(np.isfinite(got), got, cur)
        notes.append(f"{col} of {int(np.isfinite(got).sum())} interval rows from {inp.given}'s {placed} timed "
                     f"events ({name}{', the longest per row' if col in MAX_POINT_COLUMNS else ''})")
    return out


def fill_overlaps(steps: pd.DataFrame, inp, notes: list[str]) -> pd.DataFrame:
    """``steps``' :data:`OVERLAP_SERIES` columns from ``inp``'s timed events: per step row, the seconds the events
    ``[t - value, t]`` overlapped its ``(t_start_s, t_end_s]``; 0 inside the events' span where none did, NaN
    outside it. Only on a step clock of ``OVERLAP_MAX_RES_S`` or finer (a client's per-token clock, a trace):
    whole-second log stamps cannot say which step a stop fell in."""
    ser = inp.timeline.series
    if not len(ser) or not len(steps):
        return steps
    res = resolution(steps["t_end_s"])
    out = steps
    for col, names in OVERLAP_SERIES.items():
        pts = ser[ser["name"].isin(names)]
        if not len(pts):
            continue
        if not (np.isfinite(res) and res <= OVERLAP_MAX_RES_S):
            notes.append(f"{col} not placed on step rows: their clock ({res:g} s) is coarser than {OVERLAP_MAX_RES_S:g} s")
            continue
        end, dur = pts["t_s"].to_numpy(dtype=float), pts["value"].to_numpy(dtype=float)
        start = end - np.nan_to_num(dur)
        order = np.argsort(out["t_end_s"].to_numpy(dtype=float), kind="stable")
        a, b = out["t_start_s"].to_numpy(dtype=float)[order], out["t_end_s"].to_numpy(dtype=float)[order]
        got = np.where((b > np.nanmin(start)) & (a < np.nanmax(end)), 0.0, np.nan)   # the sampled span: measured 0
        for s0, e0 in zip(start[dur > 0], end[dur > 0]):
            # rows in end order; a step view's rows do not overlap, so their starts are in order too
            lo, hi = np.searchsorted(b, s0, side="left"), np.searchsorted(a, e0, side="right")
            for i in range(lo, hi):   # only the rows the event touches
                ov = min(b[i], e0) - max(a[i], s0)
                if ov > 0:
                    got[i] = (0.0 if np.isnan(got[i]) else got[i]) + ov
        if out is steps:
            out = steps.copy()
        placed = np.full(len(got), np.nan)
        placed[order] = got
        out[col] = placed
        notes.append(f"{col} of {int(np.isfinite(got).sum())} step rows from {inp.given}'s "
                     f"{int((dur > 0).sum())} timed stand-stills placed by time")
    return out
