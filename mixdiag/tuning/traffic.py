"""The user's traffic as a list of requests (arrival, prompt length, output length), from a Timeline.

Best source first:

1. token events (``tokens`` frame: the engine's own, or client records): one request per request id;
   output length = its tokens; arrival and prompt length from the first event's ``arrival_s`` /
   ``prompt_tokens`` (measured) — else arrival = first token time minus the interval TTFT median
   and prompt = the steps' prefill tokens per request (both *inferred*);
2. interval counters (``steps`` rows of granularity 'interval' with ``arrivals``, ``prefill_tokens``,
   ``output_tokens``): each interval's arrivals spread evenly over it, every request the interval
   mean prompt and the run's mean output length (*estimated*: lengths are means, not
   distributions).

The prefix-hit share is reported (prefix_hit_tokens / prompt tokens) but not replayed.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from mixdiag.errors import UserError


@dataclass(frozen=True)
class RequestSpec:
    """One request to replay: when it arrives (Timeline clock) and its lengths in tokens."""

    request_id: str
    arrival_s: float
    prompt_tokens: int
    output_tokens: int


@dataclass(frozen=True)
class Workload:
    """Requests sorted by arrival, plus where each field came from and how good it is."""

    requests: tuple[RequestSpec, ...]
    source: str                       # "token events" | "interval counters"
    quality: dict = field(default_factory=dict)   # arrivals / prompt_tokens / output_tokens -> measured|inferred|estimated
    notes: tuple[str, ...] = ()
    prefix_hit_share: float = math.nan
    instance: str = ""

    def __post_init__(self):
        if not self.requests:
            raise UserError("the input holds no requests to tune on (no token events and no interval arrivals)")

    @property
    def span_s(self) -> float:
        return self.requests[-1].arrival_s - self.requests[0].arrival_s

    def window(self, seconds: float) -> "Workload":
        """The requests arriving in the first ``seconds`` (a shorter sweep)."""
        t0 = self.requests[0].arrival_s
        keep = tuple(r for r in self.requests if r.arrival_s - t0 <= seconds)
        return Workload(keep, self.source, self.quality, self.notes, self.prefix_hit_share, self.instance)

    def summary(self) -> dict:
        """Counts, rate, length quantiles and qualities (what --json prints)."""
        p = np.array([r.prompt_tokens for r in self.requests])
        o = np.array([r.output_tokens for r in self.requests])
        span = self.span_s
        return {"source": self.source, "instance": self.instance, "requests": len(self.requests),
                "span_s": span, "request_rate_per_s": (len(p) - 1) / span if span > 0 else None,
                "prompt_tokens": {"p50": float(np.median(p)), "p99": float(np.quantile(p, 0.99)), "mean": float(p.mean())},
                "output_tokens": {"p50": float(np.median(o)), "p99": float(np.quantile(o, 0.99)), "mean": float(o.mean())},
                "prefix_hit_share": None if not math.isfinite(self.prefix_hit_share) else self.prefix_hit_share,
                "quality": dict(self.quality), "notes": list(self.notes)}


def _busiest_instance(tl) -> tuple[str, list[str]]:
    """The instance with the most data; a note when others are left out (the replay is one engine)."""
    counts: dict[str, int] = {}
    for df in (tl.tokens, tl.steps):
        if df is not None and len(df):
            for k, v in df["instance"].value_counts().items():
                counts[k] = counts.get(k, 0) + int(v)
    if not counts:
        raise UserError("the input holds no steps and no token events")
    inst = max(sorted(counts), key=lambda k: counts[k])
    notes = [f"{len(counts)} instances: tuning instance {inst} (the replay models one engine)"] if len(counts) > 1 else []
    return inst, notes


def _prefix_share(steps: pd.DataFrame | None) -> float:
    if steps is None or not len(steps) or "prefix_hit_tokens" not in steps:
        return math.nan
    hits = steps["prefix_hit_tokens"].sum(min_count=1)
    pre = steps["prefill_tokens"].sum(min_count=1)
    if not (pd.notna(hits) and pd.notna(pre)) or hits + pre <= 0:
        return math.nan
    return float(hits / (hits + pre))


def from_timeline(tl) -> Workload:
    """The workload of ``tl`` (see the module docstring for what is measured and what is estimated)."""
    inst, notes = _busiest_instance(tl)
    steps = tl.steps[tl.steps["instance"] == inst] if tl.steps is not None and len(tl.steps) else None
    share = _prefix_share(steps)
    if share > 0:
        notes.append(f"prefix-cache hits cover {100 * share:.0f} % of prompt tokens; the replay computes every "
                     "prompt token (no prefix cache), so TTFT is pessimistic")
    tok = tl.tokens[tl.tokens["instance"] == inst] if tl.tokens is not None and len(tl.tokens) else None
    if tok is not None and len(tok):
        return _from_tokens(tok, steps, inst, notes, share)
    if steps is not None and "arrivals" in steps and steps["arrivals"].notna().any():
        return _from_intervals(steps, inst, notes, share)
    raise UserError("cannot estimate a workload: the input has neither token events nor interval arrival counters "
                    "(request rate); give a run directory, client records or a metrics scrape")


def _from_tokens(tok: pd.DataFrame, steps, inst: str, notes: list[str], share: float) -> Workload:
    tok = tok.sort_values(["request_id", "t_s"], kind="stable")
    g = tok.groupby("request_id", sort=False)
    first = g.head(1).set_index("request_id")
    out_n = g["n_tokens"].sum()
    arrival = first["arrival_s"] if "arrival_s" in first else pd.Series(np.nan, index=first.index)
    plen = first["prompt_tokens"] if "prompt_tokens" in first else pd.Series(np.nan, index=first.index)
    quality = {"output_tokens": "measured"}
    if arrival.notna().all():
        quality["arrivals"] = "measured"
    else:
        ttft = _median_ttft(steps)
        arrival = arrival.fillna(first["t_s"] - ttft)
        quality["arrivals"] = "inferred"
        notes.append(f"arrivals inferred as first token time minus {'the interval TTFT median ' if ttft else ''}"
                     f"{ttft * 1e3:.0f} ms (no per-request arrival times)")
    if plen.notna().all():
        quality["prompt_tokens"] = "measured"
    else:
        mean = _mean_prompt(steps, len(first))
        if mean is None:
            raise UserError("cannot estimate prompt lengths: no per-request prompt_tokens and no prefill token counts")
        plen = plen.fillna(mean)
        quality["prompt_tokens"] = "estimated"
        notes.append(f"prompt lengths unknown per request: every request gets the mean {mean:.0f} tokens "
                     "(the steps' prefill tokens / requests)")
    reqs = [RequestSpec(str(rid), float(arrival[rid]), max(1, int(round(plen[rid]))), max(1, int(out_n[rid])))
            for rid in first.index]
    reqs.sort(key=lambda r: (r.arrival_s, r.request_id))
    return Workload(tuple(reqs), "token events", quality, tuple(notes), share, inst)


def _median_ttft(steps) -> float:
    if steps is not None and "ttft_p50_s" in steps and steps["ttft_p50_s"].notna().any():
        return float(steps["ttft_p50_s"].median())
    return 0.0


def _mean_prompt(steps, n_requests: int) -> float | None:
    if steps is None or "prefill_tokens" not in steps or not steps["prefill_tokens"].notna().any() or not n_requests:
        return None
    hits = steps["prefix_hit_tokens"].fillna(0).sum() if "prefix_hit_tokens" in steps else 0.0
    return float((steps["prefill_tokens"].fillna(0).sum() + hits) / n_requests)


def _from_intervals(steps: pd.DataFrame, inst: str, notes: list[str], share: float) -> Workload:
    rows = steps[steps["arrivals"].notna()].sort_values("t_start_s", kind="stable")
    total = float(rows["arrivals"].sum())
    if total < 1:
        raise UserError("the interval counters saw no request arrive: nothing to tune on")
    out_mean = float(rows["output_tokens"].sum() / total) if "output_tokens" in rows else math.nan
    if not math.isfinite(out_mean) or out_mean < 1:
        raise UserError("cannot estimate output lengths: the interval rows carry no output token counts")
    run_pre = float(rows["prefill_tokens"].sum() / total) if "prefill_tokens" in rows else math.nan
    if not math.isfinite(run_pre) or run_pre < 1:
        raise UserError("cannot estimate prompt lengths: the interval rows carry no prompt/prefill token counts")
    reqs, carry = [], 0.0
    for r in rows.itertuples(index=False):
        carry += float(r.arrivals)
        n = int(carry)
        carry -= n
        pre = getattr(r, "prefill_tokens", math.nan)
        plen = pre / r.arrivals if r.arrivals > 0 and pd.notna(pre) and pre > 0 else run_pre
        dt = (r.t_end_s - r.t_start_s) / max(n, 1)
        for i in range(n):   # evenly spread: the counters say how many, not when
            reqs.append(RequestSpec(f"{inst}-i{r.step}-{i}", float(r.t_start_s + (i + 0.5) * dt),
                                    max(1, int(round(plen))), max(1, int(round(out_mean)))))
    notes.append("workload from interval counters: arrivals spread evenly within each interval, prompt length = "
                 "the interval's prefill tokens per arrival, output length = the run's mean (no length distribution)")
    return Workload(tuple(reqs), "interval counters",
                    {"arrivals": "estimated", "prompt_tokens": "estimated", "output_tokens": "estimated"},
                    tuple(notes), share, inst)


def stamped_between_steps(wl: Workload, rows: pd.DataFrame, tol_s: float = 1e-5) -> bool:
    """True when every measured arrival inside the stepped span falls between two steps (never
    during one): the stamps are admissions — an engine loop that picks requests up between steps
    stamps them then (the reference runner; an API frontend stamps on receipt, mid-step) — so the
    data's TTFT excludes the wait for the step in flight. ``rows``: per-step rows with times."""
    if wl.quality.get("arrivals") != "measured" or not len(rows):
        return False
    start = rows["t_start_s"].to_numpy()
    end = rows["t_end_s"].to_numpy()
    arr = np.array([r.arrival_s for r in wl.requests])
    arr = arr[(arr > start[0]) & (arr < end[-1])]
    if len(arr) < 3:
        return False
    i = np.searchsorted(start, arr, side="right") - 1     # the last step started at or before it
    inside = arr < end[i] - tol_s
    return not inside.any()
