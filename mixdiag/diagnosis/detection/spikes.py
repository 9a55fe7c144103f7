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

import numpy as np
import pandas as pd

from mixdiag.diagnosis import groupwise as gw
from mixdiag.diagnosis.config import SpikeConfig
from mixdiag.diagnosis.labels import equal, factorize_objects


def _group_codes(s: pd.Series) -> np.ndarray:
    """Integer codes of ``s`` in sorted order of its values (missing values -> -1): a sort key
    that is cheap to compare, where sorting the strings themselves costs seconds at 1 M rows. A label column
    of objects (request ids of a million token events: a few thousand str objects) is factorised by object
    first (label_arrays.factorize_objects, pandas' own codes), then only its distinct values are sorted."""
    if s.dtype != object:
        return pd.factorize(s, sort=True)[0]
    codes, uniq = factorize_objects(s.to_numpy())
    rank = pd.factorize(uniq, sort=True)[0]  # distinct values: each one's place among them, sorted
    return np.where(codes >= 0, rank[codes], -1) if len(uniq) else codes


def _stable_order(codes: np.ndarray) -> np.ndarray:
    """``np.argsort(codes, kind="stable")`` for integer codes >= -1: codes that fit 16 bits sort by
    radix, 5-7x faster than a merge sort of int64 at a million rows."""
    if len(codes) and int(codes.max()) + 1 < 2**16:
        return np.argsort((codes + 1).astype(np.uint16), kind="stable")
    return np.argsort(codes, kind="stable")


def rows_of(frame: pd.DataFrame, instance: str) -> pd.DataFrame:
    """The rows of ``frame`` that belong to ``instance``: the frame itself when all do (one engine,
    the common case), without copying a million rows."""
    if not len(frame):
        return frame
    mine = equal(frame["instance"], instance)  # labels.equal: no str object per row of a str column
    return frame if mine.all() else frame[mine]


def spike_rows(sig: pd.DataFrame, positions: np.ndarray) -> list:
    """The rows at ``positions`` as column -> value mappings holding what ``sig.iloc[i][col]`` holds.

    Attribution reads a spike row ~50 times; a dict answers each read ~20x faster than a Series,
    and building the rows column by column avoids one row extraction per spike. A frame with a
    repeated column name keeps the Series rows (a Series returns every column of that name).
    """
    if not sig.columns.is_unique:
        return [sig.iloc[i] for i in positions]
    sub = sig.iloc[positions]
    # str columns as object arrays: the same str and missing values their .array yields, without
    # pandas' Python iterator per element (a dozen such columns of 20 000 spikes)
    cols = [(c, sub[c].to_numpy() if isinstance(sub[c].dtype, (np.dtype, pd.StringDtype)) else sub[c].array)
            for c in sub.columns]
    names = [c for c, _ in cols]
    return [dict(zip(names, vals)) for vals in zip(*(v for _, v in cols))]  # zip: the loops run in C


def step_timing(steps: pd.DataFrame) -> pd.DataFrame:
    """Per-instance ``gap_before_s`` and ``latency_s`` of step rows (sorted by instance, step).

    ``gap_before_s`` is the idle time since the previous step ended (0 for the first step);
    ``latency_s`` is ``gap_before_s + duration``.
    """
    inst = _group_codes(steps["instance"])
    order = np.lexsort((steps["step"].to_numpy(), inst))  # stable, as sort_values(kind="stable")
    s = steps.take(order) if np.any(order != np.arange(len(order))) else steps
    inst, start, end = inst[order], s["t_start_s"].to_numpy(dtype="float64"), s["t_end_s"].to_numpy(dtype="float64")
    gap = np.zeros(len(s))
    if len(s) > 1:
        same = inst[1:] == inst[:-1]
        gap[1:] = np.where(same, np.maximum(start[1:] - end[:-1], 0.0), 0.0)
    out = s.assign(gap_before_s=gap, duration_s=end - start)
    out["latency_s"] = gap + (end - start)
    return out


