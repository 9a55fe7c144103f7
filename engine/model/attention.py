"""Paged attention over the flat token stream, in PyTorch (the reference every backend must match).

Signature shared with the Triton kernel (engine/model/triton_attention.py)::

    paged_attention(q[T,Hq,D], k_cache[num_blocks,block_size,Hkv,D], v_cache[same],
                    query_start_loc int32[B+1], seq_lens int32[B], block_tables int32[B,max_blocks],
                    scale) -> out[T,Hq,D]

``seq_lens[b]`` counts request b's context *including* this step's tokens, whose K/V are already in
the cache. Query token i of request b sits at position ``seq_lens[b] - q_len_b + i`` and attends
causally to KV positions ``<=`` its own. Decode rows and prefill rows go in the same call.

Strategy (no per-token Python loop): requests with short queries (decode rows, speculative
verification rows) are padded into batches of similar context length (within 2x) and gathered
block-wise from the cache with one ``index_select`` per batch; each long query (a prefill chunk)
is a blocked matmul-softmax-matmul over its own context.
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
    hq, hkv = q.shape[1], k_cache.shape[2]
    g = hq // hkv
    k = _gather_kv(k_cache, block_tables, nb).transpose(1, 2)               # [B, Hkv, L, D]
    v = _gather_kv(v_cache, block_tables, nb).transpose(1, 2)
    # GQA without copying K/V per query head: the g query heads of one KV head become g*Qs rows.
    d = q.shape[2]
    qb = q[rows].view(b, qmax, hkv, g, d).permute(0, 2, 3, 1, 4).reshape(b, hkv, g * qmax, d)
    m = mask[:, None, None].expand(b, 1, g, qmax, mask.shape[-1]).reshape(b, 1, g * qmax, mask.shape[-1])
    o = F.scaled_dot_product_attention(qb, k, v, attn_mask=m, scale=scale)  # [B, Hkv, g*Qs, D]
    o = o.view(b, hkv, g, qmax, d).permute(0, 3, 1, 2, 4).reshape(b, qmax, hq, d)
    out[rows[valid_q]] = o[valid_q]


def _long_query(q, k_cache, v_cache, start, q_len, seq_len, block_row, scale, out):
    """Attention for one request with a long query (a prefill chunk) over its own context.

    Blocked over query rows (about 1M scores per block) so the score matrix stays in cache; only
    the last ``q_len`` key columns need the causal mask (every query sees the whole prefix).
    """
    bs = k_cache.shape[1]
    nb = -(-seq_len // bs)
    k = _gather_kv(k_cache, block_row[None], nb)[0, :seq_len].transpose(0, 1).contiguous()  # [Hkv, L, D]
    v = _gather_kv(v_cache, block_row[None], nb)[0, :seq_len].transpose(0, 1).contiguous()
    hq, hkv, d = q.shape[1], k_cache.shape[2], q.shape[2]
    g = hq // hkv
    # [Q, Hq, D] -> [Hkv, g*Q, D]: the g query heads sharing a KV head are stacked as rows (row = gi*Q + qi).
    qr = q[start:start + q_len].view(q_len, hkv, g, d).permute(1, 2, 0, 3).reshape(hkv, g * q_len, d) * scale
    blocked = ~torch.ones(q_len, q_len, dtype=torch.bool, device=q.device).tril().repeat(g, 1)  # [g*Q, Q]
    kt = k.transpose(1, 2)                                                   # [Hkv, D, L]
    o = torch.empty_like(qr)
    rows = g * q_len
    bq = max(64, (1 << 20) // max(1, hkv * seq_len))
    prefix = seq_len - q_len
    for r0 in range(0, rows, bq):
        r1 = min(rows, r0 + bq)
        sc = torch.bmm(qr[:, r0:r1], kt)                                     # [Hkv, bq, L], q pre-scaled
        sc[:, :, prefix:].masked_fill_(blocked[r0:r1], float("-inf"))
        o[:, r0:r1] = torch.bmm(torch.softmax(sc, dim=-1), v)
    out[start:start + q_len] = o.view(hkv, g, q_len, d).permute(2, 0, 1, 3).reshape(q_len, hq, d)


def _length_groups(idx: list[int], seq_lens: list[int]) -> list[list[int]]:
    """Split requests into groups whose context lengths are within 2x, so padding at most doubles the gather."""
    groups: list[list[int]] = []
    lo = 0
    for b in sorted(idx, key=seq_lens.__getitem__):
        if groups and seq_lens[b] <= 2 * lo:
            groups[-1].append(b)
        else:
            groups.append([b])
            lo = max(seq_lens[b], 16)   # short contexts all go together
    return groups


def paged_attention_ref(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                        query_start_loc: torch.Tensor, seq_lens: torch.Tensor, block_tables: torch.Tensor,
                        scale: float) -> torch.Tensor:
    """Causal varlen attention of the flat stream ``q`` against the paged KV cache; returns [T, Hq, D]."""
    out = torch.empty_like(q)
    qsl = query_start_loc.tolist()
    sl = seq_lens.tolist()
    short = [b for b in range(len(sl)) if qsl[b + 1] - qsl[b] <= SHORT_QUERY]
    for group in _length_groups(short, sl):
        if group == list(range(len(sl))):
            bt = block_tables
        else:
            bt = block_tables.index_select(0, torch.tensor(group, device=q.device, dtype=torch.long))
        _short_batch(q, k_cache, v_cache, [qsl[b] for b in group], [qsl[b + 1] - qsl[b] for b in group],
                     [sl[b] for b in group], bt, scale, out)
    for b in range(len(sl)):
        q_len = qsl[b + 1] - qsl[b]
        if q_len > SHORT_QUERY:
            _long_query(q, k_cache, v_cache, qsl[b], q_len, sl[b], block_tables[b], scale, out)
    return out

