"""What a vLLM V1 (0.1x-0.3x) operator has: ``/metrics`` families and operator-log lines.

Basis (names, types, buckets, line shapes): /work/shared/reference/formats.md sections 1.1-1.2, which
cite ``vllm/v1/metrics/loggers.py`` (PrometheusStatLogger, LoggingStatLogger), ``vllm/v1/metrics/stats.py``
(IterationStats: prompt tokens counted at a request's first output), ``nixl_connector.py``
(NixlPromMetrics, KV Transfer log keys), ``eplb_state.py`` (``EPLB step:`` line) and PR #31193
(``Iteration(N):`` lines); the real 0.32 scrape in tests/fixtures/vllm032 for label sets and
``_created`` families. vLLM has no per-step graph-mode metric; the graph evidence an operator has is the
capture list in the engine's startup config line, the running-request gauge and, with
``--cudagraph-metrics`` (v0.13+, log only), a per-interval table of runtime modes.
"""
from __future__ import annotations

import time

from .exposition import Registry

ITL_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0)
TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
                20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)
ITER_BUCKETS = (1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384)
E2E_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0,
               480.0, 960.0, 1920.0, 7680.0)
TOK_BUCKETS = (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000, 20000)
NIXL_XFER_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.2, 0.3, 0.5, 0.75, 1.0, 5.0)
NIXL_BYTES_BUCKETS = tuple(float(2 ** (10 + i)) for i in range(1, 25, 2))
LABELS = {"engine": "0", "model_name": "gen-model"}


def registry(with_nixl: bool) -> Registry:
    r = Registry()
    r.add("vllm:num_requests_running", "gauge", "Number of requests in model execution batches.")
    r.add("vllm:num_requests_waiting", "gauge", "Number of requests waiting to be processed.")
    r.add("vllm:kv_cache_usage_perc", "gauge", "KV-cache usage. 1 means 100 percent usage.")
    r.add("vllm:num_preemptions_total", "counter", "Cumulative number of preemption from the engine.")
    r.add("vllm:prompt_tokens_total", "counter", "Number of prefill tokens processed.")
    r.add("vllm:generation_tokens_total", "counter", "Number of generation tokens processed.")
    r.add("vllm:prompt_tokens_by_source_total", "counter", "Number of prompt tokens by source.")
    r.add("vllm:request_success_total", "counter", "Count of successfully processed requests.")
    r.add("vllm:iteration_tokens_total", "histogram", "Histogram of number of tokens per engine_step.", ITER_BUCKETS)
    r.add("vllm:time_to_first_token_seconds", "histogram", "Histogram of time to first token in seconds.", TTFT_BUCKETS)
    r.add("vllm:inter_token_latency_seconds", "histogram", "Histogram of inter-token latency in seconds.", ITL_BUCKETS)
    r.add("vllm:request_time_per_output_token_seconds", "histogram",
          "Histogram of time_per_output_token_seconds per request.", ITL_BUCKETS)
    r.add("vllm:e2e_request_latency_seconds", "histogram", "Histogram of e2e request latency in seconds.", E2E_BUCKETS)
    r.add("vllm:request_queue_time_seconds", "histogram", "Histogram of time spent in WAITING phase for request.",
          E2E_BUCKETS)
    r.add("vllm:request_prompt_tokens", "histogram", "Number of prefill tokens processed.", TOK_BUCKETS)
    r.add("vllm:request_generation_tokens", "histogram", "Number of generation tokens processed.", TOK_BUCKETS)
    r.add("vllm:request_prefill_kv_computed_tokens", "histogram",
          "Histogram of new KV tokens computed during prefill (excluding cached tokens).", TOK_BUCKETS)
    if with_nixl:
        r.add("vllm:nixl_xfer_time_seconds", "histogram", "Histogram of transfer duration for NIXL KV Cache transfers.",
              NIXL_XFER_BUCKETS)
        r.add("vllm:nixl_bytes_transferred", "histogram", "Histogram of bytes transferred per NIXL KV Cache transfers.",
              NIXL_BYTES_BUCKETS)
        r.add("vllm:nixl_num_failed_transfers_total", "counter", "Number of failed NIXL KV Cache transfers.")
    # labelled children exist from start-up (PrometheusStatLogger builds them in __init__)
    for name, f in r.families.items():
        if name not in ("vllm:prompt_tokens_by_source_total", "vllm:request_success_total"):
            f.touch(**LABELS)
    for reason in ("stop", "length", "abort"):
        r["vllm:request_success_total"].touch(**LABELS, finished_reason=reason)
    for src in ("local_compute", "local_cache_hit", "external_kv_transfer"):
        r["vllm:prompt_tokens_by_source_total"].inc(0.0, **LABELS, source=src)
    return r


