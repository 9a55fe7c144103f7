"""Timed Prometheus scrapes -> Timeline interval rows (shared by the scrape, server and endpoint readers).

Between two consecutive scrapes of one instance an ``interval`` row gets:

* counter increases (``v1 - v0``; a drop means the counter reset, so the increase is ``v1``; a
  series that appears between the scrapes was born from zero), summed over labels;
* histogram bucket increases -> ITL quantiles by linear interpolation inside the bucket, as PromQL
  ``histogram_quantile`` does (``itl_p50_s``/``itl_p90_s``/``itl_p99_s``), ``itl_mean_s``
  = sum increase / count increase, ``itl_count``; a quantile in the lowest bucket shown is that
  bucket's bound (not interpolated up from 0), one in ``+Inf`` the highest finite bound, and
  ``meta["quantile_bounds"][instance][column]`` counts the rows where the value is such a bound
  (``{"<=": n, ">=": m}``);
* steps by kind where the source has them (``mixdiag_engine_steps_total{kind}``): ``kind`` is
  ``mixed`` when any mixed step ran, the one kind when only one ran, ``idle`` when none ran, else
  ``unknown``; the per-kind counts go to extra columns ``<kind>_steps`` and to ``series``;
* gauges (running/waiting requests, KV usage, expert imbalance) as of the interval's end; every
  gauge also as series;
* graph dispatches per mode (``graph_full_steps``, ``graph_piecewise_steps``, ``graph_none_steps``).

Which metric fed which column (new or old vLLM name, SGLang, mixdiag) is in
``meta["metric_sources"]``; nothing is filled from a metric the scrape does not have.
"""
from __future__ import annotations

import math
from typing import Any

import numpy as np
import pandas as pd

from mixdiag import wire
from mixdiag.schema import Timeline

from mixdiag.collectors.prometheus.dialect_columns import dialect_columns, quality
from mixdiag.collectors.prometheus.prefill_work import chunk_ahead_column, prefill_work_column
from mixdiag.collectors.prometheus.prom_common import (GAUGE_COLUMNS, ITL_HISTOGRAMS, QUANTILE_BOUNDS, SPLIT_LABELS,
                                                       LabelKey, TimedScrape, View,
                                                       bucket_quantile_bound, bucket_tail_floor, counter_increase,
                                                       first_present,
                                                       gauge_value, is_gauge)

# Per column: candidate (metric, label filter) in order of preference; the first present wins.
COUNTER_COLUMNS: dict[str, list[tuple[str, dict]]] = {
    "prefill_tokens": [(wire.SCHEDULED_TOKENS_TOTAL, {"segment": "prefill"}),
                       ("vllm:prompt_tokens_by_source_total", {"source": "local_compute"}),
                       ("sglang:realtime_tokens_total", {"mode": "prefill_compute"}),
                       (wire.PROMPT_TOKENS_TOTAL, {}), ("vllm:prompt_tokens_total", {}),
                       ("sglang:prompt_tokens_total", {})],
    "decode_rows": [(wire.SCHEDULED_TOKENS_TOTAL, {"segment": "decode"}),
                    ("sglang:realtime_tokens_total", {"mode": "decode"})],
    "output_tokens": [(wire.GENERATION_TOKENS_TOTAL, {}), ("vllm:generation_tokens_total", {}),
                      ("sglang:generation_tokens_total", {})],
    # vLLM 0.32: cached prompt tokens (local + external tiers) of the requests whose prefill finished,
    # then the same split by tier, then by source (local cache hit + KV received from elsewhere);
    # the older prefix_cache_hits counts local hits only, at scheduling (docs/collectors-text.md)
    "prefix_hit_tokens": [(wire.PREFIX_CACHE_HITS_TOTAL, {}), ("vllm:prompt_tokens_cached_total", {}),
                          ("vllm:prompt_tokens_cached_by_source_total", {}),
                          ("vllm:prompt_tokens_by_source_total", {"source": ("local_cache_hit", "external_kv_transfer")}),
                          ("vllm:prefix_cache_hits_total", {}),
                          ("vllm:gpu_prefix_cache_hits_total", {}),
                          ("sglang:realtime_tokens_total", {"mode": "prefill_cache"}),
                          ("sglang:cached_tokens_total", {})],
    # vLLM's request_num_preemptions histogram counts a request's preemptions when it finishes: a
    # fallback only (and the capture-level corroboration, :func:`preemption_note`)
    "preempted_reqs": [(wire.PREEMPTIONS_TOTAL, {}), ("vllm:num_preemptions_total", {}),
                       ("sglang:num_retracted_requests_total", {}), ("vllm:request_num_preemptions_sum", {})],
    "rejected_reqs": [("vllm:admission_rejections_total", {})],
    "kv_transfer_bytes": [(wire.KV_TRANSFER_BYTES_TOTAL, {}), ("vllm:nixl_bytes_transferred_sum", {})],
    "kv_transfer_s": [(wire.KV_TRANSFER_SECONDS_TOTAL, {}), ("vllm:nixl_xfer_time_seconds_sum", {})],
}
STEPS_BY_KIND = (wire.STEPS_TOTAL, "kind")
KINDS = ("prefill", "decode", "mixed", "idle")
#: Counters split by a bounded category label whose increases go to ``series`` as ``<name>:increase``.
CATEGORY_COUNTERS = ((wire.STEPS_TOTAL, "kind"), (wire.GRAPH_DISPATCH_TOTAL, "mode"),
                     (wire.GRAPH_REPLAYS_TOTAL, "mode"), ("sglang:cuda_graph_passes_total", "mode"),
                     ("sglang:realtime_tokens_total", "mode"), ("vllm:prompt_tokens_by_source_total", "source"),
                     ("vllm:prompt_tokens_cached_by_source_total", "source"), ("vllm:admission_rejections_total", "reason"))
