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

import hashlib
import itertools
import time
from typing import Callable, Iterable, Sequence

import torch

from .config import EngineConfig
from .graph_dispatch import plan_graph
from .hooks import NULL_TRACER, Tracer
from .input_batch import prepare_inputs
from .kv_cache import KVCacheManager, allocate_kv_cache
from .model import Model, build_model
from .records import StepRecord, TokenEvent, to_timeline
from .request import InvalidRequest, Request, SamplingParams, Status
from .sampler import sample
from .schedulers import make_scheduler


class Engine:
    """A mixed-batch inference engine over a paged KV cache (one process, one device)."""

    def __init__(self, config: EngineConfig | None = None, model: Model | None = None, tracer: Tracer | None = None):
        self.config = config = config or EngineConfig()
        torch.set_num_threads(config.threads)
        self.device = torch.device(config.device)
        self.model = model if model is not None else build_model(config.model, self.device)
        self.kv_cache = allocate_kv_cache(config.model, config.cache, self.device)
        self.kv_manager = KVCacheManager(config.cache)
        self.scheduler = make_scheduler(config.scheduler, self.kv_manager, config.model.max_model_len,
                                        config.model.eos_token_id)
        self.tracer = tracer or NULL_TRACER
        self.observers: list[Callable[[StepRecord], None]] = []   # each gets every StepRecord
        self.before_step: list[Callable[[int], None]] = []        # each gets the step number first
        self.kv_connector = None   # PD split: receives remote-prefilled KV (engine/faults.py PDConnector)
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
        need = self.kv_manager.blocks_for(min(len(prompt) + params.max_tokens, mc.max_model_len))
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
            with tr.range("kv_transfer"):
                kv_bytes, kv_s = self.kv_connector.receive()
        with tr.range("schedule"):
            out = self.scheduler.schedule()
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
        msg = (f"step {n} kind={rec.kind} prefill_tokens={rec.prefill_tokens} decode_reqs={rec.decode_reqs} "
               f"decode_rows={rec.decode_rows} graph={rec.graph_mode}")
        c4 = c1
        if not out.is_empty:
            with tr.range("step", msg, out.total_num_scheduled_tokens):
                with tr.range("prepare_inputs"):
                    batch = prepare_inputs(out, self.kv_manager, self.device)
                c2 = time.perf_counter()
                with tr.range("forward"):
                    logits = self.model(batch, self.kv_cache)
                    if self.device.type == "cuda":
                        torch.cuda.synchronize(self.device)
                c3 = time.perf_counter()
                with tr.range("sample"):
                    reqs = [self.scheduler.requests[r] for r in batch.sample_req_ids]
                    tokens = sample(logits, reqs)
                c4 = time.perf_counter()
            rec.prepare_s, rec.forward_s, rec.sample_s = c2 - c1, c3 - c2, c4 - c3
            res = self.scheduler.update_from_output(out, {r: [t] for r, t in zip(batch.sample_req_ids, tokens)})
            t_tok = t_start + (c4 - c0)
            for rid, toks in res.new_tokens.items():
                req = self.scheduler.requests.get(rid) or next(r for r in res.finished if r.request_id == rid)
                first = req.first_token_s is None
                if first:
                    req.first_token_s = t_tok
                rec.token_events.append(TokenEvent(rid, t_tok, len(toks), first))
                rec.output_tokens += len(toks)
            for req in res.finished:
                self._finished[req.request_id] = req
        rec.t_end_s = t_start + (time.perf_counter() - c0)
        rec.running_reqs = self.scheduler.num_running
        rec.waiting_reqs = self.scheduler.num_waiting
        rec.kv_usage = self.kv_manager.usage
        self.step_no += 1
        for obs in self.observers:
            obs(rec)
        return rec

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