def apply_step(r: Registry, st, with_nixl: bool, pd_active: bool) -> None:
    """Fold one step's events into the cumulative families."""
    L = LABELS
    for v in st.itl:
        r["vllm:inter_token_latency_seconds"].observe(v, **L)
    for v in st.ttft:
        r["vllm:time_to_first_token_seconds"].observe(v, **L)
    n_out = len(st.itl) + len(st.ttft)
    if n_out:   # IterationStats exists only for steps with outputs; the last chunk carries the whole prompt
        r["vllm:iteration_tokens_total"].observe(st.prompt_done + n_out, **L)
    r["vllm:generation_tokens_total"].inc(n_out, **L)
    r["vllm:prompt_tokens_total"].inc(st.prompt_done, **L)
    src = "external_kv_transfer" if pd_active else "local_compute"
    r["vllm:prompt_tokens_by_source_total"].inc(st.prompt_done, **L, source=src)
    r["vllm:num_preemptions_total"].inc(st.preempted, **L)
    for prompt, gen, e2e, tpot, computed, queue in st.finished:
        r["vllm:request_success_total"].inc(1, **L, finished_reason="length")
        r["vllm:e2e_request_latency_seconds"].observe(e2e, **L)
        r["vllm:request_time_per_output_token_seconds"].observe(tpot, **L)
        r["vllm:request_queue_time_seconds"].observe(queue, **L)
        r["vllm:request_prompt_tokens"].observe(prompt, **L)
        r["vllm:request_generation_tokens"].observe(gen, **L)
        r["vllm:request_prefill_kv_computed_tokens"].observe(computed, **L)
    if with_nixl:
        for sec, nbytes in st.kv_xfer:
            r["vllm:nixl_xfer_time_seconds"].observe(sec, **L)
            r["vllm:nixl_bytes_transferred"].observe(nbytes, **L)
    r["vllm:num_requests_running"].set(st.running, **L)
    r["vllm:num_requests_waiting"].set(st.waiting, **L)
    r["vllm:kv_cache_usage_perc"].set(st.kv_usage, **L)


def stamp(t: float) -> str:
    """vLLM's prefix time: ``MM-DD hh:mm:ss`` (no year), here in UTC."""
    return time.strftime("%m-%d %H:%M:%S", time.gmtime(t))


def api(t: float, src: str, msg: str) -> str:
    return f"(APIServer pid=4101) INFO {stamp(t)} [{src}] {msg}"


def core(t: float, src: str, msg: str) -> str:
    return f"(EngineCore_DP0 pid=4188) INFO {stamp(t)} [{src}] {msg}"


def startup_lines(t: float, params) -> list[str]:
    sizes = capture_sizes(params.max_capture)
    return [
        api(t, "api_utils.py:347", "vLLM server version 0.32.0, serving model gen-model"),
        api(t, "scheduler.py:307", f"Chunked prefill is enabled with max_num_batched_tokens={params.token_budget}."),
        core(t, "core.py:133", "Initializing a V1 LLM engine (v0.32.0) with config: model='gen-model', "
             f"enforce_eager=False, kv_transfer_config=KVTransferConfig(kv_connector='NixlConnector', kv_role='kv_both'), "
             f"compilation_config={{'mode': <CompilationMode.VLLM_COMPILE: 3>, 'cudagraph_mode': "
             f"<CUDAGraphMode.FULL_AND_PIECEWISE: (2, 1)>, 'cudagraph_capture_sizes': {sizes}, "
             f"'max_cudagraph_capture_size': {params.max_capture}}}"),
    ]


def stats_line(t: float, prompt_tps: float, gen_tps: float, running: int, waiting: int, preempt: int,
               kv: float) -> str:
    parts = [f"Avg prompt throughput: {prompt_tps:.1f} tokens/s", f"Avg generation throughput: {gen_tps:.1f} tokens/s",
             f"Running: {running} reqs", f"Waiting: {waiting} reqs"]
    if preempt > 0:
        parts.append(f"Preemptions: {preempt}")
    parts += [f"GPU KV cache usage: {kv * 100:.1f}%", "Prefix cache hit rate: 0.0%"]
    return api(t, "loggers.py:259", "Engine 000: " + ", ".join(parts))


