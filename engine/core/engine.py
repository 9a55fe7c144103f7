"""The engine: requests in, one scheduled forward step at a time, a :class:`StepRecord` per step.

::

    eng = Engine(EngineConfig())
    rid = eng.add_request([5, 17, 42], SamplingParams(max_tokens=8))
    records = eng.run()                 # until every request finished
    eng.output(rid)                     # the generated token ids

A step: ``before_step`` hooks (fault injection) -> ``schedule`` -> ``prepare_inputs`` (flat token
stream) -> ``forward`` -> ``sample`` -> bookkeeping -> ``observers`` see the record. Ranges named
as docs/contracts.md §2 open on ``engine.tracer``; the ``step`` range opens once the schedule is
known (its message carries the batch shape) and covers prepare_inputs, forward and sample.
"""
from __future__ import annotations

import dataclasses
import hashlib
import itertools
import math
import time
from typing import Callable, Iterable, Sequence

import torch

from mixdiag.engine.model import microbatch
from mixdiag.engine.config import EngineConfig
from mixdiag.engine.model.cuda_graphs import build_runner, graphs_enabled
from mixdiag.engine.model.drafter import DrafterConfig, NgramDrafter
from mixdiag.engine.model.graph_dispatch import plan_graph
from mixdiag.engine.hooks import NULL_TRACER, Tracer, step_stats_message
from mixdiag.engine.core.input_batch import prepare_inputs
from mixdiag import wire
from mixdiag.wire import format_step
from mixdiag.engine.core.kv_cache import KVCacheManager, allocate_kv_cache
from mixdiag.engine.model.model import Model, build_model
from mixdiag.engine.core.prefix_cache import PrefixCachingKVManager
from mixdiag.engine.core.records import StepRecord, TokenEvent, to_timeline
from mixdiag.engine.core.request import InvalidRequest, Request, SamplingParams, Status
from mixdiag.engine.core.sampler import _draw_seed, sample
from mixdiag.engine.core.schedulers import make_scheduler
from mixdiag.engine.model.spec_decode import SpecDecoder
from mixdiag.engine.model.triton_attention import select_backend


