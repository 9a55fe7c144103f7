"""What a decode batch shape costs, measured: the evidence of a graph fallback that needs no graph mode.

A decode-only step's time grows at most in proportion to its rows (decode is memory-bound, so far
less in practice). A batch size whose decode steps *all* cost much more than the next smaller size
seen - more than the extra rows explain - pays a per-shape cost: the step leaves the captured
CUDA graph and launches every kernel eagerly (or, on CPU, the reference engine's launch-cost model
of the same). That jump is measured from step times alone, so it stands where the graph mode is
only planned from the batch shape (``estimated``) and may not corroborate anything.

``shape_cost_x`` per decode-only row: (median latency of decode-only steps with this ``decode_reqs``
/ median latency of those with the reference size) / (this size / the reference size). Sizes are
walked upwards; the reference is the largest smaller size that did not itself jump (so every size
past a jump is measured against the last size before it); sizes need ``min_rows`` steps. NaN where
a size has fewer steps or nothing smaller to compare with. ``shape_ref_reqs`` names the reference.
"""
from __future__ import annotations

import numpy as np
import pandas as pd


def shape_cost(sig: pd.DataFrame, usable: pd.Series, min_rows: int, jump: float) -> pd.DataFrame:
    """``shape_cost_x`` and ``shape_ref_reqs`` for ``sig``'s rows (see the module doc). ``usable``:
    decode-only rows free of other evidenced faults (transfers, preemptions), whose latency counts;
    ``jump``: the ``shape_cost_x`` at which a size stops serving as a reference."""
    out = pd.DataFrame({"shape_cost_x": np.nan, "shape_ref_reqs": np.nan}, index=sig.index)
    if "decode_reqs" not in sig.columns:
        return out
    reqs = pd.to_numeric(sig["decode_reqs"], errors="coerce")
    ok = usable & reqs.gt(0) & sig["latency_s"].notna()
    if not ok.any():
        return out
    med = sig.loc[ok, "latency_s"].groupby(reqs[ok]).agg(["median", "size"])
    med = med[med["size"] >= min_rows].sort_index()
    by_size: dict[float, tuple[float, float]] = {}
    ref = None
    for size, cost in zip(med.index.to_numpy(dtype=float), med["median"].to_numpy(dtype=float)):
        if ref is not None and ref[1] > 0:
            x = (cost / ref[1]) / (size / ref[0])
            by_size[size] = (float(x), ref[0])
            if x >= jump:
                continue  # a jumped size is no reference for the sizes above it
        ref = (size, cost)
    rows = sig["decode_only"].astype(bool) & reqs.isin(list(by_size))
    out.loc[rows, "shape_cost_x"] = [by_size[r][0] for r in reqs[rows]]
    out.loc[rows, "shape_ref_reqs"] = [by_size[r][1] for r in reqs[rows]]
    return out
