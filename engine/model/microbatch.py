"""Micro-batching gate: may this step be split into two micro-batches (DBO-style overlap)?

Splitting runs the first half's attention before the second half's KV writes. Run whole, a step
issues every KV write before any attention read, so a request admitted on a prefix hit may read a
block another request of the same step is computing; split, that reader can land in the first
micro-batch and read a half-written block. vLLM's ``_allow_microbatching`` therefore refuses the
split whenever the step has a *reader*::

    readers = np.flatnonzero((query_lens > (reorder_batch_threshold or 1)) & (computed > 0))

(a multi-token query over already-computed context: a chunk continuing a prefill or a prefill
admitted on a prefix hit). The engine knows more than vLLM does: which hit blocks are really
being written this step (``inflight_hit_blocks``), reported as ``confirmed_readers``.

The gate only decides and records; the reference engine runs the step whole either way.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np

REASONS = ("disabled", "too_few_requests", "too_few_tokens", "prefix_readers", "split")


@dataclass(frozen=True)
class MicroBatchConfig:
    """``enabled`` turns the gate on; a step below ``min_tokens`` is not worth splitting."""

    enabled: bool = False
    min_tokens: int = 32
    reorder_batch_threshold: int = 1

    def __post_init__(self):
        if self.min_tokens < 2 or self.reorder_batch_threshold < 1:
            raise ValueError("MicroBatchConfig needs min_tokens >= 2 and reorder_batch_threshold >= 1")


@dataclass(frozen=True)
class MicroBatchDecision:
    """Whether the step splits, why (one of REASONS), and where (request index of micro-batch 1)."""

    split: bool
    reason: str
    readers: tuple[int, ...] = ()            # request indices vLLM's rule flags
    confirmed_readers: tuple[int, ...] = ()  # readers whose prefix hit includes blocks written this step
    split_index: int = -1                    # first request of the second micro-batch; -1 = no split
    first_tokens: int = 0                    # tokens in the first micro-batch


def decide(config: MicroBatchConfig, query_lens: Sequence[int], num_computed: Sequence[int],
           reads_inflight: Sequence[bool] | None = None) -> MicroBatchDecision:
    """Gate one step: per request, its query length and tokens computed before the step.

    ``reads_inflight[i]`` says request i's prefix hit includes a block written in this step.
    """
    q = np.asarray(query_lens, dtype=np.int64)
    c = np.asarray(num_computed, dtype=np.int64)
    readers = tuple(int(i) for i in np.flatnonzero((q > config.reorder_batch_threshold) & (c > 0)))
    confirmed = tuple(i for i in readers if reads_inflight is not None and reads_inflight[i])
    if not config.enabled:
        return MicroBatchDecision(False, "disabled", readers, confirmed)
    if len(q) < 2:
        return MicroBatchDecision(False, "too_few_requests", readers, confirmed)
    total = int(q.sum())
    if total < config.min_tokens:
        return MicroBatchDecision(False, "too_few_tokens", readers, confirmed)
    if readers:
        return MicroBatchDecision(False, "prefix_readers", readers, confirmed)
    # Split at the request boundary closest to half the tokens (never an empty half).
    cum = np.cumsum(q)[:-1]
    idx = int(np.argmin(np.abs(cum - total / 2))) + 1
    return MicroBatchDecision(True, "split", readers, confirmed, idx, int(cum[idx - 1]))