QUANTILES = (("itl_p50_s", 0.5), ("itl_p90_s", 0.9), ("itl_p99_s", 0.99))


def _without_le(labels: LabelKey) -> LabelKey:
    return tuple(kv for kv in labels if kv[0] != "le")


def histogram_increase(prev: View, cur: View, base: str) -> dict[str, Any] | None:
    """ITL columns from the increase of histogram ``base`` between two scrapes (plus ``QUANTILE_BOUNDS``:
    the quantiles that are only bucket bounds); None if absent."""
    cur_b = cur.get(base + "_bucket")
    if not cur_b:
        return None
    prev_b = prev.get(base + "_bucket", {})
    # A histogram resets as a whole (process restart): if any bucket of a label set went down,
    # every bucket of that set counts from zero, even one that by chance ended higher than before.
    reset = {_without_le(k) for k, v1 in cur_b.items() if k in prev_b and v1 < prev_b[k]}
    by_le: dict[float, float] = {}
    for labels, v1 in cur_b.items():
        le = dict(labels).get("le")
        try:
            bound = float(le) if le is not None else math.nan
        except ValueError:
            continue
        if math.isnan(bound):
            continue
        before = {} if _without_le(labels) in reset or labels not in prev_b else {labels: prev_b[labels]}
        inc = counter_increase(before, {labels: v1})
        if math.isfinite(inc):
            by_le[bound] = by_le.get(bound, 0.0) + inc
    if not by_le:
        return None
    upper = np.array(sorted(by_le), dtype="float64")
    cum = np.maximum.accumulate(np.array([by_le[u] for u in upper], dtype="float64"))  # as PromQL fixes it
    count = counter_increase(prev.get(base + "_count"), cur.get(base + "_count"))
    if not math.isfinite(count):
        count = float(cum[-1]) if math.isinf(upper[-1]) else math.nan
    ssum = counter_increase(prev.get(base + "_sum"), cur.get(base + "_sum"))
    out = {"itl_count": count, "itl_mean_s": ssum / count if count and count > 0 and math.isfinite(ssum) else math.nan}
    # the slowest token's bucket: one preempted request's wait among hundreds of tokens moves no quantile
    floor = float(bucket_tail_floor(upper, cum)[0])
    if math.isfinite(floor):
        out["itl_tail_floor_s"] = floor
    bounds = {}
    for col, q in QUANTILES:
        out[col], how = bucket_quantile_bound(q, upper, cum)
        if how:
            bounds[col] = how
    if bounds:
        out[QUANTILE_BOUNDS] = bounds  # which quantiles are only bounds (popped by _interval_row)
    return out


