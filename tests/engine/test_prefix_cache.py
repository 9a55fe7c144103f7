"""Prefix cache: chain keys, the in-flight-block rule, LRU eviction, hit accounting."""
import pytest

from mixdiag.engine.core.prefix_cache import PrefixCache, chain_keys

BS = 4


def test_chain_keys_identify_whole_prefixes():
    a = list(range(12))
    b = [99] + list(range(1, 12))  # differs only in block 0
    ka, kb = chain_keys(a, BS), chain_keys(b, BS)
    assert len(ka) == 3 and len(chain_keys(a[:11], BS)) == 2  # only full blocks
    assert all(x != y for x, y in zip(ka, kb))  # block 1/2 contents equal, prefixes differ
    assert chain_keys(a, BS) == ka
    # incremental extension from block 1 gives the same keys
    assert ka[:1] + chain_keys(a, BS, parent=ka[0], start_block=1) == ka


def _register_prompt(cache, tokens, first_block_id, step):
    keys = chain_keys(tokens, BS)
    for i, k in enumerate(keys):
        cache.register(k, first_block_id + i, step)
    return keys


def test_inflight_block_rule_blocks_same_step_hit():
    """Request A fills 3 blocks in step 1; B, admitted in the same step with the same prefix,
    must not hit them; C, admitted in step 2 after A's forward, hits all three."""
    cache = PrefixCache(BS)
    prompt = list(range(100, 113))  # 13 tokens: 3 full blocks
    cache.begin_step(1)
    assert cache.lookup(chain_keys(prompt, BS), num_tokens=13).hit_tokens == 0  # A: cold
    keys = _register_prompt(cache, prompt, 10, step=1)
    hit_b = cache.lookup(keys, num_tokens=13)
    assert hit_b.hit_tokens == 0 and hit_b.inflight_blocked == 1
    assert cache.is_inflight(10)
    cache.end_step(1)
    cache.begin_step(2)
    assert not cache.is_inflight(10)
    hit_c = cache.lookup(keys, num_tokens=13, max_hit_tokens=12)
    assert hit_c.block_ids == (10, 11, 12) and hit_c.hit_tokens == 12 and hit_c.inflight_blocked == 0


def test_inflight_hits_allowed_are_reported():
    """vLLM mode admits the hit; it is reported so the micro-batch gate can refuse a split."""
    cache = PrefixCache(BS, allow_inflight_hits=True)
    cache.begin_step(5)
    older = _register_prompt(cache, [1, 2, 3, 4], 0, step=4)  # written by an earlier step
    cache.end_step(4)
    keys = chain_keys([1, 2, 3, 4, 5, 6, 7, 8, 9], BS)
    cache.register(keys[1], 1, step=5)
    hit = cache.lookup(keys, num_tokens=9, max_hit_tokens=8)
    assert older == keys[:1]
    assert hit.block_ids == (0, 1) and hit.inflight_hit_blocks == (1,)


def test_hit_capped_by_max_hit_tokens():
    cache = PrefixCache(BS)
    cache.begin_step(0)
    keys = _register_prompt(cache, list(range(8)), 0, step=0)
    cache.end_step(0)
    assert cache.lookup(keys, num_tokens=8, max_hit_tokens=7).block_ids == (0,)
    assert cache.lookup(keys, num_tokens=8).block_ids == (0, 1)


class TinyBlockManager:
    """Free list + ref counts, the way the engine's block manager drives the cache."""

    def __init__(self, n, cache):
        self.free = list(range(n))
        self.ref = {}
        self.cache = cache

    def allocate(self):
        b = self.free.pop(0) if self.free else self.cache.evict()
        assert b is not None, "out of blocks"
        self.cache.forget(b)
        self.ref[b] = 1
        return b

    def take_hit(self, blocks):
        self.cache.acquire(blocks)
        for b in blocks:
            self.ref[b] = self.ref.get(b, 0) + 1

    def release(self, blocks):
        for b in blocks:
            self.ref[b] -= 1
            if self.ref[b] == 0:
                del self.ref[b]
                if not self.cache.on_release(b):
                    self.free.append(b)

    def num_free(self):
        return len(self.free) + self.cache.num_evictable


