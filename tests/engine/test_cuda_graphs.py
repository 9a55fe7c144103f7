"""CUDA-graph runner pieces that run on CPU: capture-safe experts, bucket padding, the CPU refusal.

The capture/replay itself needs CUDA: scripts/gpu_check.sh runs it (kernel, modes, timings).
"""
import math

import pytest
import torch

from mixdiag.engine.model.attention import paged_attention_ref
from mixdiag.engine.config import ModelConfig
from mixdiag.engine.model.cuda_graphs import CudaGraphRunner, StaticInputs, dense_experts
from mixdiag.engine.core.input_batch import ForwardBatch
from mixdiag.engine.model.model import build_model

CFG = ModelConfig(vocab_size=64, hidden_size=32, num_layers=2, first_k_dense=1, num_heads=4, num_kv_heads=2,
                  head_dim=8, intermediate_size=32, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=16,
                  max_model_len=128)
BS = 4


def test_dense_experts_match_grouped_experts():
    model = build_model(CFG)
    moe = model.moe_layers[0]
    x = torch.randn(11, CFG.hidden_size, generator=torch.Generator().manual_seed(0))
    ids, w = moe.route(x)
    torch.testing.assert_close(dense_experts(moe)(x, ids, w), moe.local_experts(x, ids, w), atol=1e-5, rtol=1e-5)


def _decode_batch(gen, ctx_lens, tables, k_rows=1):
    """Uniform decode rows (k_rows per request) after ``ctx_lens`` tokens, blocks from ``tables``."""
    q_lens = [k_rows] * len(ctx_lens)
    ids, pos, slots = [], [], []
    for c, table in zip(ctx_lens, tables):
        for p in range(c, c + k_rows):
            ids.append(int(torch.randint(0, CFG.vocab_size, (1,), generator=gen)))
            pos.append(p)
            slots.append(table[p // BS] * BS + p % BS)
    width = max(len(t) for t in tables)
    bt = torch.tensor([t + [0] * (width - len(t)) for t in tables], dtype=torch.int32)
    qsl = torch.tensor([0] + list(torch.tensor(q_lens).cumsum(0)), dtype=torch.int32)
    t = sum(q_lens)
    return ForwardBatch(input_ids=torch.tensor(ids), positions=torch.tensor(pos), query_start_loc=qsl,
                        seq_lens=torch.tensor([c + k_rows for c in ctx_lens], dtype=torch.int32),
                        slot_mapping=torch.tensor(slots), block_tables=bt, logits_indices=torch.arange(t),
                        req_ids=tuple(f"r{i}" for i in range(len(ctx_lens))),
                        sample_req_ids=tuple(f"r{i}" for i in range(len(ctx_lens))))


@pytest.mark.parametrize("bucket,k_rows", [(8, 1), (16, 2), (6, 2)])
def test_padded_bucket_gives_the_same_rows_and_spares_real_kv(bucket, k_rows):
    """What a FULL graph computes: the batch padded to its bucket (one padding request over the
    scratch block, empty request slots after it) must give the real rows' logits unchanged and
    write nothing outside the rows' own slots and the scratch block."""
    gen = torch.Generator().manual_seed(bucket)
    model = build_model(CFG)
    num_blocks = 12
    pad_block = num_blocks  # the extra block the engine allocates for graphs
    kv = torch.randn(CFG.num_layers, 2, num_blocks + 1, BS, CFG.num_kv_heads, CFG.head_dim, generator=gen)
    ctx = [5, 9, 2]
    tables = [[0, 1], [2, 3, 4], [5]]
    batch = _decode_batch(gen, ctx, tables, k_rows)
    with torch.no_grad():
        kv_eager = kv.clone()
        want = model(batch, kv_eager)
        inputs = StaticInputs("cpu", BS, pad_block, width=math.ceil(CFG.max_model_len / BS))
        s = inputs.new(bucket)
        inputs.fill_padding_only(s)                  # as at capture time
        assert int(s.seq_lens[0]) == bucket and int(s.query_start_loc[1]) == bucket
        t = inputs.fill(s, batch)
        kv_padded = kv.clone()
        got = model(s, kv_padded).index_select(0, batch.logits_indices)
    assert t == batch.num_tokens
    assert s.query_start_loc.tolist()[:5] == [0, k_rows, 2 * k_rows, 3 * k_rows, bucket]
    assert set(s.query_start_loc.tolist()[4:]) == {bucket}
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    # real blocks identical to the unpadded run; only the scratch block differs
    torch.testing.assert_close(kv_padded[:, :, :num_blocks], kv_eager[:, :, :num_blocks])


def test_fill_refuses_a_batch_larger_than_the_bucket():
    gen = torch.Generator().manual_seed(0)
    batch = _decode_batch(gen, [1, 1, 1], [[0], [1], [2]], k_rows=2)
    inputs = StaticInputs("cpu", BS, 12, width=4)
    with pytest.raises(ValueError, match="does not fit"):
        inputs.fill(inputs.new(4), batch)


def test_runner_refuses_cpu():
    model = build_model(CFG)
    kv = torch.zeros(CFG.num_layers, 2, 5, BS, CFG.num_kv_heads, CFG.head_dim)
    with pytest.raises(RuntimeError, match="CUDA"):
        CudaGraphRunner(model, kv, capture_sizes=(8,), pad_block=4, max_blocks_per_req=4,
                        attn_backend=paged_attention_ref)