def _split(timed: list[TimedScrape], base: str) -> dict[str, list[tuple[float, View]]]:
    """Per Timeline instance: ``(t_s, view)`` for every scrape where the instance had samples."""
    values: dict[str, set[str]] = {k: set() for k in SPLIT_LABELS}
    for ts in timed:
        for series in ts.scrape.samples.values():
            for labels in series:
                for k, v in labels:
                    if k in values:
                        values[k].add(v)
    splitting = ["instance"] + [k for k in SPLIT_LABELS if len(values[k]) > 1]
    out: dict[str, list[tuple[float, View]]] = {}
    for ts in timed:
        views: dict[str, View] = {}
        for name, series in ts.scrape.samples.items():
            for labels, v in series.items():
                d = dict(labels)
                inst = d.get("instance", base)
                for k in splitting[1:]:
                    if k in d:
                        inst += f"/{'engine' if k == 'engine' else 'dp'}{d[k]}"
                rest = tuple((k, x) for k, x in labels if k not in splitting)
                tgt = views.setdefault(inst, {}).setdefault(name, {})
                tgt[rest] = tgt.get(rest, 0.0) + v
        for inst, view in views.items():
            out.setdefault(inst, []).append((ts.t_s, view))
    return out


def _label_str(labels: LabelKey) -> str:
    return ",".join(f"{k}={'|'.join(v) if isinstance(v, tuple) else v}" for k, v in labels)


CACHE_CONFIG_INFO = "vllm:cache_config_info"
PREEMPTIONS = ("vllm:num_preemptions_total", "vllm:request_num_preemptions_sum")
_INFO_LABELS_DROPPED = ("engine", "model_name", "instance", "job")


def _info_value(v: str):
    """A vLLM ``*_info`` label value as the Python value vLLM printed (``str(x)``): None, bool, int, float or str."""
    if v in ("None", "True", "False"):
        return {"None": None, "True": True, "False": False}[v]
    for cast in (int, float):
        try:
            x = cast(v)
        except ValueError:
            continue
        return x if math.isfinite(x) else v  # meta is JSON: 'nan'/'inf' stay text
    return v


def cache_config(seq: list[tuple[float, View]]) -> dict | None:
    """vLLM's ``cache_config_info`` labels (block_size, num_gpu_blocks, cache_dtype, ...) as of the last
    scrape that has them: the KV cache the capture ran with. None when the engine does not expose it."""
    for _, view in reversed(seq):
        for labels in view.get(CACHE_CONFIG_INFO, {}):
            return {k: _info_value(v) for k, v in labels if k not in _INFO_LABELS_DROPPED}
    return None


def preemption_note(inst: str, seq: list[tuple[float, View]]) -> str | None:
    """Corroboration of ``preempted_reqs``: vLLM counts a preemption when it happens
    (``num_preemptions_total``) and again, per request, when the request finishes (the
    ``request_num_preemptions`` histogram). Over a capture the two agree up to the requests still
    running (or aborted) at its end; one scrape compares the totals since the server started."""
    if not seq or not all(n in seq[-1][1] for n in PREEMPTIONS):
        return None
    first, last = (seq[0][1] if len(seq) > 1 else {}), seq[-1][1]
    counted, finished = (counter_increase(first.get(n), last.get(n)) for n in PREEMPTIONS)
    if not (math.isfinite(counted) and math.isfinite(finished)):
        return None
    span = "over the capture" if len(seq) > 1 else "since the server started"
    return (f"{inst}: {counted:g} preemption(s) {span} as they happened (vllm:num_preemptions_total), "
            f"{finished:g} in the requests that finished (vllm:request_num_preemptions)"
            + ("" if counted >= finished else ": the per-request count is the larger, a counter reset?"))


