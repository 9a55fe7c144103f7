"""Prompt-lookup (n-gram) drafter: propose the k tokens that followed the last n-gram before.

vLLM's ``NgramProposer``: take the last ``n`` tokens of a request's context (prompt + output),
find their most recent earlier occurrence, and propose the up to ``k`` tokens that followed it;
try ``n = max_n`` down to ``min_n``. Free (no model), deterministic, and good on repetitive text;
the target model verifies every proposal, so a bad draft costs rows, never correctness.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np


@dataclass(frozen=True)
class DrafterConfig:
    """``num_spec_tokens`` = k drafts per decode step; n-gram sizes tried from max_n down to min_n."""

    num_spec_tokens: int = 5
    min_n: int = 1
    max_n: int = 4
    #: always propose exactly k tokens, as an MTP/EAGLE head does: when the n-gram continuation is
    #: shorter (or absent), repeat its last token (or the context's). Keeps decode steps uniform.
    pad_to_k: bool = False

    def __post_init__(self):
        if self.num_spec_tokens < 1:
            raise ValueError(f"DrafterConfig.num_spec_tokens must be >= 1, got {self.num_spec_tokens}")
        if not 1 <= self.min_n <= self.max_n:
            raise ValueError(f"DrafterConfig needs 1 <= min_n <= max_n, got {self.min_n}, {self.max_n}")


class NgramDrafter:
    """Stateless prompt-lookup proposer."""

    def __init__(self, config: DrafterConfig):
        self.config = config

    def propose(self, context: Sequence[int], k: int | None = None) -> list[int]:
        """Up to ``k`` draft tokens continuing ``context`` (exactly ``k`` with ``pad_to_k``)."""
        k = self.config.num_spec_tokens if k is None else k
        if k <= 0 or not len(context):
            return []
        drafts = self._lookup(context, k)
        if self.config.pad_to_k and len(drafts) < k:
            drafts = drafts + [drafts[-1] if drafts else int(context[-1])] * (k - len(drafts))
        return drafts

    def _lookup(self, context: Sequence[int], k: int) -> list[int]:
        if len(context) < self.config.min_n + 1:
            return []
        ctx = np.asarray(context, dtype=np.int64)
        L = len(ctx)
        for n in range(min(self.config.max_n, L - 1), self.config.min_n - 1, -1):
            tail = ctx[L - n:]
            # windows[i] = ctx[i:i+n] for i in [0, L-n); the tail itself (i = L-n) is excluded.
            windows = np.lib.stride_tricks.sliding_window_view(ctx[:L - 1], n)
            hits = np.flatnonzero((windows == tail).all(axis=1))
            if hits.size:
                start = int(hits[-1]) + n  # most recent occurrence
                return ctx[start:start + k].tolist()
        return []
