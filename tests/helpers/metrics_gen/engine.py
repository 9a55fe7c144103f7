"""A simulated serving engine's timeline: one record per forward step, with the requests' token
events, written from the engines' documented behaviour (docs/analyze.md, "Tier (e2)"), not from
mixdiag's engine or collectors.

Basis of the modelled behaviour:
- vLLM V1 scheduler: decodes first, then one prompt chunk up to the token budget
  (``max_num_batched_tokens``); a chunk emits no output until its last one
  (``vllm/v1/core/sched/scheduler.py``; ``IterationStats.update_from_output`` counts the whole prompt
  at the first output, ``vllm/v1/metrics/stats.py``).
- CUDA graphs: a decode-only batch above the largest capture size runs eager (NONE)
  (``CudagraphDispatcher.dispatch``: ``num_tokens > max_cudagraph_capture_size`` -> NONE).
- Preemption (recompute): the newest running request is evicted and later re-prefills prompt +
  generated tokens (``Scheduler.schedule`` ``_preempt_request``), so its next ITL is long.
- Host stall: the engine core idles before a step; the API server keeps serving /metrics.
- PD (NIXL) and EP hotspots slow every step of the episode (HBM writes by the NIC; the hot rank
  gates the all-to-all).
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from .schedule import Episode

#: a step carries "mixing" truth when it holds at least this many prompt tokens and a decode row
#: (the same bar as the real-vLLM tier: a chunk this large costs several decode steps)
MIXING_MIN_PROMPT_TOKENS = 256


@dataclass(frozen=True)
class EngineParams:
    """Costs and limits of one simulated deployment (drawn per trace by ``draw_params``)."""

    base_s: float = 0.015           # decode step floor (graph replay)
    per_row_s: float = 0.0001       # per decode row
    per_prompt_tok_s: float = 3e-5  # per prompt token in a step
    host_gap_s: float = 0.0006      # usual engine-loop gap between steps
    token_budget: int = 2048        # max_num_batched_tokens / chunked_prefill_size
    max_capture: int = 64           # largest CUDA-graph capture size (decode rows)
    target_running: int = 24        # background concurrency
    jitter: float = 0.03            # lognormal sigma of step time
    kv_blocks_frac: float = 0.55    # healthy KV usage

    def __post_init__(self):
        if min(self.base_s, self.per_row_s, self.per_prompt_tok_s, self.host_gap_s) <= 0:
            raise ValueError("costs must be positive")
        if not 0 < self.target_running < self.max_capture < self.token_budget:
            raise ValueError("need 0 < target_running < max_capture < token_budget")
        if not 0 <= self.jitter < 0.5 or not 0 < self.kv_blocks_frac < 0.9:
            raise ValueError("bad jitter / kv fraction")


def draw_params(rng: np.random.Generator) -> EngineParams:
    return EngineParams(
        base_s=float(rng.uniform(0.010, 0.030)), per_row_s=float(rng.uniform(5e-5, 2e-4)),
        per_prompt_tok_s=float(rng.uniform(1.8e-5, 4.5e-5)), host_gap_s=float(rng.uniform(3e-4, 1.5e-3)),
        token_budget=int(rng.choice([1024, 2048, 4096, 8192])), max_capture=int(rng.choice([32, 48, 64])),
        target_running=int(rng.integers(8, 28)), jitter=float(rng.uniform(0.02, 0.05)),
        kv_blocks_frac=float(rng.uniform(0.3, 0.6)))


@dataclass
class Req:
    rid: int
    prompt: int
    out_len: int
    t_arrival: float
    computed: int = 0          # prompt (+ recompute) tokens done
    need: int = 0              # tokens to prefill before the next output
    generated: int = 0
    t_first: float | None = None
    t_last: float | None = None
    t_sched: float | None = None
    preemptions: int = 0
    resume_at: int = -1        # step at which a preempted request may return


@dataclass
class Step:
    """One forward step as truth knows it."""

    idx: int
    t_start: float
    t_end: float
    gap_s: float
    ctx_reqs: int
    ctx_tokens: int
    gen_reqs: int
    eager: bool
    running: int
    waiting: int
    kv_usage: float
    preempted: int
    elapsed_s: float
    healthy_s: float              # same decode rows, graph replay, usual gap, no chunk
    causes: dict = field(default_factory=dict)   # cause -> magnitude
    excess: dict = field(default_factory=dict)   # cause -> token-seconds of ITL excess
    itl: list = field(default_factory=list)      # ITL samples of this step's outputs
    ttft: list = field(default_factory=list)
    prompt_done: int = 0          # prompt tokens of requests whose first token came here
    finished: list = field(default_factory=list)  # (prompt, gen, e2e, tpot, computed, queue_s)
    kv_xfer: list = field(default_factory=list)   # (seconds, bytes)
    ep_balancedness: float = 1.0


def simulate(params: EngineParams, episodes: tuple[Episode, ...], n_steps: int, seed: int,
             t0: float) -> list[Step]:
    """Run ``n_steps`` forward steps from unix time ``t0``."""
    rng = np.random.default_rng([seed, 0x51A7])
    reqs: list[Req] = []
    waiting: list[Req] = []
    next_id = 0
    steps: list[Step] = []
    t = t0
    long_req: Req | None = None

    def new_req(prompt: int, out_len: int) -> Req:
        nonlocal next_id
        next_id += 1
        r = Req(next_id, prompt, out_len, t)
        r.need = prompt
        return r

    for i in range(n_steps):
        act = {e.cause: e.magnitude for e in episodes if e.start <= i < e.end}
        # arrivals: keep background concurrency; a fallback episode adds a burst above the capture size
        target = params.target_running
        if "graph_fallback" in act:
            target = params.max_capture + 1 + int(rng.integers(0, params.max_capture // 2))
        while len(reqs) + len(waiting) < target:
            waiting.append(new_req(int(rng.integers(16, 128)), int(rng.integers(64, 400))))
        if "graph_fallback" not in act and len(reqs) > params.max_capture:
            # the burst ends with its episode: its extra requests finish (stop strings, max_tokens)
            for r in reqs[params.max_capture:]:
                r.out_len = r.generated + 1
        if "mixing" in act and (long_req is None or long_req.need == 0):
            long_req = new_req(int(act["mixing"]), int(rng.integers(32, 128)))
            waiting.insert(0, long_req)
        # KV pressure: evict the newest running request (recompute preemption)
        preempted = 0
        if "kv_pressure" in act and reqs and rng.random() < act["kv_pressure"]:
            r = reqs.pop()
            r.preemptions += 1
            r.need = r.prompt + r.generated
            r.computed = 0
            r.resume_at = i + int(rng.integers(2, 12))
            waiting.append(r)
            preempted = 1
        # schedule: decodes first, then prompt work within the budget
        decoding = [r for r in reqs if r.need == 0]
        budget = params.token_budget - len(decoding)
        ctx: list[tuple[Req, int]] = []
        for r in [r for r in reqs if r.need > 0] + [w for w in waiting if w.resume_at <= i]:
            if budget <= 0:
                break
            n = min(r.need, budget)
            ctx.append((r, n))
            budget -= n
        for r, _ in ctx:
            if r in waiting:
                waiting.remove(r)
                reqs.append(r)
                r.t_sched = r.t_sched or t
        ctx_tokens = sum(n for _, n in ctx)
        # step cost
        gen = len(decoding)
        eager = gen + ctx_tokens > params.max_capture and ctx_tokens == 0
        graph_s = params.base_s + params.per_row_s * gen
        dec_s = graph_s * (act.get("graph_fallback", 1.0) if eager else 1.0)
        if eager and "graph_fallback" not in act:
            dec_s = graph_s * 1.3   # eager above the capture size costs launch overhead anyway
        chunk_s = params.per_prompt_tok_s * ctx_tokens
        core = dec_s + chunk_s
        mult = act.get("ep_hotspot", 1.0) * act.get("pd_transfer", 1.0)
        step_s = core * mult * float(np.exp(rng.normal(0.0, params.jitter)))
        gap = params.host_gap_s * float(rng.uniform(0.7, 1.3))
        if "host_stall" in act:
            gap += act["host_stall"] * float(rng.uniform(0.8, 1.2))
        t_start = t + gap
        t_end = t_start + step_s
        st = Step(i, t_start, t_end, gap, len(ctx), ctx_tokens, gen, eager, 0, 0, 0.0, preempted,
                  step_s, graph_s + params.host_gap_s)
        # outputs
        for r in decoding:
            st.itl.append(t_end - r.t_last)
            r.t_last = t_end
            r.generated += 1
        resumed_itl_excess = 0.0
        for r, n in ctx:
            r.need -= n
            r.computed += n
            if r.need == 0:
                if r.t_first is None:
                    r.t_first = t_end
                    st.ttft.append(t_end - r.t_arrival)
                    st.prompt_done += r.prompt
                else:   # a preempted request's next token: one long ITL
                    itl = t_end - r.t_last
                    st.itl.append(itl)
                    resumed_itl_excess += max(itl - st.healthy_s, 0.0)
                r.t_last = t_end
                r.generated += 1
        for r in [r for r in reqs if r.need == 0 and r.generated >= r.out_len]:
            reqs.remove(r)
            e2e = t_end - r.t_arrival
            tpot = (t_end - r.t_first) / max(r.generated - 1, 1)
            st.finished.append((r.prompt, r.generated, e2e, tpot, r.prompt, (r.t_sched or r.t_arrival) - r.t_arrival))
        st.running, st.waiting = len(reqs), len(waiting)
        held = sum(r.computed + r.generated for r in reqs)
        # healthy usage ~ kv_blocks_frac at the background concurrency; only KV pressure nears 1
        st.kv_usage = min(0.9, params.kv_blocks_frac * held / max(1.0, 200.0 * params.target_running))
        if "kv_pressure" in act:
            st.kv_usage = float(rng.uniform(0.95, 0.999))
        # truth: causes present in this step and the ITL excess each added (token-seconds)
        rows = max(gen, 1)
        if ctx_tokens >= MIXING_MIN_PROMPT_TOKENS and gen > 0:
            st.causes["mixing"] = float(ctx_tokens)
            st.excess["mixing"] = chunk_s * mult * rows
        if eager and "graph_fallback" in act:
            st.causes["graph_fallback"] = act["graph_fallback"]
            st.excess["graph_fallback"] = (dec_s - graph_s) * mult * rows
        for c in ("ep_hotspot", "pd_transfer"):
            if c in act:
                st.causes[c] = act[c]
                st.excess[c] = core * (act[c] - 1.0) * rows
        if "host_stall" in act:
            st.causes["host_stall"] = act["host_stall"]
            st.excess["host_stall"] = (gap - params.host_gap_s) * rows
        if preempted or resumed_itl_excess > 0:
            st.causes["kv_pressure"] = act.get("kv_pressure", 0.0)
            st.excess["kv_pressure"] = resumed_itl_excess + (chunk_s * mult * rows if "mixing" not in st.causes and ctx_tokens else 0.0)
        if "pd_transfer" in act:
            n = int(rng.integers(1, 3))
            st.kv_xfer = [(step_s * float(rng.uniform(0.5, 2.0)), int(rng.integers(64, 4096)) * 131072) for _ in range(n)]
        if "ep_hotspot" in act:
            st.ep_balancedness = 1.0 / act["ep_hotspot"]
        else:
            st.ep_balancedness = float(rng.uniform(0.85, 0.97))
        steps.append(st)
        t = t_end
    return steps
