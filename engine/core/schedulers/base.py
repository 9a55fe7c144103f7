"""The scheduler interface: what every policy shares, and the typed :class:`SchedulerOutput`.

A policy decides, each step, how many tokens each request computes. Requests live in ``waiting``
(not admitted, or preempted) and ``running`` (admitted, in admission order: the first is the
highest priority). A running request is either mid-prefill (a chunked prompt, or a recompute after
preemption) or decoding (:attr:`Request.is_decode`). KV blocks come from ``kv_manager``
(:class:`~mixdiag.engine.core.kv_cache.KVCacheManager` or anything with the same methods).
"""
from __future__ import annotations

import abc
import enum
from collections import deque
from dataclasses import dataclass, field

from mixdiag.engine.config import SchedulerConfig
from mixdiag.engine.core.request import Request, Status


class ForwardMode(str, enum.Enum):
    """What the step's forward runs (SGLang's names): prefill only, decode only, both, nothing."""

    EXTEND = "EXTEND"
    DECODE = "DECODE"
    MIXED = "MIXED"
    IDLE = "IDLE"


@dataclass(frozen=True)
class SchedulerOutput:
    """One step's plan. ``requests`` is the flat-stream order; counts are per request id."""

    step: int
    requests: tuple[Request, ...]
    num_scheduled_tokens: dict[str, int]
    prefill_req_ids: tuple[str, ...]
    decode_req_ids: tuple[str, ...]
    forward_mode: ForwardMode
    token_budget: int
    preempted_req_ids: tuple[str, ...] = ()
    #: decoding requests that were running but sat out this step (no mixing, or no KV room)
    skipped_decode_req_ids: tuple[str, ...] = ()
    #: requests whose last scheduled row produces a sampled token this step
    sample_req_ids: tuple[str, ...] = ()

    @property
    def total_num_scheduled_tokens(self) -> int:
        return sum(self.num_scheduled_tokens.values())

    @property
    def num_prefill_tokens(self) -> int:
        return sum(self.num_scheduled_tokens[r] for r in self.prefill_req_ids)

    @property
    def num_decode_rows(self) -> int:
        return sum(self.num_scheduled_tokens[r] for r in self.decode_req_ids)

    @property
    def is_empty(self) -> bool:
        return not self.requests

    @property
    def kind(self) -> str:
        """Timeline step kind: prefill | decode | mixed | idle."""
        if self.prefill_req_ids and self.decode_req_ids:
            return "mixed"
        if self.prefill_req_ids:
            return "prefill"
        return "decode" if self.decode_req_ids else "idle"


@dataclass
class UpdateResult:
    """What applying a step's sampled tokens changed."""

    new_tokens: dict[str, list[int]] = field(default_factory=dict)  # request id -> tokens emitted
    finished: list[Request] = field(default_factory=list)