def _interval_row(inst: str, i: int, t0: float, prev: View, t1: float, cur: View,
                  used: dict[str, str], series_rows: list[dict], bounds: dict[str, dict[str, int]]) -> dict:
    row: dict[str, Any] = {"instance": inst, "step": i, "t_start_s": t0, "t_end_s": t1, "granularity": "interval"}
    for col, cands in COUNTER_COLUMNS.items():
        c = first_present(cur, cands, lambda s, c: True)
        if c is not None:
            v = counter_increase(prev.get(c[0]), cur[c[0]], c[1])
            # The family is exposed but not this label value: client libraries create labelled
            # children on first use, so nothing was counted under it yet.
            row[col] = 0.0 if math.isnan(v) else v
            used[col] = c[0] + ("{" + _label_str(tuple(c[1].items())) + "}" if c[1] else "")
    for col in GAUGE_COLUMNS:
        g = gauge_value(cur, col)
        if g is not None:
            v, used[col] = g
            row[col] = v if not (col == "kv_usage" and v > 1.0) else math.nan
    itl_bounds: dict[str, str] = {}
    for base in ITL_HISTOGRAMS:
        h = histogram_increase(prev, cur, base)
        if h is not None:
            itl_bounds = h.pop(QUANTILE_BOUNDS, {})
            row.update(h)
            used["itl"] = base
            break
    name, label = STEPS_BY_KIND
    by_kind = {}
    if name in cur:
        by_kind = {k: counter_increase(prev.get(name), cur[name], {label: k}) for k in KINDS}
        by_kind = {k: (0.0 if math.isnan(v) else v) for k, v in by_kind.items()}
        for k, v in by_kind.items():
            row[f"{k}_steps"] = v
        ran = [k for k in ("prefill", "decode", "mixed") if by_kind[k] > 0]
        row["kind"] = "mixed" if "mixed" in ran else (ran[0] if len(ran) == 1 else ("idle" if not ran else "unknown"))
        used["kind"] = name
    elif row.get("prefill_tokens") == 0 and row.get("output_tokens") == 0:
        row["kind"] = "idle"  # no token at all was computed or emitted in the interval
    else:
        row["kind"] = "unknown"
    gd = cur.get(wire.GRAPH_DISPATCH_TOTAL)
    if gd:
        modes = {m: counter_increase(prev.get(wire.GRAPH_DISPATCH_TOTAL), gd, {"mode": m})
                 for m in ("FULL", "PIECEWISE", "NONE")}
        ran = [m for m, v in modes.items() if v > 0]
        row["graph_mode"] = ran[0] if len(ran) == 1 else "unknown"
        for m, v in modes.items():  # graph_full_steps, graph_piecewise_steps, graph_none_steps
            row[f"graph_{m.lower()}_steps"] = 0.0 if math.isnan(v) else v
        rp = counter_increase(prev.get(wire.GRAPH_REPLAYS_TOTAL),
                              cur.get(wire.GRAPH_REPLAYS_TOTAL))
        row["graph_replayed"] = (1.0 if rp > 0 else 0.0) if math.isfinite(rp) else math.nan
        used["graph_mode"] = wire.GRAPH_DISPATCH_TOTAL
    for cname, label in CATEGORY_COUNTERS:
        if cname not in cur:
            continue
        cats = {dict(k).get(label) for k in cur[cname]} - {None}
        for cat in sorted(cats):
            v = counter_increase(prev.get(cname), cur[cname], {label: cat})
            if math.isfinite(v):
                series_rows.append({"instance": inst, "name": cname + ":increase", "labels": f"{label}={cat}",
                                    "t_s": t1, "value": v})
    row.update(dialect_columns(prev, cur, row, used))  # vLLM/SGLang/mixdiag evidence columns
    row["step_source"] = "scrape"
    for col, how in {**row.pop(QUANTILE_BOUNDS, {}), **itl_bounds}.items():
        bounds.setdefault(col, {}).setdefault(how, 0)
        bounds[col][how] += 1
    return row


