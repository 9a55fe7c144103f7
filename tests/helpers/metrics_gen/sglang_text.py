"""What an SGLang operator has: ``sglang:*`` metrics (``--enable-metrics``) and the scheduler's
``Prefill batch`` / ``Decode batch`` lines.

Basis: /work/shared/reference/formats.md section 2 (``scheduler_metrics_mixin.py`` log_prefill_stats /
log_decode_stats, ``observability/collector.py``): the 2026 line shapes (``batch,``; Prefill ends
``cuda graph: <b>, input throughput``; Decode has PD fields on a decode node and ends ``#queue-req``),
Decode lines every ``--decode-log-interval`` decode forwards (default 40), scheduler gauges updated
only when a line is logged, ``cuda_graph_passes_total{mode}``, ``num_retracted_requests_total``,
``kv_transfer_latency_ms`` (histogram), ``eplb_balancedness`` (summary), the retraction line and
the ``[Expert Balancedness]`` line. With the device timer on (``SGLANG_ENABLE_METRICS_DEVICE_TIMER=1``,
drawn per capture): ``gpu_execution_seconds_total{category}`` (forward time by forward mode) and
``gpu_overlap_wait_seconds_total{category}`` (SGLang PR #19982 ``GapTimer``: the forward stream's idle time
before a forward, while it waited on the host), charged to the forward that follows the wait. Mixed chunk is on (``--enable-mixed-chunk``): a prompt chunk
runs with the decodes (extend path, no decode graph).
"""
from __future__ import annotations

import time

from .exposition import Registry

ITL_BUCKETS = (0.002, 0.004, 0.006, 0.008, 0.010, 0.015, 0.020, 0.025, 0.030, 0.035, 0.040, 0.060, 0.080,
               0.100, 0.200, 0.400, 0.600, 0.800, 1.0, 2.0, 4.0, 6.0, 8.0)
TTFT_BUCKETS = (0.1, 0.2, 0.4, 0.6, 0.8, 1, 2, 4, 6, 8, 10, 20, 40, 60, 80, 100, 200, 400)
E2E_BUCKETS = (0.1, 0.2, 0.4, 0.6, 0.8, 1, 2, 4, 6, 8, 10, 20, 40, 60, 80, 100, 200, 400, 800, 1200, 2400)
XFER_MS_BUCKETS = (1, 2, 5, 10, 25, 50, 100, 250, 500, 1000, 2500, 5000)
REQ_LABELS = {"model_name": "gen-model"}
SCHED_LABELS = {"model_name": "gen-model", "engine_type": "decode", "tp_rank": "0", "pp_rank": "0",
                "moe_ep_rank": "0"}


DEVICE_TIMER = ("sglang:gpu_execution_seconds_total", "sglang:gpu_overlap_wait_seconds_total")


def registry(device_timer: bool = False) -> Registry:
    r = Registry()
    r.add("sglang:prompt_tokens_total", "counter", "Number of prefill tokens processed.")
    r.add("sglang:generation_tokens_total", "counter", "Number of generation tokens processed.")
    r.add("sglang:inter_token_latency_seconds", "histogram", "Histogram of inter-token latency in seconds.", ITL_BUCKETS)
    r.add("sglang:time_to_first_token_seconds", "histogram", "Histogram of time to first token in seconds.", TTFT_BUCKETS)
    r.add("sglang:e2e_request_latency_seconds", "histogram", "Histogram of End-to-end request latency in seconds",
          E2E_BUCKETS)
    for g in ("num_running_reqs", "num_queue_reqs", "gen_throughput", "token_usage", "cache_hit_rate",
              "num_decode_transfer_queue_reqs"):
        r.add(f"sglang:{g}", "gauge", f"The {g.replace('_', ' ')}.")
    r.add("sglang:cuda_graph_passes_total", "counter", "Number of forward passes by cuda graph mode.")
    r.add("sglang:num_retracted_requests_total", "counter", "Number of retracted requests.")
    r.add("sglang:realtime_tokens_total", "counter", "Number of tokens processed, by mode.")
    r.add("sglang:kv_transfer_latency_ms", "histogram", "The transfer latency of the KV cache in ms.", XFER_MS_BUCKETS)
    r.add("sglang:eplb_balancedness", "summary", "Balancedness of MoE in expert parallelism.")
    if device_timer:
        r.add(DEVICE_TIMER[0], "counter", "GPU execution time of forward passes, by forward mode.")
        r.add(DEVICE_TIMER[1], "counter", "GPU idle time between forward passes waiting on the CPU, by forward mode.")
    for name, f in r.families.items():   # children exist from start-up
        if name.startswith(("sglang:prompt", "sglang:generation", "sglang:inter", "sglang:time_to", "sglang:e2e")):
            f.touch(**REQ_LABELS)
        elif name not in ("sglang:cuda_graph_passes_total", "sglang:realtime_tokens_total", "sglang:eplb_balancedness",
                          *DEVICE_TIMER):
            f.touch(**SCHED_LABELS)
    for mode in ("decode_cuda_graph", "decode_none", "prefill_cuda_graph", "prefill_none"):
        r["sglang:cuda_graph_passes_total"].inc(0.0, **SCHED_LABELS, mode=mode)
    r["sglang:num_retracted_requests_total"].inc(0.0, **SCHED_LABELS)
    for name in ("sglang:prompt_tokens_total", "sglang:generation_tokens_total"):
        r[name].inc(0.0, **REQ_LABELS)
    return r


