"""Block pool reference counts and per-request block tables."""
from types import SimpleNamespace

import pytest

from mixdiag.engine.config import CacheConfig
from mixdiag.engine.core.kv_cache import BlockPool, KVCacheManager, OutOfBlocks


def test_pool_allocate_free_refcount():
    p = BlockPool(4)
    a = p.allocate(3)
    assert p.num_free == 1 and p.usage == 0.75
    p.incref(a[:1])
    p.free(a)
    assert p.num_free == 3            # the shared block is still held once
    p.free(a[:1])
    assert p.num_free == 4
    with pytest.raises(ValueError, match="freed twice"):
        p.free(a[:1])
    with pytest.raises(OutOfBlocks):
        p.allocate(5)
    with pytest.raises(ValueError, match="is free"):
        p.incref([0])


@pytest.mark.parametrize("computed,new,have,need", [(0, 1, 0, 1), (0, 4, 0, 1), (0, 5, 0, 2), (4, 1, 1, 1),
                                                    (3, 1, 1, 0), (8, 9, 2, 3)])
def test_new_blocks(computed, new, have, need):
    m = KVCacheManager(CacheConfig(block_size=4, num_blocks=16))
    req = SimpleNamespace(request_id="r", num_computed_tokens=0)
    if have:
        assert m.allocate_slots(req, have * 4)
    req.num_computed_tokens = computed
    assert m.num_new_blocks(req, new) == need


def test_allocate_fails_without_side_effects_and_free_returns_all():
    m = KVCacheManager(CacheConfig(block_size=4, num_blocks=3))
    a = SimpleNamespace(request_id="a", num_computed_tokens=0)
    b = SimpleNamespace(request_id="b", num_computed_tokens=0)
    assert m.allocate_slots(a, 8)
    assert not m.allocate_slots(b, 5)               # needs 2, one free
    assert m.get_block_ids("b") == [] and m.num_free_blocks == 1
    assert not m.allocate_slots(b, 1, reserve_blocks=1)
    assert m.allocate_slots(b, 1)
    m.free("a")
    m.free("b")
    assert m.num_free_blocks == 3 and m.usage == 0.0