def test_lru_eviction_among_unreferenced_blocks_and_no_leaks():
    cache = PrefixCache(BS)
    bm = TinyBlockManager(4, cache)
    prompts = {name: [base + i for i in range(BS)] for name, base in (("a", 0), ("b", 100), ("c", 200))}
    owned = {}
    for step, (name, toks) in enumerate(prompts.items()):
        cache.begin_step(step)
        b = bm.allocate()
        cache.register(chain_keys(toks, BS)[0], b, step)
        cache.end_step(step)
        owned[name] = b
    # release a, then c, then b: LRU order a, c, b
    for name in ("a", "c", "b"):
        bm.release([owned[name]])
    assert cache.evictable_blocks() == (owned["a"], owned["c"], owned["b"])
    assert bm.num_free() == 4
    # a hit on c takes it off the LRU list
    hit = cache.lookup(chain_keys(prompts["c"] + [7], BS), num_tokens=5, max_hit_tokens=4)
    assert hit.block_ids == (owned["c"],)
    bm.take_hit(hit.block_ids)
    assert cache.evictable_blocks() == (owned["a"], owned["b"])
    # two allocations: the free block, then the LRU victim a; a's prefix no longer hits
    bm.allocate()
    victim = bm.allocate()
    assert victim == owned["a"] and cache.stats.evictions_total == 1
    assert cache.lookup(chain_keys(prompts["a"] + [1], BS), num_tokens=5, max_hit_tokens=4).hit_tokens == 0
    assert cache.lookup(chain_keys(prompts["b"] + [1], BS), num_tokens=5, max_hit_tokens=4).hit_tokens == 4
    bm.release([owned["c"]])
    bm.release(list(bm.ref))
    assert bm.num_free() == 4 and not bm.ref


def test_token_accounting_per_step_and_total():
    cache = PrefixCache(BS)
    cache.begin_step(0)
    keys = _register_prompt(cache, list(range(8)), 0, step=0)
    cache.end_step(0)
    cache.begin_step(1)
    cache.lookup(keys, num_tokens=10, max_hit_tokens=9)
    cache.lookup(chain_keys([9] * 8, BS), num_tokens=8, max_hit_tokens=7)
    cache.lookup(keys, num_tokens=10, record=False)
    assert (cache.stats.step_queries, cache.stats.step_hits) == (18, 8)
    cache.begin_step(2)
    assert (cache.stats.step_queries, cache.stats.step_hits) == (0, 0)
    assert (cache.stats.queries_total, cache.stats.hits_total) == (18, 8)


def test_register_duplicate_key_and_recycled_block():
    cache = PrefixCache(BS)
    cache.begin_step(0)
    k = chain_keys([1, 2, 3, 4], BS)[0]
    assert cache.register(k, 3, 0) and not cache.register(k, 4, 0)
    k2 = chain_keys([5, 6, 7, 8], BS)[0]
    cache.register(k2, 3, 0)  # block 3 recycled with new content: old key must not hit it
    cache.end_step(0)
    assert cache.lookup([k], num_tokens=4).hit_tokens == 0
    assert cache.lookup([k2], num_tokens=4).block_ids == (3,)
    with pytest.raises(ValueError):
        PrefixCache(0)


# ---- the prefix-caching KV manager -----------------------------------------------------------
from mixdiag.engine.config import CacheConfig  # noqa: E402
from mixdiag.engine.core.prefix_cache import PrefixCachingKVManager  # noqa: E402
from mixdiag.engine.core.request import Request, SamplingParams  # noqa: E402


def _req(rid, prompt):
    return Request(rid, prompt, SamplingParams(), 0.0)


def _admit(kv, req):
    hit = kv.match_prefix(req)
    n = req.num_tokens - (hit.hit_tokens if hit else 0)
    assert kv.allocate_slots(req, n, prefix=hit)
    return hit


