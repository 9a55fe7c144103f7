"""Names the trace collectors recognise in foreign engines' traces: an extendable table.

Source names stop here (house rule): the collectors read these tables, the diagnosis never sees
them. Kernel names are in :mod:`.kernel_names`. Add an engine by adding rows; order matters only in :data:`STEP_RANGES` (outermost first:
the first name present in a process wins).
"""
from __future__ import annotations

import re

from mixdiag import wire

#: ``(range name, engine, where it comes from)``; outermost first. A range of the winning name on
#: the engine thread is one step; GPU work launched inside it is the step's.
STEP_RANGES: tuple[tuple[str, str, str], ...] = (
    (wire.STEP, "mixdiag", "mixdiag/wire.py (read by the mixdiag path with its message first)"),
    ("execute_model", "vllm", "Worker/ModelRunner.execute_model (record_function in profiled runs)"),
    ("scheduler.run_batch", "sglang", "SGLANG_SCHEDULER_ENABLE_NVTX scheduler ranges"),
    ("run_batch", "sglang", "Scheduler.run_batch"),
    ("gpu_model_runner: forward", "vllm", "vllm/v1/worker/gpu_model_runner.py record_function_or_nullcontext"),
    ("forward_batch_generation", "sglang", "TpModelWorker.forward_batch_generation"),
    ("ModelRunner.forward", "sglang", "ModelRunner.forward"),
    ("forward_batch", "sglang", "model_runner forward_batch (extend/decode)"),
)

#: Names only (engine step ranges other than mixdiag's own message-carrying ``step``).
ENGINE_STEP_NAMES: tuple[str, ...] = tuple(n for n, eng, _ in STEP_RANGES if eng != "mixdiag")

#: Ranges around KV transfer by a PD connector (NIXL, UCX, Mooncake, vLLM's KV connector).
TRANSFER_RANGE_RE = re.compile(r"nixl|ucx|mooncake|kv_?transfer|kv_?connector|send_kv|recv_kv|"
                               r"start_load_kv|wait_for_layer_load|save_kv_layer", re.I)

# Kernel names (attention phase, comm, EP exchange, transfer kernels) live in .kernel_names.

#: Runtime calls the engine thread blocks in for the sampled ids (sync pattern).
SYNC_CALL_LIKE = ("cudaStreamSynchronize%", "cudaEventSynchronize%", "cudaDeviceSynchronize%",
                  "cuStreamSynchronize%", "cuEventSynchronize%", "cuCtxSynchronize%")
#: Runtime calls that issue a copy (joined to CUPTI memcpy rows by correlation id).
MEMCPY_CALL_LIKE = ("cudaMemcpy%", "cuMemcpy%")


def classify(names: dict[int, str], pattern: re.Pattern) -> set[int]:
    """String ids whose name matches ``pattern`` (classify once per name, not per row)."""
    return {i for i, s in names.items() if s and pattern.search(s)}
