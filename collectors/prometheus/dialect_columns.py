"""vLLM / SGLang / mixdiag ``/metrics`` dialects -> the Timeline's evidence columns of an interval row.

:mod:`.prom_intervals` fills the columns every dialect shares (token counters, gauges, ITL
quantiles); :func:`dialect_columns` adds, between two scrapes of one instance, what each engine's own
series say about *how* the interval's steps were built (reference/formats.md §1.1, §2.3):

============================  ============================================================  =========
column                        from (first present wins)                                      quality
============================  ============================================================  =========
``large_step_share``          mixdiag ``steps_total{kind}`` (prefill+mixed / non-idle);      measured
                              SGLang ``cuda_graph_passes_total{mode=prefill_*}`` / all;      measured
                              vLLM ``iteration_tokens_total`` increase: share of steps with  inferred
                              more tokens than ``running_reqs`` (bucket resolution; the
                              histogram misses output-less prefill chunks, so it undercounts)
``graph_{full,piecewise,      mixdiag ``graph_dispatch_total{mode}`` (the dispatcher's plan  estimated
none}_steps``                 from the batch shape, not a replay: only ``graph_replays_total``
                              counts replays); SGLang ``cuda_graph_passes_total``:           measured
                              decode_cuda_graph -> full, prefill_cuda_graph -> piecewise,
                              *_none -> none
``ttft_p50_s``/``ttft_p99_s``  TTFT histogram increase (histogram_quantile)                   measured
``arrivals``                  TTFT ``_count`` increase: requests that got their first        inferred
                              token in the interval (prefill *finished*; arrival lags by TTFT)
``kv_transfer_s``/``_bytes``  SGLang ``kv_transfer_latency_ms_sum`` / ``total_mb_sum``       measured
                              (vLLM NIXL sums are in prom_intervals' tables)
``expert_imbalance``          mixdiag gauge; SGLang ``eplb_balancedness`` summary:           inferred
                              1 / (Δsum/Δcount). Balancedness is avg/max tokens per GPU, our
                              imbalance max/avg; the reciprocal of the mean balancedness is
                              ≤ the mean imbalance (Jensen), so it understates spread a bit
``forward_s``                 SGLang ``gpu_execution_seconds_total`` (any category)          measured
``spec_accept_rate``          vLLM ``spec_decode_num_accepted_tokens`` / ``_draft_tokens``   measured
(extra column)
``kind``                      vLLM: ``mixed`` when large steps ran while requests were       inferred
                              running (V1 batches prefill chunks with decodes); SGLang:
                              ``decode``/``prefill`` when only one pass kind ran
============================  ============================================================  =========

``prefill_work_tokens``       vLLM ``prompt_tokens`` increase spread back over the requests'  inferred
                              prefill time (``request_prefill_time_seconds``; post-pass over
                              an instance's rows, :func:`prefill_work_column`)

Per-row qualities go to ``q_token_allocation`` / ``q_graph_mode`` / ``q_expert_imbalance`` /
``q_kv_transfer``; :data:`INFERRED` marks the meta-level sources that are derived, not counted.
"""
from __future__ import annotations

import math
from typing import Any

import numpy as np

from mixdiag import wire

from mixdiag.collectors.prometheus.prom_common import (ITERATION_TOKENS, QUANTILE_BOUNDS, TTFT_HISTOGRAMS, View,
                                                       bucket_quantile_bound, counter_increase, gauge_value)

#: Suffix on a ``meta["metric_sources"]`` entry whose column is derived (quality ``inferred``).
INFERRED = " [inferred]"

SGLANG_PASSES = "sglang:cuda_graph_passes_total"
#: SGLang pass mode -> graph column.
SGLANG_PASS_GRAPH = {"decode_cuda_graph": "graph_full_steps", "decode_none": "graph_none_steps",
                     "prefill_cuda_graph": "graph_piecewise_steps", "prefill_none": "graph_none_steps"}
