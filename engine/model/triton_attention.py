"""Triton paged attention over the flat token stream: prefill rows and decode rows in one launch.

Same signature and semantics as ``attention.paged_attention_ref`` (the PyTorch reference):

    paged_attention(q[T, Hq, D], k_cache[num_blocks, block_size, Hkv, D], v_cache[same],
                    query_start_loc int32[B+1], seq_lens int32[B], block_tables int32[B, max_blocks],
                    scale) -> out[T, Hq, D]

``seq_lens[b]`` counts the context including this step's new tokens, whose K/V are already in the
cache (every KV write of a step precedes every attention read). Query token ``i`` of request ``b``
sits at position ``seq_lens[b] - q_len_b + i`` and attends to KV positions ``<=`` its own.

Work split (the layout vLLM's unified Triton attention uses): one program per (query tile, KV
head). A query tile is ``BLOCK_Q`` consecutive tokens of one request times the
``Hq // Hkv`` query heads that share the KV head, flattened into ``BLOCK_M = BLOCK_Q * group``
rows, so a decode row (q_len 1) and a prefill chunk go through the same code. The grid is an
upper bound, ``T // BLOCK_Q + B`` tiles: request ``b`` owns tiles
``[qsl[b] // BLOCK_Q + b, qsl[b+1] // BLOCK_Q + b + 1)``, found by binary search, and tiles past a
request's last token exit at once. KV is walked in ``TILE_N``-position tiles through the block
table one position at a time, so any cache ``block_size`` works. Softmax is online (running max
and sum, fp32 accumulators).

On CPU the kernel runs under ``TRITON_INTERPRET=1`` (tests); the engine uses it on CUDA.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _find_request(query_start_loc_ptr, tile_idx, num_reqs, BLOCK_Q: tl.constexpr):
    """Largest b with ``qsl[b] // BLOCK_Q + b <= tile_idx`` (binary search over requests)."""
    lo: tl.int32 = 0
    hi: tl.int32 = num_reqs
    while lo < hi:
        mid = (lo + hi) // 2
        first_tile = tl.load(query_start_loc_ptr + mid) // BLOCK_Q + mid
        if first_tile <= tile_idx:
            lo = mid + 1
        else:
            hi = mid
    return lo - 1


