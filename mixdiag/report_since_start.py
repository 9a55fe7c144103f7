"""The report of a since-start Timeline (one ``/metrics`` dump: no time axis, so no spikes): per
instance ITL and TTFT quantiles, token totals and preemptions since the process started, as the
verdict and lines of ``mixdiag analyze`` and as the ``since_start`` part of its ``--json``.

A quantile is shown only as far as the buckets the dump holds: one in the lowest bucket shown is
"<= that bound", one in ``+Inf`` ">= the highest finite bound" (``meta["quantile_bounds"]``,
written by the Prometheus collectors); never a value interpolated below the lowest bucket.
"""
from __future__ import annotations

import dataclasses
import math

from mixdiag.diagnosis import Diagnosis
from mixdiag.diagnosis.budget import budget_of
from mixdiag.diagnosis.result import count_by_cause, make_headline, spike_frame
from mixdiag.schema import Timeline

#: What one dump cannot tell, said wherever its summary stands in for a verdict.
NO_TIME_AXIS = ("one dump has no time structure, so it cannot say when latency spiked or why "
                "(no spike causes)")
HOW_TO_LOCATE = ("sample the URL with --duration S, or give a directory of timed scrapes, to locate spikes "
                 "and their causes")
QUANTILE_COLUMNS = ("itl_p50_s", "itl_p90_s", "itl_p99_s", "ttft_p50_s", "ttft_p99_s")


def _finite(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def bound_of(tl: Timeline, instance: str, col: str) -> str:
    """'<=' or '>=' when the since-start row's quantile ``col`` is only a bucket bound, else ''."""
    counts = tl.meta.get("quantile_bounds", {}).get(instance, {}).get(col, {})
    return next((how for how, n in counts.items() if n), "")


def quantile_text(tl: Timeline, row: dict, col: str) -> str:
    """``0.0931 s``, ``<= 7.5 s``, ``>= 40 s`` or ``-`` (no data)."""
    v = row.get(col)
    if not _finite(v):
        return "-"
    how = bound_of(tl, str(row["instance"]), col)
    return f"{how} {v:g} s" if how else f"{v:.4f} s"


def _rows(tl: Timeline) -> list[dict]:
    if not tl.meta.get("since_start") or tl.steps is None or not len(tl.steps):
        return []
    return [r.to_dict() for _, r in tl.steps.iterrows()]


def _latency(tl: Timeline, row: dict, count: str = " over {:.0f} outputs") -> str:
    """``ITL P50 .., P99 .. over n outputs, TTFT P50 .., P99 ..``: the parts the dump holds."""
    def has(*cols):
        return any(_finite(row.get(c)) for c in cols)

    out = []
    if has("itl_p50_s", "itl_p99_s"):
        n = row.get("itl_count")
        out.append(f"ITL P50 {quantile_text(tl, row, 'itl_p50_s')}, P99 {quantile_text(tl, row, 'itl_p99_s')}"
                   + (count.format(n) if _finite(n) else ""))
    if has("ttft_p50_s", "ttft_p99_s"):
        out.append(f"TTFT P50 {quantile_text(tl, row, 'ttft_p50_s')}, P99 {quantile_text(tl, row, 'ttft_p99_s')}")
    return ", ".join(out) or "no ITL or TTFT histogram"


def _head(tl: Timeline) -> str:
    info = tl.meta["since_start"]
    span = info["t_end_s"] - info["t_start_s"]
    return f"since process start ({span:.0f} s)" if info.get("start_known") else "since process start"


def verdict(tl: Timeline) -> str:
    """The verdict of a since-start Timeline: its latency summary and what one dump cannot tell
    ('' when ``tl`` is no since-start Timeline)."""
    rows = _rows(tl)
    if not rows:
        return ""
    per = [(f"{r['instance']}: " if len(rows) > 1 else "") + _latency(tl, r) for r in rows]
    return f"One /metrics dump ({_head(tl)}): {'; '.join(per)}. A summary only: {NO_TIME_AXIS}."


def as_summary(d: Diagnosis, tl: Timeline) -> Diagnosis:
    """``d`` (the diagnosis of the since-start Timeline ``tl``) with the summary as its verdict and no
    spikes: a since-start row spans the whole run, so a P99 far above its P50 is the run's tail, not
    a moment that spiked - nothing in one dump can say when, or what caused it."""
    steps = d.steps.copy()
    if len(steps) and "is_spike" in steps:
        steps["is_spike"] = False
        steps["cause"] = None
    none = spike_frame([])
    by_cause = count_by_cause(none["cause"])
    text = verdict(tl)
    return dataclasses.replace(d, spikes=none, steps=steps, by_cause=by_cause, verdict=text,
                               headline=make_headline(tl, text, by_cause, d.itl, {}),
                               budget=budget_of(tl.tokens, steps, none))


def summary_lines(tl: Timeline) -> list[str]:
    """Human lines for a since-start Timeline: per instance ITL/TTFT quantiles, token totals, preemptions."""
    rows = _rows(tl)
    if not rows:
        return []
    out = [f"One scrape: {_head(tl)}, from the counters and histograms:"]

    def num(row, col, fmt):
        v = row.get(col)
        return fmt.format(v) if _finite(v) else "-"

    for row in rows:
        parts = [_latency(tl, row, " ({:.0f} outputs)"),
                 f"prompt tokens {num(row, 'prefill_tokens', '{:.0f}')}",
                 f"generation tokens {num(row, 'output_tokens', '{:.0f}')}",
                 f"preemptions {num(row, 'preempted_reqs', '{:.0f}')}"]
        steps = {k: row.get(f"{k}_steps") for k in ("prefill", "decode", "mixed")}
        total = sum(v for v in steps.values() if _finite(v))
        if total > 0 and _finite(steps["mixed"]):
            parts.append(f"mixed steps {steps['mixed'] / total:.1%}")
        elif _finite(row.get("large_step_share")):
            parts.append(f"large-step share {row['large_step_share']:.1%}")
        out.append(f"  {row['instance']}: " + "; ".join(parts))
    return out


SUMMARY_COLUMNS = ("itl_p50_s", "itl_p90_s", "itl_p99_s", "itl_mean_s", "itl_count", "ttft_p50_s", "ttft_p99_s",
                   "prefill_tokens", "output_tokens", "preempted_reqs", "running_reqs", "waiting_reqs",
                   "mixed_steps", "large_step_share")


def summary_rows(tl: Timeline) -> dict[str, dict]:
    """``{instance: {column: value}}`` of a since-start Timeline (JSON-ready; NaN -> None). A
    quantile that is only a bucket bound is None, with ``bounds: {column: {"upper_s" | "lower_s": x}}``."""
    if not tl.meta.get("since_start") or tl.steps is None:
        return {}
    out = {}
    for row in _rows(tl):
        inst = str(row["instance"])
        vals = {c: (float(row[c]) if _finite(row.get(c)) else None) for c in SUMMARY_COLUMNS if c in tl.steps}
        bounds = {}
        for c in QUANTILE_COLUMNS:
            how = bound_of(tl, inst, c)
            if how and vals.get(c) is not None:
                bounds[c] = {"upper_s" if how == "<=" else "lower_s": vals[c]}
                vals[c] = None
        out[inst] = vals | ({"bounds": bounds} if bounds else {})
    info = tl.meta["since_start"]
    return {"t_start_s": info["t_start_s"], "t_end_s": info["t_end_s"], "start_known": info["start_known"],
            "instances": out}
