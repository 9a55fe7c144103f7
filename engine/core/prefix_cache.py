"""Prefix cache: full KV blocks keyed by a chain hash, LRU eviction among unreferenced blocks.

A block is cacheable once all ``block_size`` of its tokens are known and scheduled. Its key is a
chain hash ``H_i = blake2b(H_{i-1} || token ids of block i)``, so equal keys mean equal whole
prefixes, not just equal block contents. The cache sits beside the block manager:

* ``register(key, block_id, step)`` when a request's block becomes full in step ``step``; the
  block is *in flight* (its KV is being written by that step's forward) until ``end_step(step)``.
* ``lookup(keys)`` at admission: the longest run of cached leading blocks. The in-flight-block
  rule stops the run at a block another request is still writing in this same step (its KV is
  not there yet when the step is split into micro-batches, and a prefill chunk must not depend
  on another chunk of the same step); ``allow_inflight_hits=True`` gives vLLM's behaviour (hit
  admitted; the micro-batch gate then refuses to split the step).
* ``on_release(block_id)`` when the block manager's ref count of a block drops to zero: a cached
  block is kept (parked at the LRU tail, still hittable) instead of freed; ``acquire(block_id)``
  takes it off the LRU list again on a hit; ``evict()`` hands the least recently released cached
  block back to the block manager when it has no free block left.

Accounting follows vLLM's ``prefix_cache_queries``/``hits``: tokens, per step and in total.
"""
from __future__ import annotations

import hashlib
from collections import OrderedDict
from dataclasses import dataclass
from typing import Sequence

import numpy as np

ROOT_KEY = b"mixdiag-prefix-root"


def chain_keys(token_ids: Sequence[int], block_size: int, *, parent: bytes = ROOT_KEY,
               start_block: int = 0) -> list[bytes]:
    """Chain-hash keys of every *full* block of ``token_ids`` from ``start_block`` on.

    ``parent`` is the key of block ``start_block - 1`` (ROOT_KEY for block 0), so keys can be
    extended incrementally as a request's tokens grow.
    """
    keys = []
    n_full = len(token_ids) // block_size
    arr = np.asarray(token_ids[start_block * block_size:n_full * block_size], dtype=np.int64)
    for i in range(n_full - start_block):
        h = hashlib.blake2b(parent, digest_size=16)
        h.update(arr[i * block_size:(i + 1) * block_size].tobytes())
        parent = h.digest()
        keys.append(parent)
    return keys


@dataclass(frozen=True)
class PrefixHit:
    """Result of a lookup: the physical blocks to reuse, and why the run stopped."""

    block_ids: tuple[int, ...]
    hit_tokens: int
    query_tokens: int
    #: cached blocks skipped because another request is still writing them this step
    inflight_blocked: int
    #: blocks of ``block_ids`` that are being written in this same step (only when allowed)
    inflight_hit_blocks: tuple[int, ...]


@dataclass
class PrefixCacheStats:
    """Token accounting; ``step_*`` reset by ``begin_step``."""

    queries_total: int = 0
    hits_total: int = 0
    step_queries: int = 0
    step_hits: int = 0
    evictions_total: int = 0
    inflight_blocked_total: int = 0