def kv_transfer_line(t: float, xfers: list[tuple[float, int]]) -> str:
    secs = sorted(s for s, _ in xfers)
    p90 = secs[min(len(secs) - 1, int(0.9 * len(secs)))]
    mb = sum(b for _, b in xfers) / len(xfers) / 1e6
    tput = sum(b for _, b in xfers) / 1e6 / max(sum(secs), 1e-9)
    kv = (f"Avg xfer time (ms)={1000 * sum(secs) / len(secs):.3f}, P90 xfer time (ms)={1000 * p90:.3f}, "
          f"Avg post time (ms)=0.412, P90 post time (ms)=0.730, Avg MB per transfer={mb:.3f}, "
          f"Throughput (MB/s)={tput:.3f}, Avg number of descriptors=64.0")
    return api(t, "loggers.py:142", f"KV Transfer metrics: KVConnectorType: NixlConnector, {kv}")


def iteration_line(t: float, st, form: int) -> str:
    body = (f"Iteration({st.idx}): {st.ctx_reqs} context requests, {st.ctx_tokens} context tokens, "
            f"{st.gen_reqs} generation requests, {st.gen_reqs} generation tokens, "
            f"iteration elapsed time: {1000 * st.elapsed_s:.2f} ms")
    if form == 0:      # PR #31193's engine-core line
        return core(t, "core.py:349", body)
    # newer builds log it from the stat logger with the engine prefix and a KV suffix (formats.md 1.2)
    return api(t, "loggers.py:281", f"Engine 000: {body}, GPU KV cache usage: {100 * st.kv_usage:.1f}%")


def eplb_line(t: float, st, n_ranks: int = 8, form: int = 0, interval: int = 3000) -> str:
    """``form`` 0: the older line (key=value pairs alone); 1: vLLM 0.32's, with the EPLB step, the
    model and the steps until the next rearrangement (``eplb_state.py``)."""
    avg = 64.0 * max(st.gen_reqs, 1) / n_ranks * 8
    mx = avg / st.ep_balancedness
    pairs = f"avg_tokens={avg:.2f}, max_tokens={int(round(mx))}, balancedness={st.ep_balancedness:.4f}"
    if form == 0:
        return core(t, "eplb_state.py:512", f"EPLB step: {pairs}")
    step = st.idx % interval
    return core(t, "eplb_state.py:634", f"EPLB step: {step} for model /models/moe: {pairs}, "
                f"steps until the next rearrangement: {interval - step}")


def capture_sizes(max_capture: int) -> list[int]:
    """vLLM's default ladder up to the largest size: 1, 2, 4, then multiples of 8 (formats.md 1.3)."""
    return [1, 2, 4] + list(range(8, max_capture + 1, 8))


def graph_row(st, sizes: list[int]) -> tuple[int, int, str]:
    """(unpadded, padded, runtime mode) of one step under FULL_AND_PIECEWISE: uniform decode within
    the sizes replays FULL, a step with a prompt chunk PIECEWISE, anything above the largest size
    runs NONE unpadded (``CudagraphDispatcher.dispatch``)."""
    n = st.gen_reqs + st.ctx_tokens
    if n > sizes[-1]:
        return n, n, "NONE"
    padded = next(s for s in sizes if s >= n)
    return n, padded, "PIECEWISE" if st.ctx_tokens else "FULL"


def cudagraph_table(t: float, sizes: list[int], counts: dict) -> str:
    """``--cudagraph-metrics``: the interval's table, one logger call with embedded newlines, so
    only its first line carries the prefix; rows by count, descending (formats.md 1.2).
    Which process logs it is UNVERIFIED; the stat logger's is used here."""
    rows = sorted(counts.items(), key=lambda kv: -kv[1])
    body = ["**CUDAGraph Config Settings:**", "", "- Mode: FULL_AND_PIECEWISE", f"- Capture sizes: {sizes}", "",
            "**CUDAGraph Stats:**", "", "| Unpadded Tokens | Padded Tokens | Num Paddings | Runtime Mode | Count |",
            "|---|---|---|---|---|"]
    body += [f"| {u} | {p} | {p - u} | {m} | {c} |" for (u, p, m), c in rows]
    return api(t, "cuda_graph.py:120", "\n".join(body))
