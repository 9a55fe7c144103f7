"""vLLM V1's policy: running requests first, then waiting prefills, all within one token budget.

Each running request asks for what it still needs (1 token for a decode, ``1 + drafts`` with
speculative decoding, the rest of its prompt when mid-prefill), cut to
``long_prefill_token_threshold`` when that is > 0 and to the remaining ``max_num_batched_tokens``.
When KV blocks run out, the lowest-priority running request (the last admitted) is preempted by
recompute. Waiting requests are admitted only if nothing was preempted this step; a prompt that
does not fit the remaining budget is chunked and continues next step.
"""
from __future__ import annotations

from mixdiag.engine.core.request import Status
from mixdiag.engine.core.schedulers.base import Scheduler, SchedulerOutput


class TokenBudgetScheduler(Scheduler):
    policy = "token_budget"

    def _schedule(self) -> SchedulerOutput:
        cfg = self.config
        budget = cfg.max_num_batched_tokens
        thr = cfg.long_prefill_token_threshold
        # vLLM: input slots are a second budget; each request also takes `draft_slots` of them
        # (parallel drafting), so num_new_tokens = min(need, token_budget, input_budget - draft_slots).
        self._input_budget = cfg.max_num_batched_tokens
        ds = cfg.draft_slots
        scheduled = []
        i = 0
        while i < len(self.running) and budget > 0 and self._input_budget > ds:
            req = self.running[i]
            n = min(self._chunk(req, budget, thr), self._input_budget - ds)
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
            self._input_budget -= n + ds
            i += 1
        if not self._preempted:
            new, budget = self._take_waiting(budget, thr)
            scheduled += new
        return self._output(scheduled, cfg.max_num_batched_tokens)

    def _take_waiting(self, budget: int, thr: int):
        out = []
        ds = self.config.draft_slots
        while (self.waiting and budget > 0 and len(self.running) < self.config.max_num_seqs
               and self._input_budget > ds):
            req = self.waiting[0]
            hit = self._prefix_hit(req)
            n = min(self._chunk(req, budget, thr, skip=hit.hit_tokens if hit else 0), self._input_budget - ds)
            if not self._allocate_admission(req, n, hit):
                break
            self.admit(req)
            out.append((req, n))
            budget -= n
            self._input_budget -= n + ds
        assert all(r.status == Status.RUNNING for r, _ in out)
        return out, budget