@triton.jit
def _paged_attention_kernel(
    q_ptr, k_cache_ptr, v_cache_ptr, out_ptr,
    query_start_loc_ptr, seq_lens_ptr, block_tables_ptr,
    scale, num_reqs, block_size,
    stride_qt, stride_qh, stride_qd,
    stride_kb, stride_ks, stride_kh, stride_kd,
    stride_vb, stride_vs, stride_vh, stride_vd,
    stride_ot, stride_oh, stride_od,
    stride_bt,
    GROUP: tl.constexpr,       # Hq // Hkv query heads per KV head
    HEAD_DIM: tl.constexpr,
    HEAD_DIM_PAD: tl.constexpr,
    BLOCK_Q: tl.constexpr,     # query tokens per tile
    BLOCK_M: tl.constexpr,     # rows per tile = padded BLOCK_Q * GROUP
    TILE_N: tl.constexpr,      # KV positions per inner iteration
    IEEE_DOT: tl.constexpr,    # fp32 inputs: no TF32 rounding, so results match the reference
):
    tile_idx = tl.program_id(0)
    kv_head = tl.program_id(1)

    req = _find_request(query_start_loc_ptr, tile_idx, num_reqs, BLOCK_Q)
    q_start = tl.load(query_start_loc_ptr + req)
    q_len = tl.load(query_start_loc_ptr + req + 1) - q_start
    local_tile = tile_idx - (q_start // BLOCK_Q + req)
    if local_tile * BLOCK_Q < q_len:
        seq_len = tl.load(seq_lens_ptr + req)
        context_len = seq_len - q_len  # tokens already in the cache before this step's rows

        offs_m = tl.arange(0, BLOCK_M)
        offs_d = tl.arange(0, HEAD_DIM_PAD)
        q_idx = local_tile * BLOCK_Q + offs_m // GROUP         # [BLOCK_M] query token within request
        head = kv_head * GROUP + offs_m % GROUP                  # [BLOCK_M] query head
        row_ok = (offs_m < BLOCK_Q * GROUP) & (q_idx < q_len)
        d_ok = offs_d < HEAD_DIM
        q_pos = context_len + q_idx                              # [BLOCK_M] absolute position

        q = tl.load(q_ptr + (q_start + q_idx)[:, None] * stride_qt + head[:, None] * stride_qh
                    + offs_d[None, :] * stride_qd,
                    mask=row_ok[:, None] & d_ok[None, :], other=0.0)  # [BLOCK_M, HEAD_DIM_PAD]

        m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
        l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
        acc = tl.zeros([BLOCK_M, HEAD_DIM_PAD], dtype=tl.float32)

        # Causal: the last row of this tile sees positions < kv_end.
        last_q = tl.minimum(local_tile * BLOCK_Q + BLOCK_Q, q_len) - 1
        kv_end = context_len + last_q + 1
        offs_n = tl.arange(0, TILE_N)
        for start_n in range(0, kv_end, TILE_N):
            pos = start_n + offs_n                               # [TILE_N] KV positions
            n_ok = pos < kv_end
            blk = tl.load(block_tables_ptr + req * stride_bt + pos // block_size, mask=n_ok, other=0)
            blk = blk.to(tl.int64)  # block * stride can pass 2**31 in a large pool
            slot_in_blk = pos % block_size
            k = tl.load(k_cache_ptr + blk[None, :] * stride_kb + slot_in_blk[None, :] * stride_ks
                        + kv_head * stride_kh + offs_d[:, None] * stride_kd,
                        mask=n_ok[None, :] & d_ok[:, None], other=0.0)  # [HEAD_DIM_PAD, TILE_N]
            v = tl.load(v_cache_ptr + blk[:, None] * stride_vb + slot_in_blk[:, None] * stride_vs
                        + kv_head * stride_vh + offs_d[None, :] * stride_vd,
                        mask=n_ok[:, None] & d_ok[None, :], other=0.0)  # [TILE_N, HEAD_DIM_PAD]
            if IEEE_DOT:
                s = tl.dot(q, k, input_precision="ieee")
            else:
                s = tl.dot(q, k)
            s = s * scale                                        # [BLOCK_M, TILE_N] fp32
            visible = (pos[None, :] <= q_pos[:, None]) & n_ok[None, :] & row_ok[:, None]
            s = tl.where(visible, s, float("-inf"))
            m_new = tl.maximum(m_i, tl.max(s, axis=1))
            # Rows that have seen nothing yet (or padding rows) keep m = -inf; avoid inf - inf.
            m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
            p = tl.exp(s - m_safe[:, None])
            alpha = tl.exp(m_i - m_safe)
            l_i = l_i * alpha + tl.sum(p, axis=1)
            if IEEE_DOT:
                pv = tl.dot(p.to(v.dtype), v, input_precision="ieee")
            else:
                pv = tl.dot(p.to(v.dtype), v)
            acc = acc * alpha[:, None] + pv
            m_i = m_new

        l_safe = tl.where(l_i == 0.0, 1.0, l_i)
        out = acc / l_safe[:, None]
        tl.store(out_ptr + (q_start + q_idx)[:, None] * stride_ot + head[:, None] * stride_oh
                 + offs_d[None, :] * stride_od,
                 out.to(out_ptr.dtype.element_ty), mask=row_ok[:, None] & d_ok[None, :])


def _pow2_at_least(n: int, floor: int) -> int:
    return max(floor, triton.next_power_of_2(n))


def paged_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                    query_start_loc: torch.Tensor, seq_lens: torch.Tensor, block_tables: torch.Tensor,
                    scale: float) -> torch.Tensor:
    """Causal varlen paged attention for a flat stream of prefill and decode rows (one launch)."""
    T, Hq, D = q.shape
    _, block_size, Hkv, Dk = k_cache.shape
    if Dk != D or v_cache.shape != k_cache.shape:
        raise ValueError(f"paged_attention: k/v cache shapes {tuple(k_cache.shape)}/{tuple(v_cache.shape)} "
                         f"do not match q head dim {D}")
    if Hq % Hkv:
        raise ValueError(f"paged_attention: {Hq} query heads is not a multiple of {Hkv} KV heads")
    B = seq_lens.shape[0]
    if query_start_loc.shape[0] != B + 1 or block_tables.shape[0] != B:
        raise ValueError("paged_attention: query_start_loc must have B+1 entries and block_tables B rows")
    out = torch.empty_like(q)
    if T == 0 or B == 0:
        return out
    group = Hq // Hkv
    # Tiles of >= 16 rows (tl.dot's minimum); a decode row fills `group` of them.
    block_m = _pow2_at_least(group, 16)
    block_q = block_m // group
    tile_n = 16 if D > 128 else 32
    grid = (T // block_q + B, Hkv)
    block_tables = block_tables.contiguous()
    _paged_attention_kernel[grid](
        q, k_cache, v_cache, out,
        query_start_loc, seq_lens, block_tables,
        float(scale), B, block_size,
        *q.stride(), *k_cache.stride(), *v_cache.stride(), *out.stride(),
        block_tables.stride(0),
        GROUP=group, HEAD_DIM=D, HEAD_DIM_PAD=_pow2_at_least(D, 16),
        BLOCK_Q=block_q, BLOCK_M=block_m, TILE_N=tile_n,
        IEEE_DOT=q.dtype == torch.float32,
    )
    return out


def select_backend(device) -> "callable":
    """The engine's attention backend: this kernel on CUDA (and on CPU when TRITON_INTERPRET=1 is
    set, for checking), the PyTorch reference ``attention.paged_attention_ref`` otherwise."""
    import os

    from mixdiag.engine.model.attention import paged_attention_ref

    if torch.device(device).type == "cuda" or os.environ.get("TRITON_INTERPRET") == "1":
        return paged_attention
    return paged_attention_ref
