"""The report of a since-start Timeline (one ``/metrics`` dump: no time axis, so no spikes): per
instance ITL quantiles, token totals and preemptions since the process started, as lines for
``mixdiag analyze`` and as the ``since_start`` part of its ``--json``.
"""
from __future__ import annotations

import math

from mixdiag.schema import Timeline


def summary_lines(tl: Timeline) -> list[str]:
    """Human lines for a since-start Timeline: per instance ITL P50/P99, token totals, preemptions."""
    info = tl.meta.get("since_start")
    if not info or tl.steps is None or not len(tl.steps):
        return []
    span = info["t_end_s"] - info["t_start_s"]
    head = f"since process start ({span:.0f} s)" if info.get("start_known") else "since process start"
    out = [f"One scrape: {head}, from the counters and histograms:"]

    def num(row, col, fmt):
        v = row.get(col)
        return fmt.format(v) if v is not None and isinstance(v, (int, float)) and math.isfinite(v) else "-"

    for _, r in tl.steps.iterrows():
        row = r.to_dict()
        parts = [f"ITL P50 {num(row, 'itl_p50_s', '{:.4f}')} s, P99 {num(row, 'itl_p99_s', '{:.4f}')} s "
                 f"({num(row, 'itl_count', '{:.0f}')} outputs)",
                 f"prompt tokens {num(row, 'prefill_tokens', '{:.0f}')}",
                 f"generation tokens {num(row, 'output_tokens', '{:.0f}')}",
                 f"preemptions {num(row, 'preempted_reqs', '{:.0f}')}"]
        steps = {k: row.get(f"{k}_steps") for k in ("prefill", "decode", "mixed")}
        total = sum(v for v in steps.values() if isinstance(v, float) and math.isfinite(v))
        if total > 0 and isinstance(steps["mixed"], float) and math.isfinite(steps["mixed"]):
            parts.append(f"mixed steps {steps['mixed'] / total:.1%}")
        elif isinstance(row.get("large_step_share"), float) and math.isfinite(row["large_step_share"]):
            parts.append(f"large-step share {row['large_step_share']:.1%}")
        out.append(f"  {row['instance']}: " + "; ".join(parts))
    return out


SUMMARY_COLUMNS = ("itl_p50_s", "itl_p90_s", "itl_p99_s", "itl_mean_s", "itl_count", "prefill_tokens",
                   "output_tokens", "preempted_reqs", "running_reqs", "waiting_reqs", "mixed_steps",
                   "large_step_share")


def summary_rows(tl: Timeline) -> dict[str, dict]:
    """``{instance: {column: value}}`` of a since-start Timeline (JSON-ready; NaN -> None)."""
    if not tl.meta.get("since_start") or tl.steps is None:
        return {}
    out = {}
    for _, r in tl.steps.iterrows():
        vals = {c: r.get(c) for c in SUMMARY_COLUMNS if c in tl.steps}
        out[str(r["instance"])] = {c: (float(v) if isinstance(v, (int, float)) and math.isfinite(v) else None)
                                   for c, v in vals.items()}
    out_meta = tl.meta["since_start"]
    return {"t_start_s": out_meta["t_start_s"], "t_end_s": out_meta["t_end_s"],
            "start_known": out_meta["start_known"], "instances": out}
