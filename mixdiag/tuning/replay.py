"""Discrete-event replay of a workload through the engine's own scheduler on a modelled clock.

Nothing of a policy is copied here: each step calls ``Scheduler.schedule()`` of the real class
(``token_budget`` = vLLM V1, ``mix_running`` = SGLang, ``prefill_first``) on real
:class:`~mixdiag.engine.core.request.Request` objects and a real
:class:`~mixdiag.engine.core.kv_cache.KVCacheManager` block pool, then skips the model forward:
the clock advances by the cost model's duration for the step's shape, every request the plan
samples gets one token (its value is irrelevant: requests run to their output length), and
``Scheduler.update_from_output`` does the bookkeeping (finishing, freeing KV) as in the engine.

Requests arrive when the clock passes their arrival (checked before each step, as the testbed's
runner does); an empty engine jumps to the next arrival. Not modelled: speculative decoding, the
prefix cache, PD transfer, CUDA-graph padding (the cost model sees the shape only).

The engine (and torch) is imported inside the functions, never at module import.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from mixdiag.tuning.cost_model import StepShape

SAMPLED_TOKEN = 0   # any id but EOS; requests ignore EOS anyway


@dataclass
class ReplayResult:
    """Per-token ITL and per-request TTFT of one replay, with its step sequence when kept."""

    itl_s: np.ndarray
    ttft_s: np.ndarray
    output_tokens: int
    makespan_s: float            # first arrival -> last token
    n_steps: int
    preemptions: int
    steps: list = field(default_factory=list)     # (kind, prefill_tokens, decode_rows) per step, if kept
    shapes: list = field(default_factory=list)    # StepShape per step, if kept
    max_step_tokens: int = 0                      # the largest step replayed (prefill tokens + decode rows)

    def metrics(self) -> dict:
        """P50/P99 ITL and TTFT (s), output throughput (tokens/s), steps and preemptions."""
        return pooled_metrics([self])


def run_quantile_upper(n: int, q: float = 0.99, conf: float = 0.95) -> float:
    """The level ``x`` such that the ``q``-quantile of a run of ``n`` samples stays at or below the
    distribution's ``x``-quantile with probability ``conf``: the sample quantile (the ``ceil(q n)``-th
    smallest) is <= Q(x) iff Binomial(n, x) >= ceil(q n); solved for x by bisection (exact
    binomial tail in log space). E.g. n = 100: 0.9965; n = 9000: 0.9917."""
    if n <= 0:
        return q
    k = max(1, math.ceil(q * n))

    def tail(x: float) -> float:   # P(Binomial(n, x) >= k)
        lx, l1 = math.log(x), math.log1p(-x)
        base = math.lgamma(n + 1)
        return sum(math.exp(base - math.lgamma(i + 1) - math.lgamma(n - i + 1) + i * lx + (n - i) * l1)
                   for i in range(k, n + 1))

    lo, hi = q, 1.0 - 1e-12
    if tail(hi) < conf:
        return 1.0
    for _ in range(60):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if tail(mid) < conf else (lo, mid)
    return hi


def pooled_metrics(results: list[ReplayResult]) -> dict:
    """Metrics of replicate replays (other jitter seeds) pooled: quantiles over all their tokens and
    requests, throughput, steps and preemptions averaged.

    ``itl_p99_hi_s``: the P99 ITL one run of this traffic stays under with 95 % probability (the
    pooled ITLs' quantile at :func:`run_quantile_upper` of one run's token count). Mixing makes ITL
    bimodal - decode steps, and rare slow mixed steps - and when the slow share is near 1 % a run's
    P99 falls on either side of that cliff; the recommendation ranks by this bound, not by a P99 a
    0.2 % shift of the slow share flips (bench_tune: chunk 4096 predicted 30 ms, real 198-233 ms)."""
    itl = np.concatenate([r.itl_s for r in results])
    ttft = np.concatenate([r.ttft_s for r in results])
    q = lambda a, p: float(np.quantile(a, p)) if len(a) else math.nan  # noqa: E731
    span = sum(r.makespan_s for r in results)
    n = len(results)
    q_hi = run_quantile_upper(int(round(len(itl) / max(n, 1))))
    return {"itl_p50_s": q(itl, 0.5), "itl_p99_s": q(itl, 0.99), "itl_p99_hi_s": q(itl, q_hi),
            "ttft_p50_s": q(ttft, 0.5), "ttft_p99_s": q(ttft, 0.99),
            "throughput_tok_s": sum(r.output_tokens for r in results) / span if span > 0 else math.nan,
            "steps": sum(r.n_steps for r in results) / n, "preemptions": sum(r.preemptions for r in results) / n,
            "max_step_tokens": max((r.max_step_tokens for r in results), default=0)}


#: requests a setting's P99 TTFT is estimated over: a short input is replayed with this many
#: requests' worth of jitter seeds and pooled (one replay of 100 requests puts its P99 TTFT on the
#: single slowest request: seed-to-seed spread +-15 % measured), at most MAX_REPLICATES times
POOLED_REQUESTS = 2000
MAX_REPLICATES = 16


def replicates(n_requests: int) -> int:
    """How many seeds to replay a workload of ``n_requests`` under (1 for long inputs)."""
    return max(1, min(MAX_REPLICATES, -(-POOLED_REQUESTS // max(n_requests, 1))))


class ModelTiming:
    """Step ``i`` lasts ``cost.step_s(shape)`` with a residual of the step's class (decode-only or
    with prefill; :meth:`FittedCost.jittered_s`); the next step starts ``cost.gap_s`` after it ends.

    The ratios are replayed in blocks of :data:`BLOCK` consecutive recorded steps of the class from
    seeded random starts (a block bootstrap), not drawn one by one: slow steps come in runs (a
    neighbour's burst, a clock change; measured on the reference engine: autocorrelation of the log
    ratio 0.25 at lag 1-2, 0.4 between consecutive prefill steps, ~0.1 at lag 10), and a long
    prompt's chunks, which make its TTFT, fall in one such run. Every setting sees the same draws."""

    def __init__(self, cost, seed: int = 0):
        self.cost = cost
        jitter = getattr(cost, "jitter", ())
        ok = bool(jitter) and all(len(j) for j in jitter)
        rng = np.random.default_rng(seed)
        self._draws = [_blocks(np.asarray(j, dtype=float), rng) for j in jitter] if ok else None
        self._k = [0] * len(jitter)

    def __call__(self, i: int, shape: StepShape) -> tuple[float, float]:
        base = self.cost.step_s(shape)
        if self._draws is None:
            return base, self.cost.gap_s
        c = shape.jitter_class
        ratio, on_s = self._draws[c][self._k[c] & 0xFFFF]
        self._k[c] += 1
        return self.cost.jittered_s(base, float(ratio), float(on_s)), self.cost.gap_s


