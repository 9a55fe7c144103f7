"""The engine's Prometheus metrics (docs/contracts.md §3), one ``CollectorRegistry`` per engine.

:class:`EngineMetrics` is an engine observer: call it (or :meth:`EngineMetrics.observe_step`) with
each step record, and :meth:`EngineMetrics.observe_token` with each output event. It reads the
record by the Timeline ``steps`` column names (``kind``, ``prefill_tokens``, ``decode_rows``,
``graph_mode``, ``t_start_s`` ...), so any object carrying those attributes works; a missing or
NaN attribute leaves its metric untouched rather than inventing a zero.

Naming follows the Prometheus conventions: base units (seconds, bytes, ratios 0..1), counters end
in ``_total``, and every label has a closed value set (``kind``, ``segment``, ``mode``,
``source``). ITL and TTFT use vLLM V1's default buckets so dashboards built for vLLM read ours.
"""
from __future__ import annotations

import math
import threading
from bisect import bisect_left
from typing import Any, Callable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import HistogramMetricFamily
from prometheus_client.utils import floatToGoString

from mixdiag import wire
from mixdiag.wire import counter_family

STEP_KINDS = ("prefill", "decode", "mixed", "idle")
SEGMENTS = ("prefill", "decode")
GRAPH_MODES = ("FULL", "PIECEWISE", "NONE")
SM_SOURCES = ("measured", "estimated")

#: vllm:inter_token_latency_seconds buckets (vllm/v1/metrics/loggers.py, V1 defaults).
ITL_BUCKETS_S = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
                 20.0, 40.0, 80.0)
#: vllm:time_to_first_token_seconds buckets (V1 defaults).
TTFT_BUCKETS_S = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
                  20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)
#: Step durations: a CPU decode step is a few ms, a GPU one ~10 ms, a long prefill seconds.
STEP_BUCKETS_S = (0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.15, 0.2, 0.3, 0.5, 0.75, 1.0,
                  2.5, 5.0, 10.0)


class BatchHistogram:
    """A label-less Prometheus histogram fed many values per call (one lock per step, not per token).

    prometheus_client's ``Histogram.observe`` takes a lock and walks the buckets per value; a
    decode step of 32 requests makes 32 ITL observations, which cost more than the rest of the
    instrumentation together. This keeps plain bucket counts and renders them at scrape time.
    """

    def __init__(self, name: str, documentation: str, buckets: tuple[float, ...], registry: CollectorRegistry,
                 labels: dict[str, str] | None = None):
        self.name, self.documentation = name, documentation
        self.labels = dict(labels or {})  # one fixed label set (the vLLM/SGLang dialects), or none
        self.bounds = tuple(float(b) for b in buckets)
        self._counts = [0] * (len(self.bounds) + 1)  # last slot: above the largest bound (+Inf only)
        self._sum = 0.0
        self._lock = threading.Lock()
        registry.register(self)

    def observe_many(self, values, total: float | None = None) -> None:
        """Add every value in ``values``; ``total`` overrides what ``_sum`` grows by (SGLang's chunked
        ITL adds n counts at interval/n but the whole interval to ``_sum``)."""
        if not values:
            return
        idx = [bisect_left(self.bounds, v) for v in values]  # bucket le=b holds v <= b
        total = sum(values) if total is None else total
        with self._lock:
            counts = self._counts
            for i in idx:
                counts[i] += 1
            self._sum += total

    def observe(self, value: float) -> None:
        self.observe_many((value,))

    def collect(self):
        with self._lock:
            counts, total = list(self._counts), self._sum
        cum, buckets = 0, []
        for b, c in zip(self.bounds + (math.inf,), counts):
            cum += c
            buckets.append((floatToGoString(b), cum))
        if not self.labels:
            yield HistogramMetricFamily(self.name, self.documentation, buckets=buckets, sum_value=total)
            return
        fam = HistogramMetricFamily(self.name, self.documentation, labels=list(self.labels))
        fam.add_metric(list(self.labels.values()), buckets, total)
        yield fam

    def describe(self):
        return [HistogramMetricFamily(self.name, self.documentation, labels=list(self.labels) or None)]


def _num(record: Any, name: str) -> float | None:
    """The record's numeric field, or None when absent/NaN (the source could not know it)."""
    v = getattr(record, name, None)
    if v is None:
        return None
    try:
        v = float(v)
    except (TypeError, ValueError):
        return None
    return None if math.isnan(v) else v


