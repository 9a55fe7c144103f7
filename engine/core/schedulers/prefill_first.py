"""No mixing: a step with prefill work runs only prefill; decodes wait (the stall baseline).

Like vLLM V0's default: if any prompt (a new one or the rest of a chunked one) can run, the step
takes prefill tokens up to ``max_num_batched_tokens`` and every decoding request sits out. Only
when no prefill can run do the decodes go, all of them, preempting from the back when KV runs out.
"""
from __future__ import annotations

from mixdiag.engine.core.schedulers.base import Scheduler, SchedulerOutput


class PrefillFirstScheduler(Scheduler):
    policy = "prefill_first"

    def _schedule(self) -> SchedulerOutput:
        cfg = self.config
        decodes = [r for r in self.running if r.is_decode]
        prefills, _ = self._take_prefills(cfg.max_num_batched_tokens, cfg.long_prefill_token_threshold)
        if prefills:
            return self._output(prefills, cfg.max_num_batched_tokens, skipped=decodes)
        rows, skipped = self._schedule_decodes(decodes, cfg.max_num_batched_tokens)
        return self._output(rows, cfg.max_num_batched_tokens, skipped=skipped)
