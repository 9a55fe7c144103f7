"""Which rows of one server count its token time (budget, regimes, the headline ITL) when several views of
it were read: each gap between two tokens is counted once, by the finer view (docs/contracts.md section 5)."""
from __future__ import annotations

import numpy as np
import pandas as pd

from mixdiag.diagnosis.evidence.fusion import engine_keys, listed_servers


def counted_once(steps: pd.DataFrame, frames: list, meta: dict) -> pd.DataFrame:
    """The rows of ``steps`` whose latency is counted (budget, regimes): where a server has a step view
    with per-step latency (client records, a log, a trace) and an interval view (scrapes), both measured
    the same token gaps over the time both cover, and counting both would add one server's excess twice.
    The finer view counts there: the step view's rows when they are shorter than half a scrape interval
    (per step), else the interval rows - a log's window rows (SGLang's Decode line every 40 forwards)
    average as many gaps as a scrape does, with fewer rows and no histogram. The other view's rows whose
    midpoint lies in that common span are left out; rows outside it still count (scrapes that ran longer
    than the log)."""
    if len(frames) < 2 or "latency_s" not in steps.columns:  # one view (frame): nothing counted twice
        return steps
    key = engine_keys(frames, listed_servers(meta))
    span: dict = {}
    row_s: dict = {}
    for f in frames:
        if not len(f) or not (f["granularity"] == "step").any():
            continue
        st = f[(f["granularity"] == "step") & (pd.to_numeric(f["latency_s"], errors="coerce") > 0)]
        if len(st) >= 3:
            eng = key(str(f["instance"].iloc[0]))
            lo, hi = float(st["t_start_s"].min()), float(st["t_end_s"].max())
            span[eng] = (min(lo, span.get(eng, (lo, hi))[0]), max(hi, span.get(eng, (lo, hi))[1]))
            dur = st["t_end_s"] - st["t_start_s"]
            if "window_start_s" in st.columns:  # a window row: a stamp that stands for the time since the last
                dur = np.fmax(dur, pd.to_numeric(st["window_end_s"], errors="coerce")
                              - pd.to_numeric(st["window_start_s"], errors="coerce"))
            row_s[eng] = float(dur.median())
    iv = (steps["granularity"] == "interval").to_numpy()
    if not span or not iv.any():
        return steps
    names = steps["instance"].astype(str).to_numpy()
    uniq, inv = np.unique(names, return_inverse=True)  # one key() per instance, not per row (200 k rows)
    engines = np.array([key(u) for u in uniq], dtype=object)[inv] if len(names) else names
    drop = np.zeros(len(steps), dtype=bool)
    t0, t1 = steps["t_start_s"].to_numpy(dtype="float64"), steps["t_end_s"].to_numpy(dtype="float64")
    mid = 0.5 * (t0 + t1)  # a row straddling the span's edge goes with the side holding most of it
    lat = pd.to_numeric(steps["latency_s"], errors="coerce").to_numpy(dtype="float64")
    for inst in np.unique(names[iv]):
        eng = key(inst)
        if eng not in span:
            continue
        lo, hi = span[eng]
        mine = iv & (names == inst)
        if row_s[eng] >= 0.5 * float(np.nanmedian(t1[mine] - t0[mine])):  # the step view is no finer
            drop |= ~iv & (engines == eng) & (mid >= lo) & (mid <= hi)
            # ... and its rows that measured no latency (a log line's stamp alone) count nowhere
            drop |= ~iv & (engines == eng) & ~(lat > 0)
        else:
            drop |= mine & (mid >= lo) & (mid <= hi)
    return steps[~drop] if drop.any() else steps