class Engine:
    """A mixed-batch inference engine over a paged KV cache (one process, one device)."""

    def __init__(self, config: EngineConfig | None = None, model: Model | None = None, tracer: Tracer | None = None):
        self.config = config = config or EngineConfig()
        torch.set_num_threads(config.threads)
        self.device = torch.device(config.device)
        self.model = model if model is not None else build_model(config.model, self.device)
        # With CUDA graphs the pool tensor has one scratch block past num_blocks (padding rows).
        use_graphs = graphs_enabled(config, self.device)
        pool = dataclasses.replace(config.cache, num_blocks=config.cache.num_blocks + 1) if use_graphs else config.cache
        self.kv_cache = allocate_kv_cache(config.model, pool, self.device)
        self.kv_manager = (PrefixCachingKVManager(config.cache, allow_inflight_hits=config.cache.allow_inflight_prefix_hits)
                           if config.cache.enable_prefix_caching else KVCacheManager(config.cache))
        self.model.attn_backend = select_backend(self.device)   # Triton on CUDA, PyTorch reference on CPU
        k = config.scheduler.num_spec_tokens
        self.spec = (SpecDecoder(NgramDrafter(DrafterConfig(num_spec_tokens=k, pad_to_k=True)),
                                 config.model.max_model_len) if k else None)
        self.microbatch = microbatch.MicroBatchConfig(enabled=config.scheduler.enable_microbatching,
                                                      min_tokens=config.scheduler.microbatch_min_tokens)
        self.graph_runner = build_runner(self.model, self.kv_cache, config, self.model.attn_backend) if use_graphs else None
        self.scheduler = make_scheduler(config.scheduler, self.kv_manager, config.model.max_model_len,
                                        config.model.eos_token_id)
        self.tracer = tracer or NULL_TRACER
        self.observers: list[Callable[[StepRecord], None]] = []   # each gets every StepRecord
        self.before_step: list[Callable[[int], None]] = []        # each gets the step number first
        self.kv_connector = None   # PD split: receives remote-prefilled KV (engine/testbed/pd_connector.py PDConnector)
        self.step_no = 0
        self._ids = itertools.count()
        self._finished: dict[str, Request] = {}

    @property
    def tracer(self) -> Tracer:
        return self._tracer

    @tracer.setter
    def tracer(self, tracer: Tracer) -> None:
        self._tracer = tracer
        self.model.tracer = tracer

    # ---- requests --------------------------------------------------------------------------
    def add_request(self, prompt_token_ids: Sequence[int], params: SamplingParams | None = None, *,
                    request_id: str | None = None, arrival_s: float | None = None,
                    has_input_embeds: bool = False, beam_group: str | None = None,
                    remote_prefill: bool = False) -> str:
        """Queue a request; returns its id. Raises :class:`InvalidRequest` and changes nothing on bad input."""
        params = SamplingParams() if params is None else params
        if not isinstance(params, SamplingParams):
            raise InvalidRequest(f"params must be SamplingParams, got {type(params).__name__}")
        mc = self.config.model
        prompt = list(prompt_token_ids) if not isinstance(prompt_token_ids, (str, bytes)) else None
        if not prompt:
            raise InvalidRequest("prompt must be a non-empty sequence of token ids")
        if not all(isinstance(t, int) and not isinstance(t, bool) and 0 <= t < mc.vocab_size for t in prompt):
            raise InvalidRequest(f"prompt token ids must be integers in [0, {mc.vocab_size})")
        if len(prompt) >= mc.max_model_len:
            raise InvalidRequest(f"prompt of {len(prompt)} tokens is too long: max_model_len is {mc.max_model_len} "
                                 "(including at least one output token)")
        # drafts (k per decode step) may sit past the last output token before verification
        need = self.kv_manager.blocks_for(min(len(prompt) + params.max_tokens + self.config.scheduler.num_spec_tokens,
                                              mc.max_model_len))
        if need > self.config.cache.num_blocks:
            raise InvalidRequest(f"request needs up to {need} KV blocks but the pool has "
                                 f"{self.config.cache.num_blocks}; lower max_tokens or enlarge the cache")
        rid = str(request_id) if request_id is not None else f"req-{next(self._ids)}"
        if rid in self.scheduler.requests or rid in self._finished or (
                self.kv_connector is not None and rid in self.kv_connector.waiting):
            raise InvalidRequest(f"request id {rid!r} is already in use")
        seed = params.seed if params.seed is not None else _derive_seed(self.config.seed, rid)
        req = Request(rid, prompt, params, time.time() if arrival_s is None else arrival_s, sampling_seed=seed,
                      has_input_embeds=has_input_embeds, beam_group=beam_group)
        if remote_prefill:  # PD: a prefill worker computes the prompt's KV; the connector queues it on arrival
            if self.kv_connector is None:
                raise InvalidRequest("remote_prefill needs a kv_connector (a [faults.pd_transfer] scenario)")
            self.kv_connector.submit(req)
        else:
            self.scheduler.add_request(req)
        return rid

    def abort(self, request_id: str) -> bool:
        """Stop a request and free its KV blocks; False if it is unknown or already finished."""
        req = self.scheduler.requests.get(request_id)
        if req is None or not self.scheduler.abort(request_id):
            return False
        self._finished[request_id] = req
        return True

    def has_unfinished(self) -> bool:
        return self.scheduler.has_unfinished() or (self.kv_connector is not None and self.kv_connector.has_pending())

    def request(self, request_id: str) -> Request:
        """A request by id, finished or not."""
        req = self.scheduler.requests.get(request_id) or self._finished.get(request_id)
        if req is None and self.kv_connector is not None:
            req = self.kv_connector.waiting.get(request_id)
        if req is None:
            raise KeyError(request_id)
        return req

    def output(self, request_id: str) -> list[int]:
        """Generated token ids of a request so far."""
        return list(self.request(request_id).output_token_ids)

    # ---- stepping --------------------------------------------------------------------------
    @torch.inference_mode()
    def step(self) -> StepRecord:
        """Schedule and run one forward step; returns its record (kind 'idle' when nothing ran)."""
        n = self.step_no
        for hook in self.before_step:
            hook(n)
        tr = self._tracer
        t_start = time.time()
        c0 = time.perf_counter()
        kv_bytes, kv_s = 0, 0.0
        if self.kv_connector is not None:  # PD: read/install KV that arrived, queue those requests
            with tr.range(wire.KV_TRANSFER):
                kv_bytes, kv_s = self.kv_connector.receive()
        prefix = self.kv_manager if isinstance(self.kv_manager, PrefixCachingKVManager) else None
        if prefix is not None:
            prefix.begin_step(n)
        with tr.range(wire.SCHEDULE):
            out = self.scheduler.schedule()
            if self.spec is not None:
                self.spec.trim(out)   # drafts beyond the rows the budget gave
        c1 = time.perf_counter()
        nst = [out.num_scheduled_tokens[r.request_id] for r in out.requests]
        plan = plan_graph(nst, not out.prefill_req_ids, self.config.scheduler)
        rec = StepRecord(step=n, t_start_s=t_start, t_end_s=t_start, kind=out.kind,
                         prefill_tokens=out.num_prefill_tokens, prefill_reqs=len(out.prefill_req_ids),
                         decode_reqs=len(out.decode_req_ids), decode_rows=out.num_decode_rows,
                         graph_mode=plan.mode, graph_bucket=plan.bucket, graph_replayed=False,
                         preempted_reqs=len(out.preempted_req_ids),
                         stalled_decode_reqs=len(out.skipped_decode_req_ids), forward_mode=out.forward_mode.value,
                         token_budget=out.token_budget, num_scheduled_tokens=dict(out.num_scheduled_tokens),
                         schedule_s=max(0.0, c1 - c0 - kv_s), kv_transfer_bytes=float(kv_bytes), kv_transfer_s=kv_s)
        self._prefix_and_microbatch(out, rec)
        msg = format_step(n, rec.kind, rec.prefill_tokens, rec.decode_reqs, rec.decode_rows, rec.graph_mode)
        c4 = c1
        if not out.is_empty:
            with tr.range(wire.STEP, msg, out.total_num_scheduled_tokens):
                with tr.range(wire.PREPARE_INPUTS):
                    batch = prepare_inputs(out, self.kv_manager, self.device)
                c2 = time.perf_counter()
                with tr.range(wire.FORWARD):
                    if self.graph_runner is not None:
                        logits, run = self.graph_runner.execute(batch, plan.mode, plan.bucket)
                        rec.graph_replayed = run.replayed
                        rec.graph_mode_ran = run.mode
                    else:
                        logits = self.model(batch, self.kv_cache)
                    if self.device.type == "cuda":
                        torch.cuda.synchronize(self.device)
                if prefix is not None:
                    prefix.end_step(n)   # the step's KV is written: its new cached blocks become hittable
                c3 = time.perf_counter()
                with tr.range(wire.SAMPLE):
                    if self.spec is not None:   # verification rows: greedy match / rejection sampling
                        sampled, sst = self.spec.sample(logits, batch, self.scheduler.requests, sample,
                                                        self._generator_for, self.spec.draft_counts(out))
                        rec.spec_draft_tokens, rec.spec_accepted_tokens = sst.draft_tokens, sst.accepted_tokens
                    else:
                        reqs = [self.scheduler.requests[r] for r in batch.sample_req_ids]
                        sampled = {r: [t] for r, t in zip(batch.sample_req_ids, sample(logits, reqs))}
                c4 = time.perf_counter()
            rec.prepare_s, rec.forward_s, rec.sample_s = c2 - c1, c3 - c2, c4 - c3
            res = self.scheduler.update_from_output(out, sampled)
            if self.spec is not None:
                self.spec.rollback(out, self.kv_manager)   # rejected drafts' KV positions
            t_tok = t_start + (c4 - c0)
            for rid, toks in res.new_tokens.items():
                req = self.scheduler.requests.get(rid) or next(r for r in res.finished if r.request_id == rid)
                first = req.first_token_s is None
                if first:
                    req.first_token_s = t_tok
                rec.token_events.append(TokenEvent(rid, t_tok, len(toks), first, req.arrival_s if first else math.nan,
                                                   req.num_prompt_tokens if first else math.nan))
                rec.output_tokens += len(toks)
            for req in res.finished:
                self._finished[req.request_id] = req
        if prefix is not None:
            prefix.end_step(n)   # (again for an empty step; idempotent)
        if self.spec is not None:
            self.spec.propose(self.scheduler.running)   # drafts for the next step
        rec.t_end_s = t_start + (time.perf_counter() - c0)
        rec.running_reqs = self.scheduler.num_running
        rec.waiting_reqs = self.scheduler.num_waiting
        rec.kv_usage = self.kv_manager.usage
        self.step_no += 1
        for obs in self.observers:
            obs(rec)
        # Values known only after the forward (and after observers such as the EP injector filled
        # them) ride on a short step_stats range; its text is built only when a range is recorded.
        if not out.is_empty and tr.recording():
            with tr.range(wire.STEP_STATS, step_stats_message(rec)):
                pass
        return rec

    def _prefix_and_microbatch(self, out, rec: StepRecord) -> None:
        """Prefix-cache tokens of the step and the micro-batching gate's decision, onto ``rec``."""
        kv = self.kv_manager
        hits = {}
        if isinstance(kv, PrefixCachingKVManager):
            st = kv.prefix_cache.stats
            rec.prefix_hit_tokens, rec.prefix_query_tokens = st.step_hits, st.step_queries
            hits = kv.step_hits
        reqs = out.requests
        inflight = [bool(hits.get(r.request_id) and hits[r.request_id].inflight_hit_blocks) for r in reqs]
        d = microbatch.decide(self.microbatch, [out.num_scheduled_tokens[r.request_id] for r in reqs],
                              [r.num_computed_tokens for r in reqs], inflight)
        rec.ubatch_split, rec.ubatch_reason = d.split, d.reason

    def _generator_for(self, req: Request) -> torch.Generator:
        """The seeded generator of a request's next random draw (as the sampler seeds it)."""
        g = torch.Generator(device=self.device)
        return g.manual_seed(_draw_seed(req.sampling_seed, req.num_output_tokens))

    def run(self, max_steps: int | None = None, progress=None) -> list[StepRecord]:
        """Step until no request is left (or ``max_steps``); returns the records."""
        records = []
        while self.has_unfinished() and (max_steps is None or len(records) < max_steps):
            records.append(self.step())
            if progress is not None:
                progress.update(1)
        return records

    def generate(self, prompts: Iterable[Sequence[int]], params: SamplingParams | None = None) -> list[list[int]]:
        """Run ``prompts`` together to completion; their outputs in order."""
        ids = [self.add_request(p, params) for p in prompts]
        self.run()
        return [self.output(i) for i in ids]

    def timeline(self, records: Iterable[StepRecord], meta: dict | None = None):
        """The records as a Timeline of this engine's instance."""
        return to_timeline(records, self.config.instance, meta)


def _derive_seed(seed: int, request_id: str) -> int:
    """A stable per-request sampling seed (Python's str hash is salted per process)."""
    h = hashlib.blake2b(f"{seed}:{request_id}".encode(), digest_size=8).digest()
    return int.from_bytes(h, "little") >> 2
