"""Label columns (kind, graph mode, qualities: few distinct strings on up to a million rows),
computed once per distinct value instead of once per row.

A comparison or ``astype(str)`` on an object column runs Python code per row (~50 ms a million
rows, each); the diagnosis does dozens. :func:`label_codes` factorises a column once; the
helpers answer from its few distinct values and spread the answer back by code.
"""
from __future__ import annotations

import ctypes

import numpy as np
import pandas as pd


def label_codes(col: pd.Series, na: str = "") -> tuple[np.ndarray, np.ndarray]:
    """``(codes, labels)`` with ``labels[codes]`` == ``col.fillna(na).astype(str)`` as objects
    (missing values get code -1, the last label: ``na``)."""
    a = col.to_numpy(dtype=object)
    codes, uniq = _factorize_objects(a) if col.dtype == object else pd.factorize(a, use_na_sentinel=True)
    return codes, np.array([str(u) for u in uniq] + [na], dtype=object)


def _pointers(a: np.ndarray) -> np.ndarray:
    """The PyObject pointers of the object array ``a`` as integers, read (never written) from its own
    buffer while ``a`` is alive (``a`` C-contiguous)."""
    return np.frombuffer((ctypes.c_void_p * len(a)).from_address(a.ctypes.data), dtype=np.uintp)


def _factorize_objects(a: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``pd.factorize(a, use_na_sentinel=True)`` of an object array, codes and uniques the same.

    A label column holds a few shared str objects (``schema.repeat_label``), so the rows are factorised
    by object identity first (integers hash without Python, ~3x faster than hashing a million str) and
    the few distinct objects by value after. Both keep the order of first appearance and a value first
    appears where its first object does, so the codes are pandas' own; equal objects at different
    addresses meet again in the second step."""
    if len(a) < 1024:
        return pd.factorize(a, use_na_sentinel=True)
    a = np.ascontiguousarray(a)
    ptr_codes, ptr_uniq = pd.factorize(_pointers(a), use_na_sentinel=False)
    if len(ptr_uniq) > len(a) // 8:  # not a label column: one factorisation by value
        return pd.factorize(a, use_na_sentinel=True)
    # first row of each distinct object, in order of first appearance (ptr codes count up from 0)
    first = np.full(len(ptr_uniq), -1, dtype=np.int64)
    first[ptr_codes[::-1]] = np.arange(len(a) - 1, -1, -1)
    obj_codes, uniq = pd.factorize(a[first], use_na_sentinel=True)
    return obj_codes[ptr_codes], uniq


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


def _one_object(a: np.ndarray) -> bool:
    """Whether every element of the object array ``a`` is the one same object, by comparing the
    element pointers as integers (no Python per row). A log's ``granularity`` is one shared ``"step"``
    (schema.repeat_label) on a million rows."""
    if not len(a) or not a.flags.c_contiguous:
        return False
    ptrs = _pointers(a)
    return bool((ptrs == ptrs[0]).all())


def equal(col: pd.Series, value: str) -> np.ndarray:
    """``(col == value).to_numpy()``: an object column that holds one object answers with one
    comparison (a comparison per row costs ~35 ms a million rows, and the diagnosis makes dozens)."""
    if col.dtype == object:
        a = col.to_numpy()
        if _one_object(a):
            return np.full(len(a), bool(a[0] == value))
    return (col == value).to_numpy(dtype=bool, na_value=False)
