"""The Timeline: the one data contract between collectors and diagnosis.

Every producer (the reference engine, each collector) builds a :class:`Timeline`; every consumer
(spike detection, attribution, reports, the dashboard, the exporter) reads one. Nothing downstream
knows where the data came from, so every column is documented here, once: its dtype, its unit
(also in the column name: ``_s`` seconds, ``_bytes``, ``_tokens``) and its meaning. A producer that
cannot know a value writes NaN (numbers) or ``"unknown"`` (categories) - never a guess.

Frames
------
``steps``   one row per forward step (``granularity == "step"``) or per log/scrape interval
            (``granularity == "interval"``) when the source is coarser.
``tokens``  one row per output event of a request (one decode row may emit several tokens with
            speculative decoding); ITL and TPOT are derived from it.
``series``  any other time series in long form (a DCGM gauge, a queue length, ...).
``meta``    a JSON-able dict: sources read, clock origin, which signals are measured or
            estimated, whether the data is partial.
``activity`` device work of trace sources (kernels, graph rows, copies), empty elsewhere: its
            contract is :mod:`mixdiag.device_activity` (integer ns, categoricals; own file in a run
            directory, ``activity.parquet``, written only when it has rows).

Clock: all ``t_*_s`` columns of one Timeline share one clock, seconds as float64; ``meta["clock"]``
says which (``"unix"`` for wall-clock epoch seconds, ``"relative"`` when only offsets are known).
"""
from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Sequence

import numpy as np
import pandas as pd

from mixdiag import device_activity

SCHEMA_VERSION = 1

STEP_KINDS = ("prefill", "decode", "mixed", "idle", "unknown")
GRAPH_MODES = ("FULL", "PIECEWISE", "NONE", "unknown")
GRANULARITIES = ("step", "interval")
#: Values ``meta["signals"][instance][signal]`` may take.
SIGNAL_QUALITIES = ("measured", "estimated", "inferred", "absent")


class SchemaError(ValueError):
    """A frame violates the Timeline contract; the message names the frame and the column."""


@dataclass(frozen=True)
class Column:
    """One documented column: name, canonical dtype, unit, whether producers must supply it."""

    name: str
    dtype: str  # "str" | "int64" | "float64"
    unit: str
    doc: str
    required: bool = False
    choices: tuple[str, ...] | None = None
    nonnegative: bool = False
    default: object = None  # fill value when a producer omits an optional column

    def fill(self):
        if self.default is not None:
            return self.default
        return "unknown" if self.dtype == "str" else np.nan


def _c(*args, **kw) -> Column:
    return Column(*args, **kw)