class PrefixCache:
    """Chain-hash block cache with LRU eviction and the in-flight-block rule (see module doc)."""

    def __init__(self, block_size: int, *, allow_inflight_hits: bool = False):
        if block_size <= 0:
            raise ValueError(f"block_size must be positive, got {block_size}")
        self.block_size = block_size
        self.allow_inflight_hits = allow_inflight_hits
        self._block_of: dict[bytes, int] = {}
        self._key_of: dict[int, bytes] = {}
        self._lru: OrderedDict[int, None] = OrderedDict()  # unreferenced cached blocks, oldest first
        self._inflight: dict[int, int] = {}  # block id -> step whose forward writes it
        self.stats = PrefixCacheStats()
        self.step = -1

    # -- step boundaries --------------------------------------------------------------------
    def begin_step(self, step: int) -> None:
        self.step = step
        self.stats.step_queries = 0
        self.stats.step_hits = 0

    def end_step(self, step: int) -> None:
        """The forward of ``step`` has written its KV: its registered blocks become readable."""
        for b in [b for b, s in self._inflight.items() if s <= step]:
            del self._inflight[b]

    # -- lookup / register ------------------------------------------------------------------
    def lookup(self, keys: Sequence[bytes], *, num_tokens: int, max_hit_tokens: int | None = None,
               record: bool = True) -> PrefixHit:
        """Longest run of cached leading blocks for a request of ``num_tokens`` known tokens.

        ``max_hit_tokens`` caps the hit (a request must compute at least its last token to get
        logits, so callers pass ``num_tokens - 1``). ``record`` adds the query/hit tokens to the
        stats (pass False for a look that will not be acted on).
        """
        cap = num_tokens if max_hit_tokens is None else min(num_tokens, max_hit_tokens)
        max_blocks = max(0, cap) // self.block_size
        blocks: list[int] = []
        inflight_hits: list[int] = []
        blocked = 0
        for key in keys[:max_blocks]:
            b = self._block_of.get(key)
            if b is None:
                break
            if b in self._inflight and self._inflight[b] == self.step:
                if not self.allow_inflight_hits:
                    blocked = 1
                    break
                inflight_hits.append(b)
            blocks.append(b)
        hit = PrefixHit(tuple(blocks), len(blocks) * self.block_size, num_tokens, blocked, tuple(inflight_hits))
        if record:
            self.stats.queries_total += num_tokens
            self.stats.step_queries += num_tokens
            self.stats.hits_total += hit.hit_tokens
            self.stats.step_hits += hit.hit_tokens
            self.stats.inflight_blocked_total += blocked
        return hit

    def acquire(self, block_ids: Sequence[int]) -> None:
        """A request took these cached blocks (the caller bumps their ref counts)."""
        for b in block_ids:
            self._lru.pop(b, None)

    def register(self, key: bytes, block_id: int, step: int) -> bool:
        """Cache a just-filled block written by ``step``; False if the key was already cached."""
        if key in self._block_of:
            return False
        old = self._key_of.pop(block_id, None)
        if old is not None:  # a recycled block must not keep its old identity
            del self._block_of[old]
        self._block_of[key] = block_id
        self._key_of[block_id] = key
        self._inflight[block_id] = step
        return True

    def is_inflight(self, block_id: int) -> bool:
        return self._inflight.get(block_id) == self.step

    # -- interplay with the block manager ---------------------------------------------------
    def on_release(self, block_id: int) -> bool:
        """Ref count of ``block_id`` hit zero. True: the cache keeps it (evictable); False: free it.

        A block registered in this step and released before the step's forward (its request was
        preempted while being scheduled) will never have its KV written: forget it.
        """
        if self._inflight.get(block_id) == self.step:
            self.forget(block_id)
            return False
        if block_id in self._key_of:
            self._lru[block_id] = None
            self._lru.move_to_end(block_id)
            return True
        return False

    def evict(self) -> int | None:
        """Forget the least recently released cached block and return it for reuse (None if none)."""
        if not self._lru:
            return None
        b, _ = self._lru.popitem(last=False)
        del self._block_of[self._key_of.pop(b)]
        self._inflight.pop(b, None)
        self.stats.evictions_total += 1
        return b

    def forget(self, block_id: int) -> None:
        """Drop a block's identity (its KV is about to be overwritten or was rolled back)."""
        key = self._key_of.pop(block_id, None)
        if key is not None:
            del self._block_of[key]
        self._lru.pop(block_id, None)
        self._inflight.pop(block_id, None)

    @property
    def num_evictable(self) -> int:
        """Unreferenced cached blocks: free for the block manager's accounting."""
        return len(self._lru)

    @property
    def num_cached(self) -> int:
        return len(self._block_of)

    def evictable_blocks(self) -> tuple[int, ...]:
        return tuple(self._lru)


# ---- the block manager with a prefix cache ----------------------------------------------------
# Imported late: kv_cache does not know about prefix caching; this subclass plugs it in.
from mixdiag.engine.core.kv_cache import BlockPool, KVCacheManager, OutOfBlocks  # noqa: E402


class CachingBlockPool(BlockPool):
    """A :class:`BlockPool` whose released cached blocks stay hittable until evicted (LRU)."""

    def __init__(self, num_blocks: int, cache: PrefixCache):
        super().__init__(num_blocks)
        self.cache = cache

    @property
    def num_free(self) -> int:
        return len(self._free) + self.cache.num_evictable

    @property
    def usage(self) -> float:
        return 1.0 - self.num_free / self.num_blocks

    def allocate(self, n: int) -> list[int]:
        if n > self.num_free:
            raise OutOfBlocks(f"need {n} KV blocks, {self.num_free} free")
        out = [self._free.popleft() if self._free else self.cache.evict() for _ in range(n)]
        for b in out:
            self.ref_counts[b] = 1
        return out

    def take_cached(self, blocks: Sequence[int]) -> None:
        """A prefix hit: share cached blocks (ref 0 ones leave the eviction list)."""
        self.cache.acquire(blocks)
        for b in blocks:
            self.ref_counts[b] += 1

    def _released(self, block: int) -> None:
        # a full, hashed block stays in the cache (evictable) instead of the free list
        if not self.cache.on_release(block):
            self._free.append(block)


