"""The engine's ``/metrics`` in vLLM's or SGLang's own dialect (``mixdiag run --metrics-dialect``).

With ``vllm`` or ``sglang`` the reference engine exposes what that server would expose for the same
steps (reference/formats.md §1.1 and §2.3), and nothing of its own, so a test or a benchmark reads
exactly what a real deployment shows. Each class is an engine observer like
:class:`~mixdiag.engine.telemetry.metrics.EngineMetrics` (call it with each step record; it has a
``registry``), counting what vLLM's ``PrometheusStatLogger`` / SGLang's ``SchedulerMetricsCollector``
would count, *traps included*:

* vLLM ``vllm:iteration_tokens_total`` is fed by the frontend's ``IterationStats``: a step whose
  prefill chunk emits no output is never seen, and the step that emits a request's first token
  carries its whole prompt (a 10-token prompt in 4-token chunks records ``[11, 1]``, not
  ``[4, 4, 2, 1]``). ``vllm:prompt_tokens_total`` likewise grows by the whole prompt at the first
  output. ITL is per output event (a speculative event with several tokens is one observation).
* SGLang gauges (``sglang:num_running_reqs`` ...) change only when a ``Prefill batch`` line (every
  step with prefill work) or a ``Decode batch`` line (every ``decode_log_interval`` decode steps) is
  logged; an n-token output event adds n ITL counts at interval/n but the whole interval to ``_sum``.

* vLLM ``request_*`` histograms and ``request_success_total{finished_reason}`` are all observed
  when a request *finishes* (``IterationStats.update_from_finished_request``): queue = first
  scheduling - arrival, prefill = first token - first scheduling (a preemption's wait included),
  decode = last token - first token, inference = last token - first scheduling, e2e = finish -
  arrival, per-request TPOT = decode / (generation tokens - 1) (0 for one token). So an
  interval's ``request_prefill_time_seconds`` increase is of the requests that *finished* in it.
  Requests aborted outside a step are not seen by a step observer and are not counted.

Series that real servers expose only behind flags we do not model (SGLang's
``gpu_execution_seconds_total`` needs ``SGLANG_ENABLE_METRICS_DEVICE_TIMER``) are left out. NIXL / SGLang KV-transfer series appear
with the first transfer, as a PD connector registers them. Standard library + prometheus_client only.
"""
from __future__ import annotations

from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge

from mixdiag.engine.telemetry.dialect_base import Dialect, labelled_histogram
from mixdiag.engine.telemetry.metrics import _num
from mixdiag.engine.telemetry.sglang_dialect import SglangMetrics


DIALECTS = ("mixdiag", "vllm", "sglang")

# vLLM V1 (~v0.12, vllm/v1/metrics/loggers.py) default buckets.
VLLM_ITERATION_TOKENS = (1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384)
VLLM_TTFT_S = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
               20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)
VLLM_ITL_S = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0,
              40.0, 80.0)
VLLM_REQUEST_LATENCY_S = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0,
                          240.0, 480.0, 960.0, 1920.0, 7680.0)
VLLM_REQUEST_TPOT_S = VLLM_ITL_S  # formats.md: "ITL-like buckets"
VLLM_PARAMS_N = (1, 2, 5, 10, 20)
VLLM_FINISH_REASONS = ("stop", "length", "abort")  # str(FinishReason); a child per reason from the start


def build_1_2_5_buckets(max_value: int) -> tuple[int, ...]:
    """vLLM's ``build_1_2_5_buckets``: 1, 2, 5, 10, 20, 50 ... up to ``max_value`` inclusive."""
    out, exp = [], 0
    while True:
        for m in (1, 2, 5):
            v = m * 10 ** exp
            if v > max_value:
                return tuple(out)
            out.append(v)
        exp += 1


VLLM_NIXL_XFER_S = (0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.2, 0.3, 0.5, 0.75, 1.0, 5.0)
VLLM_NIXL_BYTES = tuple(float(2 ** (10 + i)) for i in range(1, 25, 2))


