"""Drafter proposals, greedy / rejection-sampling verification, draft-count mask, KV rollback."""
import numpy as np
import pytest
import torch
from hypothesis import given, settings, strategies as st

from mixdiag.engine.model.drafter import DrafterConfig, NgramDrafter
from mixdiag.engine.model.spec_decode import (draft_token_counts, rollback, verify_greedy, verify_sampling)


@pytest.mark.parametrize("context,k,want", [
    ([1, 2, 3, 4, 1, 2], 5, [3, 4, 1, 2]),        # bigram [1,2] recurs at 0; what followed, clipped
    ([1, 2, 3, 4, 1, 2], 2, [3, 4]),
    ([5, 9, 5, 7, 5], 3, [7, 5]),                 # most recent occurrence of [5] wins (idx 2)
    ([7, 8, 9, 7, 8, 9, 7, 8], 3, [9, 7, 8]),     # longest n first
    ([1, 2, 3, 4], 3, []),                        # nothing recurs
    ([3], 3, []),
])
def test_ngram_drafter(context, k, want):
    assert NgramDrafter(DrafterConfig(num_spec_tokens=k, min_n=1, max_n=3)).propose(context) == want


def test_drafter_config_validated():
    with pytest.raises(ValueError):
        DrafterConfig(num_spec_tokens=0)
    with pytest.raises(ValueError):
        DrafterConfig(min_n=3, max_n=2)


@pytest.mark.parametrize("draft,target,accepted,tokens", [
    ([4, 5, 6], [4, 5, 6, 7], 3, (4, 5, 6, 7)),   # all accepted + bonus
    ([4, 5, 6], [4, 9, 6, 7], 1, (4, 9)),         # first mismatch: the target's token replaces it
    ([4, 5, 6], [1, 5, 6, 7], 0, (1,)),
    ([], [3], 0, (3,)),                           # decode without drafts
])
def test_verify_greedy(draft, target, accepted, tokens):
    r = verify_greedy(draft, target)
    assert (r.num_accepted, r.tokens, r.num_rejected) == (accepted, tokens, len(draft) - accepted)


def test_verify_greedy_rejects_wrong_length():
    with pytest.raises(ValueError):
        verify_greedy([1, 2], [1, 2])


def test_rejection_sampling_preserves_target_distribution():
    """First emitted token ~ p whatever the (one-hot) draft was: the rule's defining property."""
    p = torch.tensor([[0.1, 0.2, 0.3, 0.4], [0.25, 0.25, 0.25, 0.25]])
    g = torch.Generator().manual_seed(0)
    n = 4000
    for draft_tok in (3, 0):
        counts = np.zeros(4)
        accepted = 0
        for _ in range(n):
            r = verify_sampling([draft_tok], p, g)
            counts[r.tokens[0]] += 1
            accepted += r.num_accepted
        np.testing.assert_allclose(counts / n, p[0].numpy(), atol=0.03)
        assert abs(accepted / n - float(p[0, draft_tok])) < 0.03  # acceptance rate = p(x) for one-hot q


def test_rejection_sampling_with_draft_probs_all_accepted_when_equal():
    p = torch.tensor([[0.0, 1.0, 0.0], [0.0, 0.0, 1.0]])
    r = verify_sampling([1], p, torch.Generator().manual_seed(1), draft_probs=p[:1])
    assert r.tokens == (1, 2) and r.num_accepted == 1


def test_draft_token_counts_mask():
    # chunked prefill (512 tokens, no entry), decode without draft, decode with 5 drafts,
    # a request whose spec entry does not match its scheduled count (chunk) stays -1
    counts = draft_token_counts([512, 1, 6, 2], [None, [], [1, 2, 3, 4, 5], [7, 7]])
    assert counts.dtype == np.int32 and counts.tolist() == [-1, 0, 5, -1]


@pytest.mark.parametrize("before,k,acc,blocks,bs,valid,rej,keep,free", [
    (10, 5, 5, [0, 1, 2, 3], 4, 16, (16, 16), (0, 1, 2, 3), ()),
    (10, 5, 0, [0, 1, 2, 3], 4, 11, (11, 16), (0, 1, 2), (3,)),
    (14, 5, 1, [0, 1, 2, 3, 4], 4, 16, (16, 20), (0, 1, 2, 3), (4,)),
])
def test_rollback(before, k, acc, blocks, bs, valid, rej, keep, free):
    r = rollback(before, k, acc, blocks, bs)
    assert (r.num_computed_tokens, r.rejected_positions, r.keep_blocks, r.free_blocks) == (valid, rej, keep, free)


def _toy_target(context):
    """A deterministic 'model': next token from the last three tokens (vocab 6, so n-grams recur)."""
    a, b, c = ([0, 0] + list(context))[-3:]
    return (a * 7 + b * 3 + c * 5 + len(context) // 9) % 6


def _generate(prompt, n_out, drafter=None):
    out = []
    while len(out) < n_out:
        ctx = list(prompt) + out
        draft = drafter.propose(ctx) if drafter else []
        # what the target model computes on the verification rows: one argmax per row
        target = [_toy_target(ctx + draft[:i]) for i in range(len(draft) + 1)]
        out.extend(verify_greedy(draft, target).tokens)
    return out[:n_out]


@settings(max_examples=40, deadline=None)
@given(prompt=st.lists(st.integers(0, 5), min_size=1, max_size=20), n_out=st.integers(1, 30),
       k=st.integers(1, 6))
def test_greedy_spec_output_identical_to_plain(prompt, n_out, k):
    drafter = NgramDrafter(DrafterConfig(num_spec_tokens=k, max_n=3))
    assert _generate(prompt, n_out, drafter) == _generate(prompt, n_out)


def test_drafter_pads_to_k_like_an_mtp_head():
    d = NgramDrafter(DrafterConfig(num_spec_tokens=4, max_n=2, pad_to_k=True))
    assert d.propose([1, 2, 3, 1, 2]) == [3, 1, 2, 2]     # continuation [3,1,2] padded with its last
    assert d.propose([4, 5, 6]) == [6, 6, 6, 6]           # no recurrence: repeat the context's last token
    assert d.propose([4, 5, 6], k=0) == []


def test_engine_step_draft_counts_mark_prefill_rows_minus_one():
    """In a mixed step with k = 2: the chunked prefill is -1, decodes with drafts are 2."""
    from mixdiag.engine.config import CacheConfig, EngineConfig, ModelConfig, SchedulerConfig
    from mixdiag.engine.core.engine import Engine
    from mixdiag.engine.core.request import SamplingParams
    from mixdiag.engine.model.spec_decode import SpecDecoder

    cfg = ModelConfig(vocab_size=31, hidden_size=16, num_layers=1, first_k_dense=1, num_heads=2, num_kv_heads=1,
                      head_dim=8, intermediate_size=16, max_model_len=128)
    e = Engine(EngineConfig(model=cfg, cache=CacheConfig(block_size=4, num_blocks=64), num_threads=1,
                            scheduler=SchedulerConfig(max_num_batched_tokens=20, num_spec_tokens=2)))
    a = e.add_request([1, 2, 3], SamplingParams(max_tokens=8, ignore_eos=True))
    e.step()                                        # a: prefill, then drafts proposed
    b = e.add_request(list(range(4, 30)), SamplingParams(max_tokens=2, ignore_eos=True))
    out = e.scheduler.schedule()
    counts = SpecDecoder.draft_counts(out)
    assert counts == {a: 2, b: -1} and out.num_scheduled_tokens == {a: 3, b: 17}
