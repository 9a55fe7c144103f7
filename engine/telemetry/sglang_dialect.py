"""SGLang's ``--enable-metrics`` series in the engine's ``/metrics`` (``mixdiag run --metrics-dialect
sglang``); the shared plumbing is :mod:`.dialect_base`, the traps are described in :mod:`.dialects`."""
from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Summary

from mixdiag.engine.telemetry.dialect_base import Dialect, labelled_histogram
from mixdiag.engine.telemetry.metrics import _num

# SGLang (python/sglang/srt/observability/collector.py) default buckets.
SGLANG_ITL_S = (0.002, 0.004, 0.006, 0.008, 0.010, 0.015, 0.020, 0.025, 0.030, 0.035, 0.040, 0.060, 0.080,
                0.100, 0.200, 0.400, 0.600, 0.800, 1.0, 2.0, 4.0, 6.0, 8.0)
SGLANG_TTFT_S = (0.1, 0.2, 0.4, 0.6, 0.8, 1, 2, 4, 6, 8, 10, 20, 40, 60, 80, 100, 200, 400)
SGLANG_KV_LATENCY_MS = (1, 2, 5, 10, 25, 50, 100, 250, 500, 1000, 2500, 5000)
SGLANG_KV_MB = (0.1, 0.5, 1, 5, 10, 50, 100, 500, 1000, 5000)  # UNVERIFIED ladder; bounds come from `le`


