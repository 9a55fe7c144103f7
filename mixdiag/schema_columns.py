"""The Timeline's documented columns: per frame, each column's name, dtype, unit, meaning and
whether producers must supply it (``mixdiag schema`` prints them). The contract itself and the
:class:`~mixdiag.schema.Timeline` that holds the frames are in :mod:`mixdiag.schema`; validation
against these columns in :mod:`mixdiag.schema_validate`.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

SCHEMA_VERSION = 1

STEP_KINDS = ("prefill", "decode", "mixed", "idle", "unknown")
GRAPH_MODES = ("FULL", "PIECEWISE", "NONE", "unknown")
GRANULARITIES = ("step", "interval")
#: Values ``meta["signals"][instance][signal]`` may take.
SIGNAL_QUALITIES = ("measured", "estimated", "inferred", "absent")


class SchemaError(ValueError):
    """A frame violates the Timeline contract; the message names the frame and the column."""


@dataclass(frozen=True)
class Column:
    """One documented column: name, canonical dtype, unit, whether producers must supply it."""

    name: str
    dtype: str  # "str" | "int64" | "float64"
    unit: str
    doc: str
    required: bool = False
    choices: tuple[str, ...] | None = None
    nonnegative: bool = False
    default: object = None  # fill value when a producer omits an optional column

    def fill(self):
        if self.default is not None:
            return self.default
        return "unknown" if self.dtype == "str" else np.nan


def _c(*args, **kw) -> Column:
    return Column(*args, **kw)


STEPS_COLUMNS: tuple[Column, ...] = (
    _c("instance", "str", "-", "engine/server instance the row belongs to (e.g. host:port, 'engine0')", required=True),
    _c("step", "int64", "count", "step (or interval) index, increasing within an instance", required=True),
    _c("t_start_s", "float64", "s", "when the step (interval) started, on the Timeline clock", required=True),
    _c("t_end_s", "float64", "s", "when the step (interval) ended; >= t_start_s", required=True),
    _c("granularity", "str", "-", "'step' = one forward step; 'interval' = aggregate over a log/scrape interval",
       required=True, choices=GRANULARITIES),
    _c("kind", "str", "-", "prefill | decode | mixed (prefill tokens and decode rows in one step) | idle | unknown",
       required=True, choices=STEP_KINDS),
    _c("prefill_tokens", "float64", "tokens", "prefill (context/extend) tokens computed in the step", nonnegative=True),
    _c("prefill_reqs", "float64", "requests", "requests contributing prefill tokens", nonnegative=True),
    _c("decode_reqs", "float64", "requests", "requests contributing decode rows", nonnegative=True),
    _c("decode_rows", "float64", "rows", "decode rows = decode_reqs x (1 + spec tokens)", nonnegative=True),
    _c("output_tokens", "float64", "tokens", "output tokens emitted by the step (interval)", nonnegative=True),
    _c("graph_mode", "str", "-", "CUDA-graph mode of the step: FULL | PIECEWISE | NONE (eager) | unknown",
       choices=GRAPH_MODES),
    _c("graph_replayed", "float64", "bool", "1 = a CUDA graph was really replayed, 0 = not (planned mode only), NaN = unknown"),
    _c("sm_active", "float64", "ratio", "SM activity 0..1 over the step; meta['signals'] says measured or estimated",
       nonnegative=True),
    _c("expert_imbalance", "float64", "ratio", "max/mean tokens per expert-parallel rank (1 = balanced)", nonnegative=True),
    _c("kv_transfer_bytes", "float64", "bytes", "PD KV bytes received/installed during the step", nonnegative=True),
    _c("kv_transfer_s", "float64", "s", "time the step spent waiting on PD KV transfer", nonnegative=True),
    _c("prefix_hit_tokens", "float64", "tokens", "prompt tokens served from the prefix cache", nonnegative=True),
    _c("preempted_reqs", "float64", "requests", "requests preempted/retracted for lack of KV blocks", nonnegative=True),
    _c("running_reqs", "float64", "requests", "requests running after the step", nonnegative=True),
    _c("waiting_reqs", "float64", "requests", "requests waiting after the step", nonnegative=True),
    _c("waiting_capacity_reqs", "float64", "requests",
       "requests waiting after the step for scheduling capacity (batch slots, token budget, KV blocks), not "
       "deferred by a transient constraint (LoRA budget, KV transfer): the saturation evidence (vLLM 0.32+)",
       nonnegative=True),
    _c("kv_usage", "float64", "ratio", "KV-cache usage 0..1 after the step", nonnegative=True),
    _c("schedule_s", "float64", "s", "host time in the scheduler", nonnegative=True),
    _c("prepare_s", "float64", "s", "host time building the flat token stream", nonnegative=True),
    _c("forward_s", "float64", "s", "forward pass time (device time where measured)", nonnegative=True),
    _c("gpu_wait_s", "float64", "s", "interval rows: time the GPU forward stream sat idle between forwards, "
       "waiting on the host (SGLang gpu_overlap_wait_seconds_total; measured)", nonnegative=True),
    _c("host_pause_s", "float64", "s", "time the engine process stood still in host work it timed itself (vLLM's "
       "GC debugger, VLLM_GC_DEBUG=1: each garbage collection's duration; measured)", nonnegative=True),
    _c("host_stopped_s", "float64", "s", "time the OS saw the engine process stopped (state T; mixdiag's host "
       "sampler): interval rows the longest stop that ended in the interval, step rows the stops' overlap with the "
       "step; measured", nonnegative=True),
    _c("itl_count", "float64", "count", "interval rows: inter-token latencies observed in the interval", nonnegative=True),
    _c("itl_mean_s", "float64", "s", "interval rows: mean inter-token latency", nonnegative=True),
    _c("itl_p50_s", "float64", "s", "interval rows: median inter-token latency", nonnegative=True),
    _c("itl_p90_s", "float64", "s", "interval rows: P90 inter-token latency", nonnegative=True),
    _c("itl_p99_s", "float64", "s", "interval rows: P99 inter-token latency", nonnegative=True),
    _c("itl_tail_floor_s", "float64", "s", "interval rows: lower edge of the highest ITL histogram bucket that "
       "grew (at least one token waited this long)", nonnegative=True),
    # Evidence columns for data the reference engine did not write (traces, vLLM/SGLang metrics and logs).
    _c("step_source", "str", "-", "how the row was found: record | range | sync | gap | log | scrape | client",
       default=""),
    _c("arrivals", "float64", "requests", "requests that arrived (or began prefill) in the step/interval",
       nonnegative=True),
    _c("ttft_p50_s", "float64", "s", "interval rows: median time to first token", nonnegative=True),
    _c("ttft_p99_s", "float64", "s", "interval rows: P99 time to first token", nonnegative=True),
    _c("tpot_p50_s", "float64", "s", "interval rows: median per-request time per output token of the requests "
       "that finished in the interval", nonnegative=True),
    _c("tpot_p99_s", "float64", "s", "interval rows: P99 per-request time per output token of the requests "
       "that finished in the interval", nonnegative=True),
    _c("rejected_reqs", "float64", "requests", "interval rows: requests the server refused at admission (a queue "
       "limit reached)", nonnegative=True),
    _c("flops_estimated", "float64", "FLOP", "interval rows: FLOPs per GPU the engine estimated from token counts "
       "and the model shape (quality 'estimated': context, never evidence)", nonnegative=True),
    _c("hbm_bytes_estimated", "float64", "bytes", "interval rows: memory bytes read + written per GPU, estimated "
       "by the engine like flops_estimated (context, never evidence)", nonnegative=True),
    _c("large_step_share", "float64", "ratio",
       "interval rows: share of steps that scheduled more tokens than the decode batch (prefill work)",
       nonnegative=True),
    _c("iteration_tokens_floor", "float64", "tokens",
       "interval rows: the interval's largest iteration (vLLM iteration_tokens_total) held at least this many "
       "tokens (the lower edge of its bucket)", nonnegative=True),
    _c("prompt_chunk_ahead_tokens", "float64", "tokens",
       "interval rows: prompt tokens, at least, of the largest iteration that finished a prefill in the interval "
       "or within one mean prefill time after it (iteration tokens beyond the running batch)", nonnegative=True),
    _c("prefill_work_tokens", "float64", "tokens",
       "interval rows: prompt tokens computed in the interval, inferred by spreading vLLM's prompt tokens (counted "
       "at the first token) back over the requests' prefill time", nonnegative=True),
    _c("graph_full_steps", "float64", "count", "interval rows: steps that replayed the FULL graph", nonnegative=True),
    _c("graph_piecewise_steps", "float64", "count", "interval rows: steps run PIECEWISE", nonnegative=True),
    _c("graph_none_steps", "float64", "count", "interval rows: steps run eager (no graph)", nonnegative=True),
    _c("graph_none_min_tokens", "float64", "tokens", "interval rows: the smallest batch (unpadded tokens) the "
       "engine ran without a graph in the interval (vLLM --cudagraph-metrics table)", nonnegative=True),
    _c("comm_s", "float64", "s", "device time in collective / all-to-all / dispatch-combine kernels in the step",
       nonnegative=True),
    _c("comm_share", "float64", "ratio", "comm_s / the step's device time", nonnegative=True),
    _c("rank_skew", "float64", "ratio",
       "multi-rank traces: slowest rank's compute time / median rank's for the same step (1 = even)",
       nonnegative=True),
    _c("rank_sm_skew", "float64", "ratio",
       "multi-rank EP traces whose compute hides inside CUDA graphs: largest rank's SM-busy time "
       "(mean SMs-active x step span) / median rank's for the same step (1 = even); an asymmetry, "
       "not a compute time: waiting all-to-all kernels keep only their CTAs' SMs active", nonnegative=True),
    _c("rank_comm_spread", "float64", "ratio",
       "multi-rank EP traces: largest minus smallest rank's exchange-kernel share of the same step (kernels "
       "visible on every rank): a rank waiting in dispatch/combine while another computes", nonnegative=True),
    _c("kv_overlap_s", "float64", "s",
       "traces: time off-compute-stream copies / transfer kernels (KV-sized, docs/contracts.md section 7) ran "
       "inside the step's GPU span", nonnegative=True),
    _c("kv_overlap_bytes", "float64", "bytes",
       "traces: bytes of those copies inside the step's GPU span (time share of each copy; NaN: kernels only)",
       nonnegative=True),
    _c("kv_wait_s", "float64", "s",
       "traces: compute-stream idle time inside the step's GPU span while such a transfer ran (the forward "
       "waited on it)", nonnegative=True),
    _c("device_idle_before_s", "float64", "s",
       "measured device idle time between the previous step's end and this step's start (traces)",
       nonnegative=True),
    _c("q_token_allocation", "str", "-", "per-row quality of prefill_tokens/decode_rows/kind "
       "(measured|inferred|estimated|absent; '' = see meta['signals'])", default=""),
    _c("q_graph_mode", "str", "-", "per-row quality of graph_mode ('' = see meta['signals'])", default=""),
    _c("q_sm_active", "str", "-", "per-row quality of sm_active ('' = see meta['signals'])", default=""),
    _c("q_expert_imbalance", "str", "-", "per-row quality of expert_imbalance/rank_skew ('' = see meta)",
       default=""),
    _c("q_kv_transfer", "str", "-", "per-row quality of kv_transfer_* ('' = see meta['signals'])", default=""),
)

TOKENS_COLUMNS: tuple[Column, ...] = (
    _c("instance", "str", "-", "instance that produced the tokens", required=True),
    _c("request_id", "str", "-", "request identifier, unique within an instance", required=True),
    _c("t_s", "float64", "s", "when the tokens became available to the client", required=True),
    _c("n_tokens", "int64", "tokens", "tokens emitted by this event (>1 with speculative decoding)", required=True,
       nonnegative=True),
    _c("step", "float64", "count", "step that produced the event, NaN when unknown"),
    _c("is_first", "float64", "bool", "1 for the request's first output event (TTFT), else 0; NaN if unknown"),
    _c("arrival_s", "float64", "s", "first-event rows: when the request arrived (was sent), on the Timeline clock; "
       "NaN elsewhere or if unknown (mixdiag tune's workload)"),
    _c("prompt_tokens", "float64", "tokens", "first-event rows: the request's prompt length; NaN elsewhere or if "
       "unknown (mixdiag tune's workload)", nonnegative=True),
)

SERIES_COLUMNS: tuple[Column, ...] = (
    _c("instance", "str", "-", "instance the series belongs to", required=True),
    _c("name", "str", "-", "series name, e.g. DCGM_FI_PROF_SM_ACTIVE", required=True),
    _c("labels", "str", "-", "labels as sorted 'k=v,k=v' ('' when none)", default=""),
    _c("t_s", "float64", "s", "sample time", required=True),
    _c("value", "float64", "-", "sample value (unit implied by the name)", required=True),
)

FRAMES: dict[str, tuple[Column, ...]] = {"steps": STEPS_COLUMNS, "tokens": TOKENS_COLUMNS, "series": SERIES_COLUMNS}


def columns(frame: str) -> tuple[Column, ...]:
    """The documented columns of ``frame`` ('steps', 'tokens' or 'series')."""
    return FRAMES[frame]


def describe() -> str:
    """The Timeline contract as a text table (``mixdiag schema`` prints it, then the diagnosis result's)."""
    out = []
    for frame, cols in FRAMES.items():
        out.append(f"{frame}:")
        for c in cols:
            req = "required" if c.required else "optional"
            out.append(f"  {c.name:<20} {c.dtype:<8} {c.unit:<9} {req:<8}  {c.doc}")
    return "\n".join(out)