STEPS_COLUMNS: tuple[Column, ...] = (
    _c("instance", "str", "-", "engine/server instance the row belongs to (e.g. host:port, 'engine0')", required=True),
    _c("step", "int64", "count", "step (or interval) index, increasing within an instance", required=True),
    _c("t_start_s", "float64", "s", "when the step (interval) started, on the Timeline clock", required=True),
    _c("t_end_s", "float64", "s", "when the step (interval) ended; >= t_start_s", required=True),
    _c("granularity", "str", "-", "'step' = one forward step; 'interval' = aggregate over a log/scrape interval",
       required=True, choices=GRANULARITIES),
    _c("kind", "str", "-", "prefill | decode | mixed (prefill tokens and decode rows in one step) | idle | unknown",
       required=True, choices=STEP_KINDS),
    _c("prefill_tokens", "float64", "tokens", "prefill (context/extend) tokens computed in the step", nonnegative=True),
    _c("prefill_reqs", "float64", "requests", "requests contributing prefill tokens", nonnegative=True),
    _c("decode_reqs", "float64", "requests", "requests contributing decode rows", nonnegative=True),
    _c("decode_rows", "float64", "rows", "decode rows = decode_reqs x (1 + spec tokens)", nonnegative=True),
    _c("output_tokens", "float64", "tokens", "output tokens emitted by the step (interval)", nonnegative=True),
    _c("graph_mode", "str", "-", "CUDA-graph mode of the step: FULL | PIECEWISE | NONE (eager) | unknown",
       choices=GRAPH_MODES),
    _c("graph_replayed", "float64", "bool", "1 = a CUDA graph was really replayed, 0 = not (planned mode only), NaN = unknown"),
    _c("sm_active", "float64", "ratio", "SM activity 0..1 over the step; meta['signals'] says measured or estimated",
       nonnegative=True),
    _c("expert_imbalance", "float64", "ratio", "max/mean tokens per expert-parallel rank (1 = balanced)", nonnegative=True),
    _c("kv_transfer_bytes", "float64", "bytes", "PD KV bytes received/installed during the step", nonnegative=True),
    _c("kv_transfer_s", "float64", "s", "time the step spent waiting on PD KV transfer", nonnegative=True),
    _c("prefix_hit_tokens", "float64", "tokens", "prompt tokens served from the prefix cache", nonnegative=True),
    _c("preempted_reqs", "float64", "requests", "requests preempted/retracted for lack of KV blocks", nonnegative=True),
    _c("running_reqs", "float64", "requests", "requests running after the step", nonnegative=True),
    _c("waiting_reqs", "float64", "requests", "requests waiting after the step", nonnegative=True),
    _c("waiting_capacity_reqs", "float64", "requests",
       "requests waiting after the step for scheduling capacity (batch slots, token budget, KV blocks), not "
       "deferred by a transient constraint (LoRA budget, KV transfer): the saturation evidence (vLLM 0.32+)",
       nonnegative=True),
    _c("kv_usage", "float64", "ratio", "KV-cache usage 0..1 after the step", nonnegative=True),
    _c("schedule_s", "float64", "s", "host time in the scheduler", nonnegative=True),
    _c("prepare_s", "float64", "s", "host time building the flat token stream", nonnegative=True),
    _c("forward_s", "float64", "s", "forward pass time (device time where measured)", nonnegative=True),
    _c("itl_count", "float64", "count", "interval rows: inter-token latencies observed in the interval", nonnegative=True),
    _c("itl_mean_s", "float64", "s", "interval rows: mean inter-token latency", nonnegative=True),
    _c("itl_p50_s", "float64", "s", "interval rows: median inter-token latency", nonnegative=True),
    _c("itl_p90_s", "float64", "s", "interval rows: P90 inter-token latency", nonnegative=True),
    _c("itl_p99_s", "float64", "s", "interval rows: P99 inter-token latency", nonnegative=True),
    # Evidence columns for data the reference engine did not write (traces, vLLM/SGLang metrics and logs).
    _c("step_source", "str", "-", "how the row was found: record | range | sync | gap | log | scrape | client",
       default=""),
    _c("arrivals", "float64", "requests", "requests that arrived (or began prefill) in the step/interval",
       nonnegative=True),
    _c("ttft_p50_s", "float64", "s", "interval rows: median time to first token", nonnegative=True),
    _c("ttft_p99_s", "float64", "s", "interval rows: P99 time to first token", nonnegative=True),
    _c("tpot_p50_s", "float64", "s", "interval rows: median per-request time per output token of the requests "
       "that finished in the interval", nonnegative=True),
    _c("tpot_p99_s", "float64", "s", "interval rows: P99 per-request time per output token of the requests "
       "that finished in the interval", nonnegative=True),
    _c("rejected_reqs", "float64", "requests", "interval rows: requests the server refused at admission (a queue "
       "limit reached)", nonnegative=True),
    _c("flops_estimated", "float64", "FLOP", "interval rows: FLOPs per GPU the engine estimated from token counts "
       "and the model shape (quality 'estimated': context, never evidence)", nonnegative=True),
    _c("hbm_bytes_estimated", "float64", "bytes", "interval rows: memory bytes read + written per GPU, estimated "
       "by the engine like flops_estimated (context, never evidence)", nonnegative=True),
    _c("large_step_share", "float64", "ratio",
       "interval rows: share of steps that scheduled more tokens than the decode batch (prefill work)",
       nonnegative=True),
    _c("iteration_tokens_floor", "float64", "tokens",
       "interval rows: the interval's largest iteration (vLLM iteration_tokens_total) held at least this many "
       "tokens (the lower edge of its bucket)", nonnegative=True),
    _c("prompt_chunk_ahead_tokens", "float64", "tokens",
       "interval rows: prompt tokens, at least, of the largest iteration that finished a prefill in the interval "
       "or within one mean prefill time after it (iteration tokens beyond the running batch)", nonnegative=True),
    _c("prefill_work_tokens", "float64", "tokens",
       "interval rows: prompt tokens computed in the interval, inferred by spreading vLLM's prompt tokens (counted "
       "at the first token) back over the requests' prefill time", nonnegative=True),
    _c("graph_full_steps", "float64", "count", "interval rows: steps that replayed the FULL graph", nonnegative=True),
    _c("graph_piecewise_steps", "float64", "count", "interval rows: steps run PIECEWISE", nonnegative=True),
    _c("graph_none_steps", "float64", "count", "interval rows: steps run eager (no graph)", nonnegative=True),
    _c("graph_none_min_tokens", "float64", "tokens", "interval rows: the smallest batch (unpadded tokens) the "
       "engine ran without a graph in the interval (vLLM --cudagraph-metrics table)", nonnegative=True),
    _c("comm_s", "float64", "s", "device time in collective / all-to-all / dispatch-combine kernels in the step",
       nonnegative=True),
    _c("comm_share", "float64", "ratio", "comm_s / the step's device time", nonnegative=True),
    _c("rank_skew", "float64", "ratio",
       "multi-rank traces: slowest rank's compute time / median rank's for the same step (1 = even)",
       nonnegative=True),
    _c("rank_sm_skew", "float64", "ratio",
       "multi-rank EP traces whose compute hides inside CUDA graphs: largest rank's SM-busy time "
       "(mean SMs-active x step span) / median rank's for the same step (1 = even); an asymmetry, "
       "not a compute time: waiting all-to-all kernels keep only their CTAs' SMs active", nonnegative=True),
    _c("rank_comm_spread", "float64", "ratio",
       "multi-rank EP traces: largest minus smallest rank's exchange-kernel share of the same step (kernels "
       "visible on every rank): a rank waiting in dispatch/combine while another computes", nonnegative=True),
    _c("kv_overlap_s", "float64", "s",
       "traces: time off-compute-stream copies / transfer kernels (KV-sized, docs/contracts.md section 7) ran "
       "inside the step's GPU span", nonnegative=True),
    _c("kv_overlap_bytes", "float64", "bytes",
       "traces: bytes of those copies inside the step's GPU span (time share of each copy; NaN: kernels only)",
       nonnegative=True),
    _c("kv_wait_s", "float64", "s",
       "traces: compute-stream idle time inside the step's GPU span while such a transfer ran (the forward "
       "waited on it)", nonnegative=True),
    _c("device_idle_before_s", "float64", "s",
       "measured device idle time between the previous step's end and this step's start (traces)",
       nonnegative=True),
    _c("q_token_allocation", "str", "-", "per-row quality of prefill_tokens/decode_rows/kind "
       "(measured|inferred|estimated|absent; '' = see meta['signals'])", default=""),
    _c("q_graph_mode", "str", "-", "per-row quality of graph_mode ('' = see meta['signals'])", default=""),
    _c("q_sm_active", "str", "-", "per-row quality of sm_active ('' = see meta['signals'])", default=""),
    _c("q_expert_imbalance", "str", "-", "per-row quality of expert_imbalance/rank_skew ('' = see meta)",
       default=""),
    _c("q_kv_transfer", "str", "-", "per-row quality of kv_transfer_* ('' = see meta['signals'])", default=""),
)

