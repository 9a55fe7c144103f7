"""Label columns (kind, graph mode, qualities: few distinct strings on up to a million rows),
computed once per distinct value instead of once per row.

A comparison or ``astype(str)`` on an object column runs Python code per row (~50 ms a million
rows, each); the diagnosis does dozens. :func:`label_codes` factorises a column once; the
helpers answer from its few distinct values and spread the answer back by code.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from mixdiag.label_arrays import MIN_ROWS, factorize_objects, label_column, one_object  # noqa: F401 (label_column: used from here)


def label_codes(col: pd.Series, na: str = "") -> tuple[np.ndarray, np.ndarray]:
    """``(codes, labels)`` with ``labels[codes]`` == ``col.fillna(na).astype(str)`` as objects
    (missing values get code -1, the last label: ``na``)."""
    a = col.to_numpy(dtype=object)
    codes, uniq = factorize_objects(a) if col.dtype == object else pd.factorize(a, use_na_sentinel=True)
    return codes, np.array([str(u) for u in uniq] + [na], dtype=object)


def as_labels(col: pd.Series, na: str = "") -> np.ndarray:
    """``col.fillna(na).astype(str)`` as an object array."""
    codes, labels = label_codes(col, na)
    return labels[codes]


def label_in(col: pd.Series, values, na: str = "") -> np.ndarray:
    """Whether ``col.fillna(na).astype(str)`` is one of ``values``, per row."""
    codes, labels = label_codes(col, na)
    return np.isin(labels, list(values))[codes]


def equal(col: pd.Series, value: str) -> np.ndarray:
    """``(col == value).to_numpy()``: an object column that holds one object answers with one
    comparison (a comparison per row costs ~35 ms a million rows, and the diagnosis makes dozens); one of a
    few labels compares each distinct value once (rows of one value compare alike; a missing value, code -1,
    compares False as pandas' comparison does)."""
    if col.dtype == object:
        a = col.to_numpy()
        if one_object(a):
            return np.full(len(a), bool(a[0] == value))
        if len(a) >= MIN_ROWS:
            codes, uniq = factorize_objects(a)
            if len(uniq) <= len(a) // 8:  # a label column (else factorising cost more than comparing)
                return np.array([bool(u == value) for u in uniq] + [False])[codes]
    return (col == value).to_numpy(dtype=bool, na_value=False)
