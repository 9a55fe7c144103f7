"""One quantile of several arrays that lie above a common floor, from one partition of a million values
instead of one each.

The budget asks the P99 of an instance's token gaps three ways and more: as measured, with every unit's
excess removed (the floor) and, per cause, with that cause's excess removed. Removing excess only
lowers a unit, and never below its floor value, so every such array ``y`` satisfies ``floor <= y``
element by element. With ``cut`` the floor's k-th smallest value (k the quantile's lower rank), at most
k values of any such ``y`` lie below ``cut``, so ``y``'s k-th and (k+1)-th smallest values are among
its values at or above ``cut`` - about 1 % of them at the P99 - at ranks shifted by how many lie below.

Values are numpy's default (``method="linear"``) quantile bit for bit: the same two order statistics,
interpolated with numpy's own arithmetic (``numpy.lib._function_base_impl._lerp``).
"""
from __future__ import annotations

import math

import numpy as np

#: below this many values a plain np.quantile costs little and is taken (no selection to gain from)
MIN_VALUES = 4096


def _lerp(a: float, b: float, t: float) -> float:
    """numpy's linear interpolation between two neighbouring order statistics (its ``_lerp``: from the
    upper neighbour when ``t >= 0.5``, for symmetry)."""
    d = b - a
    return float(b - d * (1 - t)) if t >= 0.5 else float(a + d * t)


class FloorQuantile:
    """``np.quantile(y, q)`` for arrays ``y`` at or above ``floor`` element by element (see module doc)."""

    def __init__(self, floor: np.ndarray, q: float):
        self.q, self.n = q, len(floor)
        virtual = (self.n - 1) * q  # numpy's virtual index for method="linear"
        self.k = int(math.floor(virtual)) if self.n else 0
        self.gamma = virtual - math.floor(virtual) if self.n else 0.0
        # small arrays, the top rank (n = 1, q = 1) and NaN (np.quantile's NaN result) take the plain way
        self.plain = self.n < MIN_VALUES or virtual >= self.n - 1 or bool(np.isnan(floor).any())
        if self.plain:
            self.value = float(np.quantile(floor, q)) if self.n else math.nan
            return
        part = np.partition(floor, [self.k, self.k + 1])
        self.cut = part[self.k]
        self.value = _lerp(part[self.k], part[self.k + 1], self.gamma)

    def of(self, y: np.ndarray) -> float:
        """The quantile of ``y`` (same length as the floor, ``y >= floor`` everywhere)."""
        if self.plain or bool(np.isnan(y).any()):
            return float(np.quantile(y, self.q)) if len(y) else math.nan
        top = y[y >= self.cut]
        j = self.k - (self.n - len(top))  # y's values below the cut rank under the k-th
        part = np.partition(top, [j, j + 1])
        return _lerp(part[j], part[j + 1], self.gamma)