TOKENS_COLUMNS: tuple[Column, ...] = (
    _c("instance", "str", "-", "instance that produced the tokens", required=True),
    _c("request_id", "str", "-", "request identifier, unique within an instance", required=True),
    _c("t_s", "float64", "s", "when the tokens became available to the client", required=True),
    _c("n_tokens", "int64", "tokens", "tokens emitted by this event (>1 with speculative decoding)", required=True,
       nonnegative=True),
    _c("step", "float64", "count", "step that produced the event, NaN when unknown"),
    _c("is_first", "float64", "bool", "1 for the request's first output event (TTFT), else 0; NaN if unknown"),
    _c("arrival_s", "float64", "s", "first-event rows: when the request arrived (was sent), on the Timeline clock; "
       "NaN elsewhere or if unknown (mixdiag tune's workload)"),
    _c("prompt_tokens", "float64", "tokens", "first-event rows: the request's prompt length; NaN elsewhere or if "
       "unknown (mixdiag tune's workload)", nonnegative=True),
)

SERIES_COLUMNS: tuple[Column, ...] = (
    _c("instance", "str", "-", "instance the series belongs to", required=True),
    _c("name", "str", "-", "series name, e.g. DCGM_FI_PROF_SM_ACTIVE", required=True),
    _c("labels", "str", "-", "labels as sorted 'k=v,k=v' ('' when none)", default=""),
    _c("t_s", "float64", "s", "sample time", required=True),
    _c("value", "float64", "-", "sample value (unit implied by the name)", required=True),
)

