"""Label arrays (instance names, kinds, granularity: few distinct strings on up to a million rows)
handled by object identity and by code instead of once per row.

A column of str objects costs Python per row to hash (``pd.factorize``), and pandas 3 converts an
object array of str into its pyarrow-backed ``str`` dtype one Python string at a time (~50 ms a
million rows, each time a frame takes such a column). The rows of a label column share a few str
objects (``schema.repeat_label``), so they are factorised by address and the column is built by
decoding a dictionary of the few labels.
"""
from __future__ import annotations

import ctypes

import numpy as np
import pandas as pd

#: below this many rows the per-row way is cheap already and is taken (tests lower it)
MIN_ROWS = 1024


def pointers(a: np.ndarray) -> np.ndarray:
    """The PyObject pointers of the object array ``a`` as integers, read (never written) from its own
    buffer while ``a`` is alive (``a`` C-contiguous)."""
    return np.frombuffer((ctypes.c_void_p * len(a)).from_address(a.ctypes.data), dtype=np.uintp)


def one_object(a: np.ndarray) -> bool:
    """Whether every element of the object array ``a`` is the one same object, by comparing the
    element pointers as integers (no Python per row). A log's ``granularity`` is one shared ``"step"``
    (schema.repeat_label) on a million rows."""
    if not len(a) or not a.flags.c_contiguous:
        return False
    ptrs = pointers(a)
    return bool((ptrs == ptrs[0]).all())


def factorize_objects(a: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``pd.factorize(a, use_na_sentinel=True)`` of an object array, codes and uniques the same.

    The rows are factorised by object identity first (integers hash without Python, ~3x faster than
    hashing a million str) and the few distinct objects by value after. Both keep the order of first
    appearance and a value first appears where its first object does, so the codes are pandas' own;
    equal objects at different addresses meet again in the second step."""
    if len(a) < MIN_ROWS:
        return pd.factorize(a, use_na_sentinel=True)
    a = np.ascontiguousarray(a)
    ptr_codes, ptr_uniq = pd.factorize(pointers(a), use_na_sentinel=False)
    if len(ptr_uniq) > len(a) // 8:  # not a label column: one factorisation by value
        return pd.factorize(a, use_na_sentinel=True)
    # first row of each distinct object, in order of first appearance (ptr codes count up from 0)
    first = np.full(len(ptr_uniq), -1, dtype=np.int64)
    first[ptr_codes[::-1]] = np.arange(len(a) - 1, -1, -1)
    obj_codes, uniq = pd.factorize(a[first], use_na_sentinel=True)
    return obj_codes[ptr_codes], uniq


def label_column(codes: np.ndarray, names) -> np.ndarray | pd.api.extensions.ExtensionArray:
    """``names[codes]`` as the column pandas builds from those strings (its pyarrow ``str`` dtype where it
    infers one, objects otherwise), made from the few labels: converting a million Python strings to
    pyarrow costs ~50 ms a column, decoding a dictionary of three ~5 ms."""
    obj = np.asarray(list(names), dtype=object)
    dtype = pd.Series(obj).dtype  # what pandas infers for these strings
    if len(codes) < MIN_ROWS or not isinstance(dtype, pd.StringDtype) or dtype.storage != "pyarrow":
        return obj[codes]
    import pyarrow as pa  # pandas' str dtype is backed by it

    arr = pa.DictionaryArray.from_arrays(pa.array(np.asarray(codes), type=pa.int32()),
                                         pa.array(list(obj), type=pa.large_string())).dictionary_decode()
    return pd.array(arr, dtype=dtype)


def str_column(a: np.ndarray):
    """The object array ``a`` as the column a frame makes of it (``pd.DataFrame({"c": a})["c"]`` has the
    same values and dtype), without a Python step per row when ``a`` holds a few distinct str and no
    missing value; any other array comes back as it is, for pandas to convert."""
    if len(a) < MIN_ROWS or a.dtype != object:
        return a
    codes, uniq = factorize_objects(a)
    if not len(uniq) or (codes < 0).any() or any(type(u) is not str for u in uniq):
        return a
    return label_column(codes, list(uniq))