class SglangMetrics(Dialect):
    """SGLang ``--enable-metrics`` series (scheduler + tokenizer collectors) from step records."""

    def __init__(self, registry: CollectorRegistry | None = None, arrival_s=None, prompt_len=None, *,
                 model_name: str = "mixdiag-ref", dp_rank: int = 0, decode_log_interval: int = 40):
        super().__init__(registry, arrival_s, prompt_len)
        r = self.registry
        self._req = {"model_name": model_name}
        self._sched = {"model_name": model_name, "engine_type": "unified", "tp_rank": "0", "pp_rank": "0",
                       "moe_ep_rank": "0", "dp_rank": str(dp_rank)}
        self.decode_log_interval = max(int(decode_log_interval), 1)
        self._decode_steps = 0
        s = list(self._sched)

        def gauge(name, doc):
            return Gauge(name, doc, s, registry=r).labels(**self._sched)

        self.running = gauge("sglang:num_running_reqs", "The number of running requests.")
        self.queued = gauge("sglang:num_queue_reqs", "The number of requests in the waiting queue.")
        self.token_usage = gauge("sglang:token_usage", "The token usage.")
        self.gen_throughput = gauge("sglang:gen_throughput", "The generation throughput (token/s).")
        self.cache_hit_rate = gauge("sglang:cache_hit_rate", "The prefix cache hit rate.")
        self.prompt_tokens = Counter("sglang:prompt_tokens", "Number of prefill tokens processed.", list(self._req),
                                     registry=r).labels(**self._req)
        self.generation_tokens = Counter("sglang:generation_tokens", "Number of generation tokens processed.",
                                         list(self._req), registry=r).labels(**self._req)
        self.realtime = Counter("sglang:realtime_tokens", "Number of tokens processed in real time.", s + ["mode"], registry=r)
        self.graph_passes = Counter("sglang:cuda_graph_passes", "Forward passes by CUDA-graph use.", s + ["mode"], registry=r)
        self.retracted = Counter("sglang:num_retracted_requests", "Number of retracted requests.", s, registry=r).labels(**self._sched)
        self.itl = labelled_histogram("sglang:inter_token_latency_seconds", "Histogram of inter-token latency in seconds.",
                                     SGLANG_ITL_S, self._req, r)
        self.ttft = labelled_histogram("sglang:time_to_first_token_seconds", "Histogram of time to first token in seconds.",
                                      SGLANG_TTFT_S, self._req, r)
        self._modes = {m: self.realtime.labels(**self._sched, mode=m) for m in ("prefill_compute", "prefill_cache", "decode")}
        self._passes = {m: self.graph_passes.labels(**self._sched, mode=m)
                        for m in ("decode_cuda_graph", "decode_none", "prefill_cuda_graph", "prefill_none")}
        self._balancedness: Any = None
        self._kv: tuple | None = None
        self._since_log_tokens, self._since_log_t = 0.0, None

    def observe_step(self, record: Any) -> None:
        """Count one forward as SGLang's scheduler does; gauges only on a step that logs a line."""
        kind = getattr(record, "kind", None)
        if kind not in ("prefill", "decode", "mixed", "idle"):
            return
        self.steps_seen += 1
        if kind == "idle":
            return
        prefill = _num(record, "prefill_tokens") or 0.0
        hits = _num(record, "prefix_hit_tokens") or 0.0
        decode = _num(record, "decode_rows") or 0.0
        if prefill:
            self._modes["prefill_compute"].inc(prefill)
            self.prompt_tokens.inc(prefill + hits)
        if hits:
            self._modes["prefill_cache"].inc(hits)
        if decode:
            self._modes["decode"].inc(decode)
        extend = prefill > 0  # prefill and mixed batches run the extend path (no decode graph)
        # SGLang counts a pass as a graph pass only when its runner replayed one (``can_run_cuda_graph``); the
        # record's graph_mode is the dispatcher's plan, so only a real replay (graph_replayed) is a graph pass -
        # on CPU nothing replays and every pass is ``*_none`` (a planned mode read back as measured is circular)
        graph = getattr(record, "graph_mode", "NONE") if getattr(record, "graph_replayed", False) else "NONE"
        if extend:
            self._passes["prefill_cuda_graph" if graph in ("PIECEWISE", "FULL") else "prefill_none"].inc()
        else:
            self._passes["decode_cuda_graph" if graph == "FULL" else "decode_none"].inc()
        v = _num(record, "preempted_reqs")
        if v:
            self.retracted.inc(v)
        events = getattr(record, "token_events", None) or []
        ttft, itl, itl_sum, _ = self._latencies(events, per_token=True)
        self.ttft.observe_many(ttft)
        self.itl.observe_many(itl, total=itl_sum)
        gen = sum(max(int(getattr(e, "n_tokens", 1) or 1), 1) for e in events)
        if gen:
            self.generation_tokens.inc(gen)
        self._since_log_tokens += gen
        imb = _num(record, "expert_imbalance")
        if imb and imb > 0:
            if self._balancedness is None:
                self._balancedness = Summary("sglang:eplb_balancedness", "Expert balancedness (avg/max tokens per GPU).",
                                             list(self._sched) + ["forward_mode"], registry=self.registry)
            mode = "extend" if extend else "decode"
            self._balancedness.labels(**self._sched, forward_mode=mode).observe(1.0 / imb)
        kv_s, kv_b = _num(record, "kv_transfer_s"), _num(record, "kv_transfer_bytes")
        if kv_s or kv_b:
            if self._kv is None:
                self._kv = (labelled_histogram("sglang:kv_transfer_latency_ms", "KV transfer latency (ms).",
                                              SGLANG_KV_LATENCY_MS, self._sched, self.registry),
                            labelled_histogram("sglang:kv_transfer_total_mb", "KV transfer size (MB).",
                                              SGLANG_KV_MB, self._sched, self.registry))
            if kv_s:
                self._kv[0].observe_many([kv_s * 1e3])
            if kv_b:
                self._kv[1].observe_many([kv_b / 1e6])
        if not extend:
            self._decode_steps += 1
        logs = extend or self._decode_steps % self.decode_log_interval == 0
        if logs:  # SGLang sets its gauges in log_prefill_stats / log_decode_stats only
            self._set_gauges(record, extend, prefill, hits)

    def _set_gauges(self, record: Any, extend: bool, prefill: float, hits: float) -> None:
        for gauge, name in ((self.running, "running_reqs"), (self.queued, "waiting_reqs"), (self.token_usage, "kv_usage")):
            v = _num(record, name)
            if v is not None:
                gauge.set(v)
        if extend and prefill + hits > 0:
            self.cache_hit_rate.set(hits / (prefill + hits))
        t = _num(record, "t_end_s")
        if not extend and t is not None:
            if self._since_log_t is not None and t > self._since_log_t:
                self.gen_throughput.set(self._since_log_tokens / (t - self._since_log_t))
            self._since_log_t, self._since_log_tokens = t, 0.0
