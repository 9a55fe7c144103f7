"""Kernel names and per-step kernel lists of the shapes (what CUPTI would record), with the costs.

Names are (shortName, demangledName) as Nsight stores them: the short name is the bare function
name without namespace or template arguments, so FA3 shows as ``device_kernel`` (demangled
``cutlass::device_kernel<flash::FlashAttnFwdSm90<...>>``) and DeepEP's as ``dispatch``/``combine``.
Sources: vLLM ``csrc/layernorm_kernels.cu`` (rms_norm_kernel, fused_add_rms_norm_kernel),
``csrc/pos_encoding_kernels.cu`` (rotary_embedding_kernel), ``csrc/cache_kernels.cu``
(reshape_and_cache_flash_kernel), ``csrc/moe/topk_softmax_kernels.cu`` (topkGatingSoftmax),
``vllm/model_executor/layers/fused_moe/fused_moe.py`` (Triton fused_moe_kernel); FlashAttention
``csrc/flash_attn/src/flash_fwd_launch_template.h`` (FA2 flash_fwd_splitkv_kernel,
flash_fwd_splitkv_combine_kernel) and ``hopper/flash_fwd_launch_template.h`` (FA3 FlashAttnFwdSm90,
FlashAttnFwdCombine, prepare_varlen_num_blocks_kernel); FlashInfer ``include/flashinfer/attention/``
(BatchPrefillWithPagedKVCacheKernel, BatchDecodeWithPagedKVCacheKernel); DeepEP
``csrc/kernels/internode_ll.cu`` / ``intranode.cu``; NCCL ``ncclDevKernel_SendRecv`` (all-to-all is
grouped send/recv); cuBLAS >= 12.8 Hopper GEMMs are ``nvjet_*`` kernels.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

GEMM = ("nvjet_tst_128x256_64x4_1x2_h_bz_coopA_TNN", "nvjet_tst_128x256_64x4_1x2_h_bz_coopA_TNN")
NAMES = {
    "rms": ("rms_norm_kernel", "void vllm::rms_norm_kernel<c10::BFloat16, 8>(c10::BFloat16 *, const c10::BFloat16 *, const c10::BFloat16 *, float, int, int)"),
    "add_rms": ("fused_add_rms_norm_kernel", "void vllm::fused_add_rms_norm_kernel<c10::BFloat16, 8>(c10::BFloat16 *, c10::BFloat16 *, const c10::BFloat16 *, float, int, int)"),
    "rope": ("rotary_embedding_kernel", "void vllm::rotary_embedding_kernel<c10::BFloat16, true>(const long *, c10::BFloat16 *, c10::BFloat16 *, const c10::BFloat16 *, int, long, long, long, int, int, int)"),
    "cache": ("reshape_and_cache_flash_kernel", "void vllm::reshape_and_cache_flash_kernel<__nv_bfloat16, __nv_bfloat16, (vllm::Fp8KVCacheDataType)0>(...)"),
    "sg_rope": ("BatchQKApplyRotaryPosIdsCosSinCacheKernel", "void flashinfer::BatchQKApplyRotaryPosIdsCosSinCacheKernel<true, 128u, 8u, 16u, __nv_bfloat16, long>(...)"),
    "sg_cache": ("store_kvcache", "void sgl_kernel::store_kvcache<__nv_bfloat16>(...)"),
    "gemm": GEMM,
    "act": ("act_and_mul_kernel", "void vllm::act_and_mul_kernel<c10::BFloat16, &vllm::silu_kernel<c10::BFloat16>, true>(...)"),
    "topk": ("topkGatingSoftmax", "void vllm::moe::topkGatingSoftmax<8, 128, 4, 16, 32, int>(const float *, const bool *, float *, int, int *, int *, int, int, int)"),
    "experts": ("fused_moe_kernel", "fused_moe_kernel"),
    "fa2": ("flash_fwd_splitkv_kernel", "void flash::flash_fwd_splitkv_kernel<Flash_fwd_kernel_traits<128, 64, 128, 4, false, false, cutlass::bfloat16_t, Flash_kernel_traits<128, 64, 128, 4, cutlass::bfloat16_t> >, true, false, false, false, true, true, false, false>(flash::Flash_fwd_params)"),
    "fa2_combine": ("flash_fwd_splitkv_combine_kernel", "void flash::flash_fwd_splitkv_combine_kernel<Flash_fwd_kernel_traits<128, 64, 128, 4, false, false, cutlass::bfloat16_t, Flash_kernel_traits<128, 64, 128, 4, cutlass::bfloat16_t> >, 4, 5, true>(flash::Flash_fwd_params)"),
    "fa3_prep": ("prepare_varlen_num_blocks_kernel", "void flash::prepare_varlen_num_blocks_kernel(int, int, int, const int *, const int *, const int *, const int *, const int *, const int *, cutlass::FastDivmod, cutlass::FastDivmod, int, int *, int *, bool)"),
    "fa3": ("device_kernel", "void cutlass::device_kernel<flash::enable_sm90_or_later<flash::FlashAttnFwdSm90<flash::CollectiveMainloopFwdSm90<2, cute::tuple<cute::C<1>, cute::C<1>, cute::C<1> >, cute::tuple<cute::C<128>, cute::C<128>, cute::C<128> >, 128, cutlass::bfloat16_t, float, cutlass::arch::Sm90, false, false, false, true, true, false, true, true, false, false, false>, flash::CollectiveEpilogueFwd<cute::tuple<cute::C<128>, cute::C<128>, cute::C<128> >, cute::tuple<cute::C<1>, cute::C<1>, cute::C<1> >, cutlass::bfloat16_t, cutlass::arch::Sm90, 256, true, true, false, false>, flash::VarlenDynamicPersistentTileScheduler<128, 256, 128, true, true, true> > > >(flash::enable_sm90_or_later<...>::Params)"),
    "fa3_combine": ("device_kernel", "void cutlass::device_kernel<flash::enable_sm90_or_later<flash::FlashAttnFwdCombine<cute::tuple<cute::C<8>, cute::C<128> >, 6, 256, 1, false, true, cutlass::bfloat16_t, float, cutlass::arch::Sm90> > >(flash::enable_sm90_or_later<...>::Params)"),
    "fi_decode": ("BatchDecodeWithPagedKVCacheKernel", "void flashinfer::BatchDecodeWithPagedKVCacheKernel<(flashinfer::PosEncodingMode)0, 2u, 2u, 8u, 16u, 1u, 8u, flashinfer::DefaultAttention<false, false, false, false>, flashinfer::BatchDecodeParams<__nv_bfloat16, __nv_bfloat16, __nv_bfloat16, int> >(...)"),
    "fi_prefill": ("BatchPrefillWithPagedKVCacheKernel", "void flashinfer::BatchPrefillWithPagedKVCacheKernel<flashinfer::KernelTraits<(flashinfer::MaskMode)1, 128u, 1u, 4u, 8u, 8u, 1u, 4u, (flashinfer::PosEncodingMode)0, __nv_bfloat16, __nv_bfloat16, __nv_bfloat16, float, int, flashinfer::DefaultAttention<false, false, false, false> >, flashinfer::BatchPrefillPagedParams<__nv_bfloat16, __nv_bfloat16, __nv_bfloat16, int> >(...)"),
    "ll_dispatch": ("dispatch", "void deep_ep::internode_ll::dispatch<false, 7168>(void *, float *, int *, long *, int *, int *, void *, int *, void *, const void *, const long *, int *, int *, int, int, int, int, int, int, int, int, int)"),
    "ll_combine": ("combine", "void deep_ep::internode_ll::combine<7168, 1, 128>(void *, void *, int *, void *, const void *, const long *, const float *, const int *, const long *, int *, int *, int, int, int, int, int, int, int, int, bool)"),
    "nm_dispatch": ("dispatch", "void deep_ep::intranode::dispatch<8, 768, 8192>(int4 *, float *, int *, long *, float *, int *, int *, const int4 *, const float *, const long *, const float *, const bool *, const int *, int, int, int, int, int, int, void **, int, int, int)"),
    "nm_combine": ("combine", "void deep_ep::intranode::combine<__nv_bfloat16, 8, 768, 4096>(__nv_bfloat16 *, float *, const __nv_bfloat16 *, const float *, const __nv_bfloat16 *, const __nv_bfloat16 *, const int *, const int *, const int *, const int *, int, int, int, void **, int, int, int)"),
    "nccl": ("ncclDevKernel_SendRecv", "ncclDevKernel_SendRecv(ncclDevKernelArgsStorage<4096ul>)"),
    "argmax": ("reduce_kernel", "void at::native::reduce_kernel<512, 1, at::native::ReduceOp<float, at::native::ArgMaxOps<float>, unsigned int, long, 4> >(at::native::ReduceOp<float, at::native::ArgMaxOps<float>, unsigned int, long, 4>)"),
    "scale": ("elementwise_kernel", "void at::native::elementwise_kernel<128, 4, at::native::gpu_kernel_impl_nocast<at::native::BinaryFunctor<float, float, float, at::native::binary_internal::DivFunctor<float> > >(...)::{lambda(int)#1}>(int, ...)"),
}
#: SMs an all-to-all kernel keeps resident for its whole duration (waiting included): DeepEP's
#: Buffer.num_sms default 20 of H100/H200's 132; NCCL one CTA per channel (NCCL_MAX_NCHANNELS ~ 24)
COMM_SM = {"deepep": 20 / 132, "nccl": 24 / 132}


@dataclass(frozen=True)
class Costs:
    """Per-trace magnitudes drawn from the seed (never tuned to a detector)."""

    floor_ns: float       # decode step floor (weights read once per step)
    row_ns: float         # per decode row
    tok_ns: float         # per prefill token
    jitter: float         # lognormal sigma per kernel
    sched_ns: float       # engine thread: schedule + prepare inputs
    post_ns: float        # engine thread: process sampled ids
    launch_ns: float      # one cudaLaunchKernel call (eager)
    graph_launch_ns: float
    comm_ns: float        # one all-to-all latency when every rank arrives together
    fill: float           # SM share a compute kernel keeps busy
    kv_bytes_per_token: int

    @staticmethod
    def draw(rng: np.random.Generator) -> "Costs":
        # Sarathi-Serve figure-2 decode steps (formats.md 6.2) span 47-190 ms on A100 for 34B; a
        # folded small-MoE decode on Hopper is taken an order of magnitude faster: 6-14 ms + 15-50 us/row
        return Costs(floor_ns=rng.uniform(6e6, 14e6), row_ns=rng.uniform(15e3, 50e3),
                     tok_ns=rng.uniform(18e3, 45e3), jitter=rng.uniform(0.02, 0.05),
                     sched_ns=rng.uniform(0.3e6, 1.2e6), post_ns=rng.uniform(0.1e6, 0.3e6),
                     launch_ns=rng.uniform(4e3, 8e3), graph_launch_ns=rng.uniform(10e3, 25e3),
                     comm_ns=rng.uniform(60e3, 160e3), fill=rng.uniform(0.6, 0.95),
                     kv_bytes_per_token=int(rng.choice([64, 96, 160])) * 1024)


# op kinds: "k" graph-capturable compute, "attn" attention (eager between piecewise graphs),
# "exp" expert GEMM (the hot rank's), "comm" all-to-all (a barrier across ranks), "samp" sampler
def step_ops(shape, costs: Costs, decode_rows: int, prefill_tokens: int, graph_ok: bool) -> list[tuple[str, float, str]]:
    """One rank's kernels of one step in launch order: ``(name key, base ns, kind)``; base = no fault.

    ``graph_ok``: the step replays a FULL graph, so an EP shape uses DeepEP low-latency kernels;
    otherwise normal mode (not graph compatible)."""
    L = shape.layers
    dec = (costs.floor_ns + costs.row_ns * decode_rows) / L
    pre = costs.tok_ns * prefill_tokens / L
    attn = {"fa2": ["fa2", "fa2_combine"], "fa3": ["fa3_prep", "fa3", "fa3_combine"],
            "flashinfer": ["fi_prefill" if prefill_tokens else "fi_decode"]}[shape.attention]
    rope = ["rope", "cache"] if shape.engine == "vllm" else ["sg_rope", "sg_cache"]
    ops: list[tuple[str, float, str]] = []
    for layer in range(L):
        ops.append(("add_rms" if layer else "rms", 0.03 * dec + 0.02 * pre, "k"))
        ops.append(("gemm", 0.15 * dec + 0.25 * pre, "k"))
        ops += [(r, 0.02 * dec + 0.01 * pre, "k") for r in rope]
        share = [0.85, 0.15] if len(attn) == 2 else ([0.05, 0.8, 0.15] if len(attn) == 3 else [1.0])
        ops += [(a, s * (0.25 * dec + 0.3 * pre), "attn") for a, s in zip(attn, share)]
        ops.append(("gemm", 0.08 * dec + 0.1 * pre, "k"))
        ops.append(("add_rms", 0.03 * dec + 0.02 * pre, "k"))
        if shape.a2a == "none":
            ops += [("gemm", 0.2 * dec + 0.18 * pre, "k"), ("act", 0.02 * dec + 0.02 * pre, "k"),
                    ("gemm", 0.12 * dec + 0.1 * pre, "k")]
            continue
        ops += [("gemm", 0.01 * dec, "k"), ("topk", 0.01 * dec, "k")]
        disp, comb = (("ll_dispatch", "ll_combine") if graph_ok else ("nm_dispatch", "nm_combine")) \
            if shape.a2a == "deepep" else ("nccl", "nccl")
        ops.append((disp, 0.0, "comm"))
        ops += [("experts", 0.18 * dec + 0.16 * pre, "exp"), ("act", 0.02 * dec + 0.02 * pre, "exp"),
                ("experts", 0.12 * dec + 0.1 * pre, "exp")]
        ops.append((comb, 0.0, "comm"))
    ops += [("rms", 0.02 * dec, "k"), ("gemm", 0.05 * dec * L / 8, "k")]
    ops += [("scale", 15e3, "samp"), ("argmax", 25e3, "samp")]
    return ops
