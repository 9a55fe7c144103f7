"""Paged attention over the flat token stream, in PyTorch (the reference every backend must match).

Signature shared with the Triton kernel (engine/triton_attention.py)::

    paged_attention(q[T,Hq,D], k_cache[num_blocks,block_size,Hkv,D], v_cache[same],
                    query_start_loc int32[B+1], seq_lens int32[B], block_tables int32[B,max_blocks],
                    scale) -> out[T,Hq,D]

``seq_lens[b]`` counts request b's context *including* this step's tokens, whose K/V are already in
the cache. Query token i of request b sits at position ``seq_lens[b] - q_len_b + i`` and attends
causally to KV positions ``<=`` its own. Decode rows and prefill rows go in the same call.

Strategy (no per-token Python loop): requests with short queries (decode rows, speculative
verification rows) are padded into one batch and gathered block-wise from the cache in one
``index_select``; each long query (a prefill chunk) is one SDPA call over its own context.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

#: Requests with at most this many query tokens are batched together (decode / spec-verify rows).
SHORT_QUERY = 8


def _gather_kv(cache: torch.Tensor, block_tables: torch.Tensor, num_blocks: int) -> torch.Tensor:
    """[B, num_blocks*block_size, Hkv, D]: each request's blocks laid end to end."""
    b = block_tables.shape[0]
    idx = block_tables[:, :num_blocks].reshape(-1).long()
    blocks = cache.index_select(0, idx)  # [B*nb, bs, Hkv, D]
    return blocks.view(b, num_blocks * cache.shape[1], cache.shape[2], cache.shape[3])


def _short_batch(q, k_cache, v_cache, starts, q_lens, seq_lens, block_tables, scale, out):
    """Attention for requests whose queries are short, all in one padded SDPA call."""
    device = q.device
    b = len(starts)
    qmax = int(max(q_lens))
    lmax = int(max(seq_lens))
    bs = k_cache.shape[1]
    nb = -(-lmax // bs)
    starts_t = torch.tensor(starts, device=device, dtype=torch.long)
    qlen_t = torch.tensor(q_lens, device=device, dtype=torch.long)
    slen_t = torch.tensor(seq_lens, device=device, dtype=torch.long)
    i = torch.arange(qmax, device=device)
    valid_q = i[None, :] < qlen_t[:, None]                                  # [B, Qs]
    rows = (starts_t[:, None] + i[None, :]).clamp(max=q.shape[0] - 1)       # [B, Qs] rows of q
    qpos = slen_t[:, None] - qlen_t[:, None] + i[None, :]                   # [B, Qs]
    kpos = torch.arange(nb * bs, device=device)
    # Padded query rows attend to position 0 only (never a fully masked row: no NaN); dropped later.
    limit = torch.where(valid_q, qpos, torch.zeros_like(qpos))
    mask = kpos[None, None, :] <= limit[:, :, None]                         # [B, Qs, L]
    k = _gather_kv(k_cache, block_tables, nb).transpose(1, 2)               # [B, Hkv, L, D]
    v = _gather_kv(v_cache, block_tables, nb).transpose(1, 2)
    qb = q[rows].transpose(1, 2)                                            # [B, Hq, Qs, D]
    hq, hkv = q.shape[1], k_cache.shape[2]
    if hq != hkv:
        k = k.repeat_interleave(hq // hkv, dim=1)
        v = v.repeat_interleave(hq // hkv, dim=1)
    o = F.scaled_dot_product_attention(qb, k, v, attn_mask=mask[:, None], scale=scale)  # [B, Hq, Qs, D]
    o = o.transpose(1, 2)                                                   # [B, Qs, Hq, D]
    out[rows[valid_q]] = o[valid_q]


def _long_query(q, k_cache, v_cache, start, q_len, seq_len, block_row, scale, out):
    """Attention for one request with a long query (a prefill chunk) over its own context."""
    bs = k_cache.shape[1]
    nb = -(-seq_len // bs)
    k = _gather_kv(k_cache, block_row[None], nb)[0, :seq_len].transpose(0, 1)  # [Hkv, L, D]
    v = _gather_kv(v_cache, block_row[None], nb)[0, :seq_len].transpose(0, 1)
    qr = q[start:start + q_len].transpose(0, 1)                             # [Hq, Q, D]
    hq, hkv = q.shape[1], k_cache.shape[2]
    if hq != hkv:
        k = k.repeat_interleave(hq // hkv, dim=0)
        v = v.repeat_interleave(hq // hkv, dim=0)
    qpos = torch.arange(seq_len - q_len, seq_len, device=q.device)
    mask = torch.arange(seq_len, device=q.device)[None, :] <= qpos[:, None]  # [Q, L]
    o = F.scaled_dot_product_attention(qr, k, v, attn_mask=mask, scale=scale)  # [Hq, Q, D]
    out[start:start + q_len] = o.transpose(0, 1)


def paged_attention_ref(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                        query_start_loc: torch.Tensor, seq_lens: torch.Tensor, block_tables: torch.Tensor,
                        scale: float) -> torch.Tensor:
    """Causal varlen attention of the flat stream ``q`` against the paged KV cache; returns [T, Hq, D]."""
    out = torch.empty_like(q)
    qsl = query_start_loc.tolist()
    sl = seq_lens.tolist()
    short = [b for b in range(len(sl)) if qsl[b + 1] - qsl[b] <= SHORT_QUERY]
    if short:
        sel = torch.tensor(short, device=q.device, dtype=torch.long) if len(short) < len(sl) else None
        bt = block_tables if sel is None else block_tables.index_select(0, sel)
        _short_batch(q, k_cache, v_cache, [qsl[b] for b in short], [qsl[b + 1] - qsl[b] for b in short],
                     [sl[b] for b in short], bt, scale, out)
    for b in range(len(sl)):
        q_len = qsl[b + 1] - qsl[b]
        if q_len > SHORT_QUERY:
            _long_query(q, k_cache, v_cache, qsl[b], q_len, sl[b], block_tables[b], scale, out)
    return out

