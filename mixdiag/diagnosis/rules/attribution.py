"""Attribution: give each spike one cause from the closed taxonomy, a confidence in [0, 1] and the
evidence (signal values and their quality) behind it - or ``unknown`` when no cause is supported.

The rules live in one module per view of the engine: :mod:`~mixdiag.diagnosis.rules.step_rules` (step
rows), :mod:`~mixdiag.diagnosis.rules.interval_rules` (scrape / stats-line rows) and
:mod:`~mixdiag.diagnosis.rules.fused_rules` (one engine seen through both); what they share is in
:mod:`~mixdiag.diagnosis.rules.rule_context`. These modules are the only place evidence becomes a
cause and a confidence; docs/analyze.md has the rule table.
"""
from __future__ import annotations

from dataclasses import replace

import pandas as pd

from mixdiag.diagnosis.config import AttributionConfig
from mixdiag.diagnosis.detection.context import InstanceContext
from mixdiag.diagnosis.rules.fused_rules import attribute_fused
from mixdiag.diagnosis.rules.interval_rules import attribute_interval
from mixdiag.diagnosis.rules.rule_context import Attribution, num
from mixdiag.diagnosis.rules.step_rules import attribute_step


def attribute(row: pd.Series, ctx: InstanceContext, cfg: AttributionConfig = AttributionConfig()) -> Attribution:
    """Attribute one spike row (its signals plus ``latency_s``, ``baseline_s``): interval rows by
    the interval rules, step rows by the step rules."""
    if row.get("granularity") == "interval":
        return attribute_interval(row, ctx, cfg)
    return attribute_step(row, ctx, cfg)


def attribute_spike(row, ctx: InstanceContext, cfg: AttributionConfig) -> Attribution:
    """The verdict on one spike row as the diagnosis reports it: its own view's rules, the wait of a
    request that sat out steps (``request_stall_s``), the other view's evidence (fused rules), and
    on an instance without decode-like structure a confidence no higher than ``cfg.not_llm_cap``, and
    on a latency below the source's stamp resolution no higher than ``cfg.resolution_cap``."""
    a = attribute(row, ctx, cfg)
    if row.get("request_stall", False):
        a.evidence["request_stall_s"] = float(row["stall_max_s"])
    a = attribute_fused(row, a, cfg)
    if not ctx.llm_like:  # no decode-like structure: nothing is called with certainty
        a = replace(a, confidence=min(a.confidence, cfg.not_llm_cap), evidence=a.evidence | {"llm_serving": False})
    res = below_resolution(row, a)
    if res is not None:
        a = replace(a, confidence=min(a.confidence, cfg.resolution_cap),
                    evidence=a.evidence | {"stamp_resolution_s": res, "latency_below_resolution": True})
    return a


def below_resolution(row, a: Attribution) -> float | None:
    """The stamp resolution of a step row whose verdict rests on a latency read from stamps coarser
    than the usual step time, else None. The usual step time: the row's baseline, or the step time
    the source states if shorter (a log that samples one line per 40 forwards has a baseline of 40
    forwards between its lines; its stated mean step time is one forward). Stamp-read: a host
    stall (a gap between two stamps) always; any other cause unless the source stated the step's
    time itself (``elapsed_s``: SGLang's gen throughput, a measured mean, not a stamp difference)."""
    if row.get("granularity") == "interval":
        return None  # interval ITL comes from the engine's histograms, not from stamps
    res, base = num(row.get("stamp_resolution_s")), num(row.get("baseline_s"))
    step = min((x for x in (base, num(row.get("stated_step_s"))) if x is not None), default=None)
    if not res or step is None or step >= res:
        return None
    if a.cause != "host_stall" and num(row.get("elapsed_s")) is not None:
        return None
    return res
