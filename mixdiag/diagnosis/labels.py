"""Label columns (kind, graph mode, qualities: few distinct strings on up to a million rows),
computed once per distinct value instead of once per row.

A comparison or ``astype(str)`` on an object column runs Python code per row (~50 ms a million
rows, each); the diagnosis does dozens. :func:`label_codes` factorises a column once; the
helpers answer from its few distinct values and spread the answer back by code.
"""
from __future__ import annotations

import numpy as np
import pandas as pd


def label_codes(col: pd.Series, na: str = "") -> tuple[np.ndarray, np.ndarray]:
    """``(codes, labels)`` with ``labels[codes]`` == ``col.fillna(na).astype(str)`` as objects
    (missing values get code -1, the last label: ``na``)."""
    codes, uniq = pd.factorize(col.to_numpy(dtype=object), use_na_sentinel=True)
    return codes, np.array([str(u) for u in uniq] + [na], dtype=object)


def as_labels(col: pd.Series, na: str = "") -> np.ndarray:
    """``col.fillna(na).astype(str)`` as an object array."""
    codes, labels = label_codes(col, na)
    return labels[codes]


def label_in(col: pd.Series, values, na: str = "") -> np.ndarray:
    """Whether ``col.fillna(na).astype(str)`` is one of ``values``, per row."""
    codes, labels = label_codes(col, na)
    return np.isin(labels, list(values))[codes]


def label_column(codes: np.ndarray, names) -> np.ndarray | pd.api.extensions.ExtensionArray:
    """``names[codes]`` as the column pandas builds from those strings (its pyarrow ``str`` dtype where it
    infers one, objects otherwise), made from the few labels: converting a million Python strings to
    pyarrow costs ~50 ms a column, decoding a dictionary of three ~5 ms."""
    obj = np.asarray(list(names), dtype=object)
    dtype = pd.Series(obj).dtype  # what pandas infers for these strings
    if len(codes) < 1024 or not isinstance(dtype, pd.StringDtype) or dtype.storage != "pyarrow":
        return obj[codes]
    import pyarrow as pa  # pandas' str dtype is backed by it

    arr = pa.DictionaryArray.from_arrays(pa.array(np.asarray(codes), type=pa.int32()),
                                         pa.array(list(obj), type=pa.large_string())).dictionary_decode()
    return pd.array(arr, dtype=dtype)
