"""Per-engine step behaviour of foreign LLM servers, as their public sources describe it.

Each :class:`EngineSpec` fixes what an engine *does* (kernel names, graph dispatch, input copies,
synchronisation, overlap); :class:`CostModel` draws *how fast* from a seed, so no magnitude is a
constant tuned to a detector. Sources (details and links in docs/foreign-trace-simulator.md):

- vLLM V1 ``vllm/v1/worker/gpu_model_runner.py``: ``_prepare_inputs`` fills pinned CPU buffers and
  copies ``input_ids`` (int32), ``positions`` (int64), ``slot_mapping`` (int64) per scheduled token
  and ``query_start_loc``/``seq_lens`` (int32) per request to the GPU (vllm-ascend
  ``docs/.../ModelRunner_prepare_inputs.md`` walks through the same buffers); the sampled ids come
  back with a D2H copy followed by a stream sync (sync scheduling) or ``copy_event.synchronize()``
  (``vllm/v1/worker/gpu/async_utils.py`` ``AsyncOutput``: copy stream + CUDA event).
- vLLM ``CudagraphDispatcher.dispatch`` (formats.md §1.3): FULL for uniform decode at a capture
  size, PIECEWISE (graph pieces with eager attention between) for mixed batches, NONE above the
  largest capture size; default sizes ``[1,2,4] + range(8,256,8) + range(256,max+1,16)``.
- FlashAttention-2: varlen prefill runs ``flash_fwd_kernel``, decode runs
  ``flash_fwd_splitkv_kernel`` (+ ``flash_fwd_splitkv_combine_kernel`` when split).
- FlashInfer (SGLang default backend): ``BatchPrefillWithPagedKVCacheKernel`` for extend/mixed,
  ``BatchDecodeWithPagedKVCacheKernel`` for decode. SGLang: extend is eager, decode replays a graph
  when ``bs <= cuda_graph_max_bs``; a MIXED batch runs the extend path (formats.md §2); the overlap
  ("zero-overhead") scheduler launches batch n+1 before resolving batch n (lmsys blog 2024-12-04).
- EP: DeepEP low-latency ``deep_ep::internode_ll::dispatch/combine`` (graph compatible, decode) and
  normal ``deep_ep::intranode::dispatch/combine`` (not graph compatible, prefill); NCCL all-to-all
  shows as ``ncclDevKernel_SendRecv`` (formats.md §6.3). Ranks meet in every all-to-all.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

GEMM = "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64_warpgroupsize1x1x1_execute_segment_k_off_kernel__5x_cublas"


def vllm_capture_sizes(max_size: int) -> tuple[int, ...]:
    """vLLM's default capture ladder up to ``max_size``."""
    sizes = [1, 2, 4] + list(range(8, 256, 8)) + list(range(256, max_size + 1, 16))
    return tuple(s for s in sizes if s <= max_size)


def sglang_capture_sizes(max_bs: int) -> tuple[int, ...]:
    """SGLang-style ladder: 1, 2, 4, then every 8 up to ``cuda_graph_max_bs``."""
    return tuple([1, 2, 4] + list(range(8, max_bs + 1, 8)))


@dataclass(frozen=True)
class EngineSpec:
    """What one engine does per step; magnitudes live in :class:`CostModel`."""

    name: str
    attn_prefill: tuple[str, ...]          # kernels for prefill rows (or the whole varlen batch)
    attn_decode: tuple[str, ...]           # kernels for a pure-decode batch
    attn_split: bool                       # prefill and decode rows get separate attention kernels
    mixed_chunk: bool                      # prefill chunks ride along with decodes (vs prefill-only steps)
    mixed_graph: str                       # graph mode of a mixed/prefill step at or below max capture
    overlap: bool                          # CPU of step n+1 overlaps the GPU of step n
    sync_api: str                          # how the engine thread waits for the sampled ids
    token_copies: tuple[tuple[str, int], ...]    # (tensor, bytes per scheduled token)
    request_copies: tuple[tuple[str, int], ...]  # (tensor, bytes per request; +1 row for query_start_loc)
    sampled_bytes: int                     # bytes per sampled request in the D2H copy
    nvtx_step: str                         # range around one step (when NVTX is on)
    nvtx_forward: str                      # range around the forward
    layer_extra: tuple[str, ...] = ()      # engine-specific per-layer kernels (KV-cache write, rope)
    sampler: tuple[str, ...] = ("softmax_warp_forward", "argmax_kernel")
    moe: bool = False
    n_ranks: int = 1
    ep_decode: tuple[str, str] = ("deep_ep::internode_ll::dispatch", "deep_ep::internode_ll::combine")
    ep_prefill: tuple[str, str] = ("deep_ep::intranode::dispatch", "deep_ep::intranode::combine")
    process_names: tuple[str, ...] = field(default=("python3",))

    def __post_init__(self):
        if self.mixed_graph not in ("PIECEWISE", "NONE"):
            raise ValueError(f"mixed_graph must be PIECEWISE or NONE, not {self.mixed_graph!r}")
        if self.n_ranks < 1:
            raise ValueError("n_ranks must be >= 1")


