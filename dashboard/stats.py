"""What the pages and the exporter show, computed from a Timeline and its Diagnosis.

Everything here returns plain frames or frozen dataclasses; rendering (figures, HTML) lives in
:mod:`mixdiag.dashboard.figures` and :mod:`mixdiag.dashboard.layout`. A *diagnosis* is the object
``mixdiag.diagnosis.pipeline.diagnose(timeline)`` returns (docs/contracts.md section 5): ``spikes``,
``steps``, ``by_cause``, ``verdict``.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from mixdiag.schema import Timeline

from mixdiag.causes import CAUSES, SIGNAL_COLUMNS
#: Step kinds that count as work when computing the share of mixed steps.
WORK_KINDS = ("prefill", "decode", "mixed")


def _f(v) -> float:
    """A plain float (NaN for None/NA), safe to put in a dataclass and JSON."""
    try:
        v = float(v)
    except (TypeError, ValueError):
        return math.nan
    return v


@dataclass(frozen=True)
class Headline:
    """The Overview page's numbers (also what the exporter publishes)."""

    verdict: str
    by_cause: dict[str, int]
    n_spikes: int
    itl_p50_s: float
    itl_p99_s: float
    itl_max_s: float
    itl_source: str  # "tokens" (per output event) | "steps" (step-to-step) | "intervals" | "none"
    mixed_share: float  # mixed steps / work steps; NaN without step-granularity rows
    n_steps: int
    instances: tuple[str, ...]
    t_first_s: float
    t_last_s: float
    last_spike: dict = field(default_factory=dict)  # cause, itl_s, t_s, instance, step (empty: none)


def itl_values(timeline: Timeline) -> tuple[np.ndarray, str]:
    """Inter-token latencies (s) a client saw, and where they came from.

    Per output event from the tokens frame when present; otherwise the per-interval P99 (or
    mean) columns coarse sources fill, labelled ``"steps"``.
    """
    if len(timeline.tokens):
        itl = timeline.itl()["itl_s"].to_numpy(dtype="float64")
        return itl[np.isfinite(itl)], "tokens"
    for col in ("itl_p99_s", "itl_mean_s", "itl_p50_s"):
        v = timeline.steps[col].to_numpy(dtype="float64")
        v = v[np.isfinite(v)]
        if len(v):
            return v, "intervals"
    return np.array([], dtype="float64"), "none"


def mixed_share(steps: pd.DataFrame) -> float:
    """Share of work steps (prefill, decode, mixed) that were mixed; NaN with no step rows."""
    s = steps[steps["granularity"] == "step"] if "granularity" in steps else steps
    work = s["kind"].isin(WORK_KINDS)
    n = int(work.sum())
    return float((s["kind"] == "mixed").sum() / n) if n else math.nan


def by_cause(diagnosis) -> dict[str, int]:
    """Spike count per cause with every cause of the closed set present (zeros included)."""
    counts = {c: 0 for c in CAUSES}
    for c, n in dict(diagnosis.by_cause).items():
        counts[c if c in counts else "unknown"] += int(n)
    return counts


def last_spike(diagnosis) -> dict:
    """The latest spike (by time) as a plain dict, or {} when there is none."""
    sp = diagnosis.spikes
    if sp is None or not len(sp):
        return {}
    row = sp.loc[sp["t_s"].idxmax()]
    return {"cause": str(row["cause"]), "itl_s": _f(row["itl_s"]), "t_s": _f(row["t_s"]),
            "instance": str(row["instance"]), "step": int(row["step"])}


def headline(timeline: Timeline, diagnosis) -> Headline:
    """The numbers of the Overview page, from a Timeline and its diagnosis."""
    span = timeline.span() or (math.nan, math.nan)
    counts = by_cause(diagnosis)
    given = getattr(diagnosis, "itl", None)
    if isinstance(given, dict) and "p50_s" in given:  # the report's own numbers, so both agree
        p50, p99, mx = _f(given.get("p50_s")), _f(given.get("p99_s")), _f(given.get("max_s"))
        src = {"token_events": "tokens", "step_latency": "steps",
               "interval_quantiles": "intervals"}.get(str(given.get("source")), "none")
    else:
        itl, src = itl_values(timeline)
        q = np.quantile(itl, [0.5, 0.99]) if len(itl) else (math.nan, math.nan)
        p50, p99, mx = _f(q[0]), _f(q[1]), (_f(itl.max()) if len(itl) else math.nan)
    return Headline(verdict=str(diagnosis.verdict), by_cause=counts, n_spikes=sum(counts.values()),
                    itl_p50_s=p50, itl_p99_s=p99, itl_max_s=mx, itl_source=src, mixed_share=mixed_share(timeline.steps), n_steps=len(timeline.steps),
                    instances=tuple(timeline.instances), t_first_s=_f(span[0]), t_last_s=_f(span[1]),
                    last_spike=last_spike(diagnosis))


def sources_frame(timeline: Timeline) -> pd.DataFrame:
    """One row per source read: format, path, lines parsed/skipped, partial, notes."""
    rows = []
    for s in timeline.meta.get("sources", []) or []:
        if not isinstance(s, dict):
            continue
        rows.append({"format": s.get("format", "?"), "path": s.get("path", ""),
                     "lines_parsed": s.get("lines_parsed"), "lines_skipped": s.get("lines_skipped"),
                     "partial": bool(s.get("partial", False)), "notes": "; ".join(map(str, s.get("notes", []) or []))})
    if not rows and timeline.meta.get("source"):
        rows.append({"format": str(timeline.meta["source"]), "path": "", "lines_parsed": None,
                     "lines_skipped": None, "partial": bool(timeline.meta.get("partial")), "notes": ""})
    return pd.DataFrame(rows, columns=["format", "path", "lines_parsed", "lines_skipped", "partial", "notes"])


def signals_frame(timeline: Timeline, diagnosis=None) -> pd.DataFrame:
    """Which signals each instance provides: the diagnosis' (or meta's) quality, else whether data is there.

    Columns: instance, then one column per signal of :data:`SIGNAL_COLUMNS` holding
    ``measured | estimated | inferred | absent`` (or ``present`` when the data is there but
    meta does not say how it was obtained).
    """
    rows = []
    steps, tokens = timeline.steps, timeline.tokens
    for inst in timeline.instances:
        row = {"instance": inst}
        st = steps[steps["instance"] == inst]
        declared = dict(timeline.meta.get("signals", {}).get(inst, {}) or {})
        per_inst = getattr(diagnosis, "instances", None) or {}
        declared.update((per_inst.get(inst) or {}).get("signals", {}) or {})
        for sig, cols in SIGNAL_COLUMNS.items():
            if sig in declared:
                row[sig] = str(declared[sig])
                continue
            if sig == "itl":
                has = bool((tokens["instance"] == inst).any()) or bool(st["itl_p99_s"].notna().any())
            elif cols == ("graph_mode",):
                has = bool((st["graph_mode"] != "unknown").any())
            else:
                has = bool(cols) and all(bool(st[c].notna().any()) for c in cols if c in st)
            row[sig] = "present" if has else "absent"
        rows.append(row)
    return pd.DataFrame(rows, columns=["instance", *SIGNAL_COLUMNS])