class EngineMetrics:
    """Every metric of contracts §3 in ``registry``; feed it step records and token events."""

    def __init__(self, registry: CollectorRegistry | None = None,
                 arrival_s: Callable[[Any], float | None] | None = None):
        self._arrival_s = arrival_s  # request id -> arrival time (for TTFT); None: no TTFT
        self.registry = registry if registry is not None else CollectorRegistry()
        r = self.registry
        self.steps = Counter(counter_family(wire.STEPS_TOTAL), "Forward steps by kind (mixed = prefill tokens and decode rows in one step)",
                             ["kind"], registry=r)
        self.scheduled_tokens = Counter(counter_family(wire.SCHEDULED_TOKENS_TOTAL), "Tokens scheduled into forward steps by segment",
                                        ["segment"], registry=r)
        self.prompt_tokens = Counter(counter_family(wire.PROMPT_TOKENS_TOTAL), "Prompt tokens processed (computed plus prefix-cache hits)",
                                     registry=r)
        self.generation_tokens = Counter(counter_family(wire.GENERATION_TOKENS_TOTAL), "Output tokens generated", registry=r)
        self.graph_dispatch = Counter(counter_family(wire.GRAPH_DISPATCH_TOTAL), "Steps by planned CUDA-graph mode (the dispatcher's decision)",
                                      ["mode"], registry=r)
        self.graph_replays = Counter(counter_family(wire.GRAPH_REPLAYS_TOTAL), "CUDA graphs really replayed, by mode (none on CPU)",
                                     ["mode"], registry=r)
        self.step_duration = Histogram(wire.STEP_DURATION_SECONDS, "Wall time of one engine step by kind",
                                       ["kind"], buckets=STEP_BUCKETS_S, registry=r)
        self.itl = BatchHistogram(wire.INTER_TOKEN_LATENCY_SECONDS, "Time between consecutive outputs of a request",
                                  ITL_BUCKETS_S, r)
        self.ttft = BatchHistogram(wire.TIME_TO_FIRST_TOKEN_SECONDS, "Time from arrival to a request's first output",
                                   TTFT_BUCKETS_S, r)
        self.running = Gauge(wire.REQUESTS_RUNNING, "Requests running after the last step", registry=r)
        self.waiting = Gauge(wire.REQUESTS_WAITING, "Requests waiting after the last step", registry=r)
        self.kv_usage = Gauge(wire.KV_USAGE_RATIO, "KV-cache block usage 0..1 after the last step", registry=r)
        self.prefix_queries = Counter(counter_family(wire.PREFIX_CACHE_QUERIES_TOTAL), "Prompt tokens looked up in the prefix cache",
                                      registry=r)
        self.prefix_hits = Counter(counter_family(wire.PREFIX_CACHE_HITS_TOTAL), "Prompt tokens served from the prefix cache", registry=r)
        self.preemptions = Counter(counter_family(wire.PREEMPTIONS_TOTAL), "Requests preempted for lack of KV blocks", registry=r)
        self.expert_imbalance = Gauge(wire.EXPERT_IMBALANCE_RATIO,
                                      "Last step's max/mean tokens per expert-parallel rank (1 = balanced)", registry=r)
        self.kv_transfer_bytes = Counter(counter_family(wire.KV_TRANSFER_BYTES_TOTAL), "PD KV bytes received and installed", registry=r)
        self.kv_transfer_seconds = Counter(counter_family(wire.KV_TRANSFER_SECONDS_TOTAL), "Time steps spent waiting on PD KV transfer",
                                           registry=r)
        self.sm_active = Gauge(wire.SM_ACTIVE_RATIO, "SM activity 0..1 of the last step; source says measured or estimated",
                               ["source"], registry=r)
        # Bounded label sets exist from the start (a scrape before the first step shows zeros);
        # graph_replays is the exception: it shows a mode only once a replay really happened.
        # Unknown until a step reports it (no expert parallelism: never): NaN, not a made-up 0.
        self.expert_imbalance.set(math.nan)
        # Children resolved once: labels() per step costs more than the increments.
        self._steps_by_kind = {k: self.steps.labels(kind=k) for k in STEP_KINDS}
        self._duration_by_kind = {k: self.step_duration.labels(kind=k) for k in STEP_KINDS}
        self._tokens_prefill = self.scheduled_tokens.labels(segment="prefill")
        self._tokens_decode = self.scheduled_tokens.labels(segment="decode")
        self._dispatch_by_mode = {m: self.graph_dispatch.labels(mode=m) for m in GRAPH_MODES}
        self._last_token_s: dict[Any, float] = {}
        self.steps_seen = 0

    # ---- observers ----------------------------------------------------------------------------
    def __call__(self, record: Any) -> None:
        self.observe_step(record)

    def observe_step(self, record: Any) -> None:
        """Count one step record (attributes named like the Timeline ``steps`` columns)."""
        kind = getattr(record, "kind", None)
        if kind not in STEP_KINDS:
            return  # "unknown" steps are not engine steps; nothing to count honestly
        self.steps_seen += 1
        self._steps_by_kind[kind].inc()
        t0, t1 = _num(record, "t_start_s"), _num(record, "t_end_s")
        if t0 is not None and t1 is not None and t1 >= t0:
            self._duration_by_kind[kind].observe(t1 - t0)
        prefill = _num(record, "prefill_tokens") or 0.0
        decode = _num(record, "decode_rows") or 0.0
        if prefill:
            self._tokens_prefill.inc(prefill)
        if decode:
            self._tokens_decode.inc(decode)
        hits = _num(record, "prefix_hit_tokens") or 0.0
        if prefill or hits:
            self.prompt_tokens.inc(prefill + hits)
        queries = _num(record, "prefix_query_tokens")
        if queries:
            self.prefix_queries.inc(queries)
        if hits:
            self.prefix_hits.inc(hits)
        out = _num(record, "output_tokens")
        if out:
            self.generation_tokens.inc(out)
        mode = getattr(record, "graph_mode", None)
        if kind != "idle" and mode in GRAPH_MODES:
            self._dispatch_by_mode[mode].inc()
            if _num(record, "graph_replayed") == 1.0:
                self.graph_replays.labels(mode=mode).inc()
        for gauge, name in ((self.running, "running_reqs"), (self.waiting, "waiting_reqs"),
                            (self.kv_usage, "kv_usage"), (self.expert_imbalance, "expert_imbalance")):
            v = _num(record, name)
            if v is not None:
                gauge.set(v)
        v = _num(record, "preempted_reqs")
        if v:
            self.preemptions.inc(v)
        v = _num(record, "kv_transfer_bytes")
        if v:
            self.kv_transfer_bytes.inc(v)
        v = _num(record, "kv_transfer_s")
        if v:
            self.kv_transfer_seconds.inc(v)
        events = getattr(record, "token_events", None)
        if events:
            self.observe_tokens(events)
        v = _num(record, "sm_active")
        source = getattr(record, "sm_active_source", None)
        if v is not None and source in SM_SOURCES:  # an unlabelled or weaker (inferred) value is not exported
            self.observe_sm_active(v, source)

    def observe_tokens(self, events) -> None:
        """A step's output events (``request_id``, ``t_s``, ``is_first``): TTFT for firsts, ITL otherwise.

        ITL is per output event, as vLLM counts it (a speculative event carrying several tokens
        is one observation); generation tokens are counted from step records, not here. A
        first event (the engine's ``TokenEvent.is_first``) restarts a request, e.g. after preemption.
        """
        last = self._last_token_s
        itl, ttft = [], []
        for ev in events:
            rid, t = ev.request_id, ev.t_s
            prev = None if ev.is_first else last.get(rid)
            if prev is None:
                arrival = self._arrival_s(rid) if self._arrival_s is not None else None
                if arrival is not None and t >= arrival:
                    ttft.append(t - arrival)
            elif t >= prev:
                itl.append(t - prev)
            last[rid] = t
        self.itl.observe_many(itl)
        self.ttft.observe_many(ttft)

    def observe_token(self, request_id: Any, t_s: float, n_tokens: int = 1, arrival_s: float | None = None,
                      first: bool | None = None) -> None:
        """One output event outside a step record; ``arrival_s`` gives TTFT for a request's first."""
        prev = None if first else self._last_token_s.get(request_id)
        if prev is None:
            if arrival_s is not None and t_s >= arrival_s:
                self.ttft.observe(t_s - arrival_s)
        elif t_s >= prev:
            self.itl.observe(t_s - prev)
        self._last_token_s[request_id] = t_s

    def finish_request(self, request_id: Any) -> None:
        """Forget a finished or aborted request (bounds the per-request state)."""
        self._last_token_s.pop(request_id, None)

    def observe_sm_active(self, ratio: float, source: str) -> None:
        """Set the SM-activity gauge; ``source`` is ``measured`` or ``estimated`` (never blurred)."""
        if source not in SM_SOURCES:
            raise ValueError(f"sm_active source must be one of {SM_SOURCES}, got {source!r}")
        self.sm_active.labels(source=source).set(min(max(float(ratio), 0.0), 1.0))
