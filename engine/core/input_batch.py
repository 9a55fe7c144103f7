"""The flat token stream of one step: every scheduled token of every request, end to end.

Built from a :class:`~.schedulers.SchedulerOutput` with per-request (not per-token) Python work:
``input_ids`` and ``positions`` [T], ``query_start_loc`` [B+1], ``seq_lens`` [B] (context including
this step's tokens), ``slot_mapping`` [T] (where each token's K/V is written), ``block_tables``
[B, max_blocks] and ``logits_indices`` [S] (the rows that sample a token).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch


@dataclass(frozen=True)
class ForwardBatch:
    input_ids: torch.Tensor        # int64 [T]
    positions: torch.Tensor        # int64 [T]
    query_start_loc: torch.Tensor  # int32 [B+1]
    seq_lens: torch.Tensor         # int32 [B]
    slot_mapping: torch.Tensor     # int64 [T]
    block_tables: torch.Tensor     # int32 [B, max_blocks] (0-padded)
    logits_indices: torch.Tensor   # int64 [S]
    req_ids: tuple[str, ...]       # [B], stream order
    sample_req_ids: tuple[str, ...]  # [S], the request of each logits row (1 + d rows for d drafts)

    @property
    def num_tokens(self) -> int:
        return int(self.input_ids.shape[0])


def prepare_inputs(out, kv_manager, device: str | torch.device = "cpu") -> ForwardBatch:
    """Flatten the step's scheduled tokens (``out``: a SchedulerOutput) into a :class:`ForwardBatch`."""
    reqs = out.requests
    nst = out.num_scheduled_tokens
    b = len(reqs)
    q_lens = np.fromiter((nst[r.request_id] for r in reqs), dtype=np.int64, count=b)
    starts = np.fromiter((r.num_computed_tokens for r in reqs), dtype=np.int64, count=b)
    qsl = np.zeros(b + 1, dtype=np.int64)
    np.cumsum(q_lens, out=qsl[1:])
    t = int(qsl[-1])
    ids = []
    for r, c, n in zip(reqs, starts.tolist(), q_lens.tolist()):
        toks = r.all_token_ids
        if c + n <= len(toks):
            ids.extend(toks[c:c + n]) if n > 1 else ids.append(toks[c])
        else:                       # draft tokens follow the known ones
            ids.extend((toks + r.spec_token_ids)[c:c + n])
    req_idx = np.repeat(np.arange(b), q_lens)                       # [T] request of each token
    positions = np.arange(t, dtype=np.int64) - np.repeat(qsl[:-1] - starts, q_lens)
    tables = [kv_manager.get_block_ids(r.request_id) for r in reqs]
    max_blocks = max((len(x) for x in tables), default=0)
    bt = np.zeros((b, max(max_blocks, 1)), dtype=np.int64)
    for i, x in enumerate(tables):
        bt[i, :len(x)] = x
    bs = kv_manager.block_size
    slots = bt[req_idx, positions // bs] * bs + positions % bs
    seq_lens = starts + q_lens
    sample = set(out.sample_req_ids)
    sel = [i for i, r in enumerate(reqs) if r.request_id in sample]
    # Speculative verification: a decode with d drafts samples all of its 1 + d rows.
    rows = [1 + len(reqs[i].spec_token_ids) if reqs[i].spec_token_ids and reqs[i].is_decode
            and q_lens[i] == len(reqs[i].spec_token_ids) + 1 else 1 for i in sel]
    if any(r > 1 for r in rows):
        logits_idx = np.concatenate([np.arange(qsl[i + 1] - r, qsl[i + 1]) for i, r in zip(sel, rows)])
        sel = [i for i, r in zip(sel, rows) for _ in range(r)]
    else:
        logits_idx = qsl[1:][sel] - 1 if sel else np.zeros(0, dtype=np.int64)
    as_t = lambda a, dt: torch.from_numpy(np.ascontiguousarray(a)).to(device=device, dtype=dt)  # noqa: E731
    return ForwardBatch(
        input_ids=torch.tensor(ids, dtype=torch.int64, device=device), positions=as_t(positions, torch.int64),
        query_start_loc=as_t(qsl, torch.int32), seq_lens=as_t(seq_lens, torch.int32),
        slot_mapping=as_t(slots, torch.int64), block_tables=as_t(bt, torch.int32),
        logits_indices=as_t(logits_idx, torch.int64), req_ids=tuple(r.request_id for r in reqs),
        sample_req_ids=tuple(reqs[i].request_id for i in sel))
