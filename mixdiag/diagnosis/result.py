"""The diagnosis result, a contract (docs/contracts.md section 5, ``mixdiag schema``): the spike
record, counts by cause, the headline numbers, the last spike, the mixed-step share and the ITL
summary. Outputs (text and HTML reports, exporter, dashboard) read these fields; none re-counts.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from mixdiag.causes import CAUSES
from mixdiag.diagnosis.budget import Budget
from mixdiag.diagnosis.spikes import itl_values
from mixdiag.schema import SPIKE_COLUMNS as _SPIKE_SCHEMA, Timeline

if TYPE_CHECKING:
    from mixdiag.diagnosis.pipeline import DiagnosisConfig

#: Column order of ``Diagnosis.spikes`` (documented in :data:`mixdiag.schema.SPIKE_COLUMNS`).
SPIKE_COLUMNS = [c.name for c in _SPIKE_SCHEMA]
#: Step kinds that count as work when computing the share of mixed steps.
WORK_KINDS = ("prefill", "decode", "mixed")
#: ``Diagnosis.itl["source"]`` -> the headline's shorter label.
_ITL_SOURCE = {"token_events": "tokens", "step_latency": "steps", "interval_quantiles": "intervals"}


def _f(v) -> float:
    """A plain float (NaN for None/NA), safe to put in a dataclass and JSON."""
    try:
        return float(v)
    except (TypeError, ValueError):
        return math.nan


@dataclass(frozen=True)
class Headline:
    """The overview numbers of one diagnosis (dashboard Overview, exporter, demo summary)."""

    verdict: str
    by_cause: dict[str, int]
    n_spikes: int
    itl_p50_s: float
    itl_p99_s: float
    itl_max_s: float
    itl_source: str  # "tokens" (per output event) | "steps" (step-to-step) | "intervals" | "none"
    mixed_share: float  # mixed steps / work steps; NaN without step-granularity rows
    n_steps: int  # rows of the analysed Timeline's steps frame (steps and intervals)
    instances: tuple[str, ...]
    t_first_s: float
    t_last_s: float
    last_spike: dict = field(default_factory=dict)  # cause, itl_s, t_s, instance, step (empty: none)


def count_by_cause(causes) -> dict[str, int]:
    """Spikes per cause, every cause of the closed set present (zeros included); a cause outside
    the set counts as ``unknown``. The one place spikes are counted by cause."""
    counts = {c: 0 for c in CAUSES}
    for c in causes:
        counts[c if c in counts else "unknown"] += 1
    return counts


def mixed_share(steps: pd.DataFrame) -> float:
    """Share of work steps (prefill, decode, mixed) that were mixed; NaN with no step rows."""
    s = steps[steps["granularity"] == "step"] if "granularity" in steps else steps
    n = int(s["kind"].isin(WORK_KINDS).sum())
    return float((s["kind"] == "mixed").sum() / n) if n else math.nan


def last_spike_of(spikes: pd.DataFrame | None) -> dict:
    """The latest spike (by time) as a plain dict, or {} when there is none."""
    if spikes is None or not len(spikes):
        return {}
    row = spikes.loc[spikes["t_s"].idxmax()]
    return {"cause": str(row["cause"]), "itl_s": _f(row["itl_s"]), "t_s": _f(row["t_s"]),
            "instance": str(row["instance"]), "step": int(row["step"])}


def make_headline(timeline: Timeline, verdict: str, by_cause: dict[str, int], itl: dict, last: dict) -> Headline:
    """The headline of a diagnosis of ``timeline`` (counts and ITL taken as given, never recomputed)."""
    span = timeline.span() or (math.nan, math.nan)
    return Headline(verdict=str(verdict), by_cause=dict(by_cause), n_spikes=sum(by_cause.values()),
                    itl_p50_s=_f(itl.get("p50_s")), itl_p99_s=_f(itl.get("p99_s")), itl_max_s=_f(itl.get("max_s")),
                    itl_source=_ITL_SOURCE.get(str(itl.get("source")), "none"),
                    mixed_share=mixed_share(timeline.steps), n_steps=len(timeline.steps),
                    instances=tuple(timeline.instances), t_first_s=_f(span[0]), t_last_s=_f(span[1]),
                    last_spike=last)


@dataclass
class Diagnosis:
    """The result of :func:`~mixdiag.diagnosis.pipeline.diagnose` (docs/contracts.md section 5).

    ``spikes`` follows :data:`mixdiag.schema.SPIKE_COLUMNS`; ``by_cause`` has every cause as a key;
    ``headline``, ``last_spike``, ``mixed_share`` and ``itl`` are the numbers every output shows.
    """

    spikes: pd.DataFrame
    steps: pd.DataFrame
    by_cause: dict
    verdict: str
    itl: dict  # p50_s, p99_s, max_s (s or None), source
    headline: Headline
    instances: dict = field(default_factory=dict)  # instance -> {signals, periodicity, latency_source}
    config: DiagnosisConfig | None = None
    budget: Budget = field(default_factory=Budget)  # ITL excess by cause, P99 without each (budget.py)

    @property
    def last_spike(self) -> dict:
        """The latest spike: cause, itl_s, t_s, instance, step ({} when none)."""
        return self.headline.last_spike

    @property
    def mixed_share(self) -> float:
        """Mixed steps / work steps of the analysed Timeline (NaN without step rows)."""
        return self.headline.mixed_share

    def by_cause_after(self, counted_until: dict[str, float]) -> tuple[dict[str, int], dict[str, float]]:
        """Spikes per cause newer than ``counted_until[instance]`` (a watcher's earlier publications),
        and the new per-instance newest spike time. With ``{}``: ``by_cause``."""
        until, new = dict(counted_until), []
        for inst, grp in (self.spikes.groupby("instance", sort=True) if len(self.spikes) else ()):
            t = grp["t_s"].to_numpy(dtype="float64")
            new += list(grp.loc[t > until.get(str(inst), -math.inf), "cause"].astype(str))
            until[str(inst)] = max(until.get(str(inst), -math.inf), float(t.max()))
        return count_by_cause(new), until

    def to_json(self, top: int | None = None) -> dict:
        """The ``mixdiag analyze --json`` document (docs/analyze.md)."""
        st = self.steps
        step_rows = st[st["granularity"] == "step"] if len(st) else st
        by_kind = {k: int(v) for k, v in step_rows["kind"].value_counts().sort_index().items()} if len(st) else {}
        spikes = self.spikes.sort_values("t_s", kind="stable")
        if top is not None:
            spikes = spikes.head(top)
        rows = []
        for r in spikes.itertuples(index=False):
            rows.append({"instance": r.instance, "step": int(r.step), "t_s": float(r.t_s), "itl_s": float(r.itl_s),
                         "baseline_s": float(r.baseline_s), "cause": r.cause, "confidence": float(r.confidence),
                         "evidence": r.evidence, "missing_signals": list(r.missing_signals)})
        return {"verdict": self.verdict,
                "steps": {"total": int(len(step_rows)), "by_kind": by_kind,
                          "intervals": int((st["granularity"] == "interval").sum()) if len(st) else 0},
                "itl": self.itl,
                "spikes": rows,
                "by_cause": dict(self.by_cause),
                "budget": self.budget.to_json(),
                "instances": self.instances}


def itl_summary(tl: Timeline, steps: pd.DataFrame) -> dict:
    """ITL P50/P99/max (s) and their source: token events, else decode step latency, else the
    interval quantiles' medians (max = the largest interval P99)."""
    if len(tl.tokens):
        v = itl_values(tl.tokens)  # Timeline.itl()'s values, in request order: same quantiles
        src = "token_events"
    else:
        st = steps[(steps["granularity"] == "step")]
        if "latency_s" in st.columns and len(st):
            v = st.loc[st["has_decode"], "latency_s"].dropna().to_numpy()
            if not len(v):  # no decode rows known (a trace without token counts): every step's latency
                v = st["latency_s"].dropna().to_numpy()
            src = "step_latency"
        else:
            iv = steps[steps["granularity"] == "interval"] if len(steps) else steps
            p50 = iv["itl_p50_s"].dropna() if len(iv) else pd.Series(dtype=float)
            p99 = iv["itl_p99_s"].dropna() if len(iv) else pd.Series(dtype=float)
            return {"p50_s": float(p50.median()) if len(p50) else None,
                    "p99_s": float(p99.median()) if len(p99) else None,
                    "max_s": float(p99.max()) if len(p99) else None, "source": "interval_quantiles"}
    if not len(v):
        return {"p50_s": None, "p99_s": None, "max_s": None, "source": src}
    return {"p50_s": float(np.quantile(v, 0.5)), "p99_s": float(np.quantile(v, 0.99)), "max_s": float(v.max()),
            "source": src}
