"""What the pages and the exporter show, computed from a Timeline and its Diagnosis.

Everything here returns plain frames or frozen dataclasses; rendering lives in
:mod:`mixdiag.dashboard.figures` (plotly) and the page modules (Dash components). A *diagnosis* is the object
``mixdiag.diagnosis.diagnose(timeline)`` returns (docs/contracts.md section 5); its
``by_cause``, ``headline``, ``last_spike``, ``mixed_share`` and ``itl`` fields are shown as they are.
"""
from __future__ import annotations

from dataclasses import dataclass

import pandas as pd

from mixdiag.causes import SIGNAL_COLUMNS
from mixdiag.diagnosis.result import Headline
from mixdiag.report import excess_rows, saturation_lines
from mixdiag.schema import Timeline


def by_cause(diagnosis) -> dict[str, int]:
    """Spike count per cause (every cause a key): the diagnosis' own count, never re-counted."""
    return dict(diagnosis.by_cause)


def last_spike(diagnosis) -> dict:
    """The latest spike as a plain dict, or {} when there is none (the diagnosis' field)."""
    return dict(diagnosis.last_spike)


def headline(timeline: Timeline, diagnosis) -> Headline:
    """The numbers of the Overview page: the diagnosis' headline (``diagnose(timeline)`` computed it)."""
    return diagnosis.headline


@dataclass(frozen=True)
class RegimeSummary:
    """The Overview's regime numbers: excess over the healthy reference by cause (token-seconds, shares,
    largest first), episodes in all and per cause, and one line per saturated instance."""

    excess_s: dict
    shares: dict
    n_episodes: int
    episodes_by_cause: dict
    saturated: tuple


def regime_summary(diagnosis) -> RegimeSummary:
    """The diagnosis' regimes as the Overview shows them (the decomposition's numbers, never recomputed)."""
    reg = getattr(diagnosis, "regimes", None)
    rows = excess_rows(reg)
    eps = reg.episodes if reg is not None else None
    by = eps["cause"].astype(str).value_counts().to_dict() if eps is not None and len(eps) else {}
    return RegimeSummary(excess_s={c: v for c, v, _ in rows}, shares={c: sh for c, _, sh in rows},
                         n_episodes=int(sum(by.values())), episodes_by_cause={c: int(n) for c, n in by.items()},
                         saturated=tuple(saturation_lines(reg)))


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
                has = bool((tokens["instance"].to_numpy() == inst).any()) or bool(st["itl_p99_s"].notna().any())
            elif cols == ("graph_mode",):
                has = bool((st["graph_mode"] != "unknown").any())
            else:
                has = bool(cols) and all(bool(st[c].notna().any()) for c in cols if c in st)
            row[sig] = "present" if has else "absent"
        rows.append(row)
    return pd.DataFrame(rows, columns=["instance", *SIGNAL_COLUMNS])