class Scheduler(abc.ABC):
    """Shared state and bookkeeping; policies implement :meth:`_schedule`."""

    policy = "base"

    def __init__(self, config: SchedulerConfig, kv_manager, max_model_len: int, eos_token_id: int):
        self.config = config
        self.kv = kv_manager
        self.max_model_len = max_model_len
        self.eos_token_id = eos_token_id
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self.requests: dict[str, Request] = {}
        self.step_no = 0
        self.num_preemptions = 0
        self._preempted: list[str] = []

    # ---- queue management ------------------------------------------------------------------
    def add_request(self, req: Request) -> None:
        self.requests[req.request_id] = req
        self.waiting.append(req)

    def abort(self, request_id: str) -> bool:
        """Drop a request wherever it is, free its KV; False if unknown or already finished."""
        req = self.requests.pop(request_id, None)
        if req is None:
            return False
        if req.status == Status.RUNNING:
            self.running.remove(req)
        else:
            self.waiting.remove(req)
        self.kv.free(request_id)
        req.status = Status.FINISHED_ABORTED
        return True

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running)

    @property
    def num_running(self) -> int:
        return len(self.running)

    @property
    def num_waiting(self) -> int:
        return len(self.waiting)

    def preempt(self, req: Request) -> None:
        """Preempt by recompute: free the KV, forget computed tokens, back to the front of waiting."""
        self.running.remove(req)
        self.kv.free(req.request_id)
        req.num_computed_tokens = 0
        req.spec_token_ids = []
        req.status = Status.WAITING
        req.num_preemptions += 1
        self.num_preemptions += 1
        self.waiting.appendleft(req)
        self._preempted.append(req.request_id)

    def admit(self, req: Request) -> None:
        """Move the head of ``waiting`` into ``running``."""
        assert self.waiting[0] is req
        self.waiting.popleft()
        req.status = Status.RUNNING
        self.running.append(req)

    # ---- one step --------------------------------------------------------------------------
    def schedule(self) -> SchedulerOutput:
        """Plan the next step. If nothing fits while requests run, retract the lowest-priority one."""
        self._preempted = []
        while True:
            out = self._schedule()
            if not out.is_empty or not self.running:
                break
            # Deadlock guard: partial prefills hold blocks and none can grow. Recompute the last.
            self.preempt(self.running[-1])
        self.step_no += 1
        return out

    @abc.abstractmethod
    def _schedule(self) -> SchedulerOutput:
        """The policy: which requests run this step and how many tokens each."""

    def _output(self, scheduled: list[tuple[Request, int]], budget: int, mode: ForwardMode | None = None,
                skipped: list[Request] = ()) -> SchedulerOutput:
        """Build the typed output; prefill/decode split and sampling rows follow the requests' state."""
        prefill, decode, sample = [], [], []
        for req, n in scheduled:
            (decode if req.is_decode else prefill).append(req.request_id)
            if req.num_computed_tokens + n >= req.num_tokens:
                sample.append(req.request_id)
        if mode is None:
            mode = (ForwardMode.MIXED if prefill and decode else ForwardMode.EXTEND if prefill
                    else ForwardMode.DECODE if decode else ForwardMode.IDLE)
        return SchedulerOutput(step=self.step_no, requests=tuple(r for r, _ in scheduled),
                               num_scheduled_tokens={r.request_id: n for r, n in scheduled},
                               prefill_req_ids=tuple(prefill), decode_req_ids=tuple(decode), forward_mode=mode,
                               token_budget=budget, preempted_req_ids=tuple(self._preempted),
                               skipped_decode_req_ids=tuple(r.request_id for r in skipped),
                               sample_req_ids=tuple(sample))

    def update_from_output(self, out: SchedulerOutput, sampled: dict[str, list[int]]) -> UpdateResult:
        """Advance computed counts, append sampled tokens, finish requests at EOS/limits, free KV."""
        res = UpdateResult()
        for req in out.requests:
            if req.status != Status.RUNNING:   # aborted between schedule and update
                continue
            req.num_computed_tokens += out.num_scheduled_tokens[req.request_id]
            toks = sampled.get(req.request_id)
            if not toks:
                continue
            req.spec_token_ids = []
            emitted = []
            for t in toks:
                req.append_output(t)
                emitted.append(t)
                status = self._stop_status(req, t)
                if status is not None:
                    self._finish(req, status)
                    res.finished.append(req)
                    break
            res.new_tokens[req.request_id] = emitted
        return res

    def _stop_status(self, req: Request, token: int) -> Status | None:
        if token == self.eos_token_id and not req.params.ignore_eos:
            return Status.FINISHED_STOPPED
        if req.num_output_tokens >= req.params.max_tokens or req.num_tokens >= self.max_model_len:
            return Status.FINISHED_LENGTH
        return None

    def _finish(self, req: Request, status: Status) -> None:
        req.status = status
        self.running.remove(req)
        self.kv.free(req.request_id)
        self.requests.pop(req.request_id, None)

    # ---- helpers for policies --------------------------------------------------------------
    def _prefix_hit(self, req: Request):
        """The prefix-cache hit ``req`` would get if admitted now (None without a prefix cache)."""
        match = getattr(self.kv, "match_prefix", None)
        return match(req) if match is not None else None

    def _allocate_admission(self, req: Request, n: int, hit) -> bool:
        """KV for an admission of ``n`` tokens after the hit (which the KV manager applies)."""
        return self.kv.allocate_slots(req, n) if hit is None else self.kv.allocate_slots(req, n, prefix=hit)

    def _chunk(self, req: Request, budget: int, threshold: int = 0, skip: int = 0) -> int:
        """Tokens ``req`` computes this step: what it needs (less ``skip`` prefix-cache hits), cut to
        ``threshold`` (if > 0) and ``budget``."""
        n = req.num_tokens_to_compute - skip
        if 0 < threshold < n:
            n = threshold
        return min(n, budget)

    def _take_prefills(self, budget: int, threshold: int = 0, max_seqs: int | None = None
                       ) -> tuple[list[tuple[Request, int]], int]:
        """Prefill work within ``budget``: running mid-prefill requests first, then admit waiting ones."""
        out = []
        for req in list(self.running):
            if budget <= 0:
                break
            if req.is_decode:
                continue
            n = self._chunk(req, budget, threshold)
            if not self.kv.allocate_slots(req, n):
                break
            out.append((req, n))
            budget -= n
        max_seqs = self.config.max_num_seqs if max_seqs is None else max_seqs
        while self.waiting and budget > 0 and len(self.running) < max_seqs:
            req = self.waiting[0]
            hit = self._prefix_hit(req)
            n = self._chunk(req, budget, threshold, skip=hit.hit_tokens if hit else 0)
            if not self._allocate_admission(req, n, hit):
                break
            self.admit(req)
            out.append((req, n))
            budget -= n
        return out, budget

    def _schedule_decodes(self, decodes: list[Request], budget: int) -> tuple[list[tuple[Request, int]], list[Request]]:
        """Next tokens for decoding requests within ``budget``; out of KV, preempt from the back of ``running``.

        Returns (scheduled rows, decodes that did not fit the budget).
        """
        out, skipped = [], []
        for req in decodes:
            if req.status != Status.RUNNING:   # preempted as a victim below
                continue
            n = req.num_tokens_to_compute
            if n > budget:
                skipped.append(req)
                continue
            ok = True
            while not self.kv.allocate_slots(req, n):
                victim = self.running[-1]
                self.preempt(victim)
                budget += sum(k for r, k in out if r is victim)   # its tokens are no longer planned
                out = [(r, k) for r, k in out if r is not victim]
                if victim is req:
                    ok = False
                    break
            if ok:
                out.append((req, n))
                budget -= n
        return out, skipped
