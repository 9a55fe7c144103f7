"""Step-class kernel times of two captures side by side, over the kernel breakdown's frames.

Input frames (the breakdown's ``kernels`` frame, issue 25 item 1): one row per (instance, rank,
step_class, kernel) with ``time_s`` (device time of that kernel in steps of that class) and ``share``
(its share of the class's kernel time). Ranks and instances are summed: a diff compares what a step
class spent on a kernel, not which GPU ran it (the breakdown itself names stragglers).

Shares are compared as well as seconds: two captures of different length spend different seconds on
every kernel, while a kernel's share of its step class moves only when the work changed. The share
here is recomputed from the summed seconds (time / the class's total), so it is consistent after
summing ranks.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from mixdiag.errors import UserError

#: columns the breakdown's kernels frame must have
KERNEL_COLUMNS = ("instance", "rank", "step_class", "kernel", "time_s", "share")
#: columns of :func:`kernel_diff`'s frame
KERNEL_DIFF_COLUMNS = ["step_class", "kernel", "time_before_s", "time_after_s", "change_s", "change_pct",
                       "share_before", "share_after", "share_change", "status"]


def _summed(frame: pd.DataFrame, side: str) -> pd.DataFrame:
    missing = [c for c in KERNEL_COLUMNS if c not in frame.columns]
    if missing:
        raise UserError(f"{side} kernel frame lacks column(s) {', '.join(missing)} (expected {', '.join(KERNEL_COLUMNS)})")
    t = pd.to_numeric(frame["time_s"], errors="coerce")
    if (t < 0).any():
        raise UserError(f"{side} kernel frame has negative time_s")
    g = frame.assign(time_s=t.fillna(0.0)).groupby(["step_class", "kernel"], sort=True)["time_s"].sum()
    return g.to_frame("time_s")


def kernel_diff(before: pd.DataFrame, after: pd.DataFrame) -> pd.DataFrame:
    """Per (step_class, kernel): seconds and share of the class before and after, the change, and
    ``status`` (``both``, ``new`` - only after, ``gone`` - only before). Sorted by step class, then by
    the size of the change in share, largest first."""
    b, a = _summed(before, "BEFORE"), _summed(after, "AFTER")
    j = b.add_suffix("_before").join(a.add_suffix("_after"), how="outer")
    tb = j["time_s_before"].fillna(0.0)
    ta = j["time_s_after"].fillna(0.0)
    cls = j.index.get_level_values("step_class")
    share_b = tb / tb.groupby(cls).transform("sum").replace(0.0, np.nan)
    share_a = ta / ta.groupby(cls).transform("sum").replace(0.0, np.nan)
    status = np.where(j["time_s_before"].isna(), "new", np.where(j["time_s_after"].isna(), "gone", "both"))
    with np.errstate(divide="ignore", invalid="ignore"):
        pct = np.where(tb > 0, 100 * (ta - tb) / tb, np.nan)
    out = pd.DataFrame({"step_class": cls, "kernel": j.index.get_level_values("kernel"),
                        "time_before_s": tb.to_numpy(), "time_after_s": ta.to_numpy(),
                        "change_s": (ta - tb).to_numpy(), "change_pct": pct,
                        "share_before": share_b.fillna(0.0).to_numpy(), "share_after": share_a.fillna(0.0).to_numpy(),
                        "status": status})
    out["share_change"] = out["share_after"] - out["share_before"]
    out = out.assign(_k=-out["share_change"].abs()).sort_values(["step_class", "_k", "kernel"], kind="stable")
    return out.drop(columns="_k").reset_index(drop=True)[KERNEL_DIFF_COLUMNS]


def kernels_of(timeline, diagnosis) -> pd.DataFrame | None:
    """The device breakdown's ``kernels`` frame (columns KERNEL_COLUMNS) of one capture, or None for a
    capture without device activity (logs, scrapes, client records, a CPU-only trace)."""
    from mixdiag.diagnosis.breakdown import breakdown
    b = breakdown(timeline, diagnosis)
    if b.status != "ok" or not len(b.kernels):
        return None
    return b.kernels