def apply_step(r: Registry, st) -> None:
    """Counters and histograms move every step; scheduler gauges only move with a log line."""
    for v in st.itl:
        r["sglang:inter_token_latency_seconds"].observe(v, **REQ_LABELS)
    for v in st.ttft:
        r["sglang:time_to_first_token_seconds"].observe(v, **REQ_LABELS)
    r["sglang:generation_tokens_total"].inc(len(st.itl) + len(st.ttft), **REQ_LABELS)
    r["sglang:prompt_tokens_total"].inc(st.prompt_done, **REQ_LABELS)
    for f in st.finished:
        r["sglang:e2e_request_latency_seconds"].observe(f[2], **REQ_LABELS)
    if st.ctx_tokens:
        mode = "prefill_none"    # an extend (mixed) batch runs no decode graph
        r["sglang:realtime_tokens_total"].inc(st.ctx_tokens, **SCHED_LABELS, mode="prefill_compute")
    else:
        mode = "decode_none" if st.eager else "decode_cuda_graph"
    r["sglang:cuda_graph_passes_total"].inc(1, **SCHED_LABELS, mode=mode)
    r["sglang:realtime_tokens_total"].inc(st.gen_reqs, **SCHED_LABELS, mode="decode")
    r["sglang:num_retracted_requests_total"].inc(st.preempted, **SCHED_LABELS)
    for sec, _ in st.kv_xfer:
        r["sglang:kv_transfer_latency_ms"].observe(1000 * sec, **SCHED_LABELS)
    r["sglang:eplb_balancedness"].observe(st.ep_balancedness, **SCHED_LABELS, forward_mode="decode")
    if DEVICE_TIMER[0] in r.families:
        category = "forward_extend" if st.ctx_tokens else "forward_decode"
        r[DEVICE_TIMER[0]].inc(st.t_end - st.t_start, **SCHED_LABELS, category=category)
        r[DEVICE_TIMER[1]].inc(st.gap_s, **SCHED_LABELS, category=category)


def set_gauges(r: Registry, st, gen_tps: float) -> None:
    S = SCHED_LABELS
    r["sglang:num_running_reqs"].set(st.running, **S)
    r["sglang:num_queue_reqs"].set(st.waiting, **S)
    r["sglang:gen_throughput"].set(gen_tps, **S)
    r["sglang:token_usage"].set(st.kv_usage, **S)
    r["sglang:cache_hit_rate"].set(0.0, **S)
    r["sglang:num_decode_transfer_queue_reqs"].set(len(st.kv_xfer), **S)


def prefix(t: float) -> str:
    return "[" + time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(t)) + "] "


def server_args_line(t: float, params, decode_log_interval: int) -> str:
    """SGLang prints its ServerArgs at launch: the only place an operator finds mixed chunk, the
    chunk size, the graph batch limit and the decode log interval (formats.md 2.1)."""
    return prefix(t) + (
        f"server_args=ServerArgs(model_path='gen-model', tp_size=8, dp_size=8, ep_size=8, "
        f"chunked_prefill_size={params.token_budget}, enable_mixed_chunk=True, "
        f"cuda_graph_max_bs={params.max_capture}, disable_cuda_graph=False, decode_log_interval={decode_log_interval}, "
        f"disaggregation_mode='decode', disaggregation_transfer_backend='nixl', enable_eplb=True, "
        f"enable_metrics=True)")


def prefill_line(st, in_tps: float) -> str:
    return prefix(st.t_end) + (
        f"Prefill batch, #new-seq: {st.ctx_reqs}, #new-token: {st.ctx_tokens}, #cached-token: 0, "
        f"token usage: {st.kv_usage:.2f}, #running-req: {st.gen_reqs}, #queue-req: {st.waiting}, "
        f"cuda graph: False, input throughput (token/s): {in_tps:.2f}")


def decode_line(st, gen_tps: float, transfer: int) -> str:
    held = int(st.kv_usage * 200000)
    return prefix(st.t_end) + (
        f"Decode batch, #running-req: {st.gen_reqs}, #token: {held}, token usage: {st.kv_usage:.2f}, "
        f"pre-allocated usage: 0.00, #prealloc-req: 0, #transfer-req: {transfer}, #retracted-req: 0, "
        f"cuda graph: {not st.eager}, gen throughput (token/s): {gen_tps:.2f}, #queue-req: {st.waiting}")


def retract_line(st, ratio_before: float) -> str:
    return prefix(st.t_end) + (f"Decode out of memory happened. #retracted_reqs: {st.preempted}, "
                               f"#new_token_ratio: {ratio_before:.4f} -> {min(1.0, ratio_before + 0.05):.4f}")


def balancedness_line(st, fid: int, avg10: float) -> str:
    return prefix(st.t_end) + (f"[Expert Balancedness] forward_pass_id={fid} current_pass_balancedness="
                               f"{st.ep_balancedness:.3f} last_10_average_balancedness={avg10:.3f} "
                               f"last_100_average_balancedness={avg10:.3f} last_1000_average_balancedness="
                               f"{avg10:.3f} gpu_physical_count_sum={8 * max(st.gen_reqs, 1)}")
