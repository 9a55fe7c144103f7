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
from pathlib import Path
from typing import Iterable, Sequence

import numpy as np
import pandas as pd

from mixdiag import device_activity
from mixdiag.label_arrays import one_object

# The columns and their validation live beside this module; every name is re-exported here, the
# one import the rest of mixdiag uses.
from mixdiag.schema_columns import (FRAMES, GRANULARITIES, GRAPH_MODES, SCHEMA_VERSION, SERIES_COLUMNS,  # noqa: F401
                                    SIGNAL_QUALITIES, STEP_KINDS, STEPS_COLUMNS, TOKENS_COLUMNS, Column,
                                    SchemaError, columns, describe)
from mixdiag.schema_validate import empty, nan_columns, nan_series, repeat_label, validate  # noqa: F401


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
            # without a comparison per row: a label column shares one str object (repeat_label), a str column
            # compares in C (its to_numpy() would make a million str)
            if len(col) and col.dtype == object and one_object(col.to_numpy()):
                return {col.iloc[0]}
            if len(col) and col.dtype != object and bool((col == col.iloc[0]).to_numpy(dtype=bool, na_value=False).all()):
                return {col.iloc[0]}
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