def itl_events(tokens: pd.DataFrame) -> pd.DataFrame:
    """ITL events of one instance's tokens with the previous event's time and step per request.

    Columns ``t_s``, ``step``, ``prev_t_s``, ``prev_step``, ``itl_s``, ordered by request (sorted
    ids) then time (the tokens frame's own order within a request: its times never go back).
    """
    rid = _group_codes(tokens["request_id"])
    order = _stable_order(rid)
    rid = rid[order]
    t = tokens["t_s"].to_numpy(dtype="float64")[order]
    step = tokens["step"].to_numpy(dtype="float64")[order]
    keep = np.zeros(len(order), dtype=bool)
    keep[1:] = (rid[1:] == rid[:-1]) & (rid[1:] >= 0)
    pos = np.flatnonzero(keep)
    # copy=False: fresh columns, not stacked into one block (a second copy of a million events)
    return pd.DataFrame({"t_s": t[pos], "step": step[pos], "prev_t_s": t[pos - 1], "prev_step": step[pos - 1],
                         "itl_s": t[pos] - t[pos - 1]}, copy=False)


def itl_values(tokens: pd.DataFrame) -> np.ndarray:
    """Every inter-token latency of a tokens frame (any instances): the ``itl_s`` values of
    ``Timeline.itl()`` grouped by request instead of by time - enough for quantiles and the max,
    without building the frame (a third of the cost at 1.6 M events)."""
    names = tokens["instance"].to_numpy()
    one = len(names) and (names == names[0]).all()
    inst = np.zeros(len(names), dtype=np.intp) if one else pd.factorize(names)[0]
    rid = pd.factorize(tokens["request_id"])[0]
    key = inst.astype(np.int64) * (int(rid.max(initial=0)) + 1) + rid
    order = _stable_order(key)  # within a request the frame is in time order already
    k, t = key[order], tokens["t_s"].to_numpy(dtype="float64")[order]
    same = (k[1:] == k[:-1]) & (inst[order][1:] >= 0) & (rid[order][1:] >= 0)
    return (t[1:] - t[:-1])[same]


def _count_at_most(ids: np.ndarray, x: np.ndarray) -> np.ndarray:
    """``np.searchsorted(ids, x, side="right")``: how many of the sorted ``ids`` are <= each ``x``.

    Step ids are integers numbered (nearly) densely, and a million token events look up a few hundred
    thousand of them: a table holding the answer for every integer in the ids' range answers each look-up
    with one read instead of a binary search (~5x faster at 1.6 M events). Exact: an integer id is <= x
    exactly when it is <= floor(x). Other ids (not integers, unsorted, sparse) take the binary search."""
    n = len(ids)
    if n == 0 or len(x) < n or ids.dtype.kind not in "iuf" or x.dtype != np.float64 or bool(np.isnan(x).any()):
        return np.searchsorted(ids, x, side="right")
    lo, hi = ids[0], ids[-1]
    if not (np.isfinite(lo) and np.isfinite(hi)) or hi - lo > 4 * n + 1024 or bool(np.any(ids[1:] < ids[:-1])) \
            or (ids.dtype.kind == "f" and not bool(np.all(ids == np.floor(ids)))):
        return np.searchsorted(ids, x, side="right")
    span = int(hi - lo) + 1
    # the answer for each integer lo..hi, and before them 0 (below the first id), after them n (above the last)
    table = np.concatenate(([0], np.searchsorted(ids, np.arange(int(lo), int(hi) + 1), side="right"), [n]))
    rel = np.floor(x) - lo
    np.clip(rel, -1, span, out=rel)
    return table[rel.astype(np.intp) + 1]


