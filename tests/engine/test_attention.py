"""paged_attention_ref against a token-by-token float64 reference, on random paged layouts."""
import math

import pytest
import torch

from mixdiag.engine.model.attention import SHORT_QUERY, paged_attention_ref


def naive(q, k_cache, v_cache, qsl, seq_lens, block_tables, scale):
    """Obviously correct: each query token, each head, a softmax over its causal context."""
    out = torch.zeros(q.shape, dtype=torch.float64)
    bs, g = k_cache.shape[1], q.shape[1] // k_cache.shape[2]
    for b in range(len(seq_lens)):
        s, e, L = int(qsl[b]), int(qsl[b + 1]), int(seq_lens[b])
        for i in range(e - s):
            pos = L - (e - s) + i
            blk = block_tables[b, torch.arange(pos + 1) // bs].long()
            off = torch.arange(pos + 1) % bs
            for h in range(q.shape[1]):
                k = k_cache[blk, off, h // g].double()
                v = v_cache[blk, off, h // g].double()
                w = torch.softmax(k @ q[s + i, h].double() * scale, dim=0)
                out[s + i, h] = w @ v
    return out


def make_case(q_lens, ctx_before, hq=4, hkv=2, d=8, bs=4, seed=0):
    g = torch.Generator().manual_seed(seed)
    seq_lens = [c + n for c, n in zip(ctx_before, q_lens)]
    nblk = [math.ceil(s / bs) for s in seq_lens]
    num_blocks = sum(nblk) + 3
    perm = torch.randperm(num_blocks, generator=g).tolist()   # scattered, non-contiguous blocks
    tables = torch.zeros(len(q_lens), max(nblk), dtype=torch.int32)
    k = 0
    for b, n in enumerate(nblk):
        tables[b, :n] = torch.tensor(perm[k:k + n])
        k += n
    kc = torch.randn(num_blocks, bs, hkv, d, generator=g, dtype=torch.float64)
    vc = torch.randn(num_blocks, bs, hkv, d, generator=g, dtype=torch.float64)
    q = torch.randn(sum(q_lens), hq, d, generator=g, dtype=torch.float64)
    qsl = torch.tensor([0] + list(torch.tensor(q_lens).cumsum(0)), dtype=torch.int32)
    return q, kc, vc, qsl, torch.tensor(seq_lens, dtype=torch.int32), tables


CASES = {
    "decode only": ([1, 1, 1], [5, 0, 17]),
    "prefill only": ([13], [0]),
    "chunk after context": ([11], [9]),
    "mixed prefill + decodes": ([12, 1, 1, 1], [3, 7, 30, 0]),
    "spec-verify rows": ([3, 3, 1], [6, 10, 2]),
    "boundary short/long": ([SHORT_QUERY, SHORT_QUERY + 1], [4, 4]),
}


@pytest.mark.parametrize("name", list(CASES))
def test_matches_naive(name):
    q_lens, ctx = CASES[name]
    args = make_case(q_lens, ctx)
    got = paged_attention_ref(*args, scale=0.3)
    want = naive(*args, scale=0.3)
    torch.testing.assert_close(got, want, rtol=1e-9, atol=1e-9)


@pytest.mark.parametrize("hq,hkv", [(4, 4), (4, 1), (6, 2)])
def test_gqa_head_mapping(hq, hkv):
    args = make_case([5, 1], [2, 6], hq=hq, hkv=hkv)
    torch.testing.assert_close(paged_attention_ref(*args, scale=0.5), naive(*args, scale=0.5), rtol=1e-9, atol=1e-9)


def test_row_independent_of_batch():
    """A request's rows come out the same alone as batched with others (the mixing invariant)."""
    q, kc, vc, qsl, sl, bt = make_case([9, 1, 1], [4, 5, 12])
    both = paged_attention_ref(q, kc, vc, qsl, sl, bt, 0.2)
    alone = paged_attention_ref(q[9:10], kc, vc, torch.tensor([0, 1], dtype=torch.int32), sl[1:2], bt[1:2], 0.2)
    torch.testing.assert_close(both[9:10], alone, rtol=1e-12, atol=1e-12)


def test_decodes_of_very_different_lengths():
    """Short queries are grouped by context length; every group must still be exact."""
    args = make_case([1, 1, 2, 1, 1], [3, 200, 40, 90, 7], bs=8)
    torch.testing.assert_close(paged_attention_ref(*args, scale=0.2), naive(*args, scale=0.2), rtol=1e-9, atol=1e-9)
