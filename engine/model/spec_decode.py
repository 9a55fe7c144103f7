"""Speculative decoding: verification of k draft tokens, the draft-count mask, KV rollback.

A decode request with drafts ``d1..dk`` is scheduled ``1 + k`` rows: its last sampled token and
the k drafts, at positions ``num_computed .. num_computed + k``; the target model's logits at row
``i`` judge draft ``i + 1``, the last row gives a bonus token. Every row's KV is written in the
step; after verification the positions of rejected drafts are rolled back (``num_computed`` is
cut to the accepted length and wholly-rejected tail blocks can be released), so the next step
overwrites them before anything reads them.

Acceptance: greedy = accept while the draft equals the target argmax (then emit the target's
token); temperature > 0 = the standard rejection-sampling rule (Leviathan et al. 2023, Chen et al.
2023): accept ``x`` with probability ``min(1, p(x)/q(x))``, on rejection sample from
``norm(max(0, p - q))``; the output distribution equals sampling from the target alone. A
prompt-lookup drafter is deterministic, so ``q`` is one-hot.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np
import torch


@dataclass(frozen=True)
class VerifyResult:
    """``tokens`` = accepted drafts followed by one target token (bonus or correction)."""

    num_draft: int
    num_accepted: int
    tokens: tuple[int, ...]

    @property
    def num_rejected(self) -> int:
        return self.num_draft - self.num_accepted


def draft_token_counts(num_scheduled_tokens: Sequence[int], spec_tokens: Sequence[Sequence[int] | None]) -> np.ndarray:
    """Per-request draft counts as vLLM's runner builds them (int32).

    ``-1``: not a decode request (chunked prefill: the mask must not treat its rows as drafts);
    ``0``: a decode without drafts this step; ``k``: a decode with k drafts (scheduled ``k + 1``).
    ``spec_tokens[i]`` is None for requests the scheduler gave no speculative entry.
    """
    out = np.full(len(num_scheduled_tokens), -1, dtype=np.int32)
    for i, (n, drafts) in enumerate(zip(num_scheduled_tokens, spec_tokens)):
        if drafts is not None and n == len(drafts) + 1:
            out[i] = len(drafts)
    return out


def verify_greedy(draft: Sequence[int], target_ids: Sequence[int]) -> VerifyResult:
    """Accept the longest prefix of ``draft`` equal to the target argmax ``target_ids`` [k+1]."""
    k = len(draft)
    if len(target_ids) != k + 1:
        raise ValueError(f"verify_greedy: {k} drafts need {k + 1} target tokens, got {len(target_ids)}")
    n = 0
    while n < k and int(draft[n]) == int(target_ids[n]):
        n += 1
    return VerifyResult(k, n, tuple(int(t) for t in target_ids[:n + 1]))


def verify_sampling(draft: Sequence[int], target_probs: torch.Tensor, generator: torch.Generator | None,
                    draft_probs: torch.Tensor | None = None) -> VerifyResult:
    """Rejection-sampling verification; ``target_probs`` [k+1, V] after temperature/top-p.

    ``draft_probs`` [k, V] is the drafter's distribution (None = one-hot on the draft token).
    """
    k = len(draft)
    if target_probs.shape[0] != k + 1:
        raise ValueError(f"verify_sampling: {k} drafts need {k + 1} target rows, got {target_probs.shape[0]}")
    p_all = target_probs.double()
    out: list[int] = []
    for i, x in enumerate(int(t) for t in draft):
        p = p_all[i]
        q = torch.zeros_like(p)
        if draft_probs is None:
            q[x] = 1.0
        else:
            q = draft_probs[i].double()
        u = torch.rand((), generator=generator, dtype=torch.float64, device=p.device)
        if float(q[x]) > 0 and float(u) < min(1.0, float(p[x] / q[x])):
            out.append(x)
            continue
        residual = (p - q).clamp_min(0)
        if float(residual.sum()) <= 0:  # p == q: any rejection is measure-zero; fall back to p
            residual = p
        out.append(int(torch.multinomial(residual / residual.sum(), 1, generator=generator)))
        return VerifyResult(k, i, tuple(out))
    out.append(int(torch.multinomial(p_all[k] / p_all[k].sum(), 1, generator=generator)))
    return VerifyResult(k, k, tuple(out))


@dataclass(frozen=True)
class Rollback:
    """KV bookkeeping after verification of one request."""

    num_computed_tokens: int         # tokens whose KV is valid (was num_computed + 1 + k rows written)
    rejected_positions: tuple[int, int]  # [start, end) positions whose KV is stale
    keep_blocks: tuple[int, ...]
    free_blocks: tuple[int, ...]     # tail blocks holding only rejected positions


def rollback(num_computed_before: int, num_draft: int, num_accepted: int, block_ids: Sequence[int],
             block_size: int) -> Rollback:
    """Cut a request's KV back to ``num_computed_before + 1 + num_accepted`` valid positions."""
    if not 0 <= num_accepted <= num_draft:
        raise ValueError(f"rollback: accepted {num_accepted} of {num_draft} drafts")
    valid = num_computed_before + 1 + num_accepted
    written_end = num_computed_before + 1 + num_draft
    need = -(-valid // block_size)
    return Rollback(valid, (valid, written_end), tuple(block_ids[:need]), tuple(block_ids[need:]))


# ---- engine side: propose, trim to the schedule, verify, roll back ------------------------------
@dataclass
class SpecStepStats:
    """One step's speculative accounting (``draft_tokens`` verified, how many were accepted)."""

    draft_tokens: int = 0
    accepted_tokens: int = 0
    verified_reqs: int = 0


def _target_probs(logits: torch.Tensor, temperature: float, top_p: float) -> torch.Tensor:
    """Rows of ``logits`` [n, V] turned into the sampler's distribution (temperature, then top-p)."""
    probs = torch.softmax(logits.float() / temperature, dim=-1)
    if top_p < 1.0:
        sp, si = torch.sort(probs, descending=True, dim=-1)
        keep = torch.cumsum(sp, -1) - sp < top_p
        probs = torch.zeros_like(probs).scatter_(-1, si, sp * keep)
    return probs


class SpecDecoder:
    """Drives speculative decoding inside the engine loop (k = ``drafter.config.num_spec_tokens``).

    After each step's bookkeeping :meth:`propose` gives every decoding request its drafts (the
    scheduler then asks for ``1 + len(drafts)`` rows); :meth:`trim` cuts drafts a budget-limited
    schedule could not fit; :meth:`sample` verifies each drafted request's rows (greedy match, or
    rejection sampling for temperature > 0) and samples the other rows with ``sample_fn``;
    :meth:`rollback` cuts ``num_computed_tokens`` back to the accepted length and releases KV
    blocks holding only rejected positions.
    """

    def __init__(self, drafter, max_model_len: int):
        self.drafter = drafter
        self.k = drafter.config.num_spec_tokens
        self.max_model_len = max_model_len

    def propose(self, running) -> None:
        for req in running:
            if req.is_decode and not req.spec_token_ids:
                room = self.max_model_len - req.num_tokens  # draft positions must stay < max_model_len
                req.spec_token_ids = self.drafter.propose(req.all_token_ids, min(self.k, max(room, 0)))

    @staticmethod
    def trim(out) -> None:
        """Drop drafts beyond the rows the scheduler gave a request (``n - 1`` drafts fit)."""
        for req in out.requests:
            if req.spec_token_ids and req.is_decode:
                n = out.num_scheduled_tokens[req.request_id]
                if n < len(req.spec_token_ids) + 1:
                    req.spec_token_ids = req.spec_token_ids[:max(n - 1, 0)]

    @staticmethod
    def draft_counts(out) -> dict[str, int]:
        """vLLM's per-request draft-count array for the step (-1 prefill, 0 no draft, k drafts)."""
        nst = [out.num_scheduled_tokens[r.request_id] for r in out.requests]
        spec = [list(r.spec_token_ids) if r.is_decode else None for r in out.requests]
        return dict(zip((r.request_id for r in out.requests), draft_token_counts(nst, spec).tolist()))

    def sample(self, logits: torch.Tensor, batch, requests: dict, sample_fn, generator_for,
               draft_counts: dict[str, int]) -> tuple[dict[str, list[int]], SpecStepStats]:
        """Tokens per request from ``logits`` [S, V] whose rows follow ``batch.sample_req_ids``.

        ``draft_counts`` is the step's draft-count array by request id (:meth:`draft_counts`): k > 0
        rows are verified, 0 (decode without draft) and -1 (prefill) sample their last row.
        ``generator_for(req)`` gives the seeded generator of the request's next random draw.
        """
        stats = SpecStepStats()
        sampled: dict[str, list[int]] = {}
        plain_rows, plain_reqs = [], []
        ids = batch.sample_req_ids
        i = 0
        while i < len(ids):
            j = i
            while j < len(ids) and ids[j] == ids[i]:
                j += 1
            req = requests[ids[i]]
            drafts = req.spec_token_ids
            if draft_counts.get(req.request_id, -1) > 0:
                assert j - i == len(drafts) + 1, (req.request_id, j - i, len(drafts))
                rows = logits[i:j]
                if req.params.greedy:
                    res = verify_greedy(drafts, rows.argmax(-1).tolist())
                else:
                    probs = _target_probs(rows, req.params.temperature, req.params.top_p)
                    res = verify_sampling(drafts, probs, generator_for(req))
                sampled[req.request_id] = list(res.tokens)
                stats.draft_tokens += res.num_draft
                stats.accepted_tokens += res.num_accepted
                stats.verified_reqs += 1
            else:
                plain_rows.append(j - 1)
                plain_reqs.append(req)
            i = j
        if plain_rows:
            rows = logits.index_select(0, torch.tensor(plain_rows, device=logits.device))
            for req, tok in zip(plain_reqs, sample_fn(rows, plain_reqs)):
                sampled[req.request_id] = [tok]
        return sampled, stats

    @staticmethod
    def rollback(out, kv_manager) -> None:
        """After the scheduler's update: valid KV ends at the last accepted token; free the tail."""
        for req in out.requests:
            if req.status.finished or not req.is_decode:
                continue
            valid = req.num_tokens - 1  # last accepted token's KV is written next step
            if req.num_computed_tokens > valid:
                req.num_computed_tokens = valid
                blocks = kv_manager.get_block_ids(req.request_id)
                need = -(-valid // kv_manager.block_size)
                if len(blocks) > need:
                    tail = blocks[need:]
                    del blocks[need:]
                    kv_manager.pool.free(list(reversed(tail)))