class VllmMetrics(Dialect):
    """vLLM V1 ``PrometheusStatLogger`` series (labels ``model_name``, ``engine``) from step records."""

    def __init__(self, registry: CollectorRegistry | None = None, arrival_s=None, prompt_len=None, *,
                 model_name: str = "mixdiag-ref", engine: int = 0, request_end=None, max_model_len: int = 16384):
        super().__init__(registry, arrival_s, prompt_len)
        r = self.registry
        # request_end(rid) -> (finished_reason, max_tokens) once the request finished, else None
        self._request_end = request_end
        self._req: dict[Any, list] = {}  # rid -> [first scheduled, first token, last token, generation tokens]
        self._lv = {"model_name": model_name, "engine": str(engine)}
        ln = list(self._lv)

        def counter(name, doc):
            return Counter(name, doc, ln, registry=r).labels(**self._lv)

        def gauge(name, doc):
            return Gauge(name, doc, ln, registry=r).labels(**self._lv)

        self.running = gauge("vllm:num_requests_running", "Number of requests in model execution batches.")
        self.waiting = gauge("vllm:num_requests_waiting", "Number of requests waiting to be processed.")
        self.kv_usage = gauge("vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.")
        self.prefix_queries = counter("vllm:prefix_cache_queries", "Prefix cache queries, in terms of number of queried tokens.")
        self.prefix_hits = counter("vllm:prefix_cache_hits", "Prefix cache hits, in terms of number of cached tokens.")
        self.preemptions = counter("vllm:num_preemptions", "Cumulative number of preemption from the engine.")
        self.prompt_tokens = counter("vllm:prompt_tokens", "Number of prefill tokens processed.")
        self.generation_tokens = counter("vllm:generation_tokens", "Number of generation tokens processed.")
        self.spec_drafts = counter("vllm:spec_decode_num_drafts", "Number of spec decoding drafts.")
        self.spec_draft_tokens = counter("vllm:spec_decode_num_draft_tokens", "Number of draft tokens.")
        self.spec_accepted = counter("vllm:spec_decode_num_accepted_tokens", "Number of accepted tokens.")
        self.iteration_tokens = labelled_histogram("vllm:iteration_tokens_total", "Histogram of number of tokens per engine_step.",
                                                  VLLM_ITERATION_TOKENS, self._lv, r)
        self.ttft = labelled_histogram("vllm:time_to_first_token_seconds", "Histogram of time to first token in seconds.",
                                      VLLM_TTFT_S, self._lv, r)
        self.itl = labelled_histogram("vllm:inter_token_latency_seconds", "Histogram of inter-token latency in seconds.",
                                     VLLM_ITL_S, self._lv, r)
        success = Counter("vllm:request_success", "Count of successfully processed requests.",
                          ln + ["finished_reason"], registry=r)
        self.request_success = {reason: success.labels(**self._lv, finished_reason=reason)
                                for reason in VLLM_FINISH_REASONS}

        def hist(name, doc, buckets):
            return labelled_histogram(name, doc, buckets, self._lv, r)

        lat = VLLM_REQUEST_LATENCY_S
        tok = build_1_2_5_buckets(max_model_len)
        self.e2e = hist("vllm:e2e_request_latency_seconds", "Histogram of e2e request latency in seconds.", lat)
        self.queue_time = hist("vllm:request_queue_time_seconds",
                               "Histogram of time spent in WAITING phase for request.", lat)
        self.inference_time = hist("vllm:request_inference_time_seconds",
                                   "Histogram of time spent in RUNNING phase for request.", lat)
        self.prefill_time = hist("vllm:request_prefill_time_seconds",
                                 "Histogram of time spent in PREFILL phase for request.", lat)
        self.decode_time = hist("vllm:request_decode_time_seconds",
                                "Histogram of time spent in DECODE phase for request.", lat)
        self.request_tpot = hist("vllm:request_time_per_output_token_seconds",
                                 "Histogram of time_per_output_token_seconds per request.", VLLM_REQUEST_TPOT_S)
        self.request_prompt = hist("vllm:request_prompt_tokens", "Number of prefill tokens processed.", tok)
        self.request_generation = hist("vllm:request_generation_tokens", "Number of generation tokens processed.", tok)
        self.request_max_gen = hist("vllm:request_max_num_generation_tokens",
                                    "Histogram of maximum number of requested generation tokens.", tok)
        self.request_max_tokens = hist("vllm:request_params_max_tokens",
                                       "Histogram of the max_tokens request parameter.", tok)
        self.request_n = hist("vllm:request_params_n", "Histogram of the n request parameter.", VLLM_PARAMS_N)
        self._nixl: tuple | None = None

    def _track_requests(self, record: Any, sched: dict, events) -> None:
        """Per-request timestamps as vLLM's ``RequestStateStats`` keeps them; finished ones observed."""
        t_sched = _num(record, "t_start_s")  # the SCHEDULED event is stamped when the step is scheduled
        for rid in sched:
            if rid not in self._req and t_sched is not None:
                self._req[rid] = [t_sched, None, None, 0]  # first scheduling only (preemptions ignored)
        for ev in events:
            st = self._req.setdefault(ev.request_id, [ev.t_s, None, None, 0])
            if st[1] is None:
                st[1] = ev.t_s
            st[2] = ev.t_s
            st[3] += max(int(getattr(ev, "n_tokens", 1) or 1), 1)
        if self._request_end is None:
            return
        for rid in {ev.request_id for ev in events}:
            end = self._request_end(rid)
            if end is not None:
                self._finish(rid, *end)

    def _finish(self, rid: Any, reason: str, max_tokens: int | None) -> None:
        """Observe one finished request (``update_from_finished_request`` + the logger's record)."""
        sched_s, first_s, last_s, gen = self._req.pop(rid)
        arrival = self._arrival_s(rid) if self._arrival_s is not None else None
        arrival = sched_s if arrival is None else arrival
        prompt = self._prompt_len(rid) if self._prompt_len is not None else None
        decode = last_s - first_s
        self.request_success[reason if reason in self.request_success else "abort"].inc()
        self.e2e.observe(max(last_s - arrival, 0.0))
        self.queue_time.observe(max(sched_s - arrival, 0.0))
        self.prefill_time.observe(max(first_s - sched_s, 0.0))
        self.decode_time.observe(max(decode, 0.0))
        self.inference_time.observe(max(last_s - sched_s, 0.0))
        self.request_tpot.observe(max(decode, 0.0) / (gen - 1) if gen > 1 else 0.0)
        if prompt is not None:
            self.request_prompt.observe(float(prompt))
        self.request_generation.observe(float(gen))
        self.request_max_gen.observe(float(gen))  # n = 1: the one child's generation tokens
        self.request_n.observe(1.0)
        if max_tokens is not None:
            self.request_max_tokens.observe(float(max_tokens))
        self.finish_request(rid)

    def _nixl_metrics(self):
        if self._nixl is None:  # the NIXL connector registers its family when it exists
            r = self.registry
            self._nixl = (labelled_histogram("vllm:nixl_xfer_time_seconds", "Histogram of transfer duration for NIXL KV Cache transfers.",
                                            VLLM_NIXL_XFER_S, self._lv, r),
                          labelled_histogram("vllm:nixl_bytes_transferred", "Histogram of bytes transferred per NIXL KV Cache transfers.",
                                            VLLM_NIXL_BYTES, self._lv, r))
        return self._nixl

    def observe_step(self, record: Any) -> None:
        """Count one step as vLLM's scheduler stats (gauges, preemptions) and IterationStats would."""
        if getattr(record, "kind", None) not in ("prefill", "decode", "mixed", "idle"):
            return
        self.steps_seen += 1
        for gauge, name in ((self.running, "running_reqs"), (self.waiting, "waiting_reqs"), (self.kv_usage, "kv_usage")):
            v = _num(record, name)
            if v is not None:
                gauge.set(v)
        for ctr, name in ((self.prefix_queries, "prefix_query_tokens"), (self.prefix_hits, "prefix_hit_tokens"),
                          (self.preemptions, "preempted_reqs"), (self.spec_draft_tokens, "spec_draft_tokens"),
                          (self.spec_accepted, "spec_accepted_tokens")):
            v = _num(record, name)
            if v:
                ctr.inc(v)
        drafts = _num(record, "spec_draft_tokens")
        if drafts:
            self.spec_drafts.inc(_num(record, "decode_reqs") or 1.0)
        sched = getattr(record, "num_scheduled_tokens", None) or {}
        decode_ids = set()
        events = getattr(record, "token_events", None) or []
        for rid, n in sched.items():
            if rid not in self._last_token_s:  # no output yet: a prefill chunk (vLLM's "context")
                self._scheduled_prompt[rid] = self._scheduled_prompt.get(rid, 0.0) + n
            else:
                decode_ids.add(rid)
        ttft, itl, _, firsts = self._latencies(events, per_token=False)
        self.ttft.observe_many(ttft)
        self.itl.observe_many(itl)
        gen = sum(max(int(getattr(e, "n_tokens", 1) or 1), 1) for e in events)
        prompt = sum(self._prompt_tokens(rid) for rid in firsts)
        if gen:
            self.generation_tokens.inc(gen)
        if prompt:
            self.prompt_tokens.inc(prompt)
        if events:  # an output-less step never reaches IterationStats
            self.iteration_tokens.observe_many([prompt + gen])
        self._track_requests(record, sched, events)  # after the prompt count: a finish forgets the request
        kv_s, kv_b = _num(record, "kv_transfer_s"), _num(record, "kv_transfer_bytes")
        if kv_s or kv_b:
            xfer, nbytes = self._nixl_metrics()
            if kv_s:
                xfer.observe_many([kv_s])
            if kv_b:
                nbytes.observe_many([kv_b])


def make_dialect_metrics(dialect: str, *, arrival_s=None, prompt_len=None, model_name: str = "mixdiag-ref",
                         rank: int = 0, decode_log_interval: int = 40, registry: CollectorRegistry | None = None,
                         request_end=None, max_model_len: int = 16384):
    """The observer exposing ``dialect`` (``vllm`` or ``sglang``); ValueError for any other name.
    ``request_end(rid)``: ``(finished_reason, max_tokens)`` once a request finished, else None (vLLM)."""
    if dialect == "vllm":
        return VllmMetrics(registry, arrival_s, prompt_len, model_name=model_name, engine=rank,
                           request_end=request_end, max_model_len=max_model_len)
    if dialect == "sglang":
        return SglangMetrics(registry, arrival_s, prompt_len, model_name=model_name, dp_rank=rank,
                             decode_log_interval=decode_log_interval)
    raise ValueError(f"metrics dialect must be one of {', '.join(DIALECTS[1:])}, got {dialect!r}")
