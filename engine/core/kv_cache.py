"""Paged KV cache: the tensor pool, a reference-counted block pool, and per-request block tables.

Slot ``s`` of the pool is token ``s % block_size`` of block ``s // block_size``. A request's block
table lists its blocks in position order; position ``p`` lives at slot
``table[p // block_size] * block_size + p % block_size``. Reference counts let several requests
share a block (a prefix cache plugs in here); a block returns to the free list when its count
drops to zero.

The block pool and the block tables are pure Python: ``mixdiag tune`` replays schedulers on them
without the engine, so torch is imported only where the tensor pool is made
(:func:`allocate_kv_cache`), not when this module loads (tests/mixdiag/test_tune_cli.py).
"""
from __future__ import annotations

from collections import deque
from typing import TYPE_CHECKING

from mixdiag.engine.config import CacheConfig, ModelConfig

if TYPE_CHECKING:
    import torch


class OutOfBlocks(RuntimeError):
    """The pool has fewer free blocks than asked for."""


class BlockPool:
    """Fixed set of KV blocks with reference counts and a FIFO free list."""

    def __init__(self, num_blocks: int):
        self.num_blocks = num_blocks
        self.ref_counts = [0] * num_blocks
        self._free: deque[int] = deque(range(num_blocks))

    @property
    def num_free(self) -> int:
        return len(self._free)

    @property
    def usage(self) -> float:
        """Fraction of blocks in use (0..1)."""
        return 1.0 - len(self._free) / self.num_blocks

    def allocate(self, n: int) -> list[int]:
        """Take ``n`` free blocks (ref count 1 each); raises :class:`OutOfBlocks` if too few."""
        if n > len(self._free):
            raise OutOfBlocks(f"need {n} KV blocks, {len(self._free)} free")
        out = [self._free.popleft() for _ in range(n)]
        for b in out:
            self.ref_counts[b] = 1
        return out

    def incref(self, blocks: list[int]) -> None:
        """Share ``blocks`` with one more owner."""
        for b in blocks:
            if self.ref_counts[b] <= 0:
                raise ValueError(f"block {b} is free; cannot share it")
            self.ref_counts[b] += 1

    def free(self, blocks: list[int]) -> None:
        """Drop one reference to each block; blocks reaching zero return to the free list."""
        for b in blocks:
            if self.ref_counts[b] <= 0:
                raise ValueError(f"block {b} freed twice")
            self.ref_counts[b] -= 1
            if self.ref_counts[b] == 0:
                self._released(b)

    def _released(self, block: int) -> None:
        """A block's last reference went away: it is free again (a caching pool may keep it)."""
        self._free.append(block)


class KVCacheManager:
    """Block tables per request on top of a :class:`BlockPool` (the scheduler's ``kv_manager``)."""

    def __init__(self, config: CacheConfig):
        self.block_size = config.block_size
        self.pool = BlockPool(config.num_blocks)
        self.block_ids: dict[str, list[int]] = {}

    @property
    def num_free_blocks(self) -> int:
        return self.pool.num_free

    @property
    def usage(self) -> float:
        return self.pool.usage

    def blocks_for(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    def num_new_blocks(self, request, num_new_tokens: int) -> int:
        """Blocks ``request`` still needs to hold ``num_new_tokens`` more computed tokens."""
        have = len(self.block_ids.get(request.request_id, ()))
        return max(0, self.blocks_for(request.num_computed_tokens + num_new_tokens) - have)

    def allocate_slots(self, request, num_new_tokens: int, reserve_blocks: int = 0) -> bool:
        """Make room for ``num_new_tokens`` tokens after ``request.num_computed_tokens``.

        Returns False (allocating nothing) when the pool cannot supply the blocks while keeping
        ``reserve_blocks`` free.
        """
        need = self.num_new_blocks(request, num_new_tokens)
        if need == 0:
            return True
        if need + reserve_blocks > self.pool.num_free:
            return False
        self.block_ids.setdefault(request.request_id, []).extend(self.pool.allocate(need))
        return True

    def get_block_ids(self, request_id: str) -> list[int]:
        return self.block_ids.get(request_id, [])

    def free(self, request_id: str) -> None:
        """Release every block of ``request_id`` (finished, aborted or preempted)."""
        blocks = self.block_ids.pop(request_id, None)
        if blocks:
            # Free in reverse so the tail blocks (least likely shared) come back first.
            self.pool.free(list(reversed(blocks)))


def allocate_kv_cache(model: ModelConfig, cache: CacheConfig, device: str | torch.device = "cpu") -> torch.Tensor:
    """The KV pool tensor [num_layers, 2 (K,V), num_blocks, block_size, num_kv_heads, head_dim], zeroed."""
    import torch  # here, not at module level: the block pool above must load without torch

    return torch.zeros(model.num_layers, 2, cache.num_blocks, cache.block_size, model.num_kv_heads, model.head_dim,
                       dtype=getattr(torch, model.dtype), device=device)