_VLLM_COPIES = dict(token_copies=(("input_ids", 4), ("positions", 8), ("slot_mapping", 8)),
                    request_copies=(("query_start_loc", 4), ("seq_lens", 4)), sampled_bytes=8)

ENGINES: dict[str, EngineSpec] = {
    "vllm": EngineSpec(
        name="vllm", attn_prefill=("flash_fwd_kernel",),
        attn_decode=("flash_fwd_splitkv_kernel", "flash_fwd_splitkv_combine_kernel"),
        attn_split=False, mixed_chunk=True, mixed_graph="PIECEWISE", overlap=False,
        sync_api="cudaStreamSynchronize", nvtx_step="execute_model", nvtx_forward="gpu_model_runner: forward",
        layer_extra=("rotary_embedding_kernel", "reshape_and_cache_flash_kernel"),
        process_names=("VLLM::EngineCore",), **_VLLM_COPIES),
    "sglang": EngineSpec(
        name="sglang", attn_prefill=("BatchPrefillWithPagedKVCacheKernel",),
        attn_decode=("BatchDecodeWithPagedKVCacheKernel",),
        attn_split=False, mixed_chunk=False, mixed_graph="NONE", overlap=True,
        sync_api="cudaEventSynchronize", nvtx_step="run_batch", nvtx_forward="forward_batch_generation",
        layer_extra=("BatchQKApplyRotaryPosIdsCosSinCache", "store_kvcache_kernel"),
        token_copies=(("input_ids", 8), ("positions", 8), ("out_cache_loc", 8)),
        request_copies=(("seq_lens", 8), ("req_pool_indices", 8)), sampled_bytes=8,
        process_names=("sglang::scheduler",)),
    "ep2": EngineSpec(
        name="ep2", attn_prefill=("flash_fwd_kernel",),
        attn_decode=("flash_fwd_splitkv_kernel", "flash_fwd_splitkv_combine_kernel"),
        attn_split=False, mixed_chunk=True, mixed_graph="NONE", overlap=False,
        sync_api="cudaStreamSynchronize", nvtx_step="execute_model", nvtx_forward="gpu_model_runner: forward",
        layer_extra=("rotary_embedding_kernel", "reshape_and_cache_flash_kernel"),
        moe=True, n_ranks=2, process_names=("VLLM::Worker_DP0", "VLLM::Worker_DP1"), **_VLLM_COPIES),
}


@dataclass(frozen=True)
class CostModel:
    """Magnitudes of one simulated deployment, all drawn from the seed (see :func:`draw_costs`)."""

    n_layers: int            # layers modelled (a real model's layers are folded into these)
    base_ms: float           # decode step floor (weights read once per step)
    per_row_us: float        # extra per decode row (KV read)
    per_token_us: float      # extra per prefill token (GEMM + attention)
    eager_mult: float        # NONE/PIECEWISE slowdown vs a FULL replay (launch overheads)
    jitter: float            # lognormal sigma of step time
    host_gap_ms: float       # scheduler + prepare time on the CPU per step
    max_capture: int
    capture_sizes: tuple[int, ...]
    rows_lo: int
    rows_hi: int
    chunk: int               # prefill chunk budget (tokens)
    kv_bytes_per_token: int  # KV bytes of one token across all layers (PD transfer)
    transfer: str            # pd transfer path: h2d | p2p | nccl
    transfer_gbps: float
    transfer_stall: float    # share of the transfer time the compute stream waits (layer-wise load)
    h2d_gbps: float
    launch_us: float         # cudaLaunchKernel CPU time
    comm_ms: float           # all-to-all time per MoE layer pair (dispatch+combine), ep only
    hot_factor: float        # expert compute multiplier on the hot rank in a hotspot step


