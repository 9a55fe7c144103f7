"""When an interval's largest step held a prompt chunk large enough to slow it, read from the engine's own
iteration-tokens histogram (``iteration_tokens_floor``: the lower edge of the bucket the step landed in).

Basis: below the roofline ridge (~200-300 tokens per step on bf16 accelerators,
``AttributionConfig.chunk_min_tokens``) the weight read dominates and a step costs about one decode pass; a
prompt chunk of ``chunk_min`` tokens or more takes the step past it. The histogram gives only a lower bound of
the step's tokens (bucket edges 256, 512, ...), and every running request adds one decode token, so the prompt
part is at least ``floor - batch``. That bound is read against ``chunk_min`` as before, with one allowance:
a step in the ``chunk_min`` bucket beside at most ``chunk_min / 16`` decodes held at least 15/16 of
``chunk_min`` prompt tokens - a gap far inside the ridge estimate's own 200-300 spread, so the step counts.
A step of that bucket beside a larger batch does not: its prompt part may be well under the ridge.

Measured: on the real-vLLM tier (g) tuning sets (4001, 4101) a 449-token chunk beside 8 decodes (a step in
the 256-511 bucket) read as ">= 248 prompt tokens", "only short prompts ran". Admitting every step of the
bucket with a prompt part of at least its decode part (tried first) named 23 more false mixing intervals on
tier (e2) tuning seeds 10-29 (vllm/scrapes FP 0.9 % -> 3.7 %): 160-190-token chunks beside 70-96 decodes in
eager stretches, steps at the ridge, not past it.
"""
from __future__ import annotations

import numpy as np


#: decode rows beside a step of the chunk_min bucket that still leave it a chunk_min chunk (module doc)
FEW_DECODES_SHARE = 1.0 / 16.0


def large_chunk(prompt_tokens, batch, chunk_min: float) -> np.ndarray:
    """Per row: True where a step with at least ``prompt_tokens`` prompt tokens beside ``batch`` running
    decodes held a chunk of ``chunk_min`` tokens, or reached ``chunk_min`` tokens in all with at most
    ``FEW_DECODES_SHARE`` x ``chunk_min`` decodes (module doc). NaN prompt tokens are False; a NaN batch
    counts as none."""
    p = np.asarray(prompt_tokens, dtype=float)
    b = np.nan_to_num(np.asarray(batch, dtype=float), nan=0.0)
    with np.errstate(invalid="ignore"):
        few = (p + b >= chunk_min) & (b <= FEW_DECODES_SHARE * chunk_min)
        return np.isfinite(p) & ((p >= chunk_min) | few)


def large_chunk_one(prompt_tokens: float | None, batch: float | None, chunk_min: float) -> bool:
    """:func:`large_chunk` for one row (``None`` prompt tokens: False)."""
    if prompt_tokens is None:
        return False
    return bool(large_chunk([prompt_tokens], [np.nan if batch is None else batch], chunk_min)[0])