MIXDIAG_GRAPH = {"FULL": "graph_full_steps", "PIECEWISE": "graph_piecewise_steps", "NONE": "graph_none_steps"}
#: (metric, scale to our unit) for KV-transfer sums, preferred first.
KV_SECONDS = (("sglang:kv_transfer_latency_ms_sum", 1e-3),)
KV_BYTES = (("sglang:kv_transfer_total_mb_sum", 1e6),)
GPU_EXECUTION = ("sglang:gpu_execution_seconds_total", "sglang:forward_execution_seconds_total")
BALANCEDNESS = "sglang:eplb_balancedness"
SPEC = ("vllm:spec_decode_num_accepted_tokens_total", "vllm:spec_decode_num_draft_tokens_total")


def histogram_delta(prev: View, cur: View, base: str) -> tuple[np.ndarray, np.ndarray] | None:
    """(sorted upper bounds, cumulative count increases) of histogram ``base``; None if absent."""
    cur_b = cur.get(base + "_bucket")
    if not cur_b:
        return None
    prev_b = prev.get(base + "_bucket", {})
    by_le: dict[float, float] = {}
    for labels, v1 in cur_b.items():
        try:
            bound = float(dict(labels).get("le", "nan"))
        except ValueError:
            continue
        if math.isnan(bound):
            continue
        inc = counter_increase({labels: prev_b[labels]} if labels in prev_b else {}, {labels: v1})
        if math.isfinite(inc):
            by_le[bound] = by_le.get(bound, 0.0) + inc
    if not by_le or not math.isinf(max(by_le)):
        return None
    upper = np.array(sorted(by_le), dtype="float64")
    return upper, np.maximum.accumulate(np.array([by_le[u] for u in upper], dtype="float64"))


def share_above(upper: np.ndarray, cum: np.ndarray, threshold: float) -> float:
    """Share of observations above ``threshold``, at bucket resolution (the bucket holding it counts below)."""
    total = float(cum[-1])
    if total <= 0:
        return math.nan
    i = int(np.searchsorted(upper, threshold, side="left"))  # first bound >= threshold
    below = float(cum[min(i, len(cum) - 1)])
    return max(total - below, 0.0) / total


def _by_label(prev: View, cur: View, name: str, label: str) -> dict[str, float]:
    series = cur.get(name)
    if not series:
        return {}
    cats = {dict(k).get(label) for k in series} - {None}
    out = {}
    for c in cats:
        v = counter_increase(prev.get(name), series, {label: c})
        out[c] = 0.0 if math.isnan(v) else v
    return out