class PrefixCachingKVManager(KVCacheManager):
    """``KVCacheManager`` with a prefix cache: hits at admission, full blocks registered as scheduled.

    Schedulers call :meth:`match_prefix` for a request about to be admitted (no side effects), cut
    its chunk to what the hit leaves, and pass the hit to :meth:`allocate_slots`, which shares the
    hit blocks, sets ``num_computed_tokens`` and records the query/hit tokens. Every allocation
    registers the blocks the scheduled tokens fill (known tokens only: never draft positions), in
    flight for the current step. The engine calls :meth:`begin_step` / :meth:`end_step` around a step.
    """

    def __init__(self, config, *, allow_inflight_hits: bool = False):
        super().__init__(config)
        self.prefix_cache = PrefixCache(self.block_size, allow_inflight_hits=allow_inflight_hits)
        self.pool = CachingBlockPool(config.num_blocks, self.prefix_cache)
        self._keys: dict[str, list[bytes]] = {}
        self._registered: dict[str, int] = {}
        #: request id -> prefix hit applied at its admission in the current step
        self.step_hits: dict[str, PrefixHit] = {}

    def begin_step(self, step: int) -> None:
        self.prefix_cache.begin_step(step)
        self.step_hits = {}

    def end_step(self, step: int) -> None:
        self.prefix_cache.end_step(step)

    def _keys_for(self, request) -> list[bytes]:
        """Chain keys of every full block of the request's known tokens (extended incrementally)."""
        keys = self._keys.setdefault(request.request_id, [])
        have = len(keys)
        if (len(request.all_token_ids) // self.block_size) > have:
            parent = keys[-1] if keys else ROOT_KEY
            keys.extend(chain_keys(request.all_token_ids, self.block_size, parent=parent, start_block=have))
        return keys

    def match_prefix(self, request) -> PrefixHit | None:
        """The cache hit ``request`` would get if admitted now (None if it already holds KV)."""
        if request.num_computed_tokens or self.block_ids.get(request.request_id):
            return None
        n = request.num_tokens
        return self.prefix_cache.lookup(self._keys_for(request), num_tokens=n, max_hit_tokens=n - 1, record=False)

    def allocate_slots(self, request, num_new_tokens: int, reserve_blocks: int = 0,
                       prefix: PrefixHit | None = None) -> bool:
        rid = request.request_id
        if prefix is not None and prefix.block_ids:
            hit = list(prefix.block_ids)
            parked = sum(1 for b in hit if self.pool.ref_counts[b] == 0)  # counted as free until taken
            need = self.blocks_for(prefix.hit_tokens + num_new_tokens) - len(hit)
            if need + parked + reserve_blocks > self.pool.num_free:
                return False
            self.pool.take_cached(hit)
            self.block_ids[rid] = hit + self.pool.allocate(need)
            request.num_computed_tokens = prefix.hit_tokens
        elif not super().allocate_slots(request, num_new_tokens, reserve_blocks):
            return False
        if prefix is not None:
            st = self.prefix_cache.stats
            st.queries_total += prefix.query_tokens
            st.step_queries += prefix.query_tokens
            st.hits_total += prefix.hit_tokens
            st.step_hits += prefix.hit_tokens
            st.inflight_blocked_total += prefix.inflight_blocked
            self.step_hits[rid] = prefix
        self._register(request, num_new_tokens)
        return True

    def _register(self, request, num_new_tokens: int) -> None:
        """Cache the blocks this step fills with known tokens (drafts are never cached)."""
        rid = request.request_id
        upto = min(request.num_computed_tokens + num_new_tokens, request.num_tokens) // self.block_size
        start = self._registered.get(rid, 0)
        if upto <= start:
            return
        keys = self._keys_for(request)
        blocks = self.block_ids[rid]
        for i in range(start, upto):
            self.prefix_cache.register(keys[i], blocks[i], self.prefix_cache.step)
        self._registered[rid] = upto

    def free(self, request_id: str) -> None:
        super().free(request_id)
        self._keys.pop(request_id, None)
        self._registered.pop(request_id, None)
