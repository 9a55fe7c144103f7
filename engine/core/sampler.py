"""Token sampling: greedy, or temperature + top-p from a per-request seeded generator.

Presence and frequency penalties (OpenAI's semantics) apply first, to the logits of the tokens
the request generated so far (not its prompt), so greedy requests are penalised too.

Each random draw uses a generator seeded from (request seed, output index), so a request's
samples do not depend on which other requests share the batch, nor on preemption.
"""
from __future__ import annotations

import torch

_MASK64 = (1 << 63) - 1


def _draw_seed(seed: int, index: int) -> int:
    # splitmix-style mixing so consecutive indices give unrelated streams
    x = (seed * 0x9E3779B97F4A7C15 + index * 0xBF58476D1CE4E5B9 + 0x94D049BB133111EB) & _MASK64
    x ^= x >> 31
    return (x * 0xD6E8FEB86689C1D5) & _MASK64


def sample(logits: torch.Tensor, requests) -> list[int]:
    """One token per row of ``logits`` [S, V]; ``requests`` [S] give the sampling parameters."""
    if logits.shape[0] == 0:
        return []
    out = torch.argmax(logits, dim=-1).tolist()
    for i, req in enumerate(requests):
        p = req.params
        row = logits[i]
        if p.penalized and req.output_token_ids:
            row = penalize(row, req.output_token_ids, p.presence_penalty, p.frequency_penalty)
            if p.greedy:
                out[i] = int(torch.argmax(row))
        if p.greedy:
            continue
        probs = torch.softmax(row.float() / p.temperature, dim=-1)
        if p.top_p < 1.0:
            sp, si = torch.sort(probs, descending=True)
            keep = torch.cumsum(sp, 0) - sp < p.top_p       # smallest prefix reaching top_p
            probs = torch.zeros_like(probs).scatter_(0, si[keep], sp[keep])
        g = torch.Generator(device=probs.device).manual_seed(_draw_seed(req.sampling_seed, req.num_output_tokens))
        out[i] = int(torch.multinomial(probs, 1, generator=g))
    return out


def penalize(row: torch.Tensor, generated: list[int], presence: float, frequency: float) -> torch.Tensor:
    """``row`` [V] minus ``presence * [count > 0] + frequency * count`` over the ``generated`` ids."""
    vocab = row.shape[0]
    ids = torch.tensor([t for t in generated if 0 <= t < vocab], dtype=torch.long, device=row.device)
    counts = torch.bincount(ids, minlength=vocab).to(torch.float32)
    return row.float() - presence * (counts > 0).to(torch.float32) - frequency * counts