def build_timeline(timed: list[TimedScrape], base: str, *, clock: str = "unix", fmt: str = "prom-text",
                   types: dict[str, str] | None = None, sources: list[dict] | None = None) -> Timeline:
    """Interval rows (two or more scrapes) and gauge series from timed scrapes of one or more targets."""
    timed = sorted(timed, key=lambda s: s.t_s)
    all_types: dict[str, str] = dict(types or {})
    for ts in timed:
        all_types.update(getattr(ts.scrape, "types", {}) or {})
    rows: list[dict] = []
    series_rows: list[dict] = []
    metric_sources: dict[str, dict[str, str]] = {}
    signals: dict[str, dict[str, str]] = {}
    notes: list[str] = []
    caches: dict[str, dict] = {}
    single = len(timed) == 1
    quantile_bounds: dict[str, dict[str, dict[str, int]]] = {}
    for inst, seq in _split(timed, base).items():
        used: dict[str, str] = {}
        bounds: dict[str, dict[str, int]] = {}
        n_before = len(rows)
        for t, view in seq:
            for name, series in view.items():
                if single or is_gauge(name, all_types):  # one scrape: every sample is the data
                    for labels, v in series.items():
                        if math.isfinite(v):
                            series_rows.append({"instance": inst, "name": name, "labels": _label_str(labels),
                                                "t_s": t, "value": v})
        down = 0
        pairs: list[tuple[View, View]] = []
        last_up = None  # the last scrape that answered: counters continue from it across failed scrapes
        for i in range(1, len(seq)):
            (t0, prev), (t1, cur) = seq[i - 1], seq[i]
            if set(cur) <= {"up"}:  # the target was down at t1: nothing was scraped, no row
                down += 1
                if not set(prev) <= {"up"}:
                    last_up = (t0, prev)
                continue
            if set(prev) <= {"up"} and last_up is not None:
                # A failed scrape (a timeout on a busy host, a network blip) is no restart: counters go on
                # from the last answered scrape, and a real restart shows as a fall (counter_increase reads
                # it as a reset, as PromQL's increase() does). Series never seen before count from zero. The
                # row spans the whole gap, so its rates stay per second of what it counted.
                t0, prev = last_up
            rows.append(_interval_row(inst, len(rows) - n_before, t0, prev, t1, cur, used, series_rows, bounds))
            pairs.append((prev, cur))
        # cross-interval: vLLM's prompt tokens counted at first token, spread back over prefill time
        prefill_work_column(rows[n_before:], pairs, used)
        chunk_ahead_column(rows[n_before:], pairs, used)
        if down:
            notes.append(f"{inst}: {down} interval(s) ending while the target was down (up == 0): no rows")
        metric_sources[inst] = used
        if bounds:
            quantile_bounds[inst] = bounds
        note = preemption_note(inst, seq)
        if note:
            notes.append(note)
        cfg = cache_config(seq)
        if cfg is not None:
            caches[inst] = cfg
        sig = {col: quality(src) for col, src in used.items() if col not in ("itl",)}
        if "itl" in used:
            sig.update({c: "measured" for c in ("itl_p50_s", "itl_p90_s", "itl_p99_s", "itl_mean_s", "itl_count")})
        sm = seq[-1][1].get(wire.SM_ACTIVE_RATIO, {}) if seq else {}
        for labels in sm:
            src = dict(labels).get("source")
            if src in ("measured", "estimated"):
                sig["sm_active"] = src
        signals[inst] = sig
        if used.get("itl", "").startswith("sglang:"):
            notes.append(f"{inst}: SGLang adds an n-token chunk as n ITL counts at interval/n but the full "
                         "interval to _sum, so itl_mean_s overstates the per-token mean")
        if used.get("prefill_tokens", "").endswith("prompt_tokens_total"):
            notes.append(f"{inst}: prefill_tokens from a prompt-token counter (includes prefix-cache hits)")
    if single:
        notes.append("one scrape: no intervals (interval rows need two or more timed scrapes); values in series")
    srcs = list(sources or []) + [ts.stats.to_meta() for ts in timed if ts.stats is not None]
    steps = pd.DataFrame(rows) if rows else None
    series = pd.DataFrame(series_rows) if series_rows else None
    meta = {"source": fmt, "clock": clock, "sources": srcs, "signals": signals, "metric_sources": metric_sources,
            "notes": notes, "partial": any(s.get("partial") for s in srcs)}
    if quantile_bounds:
        meta["quantile_bounds"] = quantile_bounds
    if caches:
        # one server's KV cache; several instances: the first's, and every one's where they differ
        first = caches[sorted(caches)[0]]
        meta["runtime"] = {"cache_config": first}
        if any(c != first for c in caches.values()):
            meta["runtime"]["cache_config_by_instance"] = caches
    return Timeline(steps=steps, series=series, meta=meta)
