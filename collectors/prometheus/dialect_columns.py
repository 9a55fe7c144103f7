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
``gpu_wait_s``                SGLang ``gpu_overlap_wait_seconds_total`` (any category): time   measured
                              the GPU forward stream sat idle between forwards, waiting on
                              the host (PR #19982, ``GapTimer``; device timer env var on)
``spec_accept_rate``          vLLM ``spec_decode_num_accepted_tokens`` / ``_draft_tokens``   measured
``waiting_capacity_reqs``     vLLM 0.32 ``num_requests_waiting_by_reason{reason=capacity}``  measured
                              at the interval's end (``deferred`` ones are not capacity-bound)
``tpot_p50_s``/``tpot_p99_s``  vLLM 0.32 ``request_time_per_output_token_seconds`` increase:   measured
                              per-request TPOT of the requests that finished in the interval
``flops_estimated``,          vLLM 0.32 ``estimated_flops_per_gpu_total``, ``estimated_read_`` estimated
``hbm_bytes_estimated``       + ``write_bytes_per_gpu_total`` increases: computed by vLLM from
                              token counts and the model shape, context only (never evidence)
(extra column)
``kind``                      vLLM: ``mixed`` when large steps ran while requests were       inferred
                              running (V1 batches prefill chunks with decodes); SGLang:
                              ``decode``/``prefill`` when only one pass kind ran
============================  ============================================================  =========

``iteration_tokens_floor``    vLLM ``iteration_tokens_total``: lower edge of the largest      measured
                              bucket that gained an observation (tokens of the interval's
                              largest iteration with outputs, at least)
``prefill_work_tokens``       vLLM ``request_prefill_kv_computed_tokens`` (0.32+) or the       inferred
                              prompt-token increase spread back over the requests' prefill
                              time (a post-pass over an instance's rows: :mod:`.prefill_work`)

Per-row qualities go to ``q_token_allocation`` / ``q_graph_mode`` / ``q_expert_imbalance`` /
``q_kv_transfer``; :data:`INFERRED` marks the meta-level sources that are derived, not counted.
"""
from __future__ import annotations

import math
from typing import Any

import numpy as np

from mixdiag import wire

from mixdiag.collectors.prometheus.prom_common import (INFERRED, ITERATION_TOKENS, QUANTILE_BOUNDS, TTFT_HISTOGRAMS,
                                                       View, bucket_quantile, bucket_quantile_bound, counter_increase,
                                                       gauge_value)


SGLANG_PASSES = "sglang:cuda_graph_passes_total"
#: SGLang pass mode -> graph column.
SGLANG_PASS_GRAPH = {"decode_cuda_graph": "graph_full_steps", "decode_none": "graph_none_steps",
                     "prefill_cuda_graph": "graph_piecewise_steps", "prefill_none": "graph_none_steps"}
MIXDIAG_GRAPH = {"FULL": "graph_full_steps", "PIECEWISE": "graph_piecewise_steps", "NONE": "graph_none_steps"}
#: (metric, scale to our unit) for KV-transfer sums, preferred first.
KV_SECONDS = (("sglang:kv_transfer_latency_ms_sum", 1e-3),)
KV_BYTES = (("sglang:kv_transfer_total_mb_sum", 1e6),)
GPU_EXECUTION = ("sglang:gpu_execution_seconds_total", "sglang:forward_execution_seconds_total")
#: the GPU forward stream's idle time between forwards (the host did not launch the next one)
GPU_WAIT = "sglang:gpu_overlap_wait_seconds_total"
BALANCEDNESS = "sglang:eplb_balancedness"
SPEC = ("vllm:spec_decode_num_accepted_tokens_total", "vllm:spec_decode_num_draft_tokens_total")
# vLLM 0.32 series (docs/collectors-text.md, "vLLM version drift")
WAITING_BY_REASON = "vllm:num_requests_waiting_by_reason"
REQUEST_TPOT = "vllm:request_time_per_output_token_seconds"
#: analytic counters vLLM derives from token counts and the model shape (v1/metrics/perf.py), not a
#: device counter: context for a reader, never evidence (quality ``estimated``)
ESTIMATED_FLOPS = "vllm:estimated_flops_per_gpu_total"
ESTIMATED_BYTES = ("vllm:estimated_read_bytes_per_gpu_total", "vllm:estimated_write_bytes_per_gpu_total")


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


def iteration_floor(upper: np.ndarray, cum: np.ndarray) -> float:
    """The lower edge of the largest bucket that gained an observation (0 for the first bucket): the
    largest iteration held at least that many tokens. NaN without observations."""
    if cum[-1] <= 0:
        return math.nan
    k = int(np.flatnonzero(np.diff(np.concatenate(([0.0], cum))) > 0)[-1])
    return float(upper[k - 1]) if k > 0 else 0.0


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
    for base in ITERATION_TOKENS:
        h = histogram_delta(prev, cur, base)
        if h is not None and h[1][-1] > 0:
            # tokens of the largest iteration in the interval, at least (its bucket's lower edge)
            out["iteration_tokens_floor"] = iteration_floor(*h)
            used["iteration_tokens_floor"] = base
            break
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
    if GPU_WAIT in cur:
        v = counter_increase(prev.get(GPU_WAIT), cur[GPU_WAIT])
        if math.isfinite(v):
            out["gpu_wait_s"] = max(v, 0.0)
            used["gpu_wait_s"] = GPU_WAIT
    acc, drafts = (counter_increase(prev.get(n), cur.get(n)) for n in SPEC)
    if math.isfinite(drafts) and drafts > 0 and math.isfinite(acc):
        out["spec_accept_rate"] = acc / drafts
        used["spec_accept_rate"] = SPEC[0]
    out.update(_vllm032_columns(prev, cur, used))
    if "q_token_allocation" not in out and row.get("kind") not in (None, "unknown"):
        out["q_token_allocation"] = "measured" if wire.STEPS_TOTAL in used.get("kind", "") else "inferred"
    return {k: v for k, v in out.items() if k not in row or k in ("kind", "graph_mode") or
            (isinstance(row.get(k), float) and math.isnan(row[k]))}


def _vllm032_columns(prev: View, cur: View, used: dict[str, str]) -> dict[str, Any]:
    """Columns from the series vLLM 0.32 added: requests waiting for scheduling capacity, per-request
    TPOT quantiles of the requests that finished, and the analytic FLOP / byte estimates."""
    out: dict[str, Any] = {}
    waiting = cur.get(WAITING_BY_REASON)
    if waiting:
        # 'capacity' = waiting for a slot in the batch or KV blocks; 'deferred' = held back by LoRA
        # budget, a KV transfer or a blocked status: only the first says the server is full
        vals = [v for k, v in waiting.items() if dict(k).get("reason") == "capacity" and math.isfinite(v)]
        if vals:
            out["waiting_capacity_reqs"] = float(sum(vals))
            used["waiting_capacity_reqs"] = WAITING_BY_REASON + "{reason=capacity}"
    h = histogram_delta(prev, cur, REQUEST_TPOT)
    if h is not None:
        # observed when a request finishes (its mean time per output token); no finish, no value
        if h[1][-1] > 0:
            out["tpot_p50_s"] = float(bucket_quantile(0.5, *h))
            out["tpot_p99_s"] = float(bucket_quantile(0.99, *h))
        used["tpot_p50_s"] = used["tpot_p99_s"] = REQUEST_TPOT
    if ESTIMATED_FLOPS in cur:
        v = counter_increase(prev.get(ESTIMATED_FLOPS), cur[ESTIMATED_FLOPS])
        out["flops_estimated"] = 0.0 if math.isnan(v) else v
        used["flops_estimated"] = ESTIMATED_FLOPS
    if any(n in cur for n in ESTIMATED_BYTES):
        incs = [counter_increase(prev.get(n), cur.get(n)) for n in ESTIMATED_BYTES]
        out["hbm_bytes_estimated"] = float(sum(v for v in incs if math.isfinite(v)))
        used["hbm_bytes_estimated"] = " + ".join(ESTIMATED_BYTES)
    return out


#: Sources that count a plan or an analytic estimate, not what ran: their columns are ``estimated``.
PLANNED = (wire.GRAPH_DISPATCH_TOTAL, ESTIMATED_FLOPS, " + ".join(ESTIMATED_BYTES))


def quality(source: str) -> str:
    """``measured``, ``inferred`` or ``estimated`` (a planned count, an analytic estimate) for a ``meta["metric_sources"]`` entry."""
    if source in PLANNED:
        return "estimated"
    return "inferred" if source.endswith(INFERRED) else "measured"
