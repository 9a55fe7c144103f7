"""Server-side downsampling that keeps spikes visible.

A browser cannot draw 200 000 steps (or millions of tokens) per panel, and it does not need to:
a panel a thousand pixels wide shows at most a thousand columns. For each pixel bucket of the
visible x-range we keep the point with the smallest and the one with the largest y, so every
spike (and every dip) stays on screen at any zoom level; the dashboard re-samples the visible
range whenever the user zooms.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

#: Points kept per trace when nothing else is said: two per bucket of ~1000 buckets.
DEFAULT_MAX_POINTS = 2000


def window(x: np.ndarray, x_range: tuple[float, float] | None) -> tuple[int, int]:
    """Slice bounds [lo, hi) of the sorted array ``x`` that cover ``x_range`` plus one point each side.

    The extra neighbour on each side keeps lines running to the panel edges when zoomed in.
    """
    n = len(x)
    if x_range is None or n == 0:
        return 0, n
    x0, x1 = sorted(float(v) for v in x_range)
    lo = max(int(np.searchsorted(x, x0, side="left")) - 1, 0)
    hi = min(int(np.searchsorted(x, x1, side="right")) + 1, n)
    return lo, hi


def minmax_indices(x: np.ndarray, y: np.ndarray, max_points: int = DEFAULT_MAX_POINTS,
                   x_range: tuple[float, float] | None = None) -> np.ndarray:
    """Indices into ``x``/``y`` (x sorted ascending) to draw: min and max y per x-bucket.

    Only the part of the data within ``x_range`` (and one neighbour each side) is considered.
    When it holds at most ``max_points`` points all of them are returned. Otherwise the window
    is cut into ``max_points // 2`` equal-width x-buckets and the arg-min and arg-max of y in
    each non-empty bucket are kept (NaN y values are never chosen over a number). The result
    is sorted and unique, so it can index both arrays directly. O(n) in the window size.
    """
    x = np.asarray(x, dtype="float64")
    y = np.asarray(y, dtype="float64")
    if x.shape != y.shape or x.ndim != 1:
        raise ValueError(f"x and y must be 1-D arrays of one length, got {x.shape} and {y.shape}")
    if max_points < 2:
        raise ValueError("max_points must be at least 2")
    lo, hi = window(x, x_range)
    n = hi - lo
    if n <= max_points:
        return np.arange(lo, hi)
    xs, ys = x[lo:hi], y[lo:hi]
    n_buckets = max_points // 2
    span = xs[-1] - xs[0]
    if span <= 0:
        bucket = np.minimum((np.arange(n) * n_buckets) // n, n_buckets - 1)
    else:
        bucket = np.minimum(((xs - xs[0]) / span * n_buckets).astype(np.int64), n_buckets - 1)
    # x is sorted, so each bucket is one contiguous run: reduce per run, no sort needed (O(n)).
    starts = np.flatnonzero(np.r_[True, bucket[1:] != bucket[:-1]])
    lengths = np.diff(np.r_[starts, n])
    first_max = _first_extreme(np.where(np.isnan(ys), -np.inf, ys), starts, lengths, np.maximum)
    first_min = _first_extreme(np.where(np.isnan(ys), np.inf, ys), starts, lengths, np.minimum)
    return lo + np.unique(np.concatenate([first_min, first_max]))


def _first_extreme(v: np.ndarray, starts: np.ndarray, lengths: np.ndarray, op) -> np.ndarray:
    """Index of the first extreme (``op`` = np.maximum or np.minimum) of ``v`` in each run."""
    ext = op.reduceat(v, starts)
    hit = np.flatnonzero(v == np.repeat(ext, lengths))
    # the first hit at or after each run's start lies inside that run (the run holds its extreme)
    return hit[np.searchsorted(hit, starts)]


def bucket_first_of_each(x: np.ndarray, category: np.ndarray, max_points: int = DEFAULT_MAX_POINTS,
                         x_range: tuple[float, float] | None = None) -> np.ndarray:
    """Indices that keep, per x-bucket, the first point of every distinct category.

    For categorical panels (graph mode per step): a bucket holding FULL, PIECEWISE and NONE
    steps still shows all three, however far out the user zooms.
    """
    x = np.asarray(x, dtype="float64")
    lo, hi = window(x, x_range)
    n = hi - lo
    if n <= max_points:
        return np.arange(lo, hi)
    xs = x[lo:hi]
    codes, cats = pd.factorize(pd.Series(np.asarray(category)[lo:hi]), sort=False)  # hashing, not sorting objects
    n_buckets = max(max_points // max(len(cats), 1), 1)
    span = xs[-1] - xs[0]
    bucket = (np.minimum(((xs - xs[0]) / span * n_buckets).astype(np.int64), n_buckets - 1)
              if span > 0 else np.zeros(n, dtype=np.int64))
    key = bucket * len(cats) + codes
    _, first = np.unique(key, return_index=True)
    return lo + np.sort(first)
