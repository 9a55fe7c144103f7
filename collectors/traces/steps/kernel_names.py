"""What a GPU kernel's name says about a step: one table, each pattern with the source it comes from.

The trace readers classify every distinct kernel name once (Nsight ``StringIds``, Kineto event names)
into bit flags (:func:`kernel_flags`); nothing downstream of the collectors sees the names (house rule).
Add a library by adding a row to :data:`PATTERNS`; a name may carry several roles (an NCCL send/recv
kernel is comm, EP exchange and a possible KV transfer).

Attention phase is claimed only where the kernel itself differs by phase:

- FlashAttention-2 ``flash_fwd_kernel`` (varlen, no paged KV) serves prefill rows; its
  ``flash_fwd_splitkv_kernel`` is *not* a decode marker: ``mha_varlen_fwd`` forces the split-KV kernel
  whenever a block table is passed (``run_mha_fwd(params, stream, paged_KV)`` in
  ``csrc/flash_attn/flash_api.cpp``), so vLLM's paged prefill runs it too. Its first template flag
  (``Is_causal``, ``DEFINE_FLASH_FORWARD_KERNEL(flash_fwd_splitkv_kernel, bool Is_causal, bool Is_local,
  ...)`` in ``flash_fwd_launch_template.h``) tells the phases apart: ``mha_varlen_fwd`` sets
  ``is_causal = false`` when ``max_seqlen_q == 1`` - every row one query token, i.e. decode only -
  and keeps it for any batch holding a longer query (a prefill chunk, or spec-decode verification
  rows). Only the demangled name carries the flag; a short name alone says nothing.
- FlashAttention-3 (Hopper, ``hopper/``) runs one persistent kernel for every phase
  (``cutlass::device_kernel<flash::enable_sm90_or_later<flash::FlashAttnFwdSm90<...>>>``): attention,
  phase unknown. So does vLLM's Triton ``kernel_unified_attention_2d/3d``.
- FlashInfer: ``BatchPrefillWithPagedKVCacheKernel`` / ``BatchPrefillWithRaggedKVCacheKernel`` vs
  ``BatchDecodeWithPagedKVCacheKernel`` (``include/flashinfer/attention/prefill.cuh`` /
  ``decode.cuh``). vLLM's FlashInfer backend runs the decode wrapper on the decode rows and the prefill
  wrapper on the prefill rows of one batch (``vllm/v1/attention/backends/flashinfer.py``), so both in
  one step means mixed; SGLang runs a MIXED batch through the extend (prefill) path only.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

#: Flag bits (kept by the readers in ``Items.flags``).
PREFILL, DECODE, COMM, TRANSFER, EP_EXCHANGE = 1, 2, 4, 8, 16


@dataclass(frozen=True)
class Pattern:
    """One row of the table: a regex, the flags it sets and where the name comes from."""

    regex: re.Pattern
    flags: int
    basis: str


def _p(rx: str, flags: int, basis: str) -> Pattern:
    return Pattern(re.compile(rx, re.I), flags, basis)


#: Attention kernels whose phase the name fixes (first match wins among these).
ATTENTION: tuple[Pattern, ...] = (
    _p(r"\bflash_fwd_kernel\b|flash_fwd_varlen", PREFILL,
       "FlashAttention-2 csrc/flash_attn/src/flash_fwd_launch_template.h: run_mha_fwd_ -> flash_fwd_kernel "
       "(no block table: vLLM's non-paged prefill, profiled FA2 prefill)"),
    _p(r"BatchPrefill|SinglePrefill", PREFILL,
       "FlashInfer include/flashinfer/attention/prefill.cuh (SGLang extend/mixed, vLLM prefill wrapper)"),
    _p(r"extend_attention|context_attention|_fwd_kernel_stage|prefix_prefill", PREFILL,
       "SGLang srt/layers/attention/triton_ops/extend_attention.py, vLLM triton prefix_prefill.py"),
    _p(r"mla_prefill|fmha_.*varlen", PREFILL, "cutlass/FlashMLA prefill (varlen fmha)"),
    _p(r"BatchDecode|SingleDecode", DECODE, "FlashInfer include/flashinfer/attention/decode.cuh"),
    _p(r"flash_mla|flashmla|splitkv_mla|mla_decode", DECODE,
       "FlashMLA csrc (flash_fwd_splitkv_mla_kernel): decode-only MLA kernel"),
    _p(r"paged_attention_v[12]|decode_attention|decode_grouped_att", DECODE,
       "vLLM csrc/attention/paged_attention_v1/v2.cu, SGLang triton decode_attention.py: decode only"),
)
#: FlashAttention-2 split-KV: phase from the Is_causal template flag (see the module docstring).
FA2_SPLITKV = re.compile(r"flash_fwd_splitkv_kernel\s*<", re.I)

#: Non-attention roles (every matching row adds its flags).
ROLES: tuple[Pattern, ...] = (
    _p(r"nccl", COMM, "NCCL device kernels: ncclDevKernel_* (>= 2.19), ncclKernel_* (older)"),
    _p(r"nccl.*(sendrecv|send|recv)", EP_EXCHANGE | TRANSFER,
       "NCCL all-to-all is grouped send/recv: ncclDevKernel_SendRecv (vLLM/SGLang naive EP, PyNccl KV connector)"),
    _p(r"all_?to_?all|alltoallv?", COMM | EP_EXCHANGE, "ncclKernel_AllToAll*, torch all_to_all_single, custom a2a"),
    _p(r"deep_?ep::(intranode|internode|internode_ll)::(notify_|cached_notify_)?(dispatch|combine)",
       COMM | EP_EXCHANGE, "DeepEP csrc/kernels/intranode.cu, internode.cu (normal), internode_ll.cu (low latency)"),
    _p(r"pplx|moe_?dispatch|moe_?combine|ep_?dispatch|ep_?combine|moe_?a2a", COMM | EP_EXCHANGE,
       "pplx-kernels all-to-all, FlashInfer/TRT-LLM MoE a2a, custom EP dispatch/combine"),
    _p(r"all_?reduce|cross_device_reduce|all_?gather|reduce_?scatter", COMM,
       "tensor/data-parallel collectives (NCCL, vLLM custom_all_reduce.cuh cross_device_reduce_*stage)"),
    _p(r"kv_?transfer|nixl|mooncake", TRANSFER, "PD KV connectors' own kernels"),
)
#: Names that match a comm row but only prepare an exchange locally (no wait on peers).
NOT_COMM = re.compile(r"get_dispatch_layout", re.I)


def _template_args(name: str, at: int) -> list[str]:
    """Top-level template arguments of the ``<...>`` opening at ``name[at]``."""
    depth, start, out = 0, at + 1, []
    for i in range(at, len(name)):
        c = name[i]
        if c == "<":
            depth += 1
        elif c == ">":
            depth -= 1
            if depth == 0:
                out.append(name[start:i].strip())
                return out
        elif c == "," and depth == 1:
            out.append(name[start:i].strip())
            start = i + 1
    return []


def splitkv_phase(name: str) -> int:
    """PREFILL, DECODE or 0 for a FlashAttention-2 split-KV kernel name (0: no template flags)."""
    m = FA2_SPLITKV.search(name)
    if not m:
        return 0
    args = _template_args(name, m.end() - 1)
    if len(args) < 3:
        return 0
    causal, local = args[1].lower(), args[2].lower()
    if causal == "true":
        return PREFILL
    if causal == "false" and local == "false":
        return DECODE
    return 0


def kernel_flags(name: str | None) -> int:
    """Bit flags of one kernel name (:data:`PREFILL` ... :data:`EP_EXCHANGE`); 0 for anything else."""
    if not name:
        return 0
    low = name.lower()
    if FA2_SPLITKV.search(name) or "flash_fwd_splitkv_kernel" in low:
        f = splitkv_phase(name)          # Flash_fwd_kernel_traits in its template is not flash_fwd_kernel
    elif "splitkv_combine" in low:
        f = 0                            # the split-KV reduction: same phase as its split kernel, says nothing
    else:
        f = 0
        for p in ATTENTION:
            if p.regex.search(name):
                f = p.flags
                break
    if NOT_COMM.search(name):
        return f
    for p in ROLES:
        if p.regex.search(name):
            f |= p.flags
    return f
