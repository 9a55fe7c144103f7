"""Row operations that stay inside an instance: shifts, fills and centred rolling medians over a
frame holding many instances' rows, each instance's rows contiguous (a fleet's interval rows,
diagnosed in one pass instead of one small frame per instance).

``groups`` is an integer code per row: 0, 1, ... in row order, one code per instance, each
instance's rows contiguous; ``None`` means the whole series is one instance and the plain pandas
operation runs. Each grouped operation gives,
row for row, what the plain operation gives on each instance's rows alone (pandas' grouped
kernels run the same window algorithms over each group's bounds).
"""
from __future__ import annotations

import numpy as np
import pandas as pd


def shift(s: pd.Series, n: int, fill, groups: np.ndarray | None) -> pd.Series:
    """``s.shift(n, fill_value=fill)`` within each group."""
    if groups is None:
        return s.shift(n, fill_value=fill)
    return s.groupby(groups, sort=False).shift(n, fill_value=fill)


def ffill(s: pd.Series, groups: np.ndarray | None) -> pd.Series:
    """``s.ffill()`` within each group."""
    return s.ffill() if groups is None else s.groupby(groups, sort=False).ffill()


def bfill(s: pd.Series, groups: np.ndarray | None) -> pd.Series:
    """``s.bfill()`` within each group."""
    return s.bfill() if groups is None else s.groupby(groups, sort=False).bfill()


def rolling_median(s: pd.Series, window: int, min_periods: int, groups: np.ndarray | None) -> pd.Series:
    """``s.rolling(window, center=True, min_periods=min_periods).median()`` within each group."""
    if groups is None:
        return s.rolling(window, center=True, min_periods=min_periods).median()
    out = s.groupby(groups, sort=False).rolling(window, center=True, min_periods=min_periods).median()
    return pd.Series(out.to_numpy(), index=out.index.get_level_values(-1)).reindex(s.index)


def any_(mask: pd.Series, groups: np.ndarray | None) -> pd.Series:
    """Per row: whether any row of its group is True (``mask.any()`` broadcast)."""
    if groups is None:
        return pd.Series(bool(mask.any()), index=mask.index)
    return pd.Series(per_group(mask.to_numpy(dtype=bool), groups, np.logical_or)[groups], index=mask.index)


def all_(mask: pd.Series, groups: np.ndarray | None) -> pd.Series:
    """Per row: whether every row of its group is True (``mask.all()`` broadcast)."""
    return ~any_(~mask.astype(bool), groups)


def median(s: pd.Series, groups: np.ndarray | None) -> pd.Series:
    """Per row: the median of its group's non-missing values (``s.median()`` broadcast)."""
    if groups is None:
        return pd.Series(float(s.median()), index=s.index)
    return s.groupby(groups, sort=False).transform("median")


def quantile(s: pd.Series, q: float, groups: np.ndarray | None) -> pd.Series:
    """Per row: the ``q`` quantile of its group's non-missing values (``s.quantile(q)`` broadcast)."""
    if groups is None:
        return pd.Series(float(s.quantile(q)), index=s.index)
    g = np.asarray(groups)
    per = s.groupby(g, sort=True).quantile(q)  # one cythonized pass (a fleet has thousands of groups)
    out = per.reindex(np.arange(int(g.max()) + 1 if len(g) else 0)).to_numpy(dtype=float)
    return pd.Series(out[g], index=s.index)


def per_group(values: np.ndarray, groups: np.ndarray, ufunc) -> np.ndarray:
    """``ufunc.reduce`` of ``values`` over each group; groups are numbered 0, 1, ... in row order."""
    return ufunc.reduceat(values, bounds(groups)[:-1]) if len(groups) else values[:0]


def bounds(groups: np.ndarray) -> np.ndarray:
    """Start positions of each contiguous group plus the end: group ``g`` is ``[b[g], b[g + 1])``."""
    return np.flatnonzero(np.r_[True, groups[1:] != groups[:-1], True]) if len(groups) else np.array([0])
