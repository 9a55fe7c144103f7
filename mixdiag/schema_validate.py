"""Validation of a Timeline frame against its documented columns (:mod:`mixdiag.schema_columns`):
dtypes cast to the canonical ones, absent optional columns added (NaN without memory per row,
``"unknown"`` / ``""`` labels as one shared object), values and time order checked, rows sorted.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from mixdiag.schema_columns import FRAMES, SchemaError

# Time columns that must not go backwards within a group; groups per frame.
_MONOTONIC = {"steps": ("t_start_s", ("instance",)), "tokens": ("t_s", ("instance", "request_id")),
              "series": ("t_s", ("instance", "name", "labels"))}
_SORT = {"steps": ["instance", "step"], "tokens": ["instance", "t_s", "request_id"],
         "series": ["instance", "name", "labels", "t_s"]}



def repeat_label(n: int, value: str) -> np.ndarray:
    """An object array of ``n`` references to the one ``value``. ``np.full(n, "x", dtype=object)``
    casts through a numpy string and makes a new str per row (56 MB a million rows)."""
    return np.full(n, np.array(value, dtype=object))


# Copy-on-write (pandas 3, or 2.x with the option on) copies a block before writing into it when
# another block references its values; a block that references this one forever makes every write
# into a broadcast NaN block (below) copy first, whichever frame or view of it is written.
_COW = int(pd.__version__.split(".")[0]) >= 3 or bool(getattr(pd.options.mode, "copy_on_write", False))
_PINNED = pd.DataFrame({"pin": [np.nan]})._mgr.blocks[0]


def nan_columns(names: list[str], index: pd.Index) -> pd.DataFrame:
    """All-NaN float64 columns ``names`` on ``index`` as one block that holds no memory per row.

    The block is one NaN broadcast to (rows, columns) (strides 0, read-only): 34 absent documented
    columns of a million-row log were 272 MB. Reads see NaN; a write copies the written column first
    (copy-on-write, see ``_PINNED``). Without copy-on-write the columns are ordinary arrays.
    """
    shape = (len(index), len(names))
    if _COW:
        frame = pd.DataFrame(np.broadcast_to(np.nan, shape), columns=names, index=index, copy=False)
        blocks = getattr(getattr(frame, "_mgr", None), "blocks", ())
        if len(blocks) == 1 and hasattr(blocks[0], "refs") and hasattr(blocks[0].refs, "add_reference"):
            blocks[0].refs.add_reference(_PINNED)
            return frame
    return pd.DataFrame(np.full(shape, np.nan), columns=names, index=index)


def nan_series(index: pd.Index) -> pd.Series:
    """One all-NaN float64 column on ``index`` without memory per row (see :func:`nan_columns`):
    ``frame[col] = nan_series(frame.index)`` in place of ``frame[col] = np.nan``."""
    return nan_columns(["nan"], index)["nan"]


def _is_str_dtype(s: pd.Series) -> bool:
    return pd.api.types.is_object_dtype(s) or pd.api.types.is_string_dtype(s)


def _coerce(frame: str, df: pd.DataFrame) -> pd.DataFrame:
    """Add missing optional columns, check and cast dtypes to the canonical ones.

    Builds the canonical frame column by column into a new frame at once: no deep copy of the
    input, no block consolidation per added column (a million-row steps frame has ~50 columns).
    """
    n = len(df)
    if not df.index.equals(pd.RangeIndex(n)):
        df = df.reset_index(drop=True)  # one index for every column (copy-on-write: no data copied)
    out: dict[str, object] = {}
    for c in FRAMES[frame]:
        if c.name not in df.columns:
            if c.required:
                raise SchemaError(f"{frame}: missing required column '{c.name}'")
            if c.dtype == "float64" and c.default is None:
                out[c.name] = None  # all-NaN: filled below
                continue
            # a Series: the frame constructor would infer pandas' string dtype from a bare object array
            out[c.name] = pd.Series(repeat_label(n, c.fill()) if c.dtype == "str" else np.full(n, c.fill()),
                                    index=df.index, dtype=object if c.dtype == "str" else None)
            continue
        s = df[c.name]
        if c.dtype == "str":
            if not _is_str_dtype(s) and not isinstance(s.dtype, pd.CategoricalDtype):
                if len(s) and not s.isna().all():
                    raise SchemaError(f"{frame}: column '{c.name}' must hold strings, got dtype {s.dtype}")
            bad = s.isna()
            if bad.any():
                if c.required:
                    raise SchemaError(f"{frame}: column '{c.name}' has {int(bad.sum())} missing values")
                s = s.where(~bad, c.fill())
            if not (pd.api.types.is_object_dtype(s) and pd.api.types.infer_dtype(s, skipna=False) == "string"):
                # s.astype(str).astype(object), one str object per distinct value: a million rows of
                # "log" are a million pointers to one string, not a million strings (~60 MB)
                codes, uniq = pd.factorize(s)
                s = pd.Series(np.array([str(u) for u in uniq], dtype=object)[codes], index=s.index, dtype=object)
            out[c.name] = s
            if c.choices is not None:
                wrong = ~s.isin(c.choices)
                if wrong.any():
                    raise SchemaError(f"{frame}: column '{c.name}' has value {s[wrong].iloc[0]!r}; "
                                      f"allowed: {', '.join(c.choices)}")
        elif c.dtype == "int64":
            if pd.api.types.is_bool_dtype(s) or not pd.api.types.is_numeric_dtype(s):
                raise SchemaError(f"{frame}: column '{c.name}' must be integer, got dtype {s.dtype}")
            if s.isna().any():
                raise SchemaError(f"{frame}: column '{c.name}' has missing values (integer column)")
            if pd.api.types.is_float_dtype(s) and not np.all(np.mod(s.to_numpy(), 1) == 0):
                raise SchemaError(f"{frame}: column '{c.name}' must be integer, has fractional values")
            out[c.name] = s.astype("int64")
        else:
            if not (pd.api.types.is_numeric_dtype(s) or (len(s) and s.isna().all()) or len(s) == 0):
                raise SchemaError(f"{frame}: column '{c.name}' must be numeric, got dtype {s.dtype}")
            out[c.name] = pd.to_numeric(s, errors="raise").astype("float64") if len(s) else s.astype("float64")
    for name in df.columns:
        if name not in out:
            out[name] = df[name]
    # The documented columns a source does not fill (most of them) are NaN: each run of them in
    # column order is one 2-D block (nan_columns: no memory per row), so a frame of a million rows
    # stays a few dozen blocks (adding columns later never fragments it) and nothing is copied to
    # put the columns in order.
    keys, parts, i = list(out), [], 0
    while i < len(keys):
        j, nan_run = i, out[keys[i]] is None
        while j < len(keys) and (out[keys[j]] is None) == nan_run:
            j += 1
        run, i = keys[i:j], j
        parts.append(nan_columns(run, df.index) if nan_run
                     else pd.DataFrame({c: out[c] for c in run}, index=df.index, copy=False))
    return pd.concat(parts, axis=1) if len(parts) > 1 else parts[0]


def _check_values(frame: str, df: pd.DataFrame, in_order: bool = False) -> None:
    """``in_order``: the rows are sorted by ``_SORT[frame]`` already (steps: no sort needed here)."""
    for c in FRAMES[frame]:
        if c.nonnegative and c.dtype != "str":
            v = df[c.name].to_numpy(dtype="float64")
            if np.any(v < 0):
                raise SchemaError(f"{frame}: column '{c.name}' has negative values (min {np.nanmin(v)})")
        if c.dtype == "float64" and c.name.startswith("t_"):
            v = df[c.name].to_numpy()
            if np.any(~np.isfinite(v)):
                raise SchemaError(f"{frame}: column '{c.name}' has non-finite times")
    if frame == "steps" and len(df):
        dur = df["t_end_s"].to_numpy() - df["t_start_s"].to_numpy()
        if np.any(dur < 0):
            i = int(np.argmax(dur < 0))
            raise SchemaError(f"steps: column 't_end_s' is before 't_start_s' (negative duration) at row {i}")
        if _repeats(df, in_order and frame == "steps"):
            raise SchemaError("steps: column 'step' repeats within an instance")
    if frame == "steps" and len(df):
        for col in ("sm_active", "kv_usage"):
            if np.any(df[col].to_numpy() > 1.0 + 1e-9):
                raise SchemaError(f"steps: column '{col}' must be a ratio in [0, 1]")
    tcol, keys = _MONOTONIC[frame]
    if len(df) > 1:
        by = list(keys) + (["step"] if frame == "steps" else [])
        # steps sorted by (instance, step) are in this order already; else sort these columns only
        order = df if in_order and frame == "steps" else df[list(dict.fromkeys(by + [tcol]))].sort_values(by, kind="stable")
        same = np.ones(len(order) - 1, dtype=bool)
        for k in keys:
            v = order[k].to_numpy()
            same &= v[1:] == v[:-1]
        dt = np.diff(order[tcol].to_numpy())
        if np.any(same & (dt < 0)):
            raise SchemaError(f"{frame}: column '{tcol}' goes backwards within {'/'.join(keys)}")


def validate(frame: str, df: pd.DataFrame) -> pd.DataFrame:
    """Check ``df`` against the contract of ``frame`` and return it in canonical form.

    Canonical form: every documented column present (missing optional ones filled with NaN or
    'unknown'), canonical dtypes, documented columns first, rows sorted. Raises
    :class:`SchemaError` naming the column on wrong dtype, missing required column, a value
    outside its choices, negative counts or durations, or time going backwards.
    """
    if frame not in FRAMES:
        raise SchemaError(f"unknown frame {frame!r}; expected one of {', '.join(FRAMES)}")
    if not isinstance(df, pd.DataFrame):
        raise SchemaError(f"{frame}: expected a pandas DataFrame, got {type(df).__name__}")
    df = _coerce(frame, df)
    in_order = _is_sorted(df, _SORT[frame])
    _check_values(frame, df, in_order)
    if in_order:
        return df  # a reader's rows usually come sorted: no sorted copy of a million rows
    return df.sort_values(_SORT[frame], kind="stable").reset_index(drop=True)


def _repeats(df: pd.DataFrame, in_order: bool) -> bool:
    """Whether a (instance, step) pair repeats; rows in that order repeat only next to each other."""
    if not in_order:
        return bool(df.duplicated(["instance", "step"]).any())
    inst, step = df["instance"].to_numpy(), df["step"].to_numpy()
    return bool(np.any((inst[1:] == inst[:-1]) & (step[1:] == step[:-1])))


def _is_sorted(df: pd.DataFrame, keys: list[str]) -> bool:
    """True when the rows are already in (stable) sort order by ``keys``; False when unsure."""
    n = len(df)
    if n < 2:
        return True
    open_pairs = np.ones(n - 1, dtype=bool)  # neighbours equal on every key so far
    for k in keys:
        v = df[k].to_numpy()
        if v.dtype == object and pd.api.types.infer_dtype(v, skipna=False) != "string":
            return False
        try:
            up, down = v[1:] > v[:-1], v[1:] < v[:-1]
        except TypeError:
            return False
        if v.dtype.kind == "f" and np.isnan(v).any():
            return False  # NaN sorts last, whatever the neighbours say
        if np.any(open_pairs & down):
            return False
        open_pairs &= ~up
    return True


def empty(frame: str) -> pd.DataFrame:
    """An empty frame with the canonical columns and dtypes."""
    return pd.DataFrame({c.name: pd.Series([], dtype=object if c.dtype == "str" else c.dtype)
                         for c in FRAMES[frame]})