def gap_spans(steps: pd.DataFrame, itl: pd.DataFrame) -> tuple[np.ndarray, np.ndarray]:
    """Positions ``[lo, hi)`` in ``steps`` (one instance's step rows, sorted by step) of the steps each
    inter-token gap of ``itl`` spans: by step id where the event and the previous one have one, else the
    steps that ended within (previous event, this event], with 1 ms of slack for tokens stamped just
    before the step's end was recorded."""
    step_ids = steps["step"].to_numpy()
    ends = steps["t_end_s"].to_numpy()
    cur, prev = itl["step"].to_numpy(dtype="float64"), itl["prev_step"].to_numpy(dtype="float64")
    have_step = ~(np.isnan(cur) | np.isnan(prev))
    lo = np.empty(len(itl), dtype=np.int64)
    hi = np.empty(len(itl), dtype=np.int64)
    every = bool(have_step.all())  # the usual case: no mask copies of a million events
    lo[have_step] = _count_at_most(step_ids, prev if every else prev[have_step])
    hi[have_step] = _count_at_most(step_ids, cur if every else cur[have_step])
    if not every:
        tol = 1e-3
        lo[~have_step] = np.searchsorted(ends, itl["prev_t_s"].to_numpy()[~have_step] + tol, side="right")
        hi[~have_step] = np.searchsorted(ends, itl["t_s"].to_numpy()[~have_step] + tol, side="right")
    return lo, hi


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
    lo, hi = gap_spans(steps, itl)
    vals = itl["itl_s"].to_numpy(dtype="float64")
    width = np.maximum(hi - lo, 0)
    # Every (gap, step) pair the gaps cover, flattened: almost all gaps cover one step, a request
    # that sat out steps (stall, preemption) covers several.
    covered = np.repeat(lo, width) + (np.arange(int(width.sum())) - np.repeat(np.cumsum(width) - width, width))
    events += np.bincount(covered, minlength=n)
    peak = np.full(n, -np.inf)
    np.maximum.at(peak, covered, np.repeat(vals, width))
    itl_max = np.where(events > 0, peak, np.nan)
    multi = width > 1
    if multi.any():
        wait = np.full(n, -np.inf)
        np.maximum.at(wait, lo[multi], vals[multi])
        stall_max = np.where(np.isfinite(wait), wait, np.nan)
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


def grouped_baseline(values: pd.Series, reference: pd.Series, window: int, min_periods: int,
                     groups: np.ndarray) -> pd.Series:
    """The baseline :func:`rolling_baseline` gives each group's rows
    alone (its centred rolling median over reference rows, filled from the nearest ones; the
    group's median when it has no reference row): the interval path reads only the baseline."""
    v = values.astype("float64")
    ref = reference.fillna(False).astype(bool) & v.notna()
    n_ref = gw.per_group(ref.to_numpy().astype(np.int64), groups, np.add)
    ref = ref.where(pd.Series(n_ref[groups] >= min_periods, index=v.index), v.notna())
    n_ref = gw.per_group(ref.to_numpy().astype(np.int64), groups, np.add)
    need = np.minimum(min_periods, np.maximum(n_ref, 1))[groups]
    x = v.where(ref)
    base = gw.rolling_median(x, window, 1, groups)
    if (need > 1).any():  # rolling(min_periods=need): a window with fewer values gives no median
        count = x.notna().astype(float).groupby(groups, sort=False).rolling(window, center=True, min_periods=1).sum()
        base = base.where(count.to_numpy() >= need)
    base = gw.bfill(gw.ffill(base, groups), groups)
    lost = gw.all_(base.isna(), groups)
    if lost.any():
        base = base.where(~lost, gw.median(v, groups))  # NaN for a group without any value
    return base


def is_spike(latency: pd.Series, baseline: pd.Series, sigma: pd.Series, cfg: SpikeConfig) -> pd.Series:
    """Latency above ``ratio x baseline`` and above ``baseline + mad_k x sigma``."""
    thr = np.maximum(cfg.ratio * baseline, baseline + cfg.mad_k * sigma)
    return (latency > thr) & latency.notna() & baseline.notna()
