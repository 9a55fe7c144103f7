"""The Timeline's ``activity`` frame: one row per piece of device work a trace recorded.

Trace collectors (Nsight SQLite, Kineto) fill it; every other source leaves it empty. It is what the
kernel and idle breakdown (:mod:`mixdiag.diagnosis.breakdown`) reads: kernels, CUDA-graph rows whose
kernels the trace hides, copies and memsets, each with the step it belongs to and the time the host
issued it. Times are integer nanoseconds on the Timeline clock (``t_s * 1e9``): float seconds on a
unix clock keep only ~0.2 us, too coarse for kernel gaps.

Columns (dtype, meaning); string columns are pandas categoricals (a 2.5 M-kernel export holds a few
hundred distinct names):

``instance``    category  the Timeline instance (process) that issued the work
``job``         category  the capture the row came from: ranks of one job are compared (stragglers)
``device``      int32     GPU id the work ran on (the rank's device)
``stream``      int32     stream id (-1 unknown)
``step``        int64     the instance's step the work belongs to (the collector's assignment: the
                          step whose launch call issued it), -1 when none
``kind``        category  kernel | graph (a CUDA-graph replay traced as one row) | memcpy | memset
``role``        category  compute | comm (collective / all-to-all / dispatch-combine kernels, classified
                          by the collector from the kernel name) | copy (memcpy, memset) | opaque (graph
                          rows: compute and comm inside cannot be told apart)
``name``        category  kernel name ('' for other kinds)
``t_start_ns``  int64     start on the device
``t_end_ns``    int64     end on the device (>= start)
``launch_ns``   int64     start of the runtime call that issued it (launch, graph launch, memcpy),
                          :data:`NO_LAUNCH` when the trace has no such call (times may be negative
                          on a relative clock, so no small sentinel)
``bytes``       int64     bytes moved or set (copies, memsets), 0 otherwise
``copy_kind``   category  H2D | D2H | D2D | P2P | other for copies, '' otherwise
"""
from __future__ import annotations

import numpy as np
import pandas as pd

ACTIVITY_FILE = "activity.parquet"
#: ``launch_ns`` of work whose launch call the trace lacks
NO_LAUNCH = np.iinfo(np.int64).min
KINDS = ("kernel", "graph", "memcpy", "memset")
ROLES = ("compute", "comm", "copy", "opaque")
COPY_KINDS = ("", "H2D", "D2H", "D2D", "P2P", "other")
#: column -> dtype; category columns list their allowed values where closed
COLUMNS: dict[str, str] = {
    "instance": "category", "job": "category", "device": "int32", "stream": "int32", "step": "int64",
    "kind": "category", "role": "category", "name": "category", "t_start_ns": "int64", "t_end_ns": "int64",
    "launch_ns": "int64", "bytes": "int64", "copy_kind": "category"}
_CHOICES = {"kind": KINDS, "role": ROLES, "copy_kind": COPY_KINDS}


class ActivityError(ValueError):
    """The activity frame violates its contract; the message names the column."""


def empty() -> pd.DataFrame:
    """An activity frame without rows."""
    return pd.DataFrame({c: pd.Series([], dtype=d) for c, d in COLUMNS.items()})


def validate(df: pd.DataFrame | None) -> pd.DataFrame:
    """``df`` in canonical form (the documented columns in order, canonical dtypes; row order kept:
    sorting millions of rows is the reader's choice, not the contract's). Raises :class:`ActivityError`."""
    if df is None or not len(df):
        return empty()
    if not isinstance(df, pd.DataFrame):
        raise ActivityError(f"activity: expected a pandas DataFrame, got {type(df).__name__}")
    missing = [c for c in COLUMNS if c not in df.columns]
    if missing:
        raise ActivityError(f"activity: missing column '{missing[0]}'")
    canonical = list(df.columns) == list(COLUMNS) and all(
        isinstance(df[c].dtype, pd.CategoricalDtype) if d == "category" else df[c].dtype == d for c, d in COLUMNS.items())
    if canonical:  # a reader's frame: check it, never copy millions of rows to rebuild it
        _check(df, {c: df[c] for c, d in COLUMNS.items() if d == "category"})
        return df if df.index.equals(pd.RangeIndex(len(df))) else df.reset_index(drop=True)
    out = {}
    for c, dtype in COLUMNS.items():
        s = df[c]
        if dtype == "category":
            s = s if isinstance(s.dtype, pd.CategoricalDtype) else s.astype("category")
        else:
            if not pd.api.types.is_integer_dtype(s):
                raise ActivityError(f"activity: column '{c}' must be integer, got dtype {s.dtype}")
            s = s.astype(dtype)
        out[c] = s.reset_index(drop=True)
    df = pd.DataFrame(out)
    _check(df, {c: df[c] for c, d in COLUMNS.items() if d == "category"})
    return df


def _check(df: pd.DataFrame, cats: dict) -> None:
    for c, s in cats.items():
        codes = s.cat.codes.to_numpy()
        if (codes < 0).any():
            raise ActivityError(f"activity: column '{c}' has missing values")
        if c in _CHOICES:
            used = np.flatnonzero(np.bincount(codes.astype(np.intp), minlength=len(s.cat.categories)))  # O(n), no sort
            bad = set(map(str, s.cat.categories[used])) - set(_CHOICES[c])
            if bad:
                raise ActivityError(f"activity: column '{c}' has value {sorted(bad)[0]!r}; "
                                    f"allowed: {', '.join(repr(x) for x in _CHOICES[c])}")
    if np.any(df["t_end_ns"].to_numpy() < df["t_start_ns"].to_numpy()):
        raise ActivityError("activity: column 't_end_ns' is before 't_start_ns' (negative duration)")
    if np.any(df["bytes"].to_numpy() < 0):
        raise ActivityError("activity: column 'bytes' has negative values")


def categorical(codes: np.ndarray, names) -> pd.Categorical:
    """A categorical from integer codes into ``names`` (no per-row Python strings)."""
    names = [str(n) for n in names]
    uniq = list(dict.fromkeys(names))
    if len(uniq) == len(names):
        return pd.Categorical.from_codes(np.asarray(codes, dtype=np.int64), categories=uniq)
    pos = {n: i for i, n in enumerate(uniq)}
    remap = np.array([pos[n] for n in names], dtype=np.int64)  # repeated names share one category
    return pd.Categorical.from_codes(remap[np.asarray(codes, dtype=np.int64)], categories=uniq)
