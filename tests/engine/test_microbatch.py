"""Micro-batching gate: vLLM's reader rule, reasons, split point."""
import pytest

from mixdiag.engine.model.microbatch import REASONS, MicroBatchConfig, decide
from mixdiag.engine.core.prefix_cache import PrefixCache, chain_keys

ON = MicroBatchConfig(enabled=True, min_tokens=8)


@pytest.mark.parametrize("config,q,c,split,reason,readers", [
    (MicroBatchConfig(), [1] * 40, [10] * 40, False, "disabled", ()),
    (ON, [64], [0], False, "too_few_requests", ()),
    (ON, [1, 1, 1], [5, 6, 7], False, "too_few_tokens", ()),
    (ON, [1] * 32, [20] * 32, True, "split", ()),                    # pure decode splits
    (ON, [16, 16, 1, 1], [0, 0, 30, 40], True, "split", ()),         # fresh prefills are not readers
    (ON, [16, 1, 1], [32, 30, 40], False, "prefix_readers", (0,)),   # chunk over computed context
    (ON, [1, 24, 1, 8], [9, 0, 9, 16], False, "prefix_readers", (3,)),
])
def test_gate_table(config, q, c, split, reason, readers):
    d = decide(config, q, c)
    assert (d.split, d.reason, d.readers) == (split, reason, readers)
    assert d.reason in REASONS
    if d.split:
        assert 0 < d.split_index < len(q) and d.first_tokens == sum(q[:d.split_index])
    else:
        assert d.split_index == -1


def test_split_point_balances_tokens():
    d = decide(ON, [20, 1, 1, 1, 1, 20], [0, 5, 5, 5, 5, 0])
    assert d.split and d.split_index == 3 and d.first_tokens == 22


def test_reader_of_block_written_this_step_refuses_split():
    """The article's case, built end to end: request A prefills a shared prefix in step 3; request
    B is admitted in the same step on a prefix hit over A's blocks (vLLM-style admission); the gate
    must refuse to split, naming B as a confirmed reader."""
    bs = 4
    cache = PrefixCache(bs, allow_inflight_hits=True)
    shared = list(range(50, 62))             # 3 full blocks
    cache.begin_step(3)
    keys_a = chain_keys(shared + [1, 2], bs)
    for i, key in enumerate(keys_a):         # A is computing these blocks in step 3
        cache.register(key, 20 + i, step=3)
    prompt_b = shared + [7, 8, 9, 10, 11]
    hit_b = cache.lookup(chain_keys(prompt_b, bs), num_tokens=len(prompt_b), max_hit_tokens=len(prompt_b) - 1)
    assert hit_b.hit_tokens == 12 and len(hit_b.inflight_hit_blocks) == 3
    # step 3: A = 14-token prefill from 0, B = 5 tokens after a 12-token hit, plus 20 decodes
    q = [14, len(prompt_b) - hit_b.hit_tokens] + [1] * 20
    c = [0, hit_b.hit_tokens] + [30] * 20
    d = decide(ON, q, c, reads_inflight=[False, bool(hit_b.inflight_hit_blocks)] + [False] * 20)
    assert not d.split and d.reason == "prefix_readers"
    assert d.readers == (1,) and d.confirmed_readers == (1,)
    # with the in-flight-block rule (the default) B gets no hit, computes its prompt, and the split goes ahead
    strict = PrefixCache(bs)
    strict.begin_step(3)
    for i, key in enumerate(keys_a):
        strict.register(key, 20 + i, step=3)
    assert strict.lookup(chain_keys(prompt_b, bs), num_tokens=len(prompt_b)).hit_tokens == 0
    d2 = decide(ON, [14, len(prompt_b)] + [1] * 20, [0, 0] + [30] * 20)
    assert d2.split and d2.reason == "split"


def test_config_validated():
    with pytest.raises(ValueError):
        MicroBatchConfig(min_tokens=1)