def dialect_columns(prev: View, cur: View, row: dict[str, Any], used: dict[str, str]) -> dict[str, Any]:
    """Evidence columns of one interval row (see the module table); records sources in ``used``."""
    out: dict[str, Any] = {}
    # graph modes and large steps: counted per pass where the engine counts them
    kinds = _by_label(prev, cur, wire.STEPS_TOTAL, "kind")
    passes = _by_label(prev, cur, SGLANG_PASSES, "mode")
    if kinds:
        work = sum(kinds.get(k, 0.0) for k in ("prefill", "decode", "mixed"))
        if work > 0:
            out["large_step_share"] = (kinds.get("prefill", 0.0) + kinds.get("mixed", 0.0)) / work
        used["large_step_share"] = wire.STEPS_TOTAL
    dispatch = _by_label(prev, cur, wire.GRAPH_DISPATCH_TOTAL, "mode")
    if dispatch:
        for mode, col in MIXDIAG_GRAPH.items():
            out[col] = dispatch.get(mode, 0.0)
        used.update(dict.fromkeys(MIXDIAG_GRAPH.values(), wire.GRAPH_DISPATCH_TOTAL))
        # planned modes: never evidence a graph ran or was left (estimated signals never corroborate)
        out["q_graph_mode"] = "estimated"
    if passes:
        for col in set(SGLANG_PASS_GRAPH.values()):
            out[col] = sum(v for m, v in passes.items() if SGLANG_PASS_GRAPH.get(m) == col)
        extend = sum(v for m, v in passes.items() if m.startswith("prefill"))
        decode = sum(v for m, v in passes.items() if m.startswith("decode"))
        if extend + decode > 0:
            out["large_step_share"] = extend / (extend + decode)
            used["large_step_share"] = SGLANG_PASSES
            if row.get("kind") == "unknown":
                # one pass kind only: the interval's kind is counted; both: SGLang's logs/metrics
                # never say whether a prefill was mixed with the decodes, so it stays unknown
                if extend == 0 or decode == 0:
                    out["kind"] = "decode" if extend == 0 else "prefill"
                    out["q_token_allocation"] = "measured"
                    used["kind"] = SGLANG_PASSES
                    if extend > 0 and (row.get("decode_rows") or 0) > 0:
                        # decode tokens computed with no decode pass: they rode in the extend passes
                        out["kind"], out["q_token_allocation"] = "mixed", "inferred"
                        used["kind"] = SGLANG_PASSES + INFERRED
        used.update(dict.fromkeys(SGLANG_PASS_GRAPH.values(), SGLANG_PASSES))
        out["q_graph_mode"] = "measured"
        ran = [c for c in ("graph_full_steps", "graph_piecewise_steps", "graph_none_steps") if out[c] > 0]
        if row.get("graph_mode") in (None, "unknown") and len(ran) == 1:
            out["graph_mode"] = {"graph_full_steps": "FULL", "graph_piecewise_steps": "PIECEWISE"}.get(ran[0], "NONE")
    if "large_step_share" not in out:
        for base in ITERATION_TOKENS:
            h = histogram_delta(prev, cur, base)
            running = row.get("running_reqs")
            if h is None or running is None or not math.isfinite(running):
                continue
            # the decode batch may have been larger earlier in the interval: requests that finished
            # before the later scrape still decoded in its steps (33 decodes then 32 running must
            # not read as a large step)
            before = gauge_value(prev, "running_reqs")
            running = max(running, before[0]) if before is not None and math.isfinite(before[0]) else running
            share = share_above(h[0], h[1], max(float(running), 1.0))
            if math.isfinite(share):
                out["large_step_share"] = share
                used["large_step_share"] = base + INFERRED
                if row.get("kind") == "unknown" and share > 0 and running > 0:
                    out["kind"] = "mixed"  # V1 schedules prefill chunks into the running decode batch
                    out["q_token_allocation"] = "inferred"
                    used["kind"] = base + INFERRED
                elif row.get("kind") == "unknown" and share == 0 and (row.get("output_tokens") or 0) > 0:
                    out["kind"] = "decode"
                    out["q_token_allocation"] = "inferred"
                    used["kind"] = base + INFERRED
            break
    for base in TTFT_HISTOGRAMS:
        h = histogram_delta(prev, cur, base)
        if h is None:
            continue
        if h[1][-1] > 0:
            bounds = {}
            for col, q in (("ttft_p50_s", 0.5), ("ttft_p99_s", 0.99)):
                out[col], how = bucket_quantile_bound(q, *h)
                if how:
                    bounds[col] = how
            if bounds:
                out[QUANTILE_BOUNDS] = bounds
        out["arrivals"] = float(h[1][-1])
        used["ttft_p50_s"] = used["ttft_p99_s"] = base
        used["arrivals"] = base + "_count" + INFERRED
        break
    for col, cands in (("kv_transfer_s", KV_SECONDS), ("kv_transfer_bytes", KV_BYTES)):
        if col in row:
            continue  # this row's counters (mixdiag's, vLLM's NIXL) filled it; ``used`` spans every row
        for name, scale in cands:
            if name in cur:
                v = counter_increase(prev.get(name), cur[name])
                out[col] = 0.0 if math.isnan(v) else v * scale
                used[col] = name
                out["q_kv_transfer"] = "measured"
                break
    if "kv_transfer_s" in used or "kv_transfer_bytes" in used:
        out["q_kv_transfer"] = "measured"
    imb = cur.get(wire.EXPERT_IMBALANCE_RATIO)
    if imb:
        vals = [v for v in imb.values() if math.isfinite(v)]
        if vals:
            out["expert_imbalance"] = max(vals)
            used["expert_imbalance"] = wire.EXPERT_IMBALANCE_RATIO
            out["q_expert_imbalance"] = "measured"
    elif BALANCEDNESS + "_count" in cur:
        n = counter_increase(prev.get(BALANCEDNESS + "_count"), cur[BALANCEDNESS + "_count"])
        s = counter_increase(prev.get(BALANCEDNESS + "_sum"), cur.get(BALANCEDNESS + "_sum"))
        if n > 0 and s > 0:
            out["expert_imbalance"] = n / s  # 1 / mean balancedness
            used["expert_imbalance"] = BALANCEDNESS + INFERRED
            out["q_expert_imbalance"] = "inferred"
    for name in GPU_EXECUTION:
        if name in cur:
            v = counter_increase(prev.get(name), cur[name])
            if math.isfinite(v):
                out["forward_s"] = v
                used["forward_s"] = name
            break
    acc, drafts = (counter_increase(prev.get(n), cur.get(n)) for n in SPEC)
    if math.isfinite(drafts) and drafts > 0 and math.isfinite(acc):
        out["spec_accept_rate"] = acc / drafts
        used["spec_accept_rate"] = SPEC[0]
    if "q_token_allocation" not in out and row.get("kind") not in (None, "unknown"):
        out["q_token_allocation"] = "measured" if wire.STEPS_TOTAL in used.get("kind", "") else "inferred"
    return {k: v for k, v in out.items() if k not in row or k in ("kind", "graph_mode") or
            (isinstance(row.get(k), float) and math.isnan(row[k]))}


