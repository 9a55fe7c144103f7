"""vLLM V1's policy: running requests first, then waiting prefills, all within one token budget.

Each running request asks for what it still needs (1 token for a decode, ``1 + drafts`` with
speculative decoding, the rest of its prompt when mid-prefill), cut to
``long_prefill_token_threshold`` when that is > 0 and to the remaining ``max_num_batched_tokens``.
When KV blocks run out, the lowest-priority running request (the last admitted) is preempted by
recompute. Waiting requests are admitted only if nothing was preempted this step; a prompt that
does not fit the remaining budget is chunked and continues next step.
"""
from __future__ import annotations

from ..request import Status
from .base import Scheduler, SchedulerOutput


class TokenBudgetScheduler(Scheduler):
    policy = "token_budget"

    def _schedule(self) -> SchedulerOutput:
        cfg = self.config
        budget = cfg.max_num_batched_tokens
        thr = cfg.long_prefill_token_threshold
        scheduled = []
        i = 0
        while i < len(self.running) and budget > 0:
            req = self.running[i]
            n = self._chunk(req, budget, thr)
            preempted_self = False
            while not self.kv.allocate_slots(req, n):
                victim = self.running[-1]
                self.preempt(victim)
                if victim is req:
                    preempted_self = True
                    break
            if preempted_self:
                break
            scheduled.append((req, n))
            budget -= n
            i += 1
        if not self._preempted:
            new, budget = self._take_waiting(budget, thr)
            scheduled += new
        return self._output(scheduled, cfg.max_num_batched_tokens)

    def _take_waiting(self, budget: int, thr: int):
        out = []
        while self.waiting and budget > 0 and len(self.running) < self.config.max_num_seqs:
            req = self.waiting[0]
            n = self._chunk(req, budget, thr)
            if not self.kv.allocate_slots(req, n):
                break
            self.admit(req)
            out.append((req, n))
            budget -= n
        assert all(r.status == Status.RUNNING for r, _ in out)
        return out, budget