FRAMES: dict[str, tuple[Column, ...]] = {"steps": STEPS_COLUMNS, "tokens": TOKENS_COLUMNS, "series": SERIES_COLUMNS}
# Time columns that must not go backwards within a group; groups per frame.
_MONOTONIC = {"steps": ("t_start_s", ("instance",)), "tokens": ("t_s", ("instance", "request_id")),
              "series": ("t_s", ("instance", "name", "labels"))}
_SORT = {"steps": ["instance", "step"], "tokens": ["instance", "t_s", "request_id"],
         "series": ["instance", "name", "labels", "t_s"]}


def columns(frame: str) -> tuple[Column, ...]:
    """The documented columns of ``frame`` ('steps', 'tokens' or 'series')."""
    return FRAMES[frame]


def describe() -> str:
    """The Timeline contract as a text table (``mixdiag schema`` prints it, then the diagnosis result's)."""
    out = []
    for frame, cols in FRAMES.items():
        out.append(f"{frame}:")
        for c in cols:
            req = "required" if c.required else "optional"
            out.append(f"  {c.name:<20} {c.dtype:<8} {c.unit:<9} {req:<8}  {c.doc}")
    return "\n".join(out)


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
            out[c.name] = pd.Series(np.full(n, c.fill(), dtype=object if c.dtype == "str" else None), index=df.index,
                                    dtype=object if c.dtype == "str" else None)
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
    # column order is one 2-D block, so a frame of a million rows stays a few dozen blocks (adding
    # columns later never fragments it) and nothing is copied to put the columns in order.
    keys, parts, i = list(out), [], 0
    while i < len(keys):
        j, nan_run = i, out[keys[i]] is None
        while j < len(keys) and (out[keys[j]] is None) == nan_run:
            j += 1
        run, i = keys[i:j], j
        parts.append(pd.DataFrame(np.full((n, len(run)), np.nan), columns=run, index=df.index) if nan_run
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


def _jsonable(obj):
    """meta must survive json: reject NaN/inf and non-serialisable values early."""
    try:
        json.dumps(obj, allow_nan=False)
    except (TypeError, ValueError) as e:
        raise SchemaError(f"meta: not JSON-serialisable ({e})") from None
    return obj


class Timeline:
    """The frames one source (or several aligned sources) produced. Validated on construction."""

    FILES = {"steps": "steps.parquet", "tokens": "tokens.parquet", "series": "series.parquet", "meta": "meta.json"}

    def __init__(self, steps: pd.DataFrame | None = None, tokens: pd.DataFrame | None = None,
                 series: pd.DataFrame | None = None, meta: dict | None = None,
                 activity: pd.DataFrame | None = None):
        self.steps = validate("steps", steps if steps is not None else empty("steps"))
        try:
            self.activity = device_activity.validate(activity)
        except device_activity.ActivityError as e:
            raise SchemaError(str(e)) from None
        self.tokens = validate("tokens", tokens if tokens is not None else empty("tokens"))
        self.series = validate("series", series if series is not None else empty("series"))
        meta = dict(meta or {})
        meta.setdefault("schema_version", SCHEMA_VERSION)
        meta.setdefault("clock", "unix")
        meta.setdefault("sources", [])
        meta.setdefault("signals", {})
        meta.setdefault("partial", False)
        self.meta = _jsonable(meta)

    # ---- facts ------------------------------------------------------------------------------
    @property
    def instances(self) -> list[str]:
        """Instances present in any frame, sorted."""
        def names(col: pd.Series) -> set:  # one engine (the common case): one array compare, no set of a million
            a = col.to_numpy()
            return {a[0]} if len(a) and bool((a == a[0]).all()) else set(a)

        s = names(self.steps["instance"]) | names(self.tokens["instance"]) | names(self.series["instance"])
        return sorted(s)

    def span(self) -> tuple[float, float] | None:
        """(first, last) time over all frames, or None when empty."""
        ts = [self.steps["t_start_s"], self.steps["t_end_s"], self.tokens["t_s"], self.series["t_s"]]
        ts = [t for t in ts if len(t)]
        if not ts:
            return None
        return float(min(t.min() for t in ts)), float(max(t.max() for t in ts))

    def signal_quality(self, instance: str, signal: str) -> str:
        """'measured' | 'estimated' | 'inferred' | 'absent' for a signal of an instance (from meta)."""
        return self.meta.get("signals", {}).get(instance, {}).get(signal, "absent")

    def __len__(self) -> int:
        return len(self.steps)

    def __repr__(self) -> str:
        return (f"Timeline(instances={self.instances}, steps={len(self.steps)}, tokens={len(self.tokens)}, "
                f"series={len(self.series)})")

    # ---- derived latency --------------------------------------------------------------------
    def itl(self) -> pd.DataFrame:
        """Inter-token latency per output event.

        For each request, events sorted by time; ``itl_s`` of an event is the gap since the
        request's previous event (the latency the client saw before these tokens), and
        ``itl_per_token_s`` divides it by the event's ``n_tokens`` (speculative decoding may emit
        several at once). The first event of a request has no ITL (it is TTFT's end) and is
        omitted. Columns: instance, request_id, step, t_s, n_tokens, itl_s, itl_per_token_s.
        """
        # The frame is validated sorted by (instance, t_s, request_id) and times never go back within
        # a request, so the previous event of a request is the previous row of its group in a stable
        # sort by integer group codes, and the result keeps the frame's own order (string sorts and
        # groupbys cost seconds at a day of tokens).
        tok = self.tokens
        cols = ["instance", "request_id", "step", "t_s", "n_tokens", "itl_s", "itl_per_token_s"]
        names = tok["instance"].to_numpy()
        one = len(names) and (names == names[0]).all()  # one engine: no factorizing a million names
        inst = np.zeros(len(tok), dtype=np.intp) if one else pd.factorize(names)[0]
        rid = pd.factorize(tok["request_id"])[0]
        key = inst.astype(np.int64) * (int(rid.max(initial=0)) + 1) + rid
        order = np.argsort(key, kind="stable")
        t = tok["t_s"].to_numpy(dtype="float64")
        prev = np.full(len(tok), np.nan)
        same = (key[order][1:] == key[order][:-1]) & (inst[order][1:] >= 0) & (rid[order][1:] >= 0)
        prev[order[1:][same]] = t[order[:-1][same]]
        keep = ~np.isnan(prev)
        out = tok.loc[keep, cols[:5]].reset_index(drop=True)
        out["itl_s"] = t[keep] - prev[keep]
        out["itl_per_token_s"] = out["itl_s"] / out["n_tokens"].clip(lower=1)
        return out

    def tpot(self) -> pd.DataFrame:
        """Time per output token per request: (last - first event time) / tokens after the first event.

        Columns: instance, request_id, output_tokens, first_t_s, last_t_s, tpot_s (NaN for
        requests with a single event).
        """
        tok = self.tokens
        g = tok.groupby(["instance", "request_id"], sort=True)
        first_idx = g["t_s"].idxmin()
        agg = g.agg(output_tokens=("n_tokens", "sum"), first_t_s=("t_s", "min"), last_t_s=("t_s", "max"))
        first_tokens = tok.loc[first_idx.to_numpy(), "n_tokens"].to_numpy()
        after = agg["output_tokens"].to_numpy() - first_tokens
        with np.errstate(divide="ignore", invalid="ignore"):
            tpot = np.where(after > 0, (agg["last_t_s"] - agg["first_t_s"]).to_numpy() / np.maximum(after, 1), np.nan)
        agg["tpot_s"] = tpot
        agg["output_tokens"] = agg["output_tokens"].astype("int64")
        return agg.reset_index()

    # ---- slicing and combining --------------------------------------------------------------
    def slice(self, t0: float | None = None, t1: float | None = None,
              instances: Iterable[str] | str | None = None) -> "Timeline":
        """Rows within [t0, t1] (steps overlapping the window) and of the given instances."""
        lo = -math.inf if t0 is None else float(t0)
        hi = math.inf if t1 is None else float(t1)
        if isinstance(instances, str):
            instances = [instances]
        keep = None if instances is None else set(instances)

        def pick(df, start, end):
            m = (df[end] >= lo) & (df[start] <= hi)
            if keep is not None:
                m &= df["instance"].isin(keep)
            return df[m]

        act = self.activity
        m = (act["t_end_ns"].to_numpy() >= lo * 1e9) & (act["t_start_ns"].to_numpy() <= hi * 1e9)
        if keep is not None:
            m &= act["instance"].isin(list(keep)).to_numpy()  # categorical: compared per category, not per row
        return Timeline(pick(self.steps, "t_start_s", "t_end_s"), pick(self.tokens, "t_s", "t_s"),
                        pick(self.series, "t_s", "t_s"), self.meta, act[m])

    @staticmethod
    def concat(timelines: Sequence["Timeline"]) -> "Timeline":
        """Combine Timelines of distinct instances (e.g. several servers) on one clock.

        Raises SchemaError if two inputs share an instance name or use different clocks.
        """
        timelines = list(timelines)
        if not timelines:
            return Timeline()
        seen: dict[str, int] = {}
        for i, tl in enumerate(timelines):
            for inst in tl.instances:
                if inst in seen:
                    raise SchemaError(f"concat: column 'instance' value {inst!r} appears in inputs {seen[inst]} and {i}")
                seen[inst] = i
        clocks = {tl.meta.get("clock") for tl in timelines}
        if len(clocks) > 1:
            raise SchemaError(f"concat: inputs use different clocks {sorted(map(str, clocks))}")
        meta = {"schema_version": SCHEMA_VERSION, "clock": clocks.pop(), "sources": [], "signals": {},
                "partial": any(tl.meta.get("partial") for tl in timelines)}
        for tl in timelines:
            meta["sources"] += tl.meta.get("sources", [])
            meta["signals"].update(tl.meta.get("signals", {}))
            for k, v in tl.meta.items():
                meta.setdefault(k, v)

        def cat(frame):
            frames = [getattr(tl, frame) for tl in timelines if len(getattr(tl, frame))]
            return pd.concat(frames, ignore_index=True) if frames else empty(frame)

        acts = [tl.activity for tl in timelines if len(tl.activity)]
        activity = None
        if acts:  # categoricals of different inputs: union their categories, keep the codes compact
            activity = pd.concat([a.astype({c: object for c, d in device_activity.COLUMNS.items() if d == "category"})
                                  for a in acts], ignore_index=True) if len(acts) > 1 else acts[0]
        return Timeline(cat("steps"), cat("tokens"), cat("series"), meta, activity)

    # ---- persistence ------------------------------------------------------------------------
    def save(self, directory: str | os.PathLike, overwrite: bool = False) -> Path:
        """Write steps/tokens/series as Parquet and meta.json into ``directory``.

        Refuses to replace existing Timeline files unless ``overwrite`` is true, so nothing a
        user gave is lost. Other files in the directory are left alone.
        """
        d = Path(directory)
        d.mkdir(parents=True, exist_ok=True)
        if not overwrite:
            clash = [f for f in list(self.FILES.values()) + [device_activity.ACTIVITY_FILE] if (d / f).exists()]
            if clash:
                raise FileExistsError(f"{d} already holds {', '.join(clash)}; choose another directory or overwrite")
        for frame in ("steps", "tokens", "series"):
            getattr(self, frame).to_parquet(d / self.FILES[frame], index=False)
        (d / self.FILES["meta"]).write_text(json.dumps(self.meta, indent=2, sort_keys=True) + "\n")
        if len(self.activity):
            self.activity.to_parquet(d / device_activity.ACTIVITY_FILE, index=False)
        return d

    @classmethod
    def load(cls, directory: str | os.PathLike) -> "Timeline":
        """Read a directory written by :meth:`save` (missing frames load empty, flagged partial)."""
        d = Path(directory)
        if not d.is_dir():
            raise FileNotFoundError(f"no such Timeline directory: {d}")
        if not any((d / f).exists() for f in cls.FILES.values()):
            raise SchemaError(f"{d} holds no Timeline files ({', '.join(cls.FILES.values())})")
        meta = json.loads((d / cls.FILES["meta"]).read_text()) if (d / cls.FILES["meta"]).exists() else {}
        frames = {}
        for frame in ("steps", "tokens", "series"):
            p = d / cls.FILES[frame]
            if p.exists():
                frames[frame] = pd.read_parquet(p)
            else:
                meta["partial"] = True
        act = d / device_activity.ACTIVITY_FILE
        return cls(frames.get("steps"), frames.get("tokens"), frames.get("series"), meta,
                   pd.read_parquet(act) if act.exists() else None)

    def to_csv(self, path: str | os.PathLike, overwrite: bool = False) -> Path:
        """Write the steps frame as CSV (one row per step/interval, documented columns first)."""
        p = Path(path)
        if p.exists() and not overwrite:
            raise FileExistsError(f"{p} exists; choose another path or overwrite")
        self.steps.to_csv(p, index=False)
        return p

    def equals(self, other: "Timeline") -> bool:
        """Exact equality of all frames (values and dtypes) and meta."""
        return (all(getattr(self, f).equals(getattr(other, f)) and
                    list(getattr(self, f).dtypes) == list(getattr(other, f).dtypes)
                    for f in ("steps", "tokens", "series")) and self.meta == other.meta
                and self.activity.equals(other.activity))
