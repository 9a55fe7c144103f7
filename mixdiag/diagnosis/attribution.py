"""Attribution: give each spike one cause from the closed taxonomy, a confidence in [0, 1] and the
evidence (signal values and their quality) behind it - or ``unknown`` when no cause is supported.

The rules live in one module per view of the engine: :mod:`~mixdiag.diagnosis.step_rules` (step
rows), :mod:`~mixdiag.diagnosis.interval_rules` (scrape / stats-line rows) and
:mod:`~mixdiag.diagnosis.fused_rules` (one engine seen through both); what they share is in
:mod:`~mixdiag.diagnosis.rule_context`. These modules are the only place evidence becomes a cause
and a confidence; docs/analyze.md has the rule table.
"""
from __future__ import annotations

import pandas as pd

from mixdiag.causes import CAUSES  # noqa: F401  (re-exported for callers)
from mixdiag.diagnosis.fused_rules import attribute_between_steps, attribute_fused, attribute_preemptions  # noqa: F401
from mixdiag.diagnosis.interval_rules import attribute_interval
from mixdiag.diagnosis.rule_context import Attribution, AttributionConfig, InstanceContext  # noqa: F401
from mixdiag.diagnosis.step_rules import attribute_step


def attribute(row: pd.Series, ctx: InstanceContext, cfg: AttributionConfig = AttributionConfig()) -> Attribution:
    """Attribute one spike row (its signals plus ``latency_s``, ``baseline_s``): interval rows by
    the interval rules, step rows by the step rules."""
    if row.get("granularity") == "interval":
        return attribute_interval(row, ctx, cfg)
    return attribute_step(row, ctx, cfg)
