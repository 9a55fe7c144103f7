"""The kernel-name table (collectors/traces/steps/kernel_names.py) on names as the libraries emit them.

Demangled FA2 names follow DEFINE_FLASH_FORWARD_KERNEL(flash_fwd_splitkv_kernel, bool Is_causal, bool Is_local,
...) in flash-attention csrc/flash_attn/src/flash_fwd_launch_template.h; the others are the kernel names of
FlashAttention-3 (hopper/), FlashInfer, FlashMLA, vLLM csrc, NCCL, DeepEP and pplx as profilers show them.
"""
from __future__ import annotations

import pytest

from mixdiag.collectors.traces.steps.kernel_names import COMM, DECODE, EP_EXCHANGE, PREFILL, TRANSFER, kernel_flags

TRAITS = "Flash_fwd_kernel_traits<128, 64, 128, 4, false, false, cutlass::bfloat16_t, " \
         "Flash_kernel_traits<128, 64, 128, 4, cutlass::bfloat16_t>>"


def splitkv(causal: str, local: str = "false") -> str:
    return (f"void flash::flash_fwd_splitkv_kernel<{TRAITS}, {causal}, {local}, false, false, true, false, true, "
            f"false>(flash::Flash_fwd_params)")


CASES = [  # (name, flags, why)
    (splitkv("false"), DECODE, "FA2 split-KV, Is_causal false: max_seqlen_q == 1, every row decodes"),
    (splitkv("true"), PREFILL, "FA2 split-KV, Is_causal true: a longer query (paged prefill) is in the batch"),
    (splitkv("false", "true"), 0, "FA2 split-KV with a local window: the causal flag alone does not tell"),
    ("flash_fwd_splitkv_kernel", 0, "short name: no template flags, no phase (paged prefill runs it too)"),
    (f"void flash::flash_fwd_splitkv_combine_kernel<{TRAITS}, 4, 4, true>(flash::Flash_fwd_params)", 0,
     "the split-KV reduction carries no phase (and its traits are not flash_fwd_kernel)"),
    (f"void flash::flash_fwd_kernel<{TRAITS}, false, true, false, false, false, true, true, false>"
     "(flash::Flash_fwd_params)", PREFILL, "FA2 varlen forward without a block table"),
    ("void cutlass::device_kernel<flash::enable_sm90_or_later<flash::FlashAttnFwdSm90<flash::CollectiveMainloopFwdSm90"
     "<2, cute::tuple<cute::C<1>, cute::C<1>, cute::C<1>>>, flash::VarlenDynamicPersistentTileScheduler<128, 256, 128, "
     "false, true, true>>>>(flash::FlashAttnFwdSm90<...>::Params)", 0, "FA3: one kernel for every phase"),
    ("void cutlass::device_kernel<flash::FlashAttnFwdCombine<cute::tuple<cute::C<8>, cute::C<128>>, 7, 256, 1, "
     "false, true, cutlass::bfloat16_t, float, cutlass::arch::Sm90>>(...)", 0, "FA3 combine is attention, not comm"),
    ("BatchPrefillWithPagedKVCacheKernel", PREFILL, "FlashInfer prefill"),
    ("BatchDecodeWithPagedKVCacheKernel", DECODE, "FlashInfer decode"),
    ("void flash::flash_fwd_splitkv_mla_kernel<Flash_fwd_kernel_traits_mla<576, 64, 64, 8, cutlass::bfloat16_t, 512>,"
     " true, false>(Flash_fwd_mla_params)", DECODE, "FlashMLA decode, though its name holds splitkv"),
    ("void vllm::paged_attention_v2_kernel<__nv_bfloat16, __nv_bfloat16, 128, 16, 128, "
     "(vllm::Fp8KVCacheDataType)0, false, 512>(...)", DECODE, "vLLM paged attention v2: decode only"),
    ("kernel_unified_attention_2d", 0, "vLLM Triton unified attention: every phase"),
    ("ncclDevKernel_SendRecv(ncclDevKernelArgsStorage<4096ul>)", COMM | EP_EXCHANGE | TRANSFER,
     "NCCL all-to-all is grouped send/recv"),
    ("ncclKernel_AllToAll_RING_SIMPLE_Sum_int8_t", COMM | EP_EXCHANGE, "older NCCL all-to-all kernel name"),
    ("ncclDevKernel_AllReduce_Sum_bf16_RING_LL(ncclDevKernelArgsStorage<4096ul>)", COMM, "TP all-reduce, not EP"),
    ("ncclDevKernel_AllGather_RING_LL(ncclDevKernelArgsStorage<4096ul>)", COMM, "all-gather, not EP"),
    ("void vllm::cross_device_reduce_1stage<__nv_bfloat16, 8>(vllm::RankData*, vllm::RankSignals, ...)", COMM,
     "vLLM custom all-reduce"),
    ("void deep_ep::intranode::dispatch<8, 768, 8192>(...)", COMM | EP_EXCHANGE, "DeepEP normal, NVLink"),
    ("void deep_ep::intranode::combine<__nv_bfloat16, 8, 768, 4096>(...)", COMM | EP_EXCHANGE, "DeepEP normal"),
    ("void deep_ep::internode::dispatch<true, 8, 20, 2, 256, 8, 8>(...)", COMM | EP_EXCHANGE, "DeepEP RDMA"),
    ("void deep_ep::internode_ll::dispatch<true, 3, 7168>(...)", COMM | EP_EXCHANGE, "DeepEP low latency"),
    ("void deep_ep::internode_ll::combine<3, 7168, 9>(...)", COMM | EP_EXCHANGE, "DeepEP low latency"),
    ("void deep_ep::intranode::notify_dispatch<8>(...)", COMM | EP_EXCHANGE, "DeepEP notify: waits on peers"),
    ("void deep_ep::layout::get_dispatch_layout<256, 32, 8>(...)", 0, "local layout computation, no exchange"),
    ("void pplx::dispatchKernel<__nv_bfloat16, 128, false>(...)", COMM | EP_EXCHANGE, "pplx-kernels all-to-all"),
    ("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64_cublas", 0, "a GEMM is nothing here"),
    ("", 0, "no name"),
]


@pytest.mark.parametrize("name,flags,why", CASES, ids=[c[2] for c in CASES])
def test_kernel_flags(name, flags, why):
    assert kernel_flags(name) == flags, why