def draw_costs(spec: EngineSpec, rng: np.random.Generator) -> CostModel:
    """Draw a deployment's magnitudes: decode 10-30 ms, a 2048-token chunk adds ~30-100 ms."""
    if spec.name == "sglang":
        max_capture = int(rng.choice([80, 160, 256]))
        sizes = sglang_capture_sizes(max_capture)
    else:
        max_capture = int(rng.choice([256, 512]))
        sizes = vllm_capture_sizes(max_capture)
    rows_hi = int(rng.integers(max_capture // 3, int(max_capture * 0.8)))
    return CostModel(
        # layers folded into 6-9 modelled ones (4-6 for MoE, whose layers carry twice the kernels) keep files small
        n_layers=int(rng.integers(4, 7) if spec.moe else rng.integers(6, 10)), base_ms=float(rng.uniform(8, 18)),
        per_row_us=float(rng.uniform(15, 45)), per_token_us=float(rng.uniform(15, 48)),
        eager_mult=float(rng.uniform(1.08, 1.35)), jitter=float(rng.uniform(0.02, 0.06)),
        host_gap_ms=float(rng.uniform(0.4, 2.5)), max_capture=max_capture, capture_sizes=sizes,
        rows_lo=max(4, rows_hi // 4), rows_hi=rows_hi, chunk=int(rng.choice([512, 1024, 2048, 4096])),
        kv_bytes_per_token=int(rng.choice([64, 128, 160]) * 1024),
        transfer=str(rng.choice(["h2d", "p2p", "nccl"])), transfer_gbps=float(rng.uniform(15, 60)),
        transfer_stall=float(rng.uniform(0.3, 0.8)), h2d_gbps=float(rng.uniform(10, 25)),
        launch_us=float(rng.uniform(3.5, 7.0)), comm_ms=float(rng.uniform(0.05, 0.25)),
        hot_factor=float(rng.uniform(1.8, 3.5)))


def graph_mode(spec: EngineSpec, cost: CostModel, prefill_tokens: int, decode_rows: int) -> str:
    """The dispatcher's choice: FULL for uniform decode at a capture size, else mixed mode or NONE."""
    tokens = prefill_tokens + decode_rows
    if tokens > cost.max_capture or tokens == 0:
        return "NONE"
    if prefill_tokens == 0:
        return "FULL"
    return spec.mixed_graph


def padded(cost: CostModel, tokens: int) -> int:
    """Graph replays run the next capture size (padding)."""
    for s in cost.capture_sizes:
        if s >= tokens:
            return s
    return tokens


def layer_kernels(spec: EngineSpec, prefill_tokens: int, decode_rows: int) -> list[tuple[str, str]]:
    """One layer's kernels as ``(name, role)``; roles weight time in :func:`kernel_durations`."""
    ks = [("rms_norm_kernel", "norm"), (GEMM, "gemm_qkv")]
    ks += [(k, "misc") for k in spec.layer_extra]
    if prefill_tokens and decode_rows and spec.attn_split:
        ks += [(k, "attn_p") for k in spec.attn_prefill] + [(k, "attn_d") for k in spec.attn_decode]
    elif prefill_tokens:
        ks += [(k, "attn_p") for k in spec.attn_prefill]
    else:
        ks += [(k, "attn_d") for k in spec.attn_decode]
    ks += [(GEMM, "gemm_o"), ("fused_add_rms_norm_kernel", "norm")]
    if spec.moe:
        ks += [("topkGatingSoftmax", "misc"), ("EP_DISPATCH", "dispatch"), (GEMM, "expert"),
               ("act_and_mul_kernel", "misc"), (GEMM, "expert"), ("EP_COMBINE", "combine")]
    else:
        ks += [(GEMM, "gemm_mlp"), ("act_and_mul_kernel", "misc"), (GEMM, "gemm_mlp")]
    return ks


#: SMs of an H100 / H200 SXM (both 132).
GPU_SMS = 132
#: Routed-expert counts of public MoE models: DeepSeek-V2-Lite / Qwen1.5-MoE (64), Qwen3-MoE (128),
#: DeepSeek-V2 (160), DeepSeek-V3 / R1 (256).
EXPERT_COUNTS = (64, 128, 160, 256)


def comm_sm_shares(spec: EngineSpec, rng: np.random.Generator) -> dict[str, float]:
    """Share of the GPU's SMs each all-to-all / transfer kernel keeps resident for its whole
    duration (it spins on flags while it waits for the peers, so those SMs count as active).

    NCCL runs one CTA per channel (``NCCL_MAX_NCHANNELS``; 16-32 channels on NVLink H100/H200);
    DeepEP normal mode runs ``Buffer.num_sms`` CTAs (default 20; 20-24 in public deployments);
    DeepEP low-latency runs ``ceil(E / num_warp_groups)`` CTAs with ``num_warp_groups =
    ceil(E / num_device_sms)`` (``csrc/kernels/internode_ll.cu``), E the routed experts - up to
    almost every SM, so its wait is not visible as idle SMs for every model.
    """
    nccl = int(rng.integers(16, 33)) / GPU_SMS
    normal = int(rng.integers(20, 25)) / GPU_SMS
    e = int(rng.choice(EXPERT_COUNTS))
    ll = -(-e // -(-e // GPU_SMS)) / GPU_SMS
    out = {"ncclDevKernel_SendRecv": nccl}
    out.update({k: ll for k in spec.ep_decode})
    out.update({k: normal for k in spec.ep_prefill})
    return out


ROLE_WEIGHT = {"norm": 0.03, "misc": 0.02, "gemm_qkv": 0.18, "gemm_o": 0.12, "gemm_mlp": 0.25,
               "expert": 0.25, "attn_p": 0.2, "attn_d": 0.2, "dispatch": 0.0, "combine": 0.0}
