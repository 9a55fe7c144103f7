"""What every Prometheus module shares: the label/view types, the timed-scrape record, the metric
names read by more than one layer, and the counter/histogram/gauge arithmetic.

The bottom of ``collectors/prometheus/``: imports only numpy, ``mixdiag.wire`` and
``collectors.text_input`` (for the ``LineStats`` type), so parsing, fetching, dialect mapping and
interval building can all use it without importing each other.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from mixdiag import wire

from mixdiag.collectors.text_input import LineStats

LabelKey = tuple[tuple[str, str], ...]  # sorted (name, value) pairs
View = dict[str, dict[LabelKey, float]]  # one instance's samples in one scrape

#: Suffix on a ``meta["metric_sources"]`` entry whose column is derived (quality ``inferred``).
INFERRED = " [inferred]"
#: Labels that split a target into several Timeline instances (vLLM DP engines, SGLang DP ranks).
SPLIT_LABELS = ("engine", "dp_rank")

# Gauges as of the interval end: (metric, how several series combine).
GAUGE_COLUMNS: dict[str, list[tuple[str, str]]] = {
    "running_reqs": [(wire.REQUESTS_RUNNING, "sum"), ("vllm:num_requests_running", "sum"),
                     ("sglang:num_running_reqs", "sum")],
    "waiting_reqs": [(wire.REQUESTS_WAITING, "sum"), ("vllm:num_requests_waiting", "sum"),
                     ("sglang:num_queue_reqs", "sum")],
    "kv_usage": [(wire.KV_USAGE_RATIO, "mean"), ("vllm:kv_cache_usage_perc", "mean"),
                 ("vllm:gpu_cache_usage_perc", "mean"), ("sglang:token_usage", "mean")],
    # the last step's max/mean tokens per EP rank at scrape time: a sample, not an interval mean
    "expert_imbalance": [(wire.EXPERT_IMBALANCE_RATIO, "max")],
}
#: ITL histograms, preferred first (vLLM's TPOT histogram holds the same data under its old name).
ITL_HISTOGRAMS = (wire.INTER_TOKEN_LATENCY_SECONDS, "vllm:inter_token_latency_seconds",
                  "vllm:time_per_output_token_seconds", "sglang:inter_token_latency_seconds",
                  "sglang:time_per_output_token_seconds")
#: TTFT histograms (dialect mapping reads them; the HTTP layer fetches their buckets).
TTFT_HISTOGRAMS = (wire.TIME_TO_FIRST_TOKEN_SECONDS, "vllm:time_to_first_token_seconds",
                   "sglang:time_to_first_token_seconds")
ITERATION_TOKENS = ("vllm:iteration_tokens_total",)  # histogram base name (its buckets are tokens)
_NOT_GAUGE_SUFFIXES = ("_total", "_bucket", "_sum", "_count", "_created")


@dataclass
class TimedScrape:
    """One parsed scrape (a ``prom_text.Scrape``), its time and its honesty counters."""

    t_s: float
    scrape: Any
    stats: LineStats | None = None


def match_labels(labels: LabelKey, want: dict) -> bool:
    """Whether ``labels`` hold every ``name: value`` of ``want`` (a tuple value: any one of them)."""
    d = dict(labels)
    return all(d.get(k) in v if isinstance(v, tuple) else d.get(k) == v for k, v in want.items())


def counter_increase(prev: dict[LabelKey, float] | None, cur: dict[LabelKey, float] | None,
                     want: dict | None = None) -> float:
    """Summed increase of the matching series between two scrapes; NaN when none is present now."""
    if not cur:
        return math.nan
    prev = prev or {}
    total, seen = 0.0, False
    for labels, v1 in cur.items():
        if want and not match_labels(labels, want):
            continue
        if not math.isfinite(v1):
            continue
        seen = True
        v0 = prev.get(labels)
        if v0 is None or not math.isfinite(v0):
            total += v1  # born after the previous scrape, from zero
        elif v1 >= v0:
            total += v1 - v0
        else:
            total += v1  # reset (process restart): everything counted since is the increase
    return total if seen else math.nan


#: How a bucket quantile relates to the truth: inside a bucket with both edges shown (interpolated),
#: at most the lowest bound shown, or at least the highest finite bound.
INSIDE, AT_MOST, AT_LEAST = "", "<=", ">="
#: Row key (dropped before the row reaches the Timeline) carrying ``{column: AT_MOST | AT_LEAST}``;
#: ``build_timeline`` counts them into ``meta["quantile_bounds"]``.
QUANTILE_BOUNDS = "_quantile_bounds"


def bucket_quantile_bound(q: float, upper: np.ndarray, cum: np.ndarray) -> tuple[float, str]:
    """``histogram_quantile`` over cumulative ``cum`` counts at sorted ``upper`` bounds, and whether
    the value is exact to the bucket (``INSIDE``) or only a bound.

    Unlike PromQL, a quantile in the lowest bucket shown is not interpolated up from 0: its lower
    edge is not in the data (a fragment whose lowest bucket is ``le="7.5"`` says nothing about
    where under 7.5 s the values lie), so the answer is ``(7.5, AT_MOST)``. In the ``+Inf`` bucket it
    is ``(highest finite bound, AT_LEAST)``, as PromQL returns that bound. NaN without observations."""
    if len(upper) < 2 or not math.isinf(upper[-1]) or cum[-1] <= 0:
        return math.nan, INSIDE
    rank = q * cum[-1]
    b = int(np.searchsorted(cum[:-1], rank, side="left"))
    if b >= len(upper) - 1:
        return float(upper[-2]), AT_LEAST
    hi = float(upper[b])
    if b == 0:
        return hi, (INSIDE if hi <= 0 else AT_MOST)
    lo, below = float(upper[b - 1]), float(cum[b - 1])
    n = float(cum[b]) - below
    return (hi if n <= 0 else lo + (hi - lo) * (rank - below) / n), INSIDE


def bucket_tail_floor(upper: np.ndarray, cum: np.ndarray) -> np.ndarray:
    """Per row of cumulative bucket increases (rows x sorted bounds ``upper``): the lower edge of the highest
    bucket that grew - at least one observation was this large (0 for the lowest bucket; NaN where no bucket
    grew or a bucket is absent). One slow token among hundreds moves no quantile; this shows it."""
    cum = np.atleast_2d(np.asarray(cum, dtype=float))
    out = np.full(len(cum), np.nan)
    if not cum.size or not len(upper):
        return out
    full = ~np.isnan(cum).any(axis=1)
    c = np.maximum.accumulate(np.where(np.isnan(cum), 0.0, cum), axis=1)  # as PromQL fixes a dip
    grew = np.diff(c, axis=1, prepend=0.0) > 0
    top = grew.shape[1] - 1 - np.argmax(grew[:, ::-1], axis=1)
    lower = np.concatenate([[0.0], np.asarray(upper, dtype=float)[:-1]])
    ok = full & grew.any(axis=1)
    out[ok] = lower[top[ok]]
    return out


def bucket_quantile(q: float, upper: np.ndarray, cum: np.ndarray) -> float:
    """The value of :func:`bucket_quantile_bound` (a bound where the buckets give no more)."""
    return bucket_quantile_bound(q, upper, cum)[0]


def first_present(cur: View, candidates, test: Callable[[dict[LabelKey, float], Any], bool]):
    """The first candidate ``(metric, ...)`` whose series ``cur`` holds and ``test`` accepts; None if none."""
    for cand in candidates:
        series = cur.get(cand[0])
        if series and test(series, cand):
            return cand
    return None


def _gauge(series: dict[LabelKey, float], how: str) -> float:
    vals = [v for v in series.values() if math.isfinite(v)]
    if not vals:
        return math.nan
    if how == "max":
        return float(max(vals))
    return float(sum(vals) if how == "sum" else sum(vals) / len(vals))


def gauge_value(view: View, col: str) -> tuple[float, str] | None:
    """Gauge column ``col`` (a GAUGE_COLUMNS key) of one scrape: (value, the series read), from the
    first candidate series present; None when none is."""
    c = first_present(view, GAUGE_COLUMNS[col], lambda s, c: True) if view else None
    return None if c is None else (_gauge(view[c[0]], c[1]), c[0])


def is_gauge(name: str, types: dict[str, str]) -> bool:
    """Whether family ``name`` holds gauge values (not counter, bucket, sum or count series)."""
    t = types.get(name)
    if t is not None:
        return t in ("gauge", "untyped", "unknown", "summary") and not name.endswith(_NOT_GAUGE_SUFFIXES)
    return not name.endswith(_NOT_GAUGE_SUFFIXES)
