"""Columns of a diagnosis frame as numpy arrays, converted once over all rows and then sliced, for
stages that visit each instance's rows in turn (detection/regimes.py, rules/decomposition.py).

Why: the regime stage reads ~25 columns of every instance. Converting each instance's columns again
(``pd.to_numeric``, ``fillna``, a label comparison: ~50 us each) costs ~1 ms an instance, seconds for
a fleet of 2000 interval-only instances. Every conversion here is per row, so converting the whole
column once and slicing gives, row for row, what converting the slice gives.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from mixdiag.diagnosis.labels import label_in


class RowArrays:
    """Rows ``pos`` (all when None) of ``frame``, read as arrays; conversions are cached on the whole
    column and shared by every :meth:`take` of the same frame."""

    def __init__(self, frame: pd.DataFrame, pos: np.ndarray | None = None, _cache: dict | None = None):
        self.frame = frame
        self.pos = pos
        self._cache = {} if _cache is None else _cache

    def __len__(self) -> int:
        return len(self.frame) if self.pos is None else len(self.pos)

    def take(self, pos) -> "RowArrays":
        """These rows' rows at positions ``pos`` (a slice or an integer array)."""
        base = np.arange(len(self.frame)) if self.pos is None else self.pos
        return RowArrays(self.frame, base[pos], self._cache)

    def forget(self) -> None:
        """Drop every converted column (shared by every :meth:`take`); a later read converts again."""
        self._cache.clear()

    def has(self, col: str) -> bool:
        return col in self.frame.columns

    def _get(self, key: tuple, convert) -> np.ndarray:
        full = self._cache.get(key)
        if full is None:
            full = self._cache[key] = convert()
        return full if self.pos is None else full[self.pos]

    def raw(self, col: str) -> np.ndarray:
        """``frame[col].to_numpy()`` of these rows."""
        return self._get(("raw", col), lambda: self.frame[col].to_numpy())

    def num(self, col: str) -> np.ndarray:
        """``pd.to_numeric(frame[col], errors="coerce")`` as float64 (NaN where missing or no column)."""
        if col not in self.frame.columns:
            return np.full(len(self), np.nan)
        s = self.frame[col]
        if s.dtype == np.float64:
            a = s.to_numpy()
            if a.ndim == 1 and len(a) and a.strides == (0,):
                # one value broadcast over every row (schema_validate.nan_columns: a column no source filled):
                # to_numeric leaves float64 as it is, so these rows read that value, as a read-only broadcast
                # without memory per row (nine such columns of a million rows were 72 MB, and 8 MB a take)
                return np.broadcast_to(a[:1], (len(self),))
        return self._get(("num", col), lambda: pd.to_numeric(self.frame[col], errors="coerce").to_numpy(dtype="float64"))

    def flag(self, col: str) -> np.ndarray:
        """``frame[col].fillna(False)`` as bool (False without the column)."""
        if col not in self.frame.columns:
            return np.zeros(len(self), dtype=bool)
        return self._get(("flag", col), lambda: self.frame[col].fillna(False).to_numpy(dtype=bool))

    def bools(self, col: str) -> np.ndarray:
        """``frame[col].to_numpy(dtype=bool)`` of these rows; a column that cannot be converted whole (a
        missing value in rows not asked for) is converted for these rows alone."""
        try:
            return self._get(("bools", col), lambda: self.frame[col].to_numpy(dtype=bool))
        except (TypeError, ValueError):
            rows = self.frame[col] if self.pos is None else self.frame[col].iloc[self.pos]
            return rows.to_numpy(dtype=bool)

    def label_in(self, col: str, values, na: str = "") -> np.ndarray:
        """:func:`~mixdiag.diagnosis.labels.label_in` of ``frame[col]``."""
        return self._get(("label_in", col, tuple(values), na), lambda: label_in(self.frame[col], values, na=na))


def as_rows(rows) -> RowArrays:
    """``rows`` as :class:`RowArrays` (a frame is wrapped, RowArrays pass through)."""
    return rows if isinstance(rows, RowArrays) else RowArrays(rows)
