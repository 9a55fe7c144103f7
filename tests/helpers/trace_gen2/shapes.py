"""Trace shapes of tier (d2): what one engine deployment writes into an Nsight export.

Each field names the engine behaviour it stands for; the basis (engine source read, never copied)
is in the comment beside each shape and in docs/analyze.md, "Tier (d2)".
"""
from __future__ import annotations

from dataclasses import dataclass

ATTENTION = ("fa2", "fa3", "flashinfer")
A2A = ("none", "deepep", "nccl")
PD = ("none", "nixl", "copy")


@dataclass(frozen=True)
class Shape:
    """One deployment's trace shape.

    ``engine``: vllm | sglang. ``graph_trace``: nsys ``--cuda-graph-trace`` (graph: one
    GRAPH_TRACE row per replay, no node kernels; node: node kernels with graphId). ``lag``: steps
    the engine thread runs ahead of the GPU before it waits for sampled ids (0: vLLM sync scheduling,
    D2H + cudaStreamSynchronize each step; 1: vLLM async scheduling / SGLang overlap scheduler).
    ``inputs_on_gpu``: per-token inputs built on the device (no per-token H2D copy).
    ``nvtx``: the engine's own step ranges are in the capture (name ``nvtx_step``)."""

    name: str
    engine: str
    graph_trace: str
    n_ranks: int
    attention: str
    a2a: str
    pd: str
    lag: int
    inputs_on_gpu: bool
    nvtx: bool
    nvtx_step: str = ""
    gpu_metrics_hz: int = 0
    max_capture: int = 256
    layers: int = 8

    def __post_init__(self):
        if self.engine not in ("vllm", "sglang") or self.graph_trace not in ("graph", "node"):
            raise ValueError(f"{self.name}: engine vllm|sglang, graph_trace graph|node")
        if self.attention not in ATTENTION or self.a2a not in A2A or self.pd not in PD:
            raise ValueError(f"{self.name}: attention {ATTENTION}, a2a {A2A}, pd {PD}")
        if self.n_ranks < 1 or (self.n_ranks > 1) != (self.a2a != "none"):
            raise ValueError(f"{self.name}: multi-rank shapes (and only they) need an all-to-all")
        if self.lag not in (0, 1) or self.layers < 2 or self.max_capture < 8:
            raise ValueError(f"{self.name}: lag 0|1, layers >= 2, max_capture >= 8")
        if self.nvtx and not self.nvtx_step:
            raise ValueError(f"{self.name}: nvtx needs the engine's step range name")
        if self.gpu_metrics_hz < 0:
            raise ValueError(f"{self.name}: gpu_metrics_hz >= 0")


SHAPES = {
    # vLLM V1, CUDAGraphMode FULL_AND_PIECEWISE (vllm/config/compilation.py default): uniform decode
    # replays one FULL graph (vllm/v1/cudagraph_dispatcher.py CudagraphDispatcher.dispatch), mixed
    # steps replay piecewise graphs with attention eager between; async scheduling
    # (vllm/v1/worker/gpu/async_utils.py AsyncOutput: sampled ids copied on a copy stream, the copy
    # event synchronised one step later, so no GPU idle gap per step); nsys default graph-level trace;
    # FA3 on Hopper (hopper/flash_fwd_launch_template.h: cutlass::device_kernel<flash::FlashAttnFwdSm90>,
    # one kernel family for prefill and decode, FlashAttnFwdCombine after split-KV)
    "graph-trace": Shape("graph-trace", "vllm", "graph", 1, "fa3", "none", "none", lag=1,
                         inputs_on_gpu=False, nvtx=False, gpu_metrics_hz=1000),
    # vLLM V1 sync scheduling (EngineCore.step: schedule -> execute_model -> update_from_output, the
    # sampled ids' D2H + stream sync every step), --cuda-graph-trace=node as vLLM's profiling docs
    # advise; FA2 with paged KV: flash_attn_varlen_func with a block table dispatches split-KV
    # (csrc/flash_attn/flash_api.cpp run_mha_fwd: paged KV forces the splitkv path), so prefill
    # chunks also run flash_fwd_splitkv_kernel
    "node-trace": Shape("node-trace", "vllm", "node", 1, "fa2", "none", "none", lag=0,
                        inputs_on_gpu=False, nvtx=False),
    # SGLang overlap scheduler (python/sglang/srt/managers/scheduler.py event_loop_overlap: batch n+1
    # is launched before batch n's result is processed; copy_done event), inputs on the device
    # (ForwardBatch input_ids/positions/out_cache_loc are GPU tensors), FlashInfer kernels,
    # SGLANG scheduler NVTX ranges (scheduler.run_batch)
    "sglang-overlap": Shape("sglang-overlap", "sglang", "graph", 1, "flashinfer", "none", "none", lag=1,
                            inputs_on_gpu=True, nvtx=True, nvtx_step="run_batch", gpu_metrics_hz=1000,
                            max_capture=160),
    # 2 DP-attention + EP ranks, one process and device each; DeepEP low-latency kernels inside the
    # FULL decode graph, normal-mode kernels in eager/piecewise steps (DeepEP README / docs/legacy.md:
    # low_latency is graph compatible, normal is not); node trace so expert kernels are visible
    "2-rank": Shape("2-rank", "vllm", "node", 2, "fa3", "deepep", "none", lag=1, inputs_on_gpu=False,
                    nvtx=True, nvtx_step="execute_model", gpu_metrics_hz=1000),
    # 4 ranks, NCCL all-to-all (ncclDevKernel_SendRecv: NCCL implements all-to-all as grouped
    # send/recv), graph-level trace: expert kernels inside replays are not in the export
    "4-rank": Shape("4-rank", "sglang", "graph", 4, "flashinfer", "nccl", "none", lag=1, inputs_on_gpu=True,
                    nvtx=False, gpu_metrics_hz=1000, max_capture=160),
    # PD decode instance with NIXL (vllm/distributed/kv_transfer/kv_connector/v1/nixl_connector.py:
    # KV blocks are READ by RDMA into the decode GPU's cache; no CUDA memcpy is issued, so the export
    # has no copy rows: only slower steps while the NIC writes HBM)
    "pd-nixl": Shape("pd-nixl", "vllm", "graph", 1, "fa3", "none", "nixl", lag=1, inputs_on_gpu=False,
                     nvtx=False, gpu_metrics_hz=1000),
    # PD decode instance with a cudaMemcpy-based connector: a connector thread copies KV layer by layer
    # H2D on its own stream and the compute stream waits on its events (cudaStreamWaitEvent) -
    # vLLM KVConnectorBase_V1 start_load_kv / wait_for_layer_load (e.g. LMCache / offloading connectors)
    "pd-copy": Shape("pd-copy", "vllm", "node", 1, "fa2", "none", "copy", lag=0, inputs_on_gpu=False,
                     nvtx=True, nvtx_step="execute_model"),
}
