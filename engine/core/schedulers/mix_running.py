"""SGLang's policy: a prefill batch within ``chunked_prefill_size``, then ``mix_with_running``.

The prefill batch takes the chunked request in progress first, then waiting requests, until the
chunk budget is spent (the last one is cut and continues next step). With ``enable_mixed_chunk``
the running decodes' rows are reserved out of that budget (SGLang's ``mixed_with_decode_tokens``)
and they join the prefill batch as 1-token extends (``prefix_len = seq_len - 1``,
``extend_len = 1``; forward mode MIXED) only if

* no request in either batch asks for logprobs or carries input embeddings,
* no running request is a beam member, and
* ``check_decode_mem`` passes: after the prefill batch took its KV, the pool still holds every
  decode's next token.

Otherwise the decodes sit out this step. Without prefill work the step is a decode batch; if KV
cannot hold it, requests are retracted (preempted) from the back.
"""
from __future__ import annotations

from mixdiag.engine.core.schedulers.base import ForwardMode, Scheduler, SchedulerOutput


class MixRunningScheduler(Scheduler):
    policy = "mix_running"

    def check_decode_mem(self, decodes) -> bool:
        """True if the free KV blocks cover every decode's next token(s)."""
        need = sum(self.kv.num_new_blocks(r, r.num_tokens_to_compute) for r in decodes)
        return need <= self.kv.num_free_blocks

    @staticmethod
    def _mixable(prefills, decodes) -> bool:
        reqs = [r for r, _ in prefills] + decodes
        if any(r.params.logprobs or r.has_input_embeds for r in reqs):
            return False
        return all(r.beam_group is None for r in decodes)

    def _schedule(self) -> SchedulerOutput:
        cfg = self.config
        decodes = [r for r in self.running if r.is_decode]
        reserve = sum(r.num_tokens_to_compute for r in decodes) if cfg.enable_mixed_chunk else 0
        budget = cfg.chunked_prefill_size - reserve
        prefills = []
        if budget > 0:
            prefills, _ = self._take_prefills(budget)
        if prefills:
            if (cfg.enable_mixed_chunk and decodes and self._mixable(prefills, decodes)
                    and self.check_decode_mem(decodes)):
                rows = []
                for r in decodes:
                    n = r.num_tokens_to_compute
                    ok = self.kv.allocate_slots(r, n)
                    assert ok, "check_decode_mem passed, so the blocks exist"
                    rows.append((r, n))
                return self._output(prefills + rows, cfg.chunked_prefill_size, ForwardMode.MIXED)
            return self._output(prefills, cfg.chunked_prefill_size, ForwardMode.EXTEND, skipped=decodes)
        rows, skipped = self._schedule_decodes(decodes, cfg.chunked_prefill_size)
        return self._output(rows, cfg.chunked_prefill_size, skipped=skipped)
