"""Step rows as columns: the dict-row rules of :mod:`log_lines` on a DataFrame.

A 10-minute vLLM iteration log has a million step rows; as dicts they cost seconds and a
gigabyte. These functions do what :func:`log_lines.attach_events` and ``LogRows.timeline`` do to
dict rows - same rule, same floating-point operations in the same order - on a frame.
"""
from __future__ import annotations

import math

import numpy as np
import pandas as pd


def attach_events_frame(df: pd.DataFrame, events: list[tuple]) -> int:
    """:func:`log_lines.attach_events` on a frame (columns added or updated in place); returns the orphans."""
    inst = df["instance"].to_numpy(dtype=object)
    present = set(pd.unique(inst)) if len(inst) else set()
    by_inst: dict[str, list[tuple]] = {}
    orphans = 0
    for e in events:
        if e[0] not in present or e[1] is None or not math.isfinite(e[3]):
            orphans += 1
        else:
            by_inst.setdefault(e[0], []).append(e)
    if not by_inst:
        return orphans
    t0_all = df["t_start_s"].to_numpy(dtype=float)
    t1_all = df["t_end_s"].to_numpy(dtype=float)
    cols: dict[str, np.ndarray] = {}
    for k, evs in by_inst.items():
        pos = np.flatnonzero(inst == k)
        # untimed rows first, then by start; stable, so line order within a time
        pos = pos[np.argsort(np.where(np.isnan(t0_all[pos]), -np.inf, t0_all[pos]), kind="stable")]
        targets = event_rows(t0_all[pos], t1_all[pos], np.array([e[1] for e in evs], dtype=float))
        acc: dict[tuple[int, str], tuple[str, list[float]]] = {}
        for e, i in zip(evs, targets.tolist()):
            if i < 0:
                orphans += 1
                continue
            acc.setdefault((i, e[2]), (e[4], []))[1].append(e[3])
        for (i, col), (how, nums) in acc.items():
            if col not in cols:
                cols[col] = df[col].to_numpy(dtype=float, copy=True) if col in df else np.full(len(df), np.nan)
            arr = cols[col]
            prev = float(arr[pos[i]])
            base = prev if math.isfinite(prev) and how == "sum" else 0.0
            arr[pos[i]] = base + sum(nums) if how == "sum" else min(nums) if how == "min" else sum(nums) / len(nums)
    for col, arr in cols.items():
        df[col] = arr
    return orphans


def event_rows(t0: np.ndarray, t1: np.ndarray, t: np.ndarray) -> np.ndarray:
    """Index into rows with starts ``t0`` and ends ``t1`` (sorted by start, untimed = NaN first) of
    each event time's row (the rule of :func:`attach_events`), -1 for none."""
    n = len(t0)
    idx = np.arange(n)
    out = np.full(len(t), -1, dtype=np.int64)
    # step rows: the last one (in row order) starting at or before t
    step = idx[t1 == t0]
    if len(step):
        k = np.searchsorted(t0[step], t, side="right") - 1
        out = np.where(k >= 0, step[np.maximum(k, 0)], out)
    # interval rows: the first (in row order) with t0 < t <= t1. Among those starting before t, the
    # first whose end reaches t is where the running maximum of the ends first reaches t.
    iv = idx[t1 > t0]
    if len(iv):
        starts_before = np.searchsorted(t0[iv], t, side="left")
        j = np.searchsorted(np.maximum.accumulate(t1[iv]), t, side="left")
        out = np.where(j < starts_before, iv[np.minimum(j, len(iv) - 1)], out)
    # logged before every row: the first row, when it ends at or after the event
    if n and not math.isnan(t0[0]):
        out = np.where((out < 0) & (t1[0] >= t), 0, out)
    return out


def order_steps(df: pd.DataFrame) -> tuple[pd.DataFrame, int]:
    """Rows sorted by (instance, start), stable; time kept from going backwards; ``step`` numbered.

    Returns the frame and how many rows were moved forward (logged earlier than the row before).
    """
    codes, _ = pd.factorize(df["instance"], sort=True)
    t0 = df["t_start_s"].to_numpy(dtype=float)
    order = np.lexsort((t0, codes))  # stable: line order within a time
    df = df.take(order).reset_index(drop=True)
    codes, t0 = codes[order], t0[order]
    same = codes[1:] == codes[:-1]
    clamped = 0
    if np.any(same & (t0[1:] < t0[:-1])):
        # rare (a clock step, reordered lines): the row-by-row rule, exact to the last bit
        t1 = df["t_end_s"].to_numpy(dtype=float)
        a0, a1, c = t0.tolist(), t1.tolist(), codes.tolist()
        last: dict[int, float] = {}
        for i in range(len(a0)):
            if c[i] in last and a0[i] < last[c[i]]:
                shift = last[c[i]] - a0[i]
                a0[i], a1[i] = a0[i] + shift, a1[i] + shift
                clamped += 1
            last[c[i]] = a0[i]
        df["t_start_s"], df["t_end_s"] = np.array(a0), np.array(a1)
    first = np.searchsorted(codes, codes, side="left")
    df["step"] = np.arange(len(df), dtype=np.int64) - first
    return df, clamped