def test_manager_inflight_rule_then_hit_and_no_leak():
    kv = PrefixCachingKVManager(CacheConfig(block_size=BS, num_blocks=16))
    shared = list(range(30, 42))                       # 3 full blocks
    a, b, c = _req("a", shared + [1]), _req("b", shared + [2, 3]), _req("c", shared + [4])
    kv.begin_step(0)
    assert _admit(kv, a).hit_tokens == 0
    hit_b = _admit(kv, b)                              # same step: A is still writing the blocks
    assert hit_b.hit_tokens == 0 and hit_b.inflight_blocked == 1
    assert kv.get_block_ids("b")[:3] != kv.get_block_ids("a")[:3]
    kv.end_step(0)
    kv.begin_step(1)
    hit_c = _admit(kv, c)
    assert hit_c.hit_tokens == 12 and c.num_computed_tokens == 12
    assert kv.get_block_ids("c")[:3] == kv.get_block_ids("a")[:3]
    assert kv.step_hits["c"] is hit_c
    assert (kv.prefix_cache.stats.step_queries, kv.prefix_cache.stats.step_hits) == (13, 12)
    assert kv.prefix_cache.stats.queries_total == 13 + 14 + 13
    for rid in ("a", "b", "c"):
        kv.free(rid)
    assert kv.num_free_blocks == 16 and not any(kv.pool.ref_counts)
    assert kv.prefix_cache.num_evictable == kv.prefix_cache.num_cached > 0


def test_manager_evicts_lru_cached_blocks_under_pressure():
    kv = PrefixCachingKVManager(CacheConfig(block_size=BS, num_blocks=4))
    kv.begin_step(0)
    a = _req("a", list(range(100, 108)) + [1])         # 3 blocks, 2 full ones cached
    _admit(kv, a)
    kv.end_step(0)
    kv.free("a")
    assert kv.num_free_blocks == 4 and kv.prefix_cache.num_evictable == 2
    kv.begin_step(1)
    big = _req("big", list(range(200, 215)))          # needs all 4 blocks: both cached ones evicted
    assert _admit(kv, big).hit_tokens == 0
    assert kv.prefix_cache.num_cached == 3 and kv.prefix_cache.stats.evictions_total == 2
    kv.end_step(1)
    kv.begin_step(2)
    again = _req("again", list(range(100, 108)) + [1])
    assert kv.match_prefix(again).hit_tokens == 0       # a's prefix was evicted
    assert not kv.allocate_slots(again, 9)               # and the pool is full
    kv.free("big")
    assert kv.num_free_blocks == 4


def test_manager_never_caches_draft_positions():
    kv = PrefixCachingKVManager(CacheConfig(block_size=BS, num_blocks=8))
    kv.begin_step(0)
    r = _req("r", [5, 6, 7])
    _admit(kv, r)
    r.append_output(8)
    r.num_computed_tokens = 3
    r.spec_token_ids = [9, 9, 9, 9]                    # positions 4..7: drafts fill block 1
    assert kv.allocate_slots(r, 5)
    assert kv.prefix_cache.num_cached == 1              # block 0 (tokens 5,6,7,8); block 1 holds drafts


def test_block_released_before_its_step_ran_is_forgotten():
    """A request registers a block while being scheduled, then is preempted in the same step: the
    block's KV is never written, so its key must not survive to be hit later."""
    kv = PrefixCachingKVManager(CacheConfig(block_size=BS, num_blocks=8))
    kv.begin_step(0)
    a = _req("a", list(range(50, 59)))
    _admit(kv, a)
    assert kv.prefix_cache.num_cached == 2
    kv.free("a")                                     # preempted before the forward
    kv.end_step(0)
    assert kv.prefix_cache.num_cached == 0 and kv.num_free_blocks == 8
    kv.begin_step(1)
    assert kv.match_prefix(_req("b", list(range(50, 59)))).hit_tokens == 0
    # released after its step's forward: kept for reuse
    c = _req("c", list(range(50, 59)))
    _admit(kv, c)
    kv.end_step(1)
    kv.free("c")
    kv.begin_step(2)
    assert kv.match_prefix(_req("d", list(range(50, 59)))).hit_tokens == 8