#: steps per bootstrap block (the log-ratio autocorrelation has decayed to ~0.1 by lag 10)
BLOCK = 32


def _blocks(seq: np.ndarray, rng, n: int = 1 << 16) -> np.ndarray:
    """``n`` rows of ``seq`` (in recorded order) as blocks of BLOCK from random starts, wrapping."""
    starts = rng.integers(0, len(seq), -(-n // BLOCK))
    idx = (starts[:, None] + np.arange(BLOCK)[None, :]) % len(seq)
    return seq[idx.reshape(-1)[:n]]


class RecordedTiming:
    """The recorded run's own step costs (relative starts and ends), step by step — for validation."""

    def __init__(self, starts, ends, t0: float):
        self.starts = [float(s) - t0 for s in starts]
        self.ends = [float(e) - t0 for e in ends]

    def __call__(self, i: int, shape: StepShape) -> tuple[float, float]:
        if i >= len(self.starts):
            return 0.0, 0.0
        dur = self.ends[i] - self.starts[i]
        gap = self.starts[i + 1] - self.ends[i] if i + 1 < len(self.starts) else 0.0
        return dur, gap

    def start(self, i: int) -> float | None:
        return self.starts[i] if i < len(self.starts) else None


def replay(requests, timing, scheduler, cache, max_model_len: int = 16384, *, keep_steps: bool = False,
           max_steps: int = 5_000_000, ttft_from_admission: bool = False, frontend=None) -> ReplayResult:
    """Replay ``requests`` (:class:`~mixdiag.tuning.traffic.RequestSpec`, sorted by arrival) under
    ``scheduler`` (a SchedulerConfig) and ``cache`` (a CacheConfig); ``timing(i, shape)`` gives
    step ``i``'s (duration, gap to the next step) — :class:`ModelTiming` or :class:`RecordedTiming`.

    TTFT counts from the arrival, or with ``ttft_from_admission`` from the step boundary where the
    request joins the scheduler: what the data's TTFT measured when its arrival stamps are
    admissions (an engine that stamps requests as its loop picks them up between steps), so the
    wait for the step in flight — up to a whole large chunk — is not counted.

    ``frontend(t)``: the delay from a step ending at ``t`` to its tokens reaching the client
    (:meth:`mixdiag.tuning.frontend.FrontEndDelay.sampler`); ITL and TTFT are then the client's
    (a stream delivers in order: a token never arrives before the previous one)."""
    from mixdiag.engine.core.kv_cache import KVCacheManager
    from mixdiag.engine.core.request import Request, SamplingParams
    from mixdiag.engine.core.schedulers import make_scheduler

    eos = 1
    sched = make_scheduler(scheduler, KVCacheManager(cache), max_model_len, eos)
    pool_tokens = cache.num_blocks * cache.block_size
    t0 = requests[0].arrival_s if requests else 0.0
    pending = [(r.arrival_s - t0, r) for r in requests]
    nxt, now, step = 0, 0.0, 0
    arrival: dict[str, float] = {}
    last_tok: dict[str, float] = {}
    itl, ttft = [], []
    out_tokens = preempt = 0
    steps, shapes = [], []
    max_tokens = 0
    recorded = timing.start if isinstance(timing, RecordedTiming) else None
    while (nxt < len(pending) or sched.has_unfinished()) and step < max_steps:
        if recorded is not None and recorded(step) is not None:
            now = max(now, recorded(step))
        if not sched.has_unfinished() and pending[nxt][0] > now:
            now = pending[nxt][0]      # idle: jump to the next arrival (no idle steps, as the runner)
        while nxt < len(pending) and pending[nxt][0] <= now:
            rel, spec = pending[nxt]
            nxt += 1
            plen, olen = _fit(spec.prompt_tokens, spec.output_tokens, max_model_len, pool_tokens, cache.block_size)
            req = Request(spec.request_id, [SAMPLED_TOKEN] * plen, SamplingParams(max_tokens=olen, ignore_eos=True), rel)
            arrival[req.request_id] = now if ttft_from_admission else rel
            sched.add_request(req)
        out = sched.schedule()
        shape = _shape(out)
        max_tokens = max(max_tokens, shape.prefill_tokens + shape.decode_rows)
        dur, gap = timing(step, shape)
        t_tok = now + dur
        preempt += len(out.preempted_req_ids)
        res = sched.update_from_output(out, {rid: [SAMPLED_TOKEN] for rid in out.sample_req_ids})
        t_cli = t_tok if frontend is None else t_tok + frontend(t_tok)
        for rid, toks in res.new_tokens.items():
            prev = last_tok.get(rid)
            t_r = t_cli if prev is None else max(t_cli, prev)
            if prev is None:
                ttft.append(t_r - arrival[rid])
            else:
                itl.append(t_r - prev)
            last_tok[rid] = t_r
            out_tokens += len(toks)
        if keep_steps:
            steps.append((out.kind, shape.prefill_tokens, shape.decode_rows))
            shapes.append(shape)
        now = t_tok + gap
        step += 1
    end = max(last_tok.values()) if last_tok else 0.0
    return ReplayResult(np.asarray(itl), np.asarray(ttft), out_tokens, end, step, preempt, steps, shapes,
                        max_step_tokens=max_tokens)


def _fit(plen: int, olen: int, max_model_len: int, pool_tokens: int, block_size: int) -> tuple[int, int]:
    """Clip a request to what the engine accepts (max_model_len, a pool that can hold it)."""
    cap = min(max_model_len, pool_tokens - block_size)
    plen = max(1, min(plen, cap - 1))
    return plen, max(1, min(olen, cap - plen))


def _shape(out) -> StepShape:
    """The step's shape: its prefill chunks' sizes and cached context, its decode rows' context."""
    n = out.num_scheduled_tokens
    pre = set(out.prefill_req_ids)
    p = d = 0
    kc = k2 = ctx = 0.0
    for req in out.requests:
        k = n[req.request_id]
        if req.request_id in pre:
            p += k
            kc += k * req.num_computed_tokens
            k2 += k * k
        else:
            d += k
            ctx += req.num_computed_tokens
    return StepShape(p, d, kc, k2, ctx)


def align(requests, rows, scheduler, cache, max_model_len: int) -> tuple[list[StepShape] | None, float]:
    """Replay the recorded run on its own step costs; if the step sequence matches the rows
    (kinds and token counts), return the replay's exact shapes, else None. Also the matched share."""
    if not len(rows) or not requests:
        return None, 0.0
    t0 = requests[0].arrival_s
    res = replay(requests, RecordedTiming(rows["t_start_s"], rows["t_end_s"], t0), scheduler, cache, max_model_len,
                 keep_steps=True, max_steps=len(rows) + 1)
    rec = list(zip(rows["kind"], rows["prefill_tokens"].astype(int), rows["decode_rows"].astype(int)))
    same = sum(1 for a, b in zip(res.steps, rec) if a == b)
    share = same / max(len(rec), 1)
    ok = len(res.steps) == len(rec) and same == len(rec)
    return (res.shapes if ok else None), share
