"""Interval rules: a spike on an interval row (a scrape, a periodic stats line) is judged from its
counters and gauges; for mixing, from the relation between prefill work per interval and ITL
excess across the instance's intervals - one interval's sums never show that a prefill shared a
step with decodes."""
from __future__ import annotations

import pandas as pd

from mixdiag.diagnosis.rule_context import Attribution, AttributionConfig, InstanceContext, evidence_of, num, row_quality


def attribute_interval(row: pd.Series, ctx: InstanceContext, cfg: AttributionConfig = AttributionConfig()) -> Attribution:
    """An interval (scrape, periodic log) spike: its counters and gauges, and for mixing the relation
    between prefill work per interval and ITL excess across the instance's intervals - one
    interval's sums alone never show that a prefill shared a step with decodes."""
    ev = evidence_of(row, ctx)
    f = cfg.interval_factor

    def done(cause: str, conf: float, **extra) -> Attribution:
        ev.update({k: v for k, v in extra.items() if v is not None})
        return Attribution(cause, round(max(0.0, min(1.0, conf * f)), 3), ev)

    if bool(row.get("kv_xfer")):
        return done("pd_transfer", 0.75 if row_quality(row, ctx, "kv_transfer") == "measured" else 0.65)
    if bool(row.get("preempt")):
        return done("kv_pressure", 0.8)
    imb, rel = num(row.get("expert_imbalance")), num(row.get("imbalance_rel"))
    if imb is not None and imb >= cfg.imbalance_abs and (rel is None or rel >= cfg.imbalance_rel):
        return done("ep_hotspot", 0.6 + 0.4 * min(1.0, ((rel or imb) - 1.0) / 2.0), imbalance_rel=rel)

    def pos(c):
        return num(row.get(c)) is not None and num(row.get(c)) > 0

    work = any(pos(c) for c in ("prefill_tokens", "large_step_share", "arrivals", "mixed_steps", "prefill_steps"))
    running = any(pos(c) for c in ("running_reqs", "decode_steps", "mixed_steps", "itl_count", "output_tokens"))
    counted = num(row.get("mixed_steps")) is not None and num(row.get("prefill_steps")) is not None
    rho, p = num(ctx.relation.get("rho")), num(ctx.relation.get("p_value"))
    related = rho is not None and p is not None and rho > 0 and p < cfg.relation_p
    rel_ev = {"prefill_itl_rho": None if rho is None else round(rho, 3),
              "prefill_itl_p_value": None if p is None else round(p, 4)}
    if work and running:
        # the engine counted a mixed step in the interval, or the row states it (measured kind)
        if pos("mixed_steps") or (row.get("kind") == "mixed" and row_quality(row, ctx, "token_allocation") == "measured"):
            return done("mixing", 0.7 + (0.15 if related else 0.0), **rel_ev)
        if counted and pos("prefill_steps") and pos("decode_steps"):
            return done("prefill_stall", 0.7 + (0.1 if related else 0.0), decodes_before=True, **rel_ev)
        if related:
            return done("mixing", 0.55 + 0.25 * min(1.0, rho / 0.6), **rel_ev)
        return done("unknown", 0.3, **rel_ev, reason="prefill work ran in the interval, but across intervals ITL "
                    "does not rise with prefill work, so it does not show that the prefill slowed the decodes")
    goff = num(row.get("graph_off_decode_steps"))
    if goff is not None and goff > 0 and not work:
        # decode passes the engine itself counted as run without a graph: a direct count
        return done("graph_fallback", 0.7, interval_graph_off_decode_steps=goff)
    return done("unknown", 0.3, reason="no prefill work, transfer, preemption, imbalance or off-graph decode "
                "counted in the interval")