#: Sources that count a plan, not what ran: their columns are ``estimated``.
PLANNED = (wire.GRAPH_DISPATCH_TOTAL,)


def quality(source: str) -> str:
    """``measured``, ``inferred`` or ``estimated`` (a planned count) for a ``meta["metric_sources"]`` entry."""
    if source in PLANNED:
        return "estimated"
    return "inferred" if source.endswith(INFERRED) else "measured"


PREFILL_TIME = "vllm:request_prefill_time_seconds"
DECODE_TIME = "vllm:request_decode_time_seconds"


def spread_prefill_work(t0, t1, tokens, prefill_sum, prefill_count, decode_sum=None, decode_count=None,
                        points: int = 8) -> np.ndarray:
    """Each interval's completed prompt tokens spread back over the time their prefill ran.

    Basis (formats.md §1.1 traps; vLLM ``IterationStats``): vLLM counts a prompt's tokens
    (``prompt_tokens``, ``iteration_tokens_total``, TTFT) only when its first token comes, so the
    intervals in which its chunks actually ran show none of them. ``request_prefill_time_seconds``
    (first scheduling -> first token) says how far back that work reached, but it is observed when the
    request *finishes*, so the prefill time of the requests that got their first token in interval i
    is estimated from those finishing one mean decode time (``request_decode_time_seconds``) plus
    one interval later: the pooled ``Δsum / Δcount`` over intervals ending in
    ``[t1_i, t1_i + mean decode + (t1_i - t0_i)]``, else over the whole capture. First tokens are taken
    as spread evenly over interval i (``points`` of them); each one's tokens are spread evenly over
    ``[f - D_i, f]`` and given to the intervals that span overlaps. Work before the first interval
    or in a gap between intervals is dropped. NaN everywhere without any prefill time observed.
    """
    t0, t1 = np.asarray(t0, dtype=float), np.asarray(t1, dtype=float)
    if len(t0):
        # times relative to the first stamp: the prefix sums below multiply times by rates, and at
        # epoch stamps (~1.7e9 s) that product loses whole tokens to float64 cancellation
        ref = float(np.nanmin(t0))
        t0, t1 = t0 - ref, t1 - ref
    tok = np.nan_to_num(np.asarray(tokens, dtype=float))
    ps = np.nan_to_num(np.asarray(prefill_sum, dtype=float))
    pc = np.nan_to_num(np.asarray(prefill_count, dtype=float))
    n = len(t0)
    if n == 0 or pc.sum() <= 0:
        return np.full(n, np.nan)
    pooled = ps.sum() / pc.sum()
    lag = 0.0
    if decode_sum is not None and decode_count is not None:
        dc = np.nan_to_num(np.asarray(decode_count, dtype=float))
        if dc.sum() > 0:
            lag = float(np.nan_to_num(np.asarray(decode_sum, dtype=float)).sum() / dc.sum())
    # mean prefill time of the requests finishing in the window after each interval (prefix sums over
    # the intervals in end-time order: O(n log n) for hour-long captures)
    order = np.argsort(t1, kind="stable")
    ends, cs, cc = t1[order], np.concatenate(([0.0], np.cumsum(ps[order]))), np.concatenate(([0.0], np.cumsum(pc[order])))
    lo = np.searchsorted(ends, t1, side="left")
    hi = np.searchsorted(ends, t1 + lag + (t1 - t0), side="right")
    c = cc[hi] - cc[lo]
    with np.errstate(invalid="ignore", divide="ignore"):
        dur = np.where(c > 0, (cs[hi] - cs[lo]) / c, pooled)
    frac = (np.arange(points) + 0.5) / points
    f = (t0[:, None] + frac[None, :] * (t1 - t0)[:, None]).ravel()    # first-token times
    d = np.repeat(np.maximum(dur, 0.0), points)
    w = np.repeat(tok / points, points)
    # cumulative work done by time x: each point's w spread evenly over [f - d, f] (a ramp), or all
    # at f when d = 0; an interval gets C(t1) - C(t0)
    ramp = d > 0
    a, fr, rate = f[ramp] - d[ramp], f[ramp], w[ramp] / d[ramp]
    ia, ifr = np.argsort(a), np.argsort(fr)
    a_s, fr_s = a[ia], fr[ifr]
    ra, rf = np.concatenate(([0.0], np.cumsum(rate[ia]))), np.concatenate(([0.0], np.cumsum(rate[ifr])))
    rxa, rxf = (np.concatenate(([0.0], np.cumsum(rate[ia] * a_s))),
                np.concatenate(([0.0], np.cumsum(rate[ifr] * fr_s))))
    fp = np.sort(f[~ramp])
    wp = np.concatenate(([0.0], np.cumsum(w[~ramp][np.argsort(f[~ramp])])))

    def done_by(x):
        """(cumulative work by x, the magnitude of the terms it cancels: its round-off scale)"""
        ka, kf = np.searchsorted(a_s, x, side="right"), np.searchsorted(fr_s, x, side="right")
        started = x * ra[ka] - rxa[ka]      # sum over a <= x of rate * (x - a)
        ended = x * rf[kf] - rxf[kf]        # minus, for f <= x, rate * (x - f)
        done = started - ended + wp[np.searchsorted(fp, x, side="left")]
        scale = np.abs(x) * (ra[ka] + rf[kf]) + np.abs(rxa[ka]) + np.abs(rxf[kf]) + wp[-1]
        return done, scale

    (c1, s1), (c0, s0) = done_by(t1), done_by(t0)
    work = c1 - c0
    # Each ramp's share of an interval is >= 0, so a negative is round-off of the prefix sums (bounded
    # by the number of terms summed x eps x their magnitude): clip that to 0. A larger negative is no
    # round-off and is left for the schema check to report.
    tol = (len(f) + 4) * np.finfo(float).eps * (s1 + s0)
    return np.where((work < 0) & (work >= -tol), 0.0, work)


def prefill_work_column(rows: list[dict], pairs: list[tuple[View, View]], used: dict[str, str]) -> None:
    """Add ``prefill_work_tokens`` to one instance's interval rows (``pairs``: their scrape pairs)
    when the prompt counter is vLLM's and vLLM's prefill-time histogram is exposed."""
    if not rows or not used.get("prefill_tokens", "").startswith("vllm:"):
        return
    if not any(PREFILL_TIME + "_count" in cur for _, cur in pairs):
        return

    def inc(name):
        return [counter_increase(prev.get(name), cur.get(name)) for prev, cur in pairs]

    work = spread_prefill_work([r["t_start_s"] for r in rows], [r["t_end_s"] for r in rows],
                               [r.get("prefill_tokens", math.nan) for r in rows],
                               inc(PREFILL_TIME + "_sum"), inc(PREFILL_TIME + "_count"),
                               inc(DECODE_TIME + "_sum"), inc(DECODE_TIME + "_count"))
    if not np.isfinite(work).any():
        return
    for r, v in zip(rows, work):
        r["prefill_work_tokens"] = float(v)
    used["prefill_work_tokens"] = PREFILL_TIME + INFERRED
