"""Step plans: which batch each step runs and which fault (if any) shaped it — the ground truth.

A plan is drawn before any trace row exists, so the truth never depends on how rows are written.
Workload facts it follows (sources in docs/foreign-trace-simulator.md):

- vLLM V1 chunked prefill charges decode rows to the token budget and fills the rest with one
  prompt's chunk, so a long prompt becomes several *mixed* steps (``mixing``).
- SGLang without ``--enable-mixed-chunk`` runs a prefill batch on its own while running decodes wait
  (``prefill_stall``; sglang PR #35300 measured 96-98 % of prefill steps stranding decodes).
- A decode batch larger than the largest capture size runs eager (``graph_fallback``).
- PD disaggregation: a finished prefill's KV arrives at the decode instance, then the request joins
  the decode batch (``pd_transfer``).
- EP: one rank receives more tokens for its experts and computes longer (``ep_hotspot``).
- A host stall (GC, tokenizer, scheduler) leaves the GPU idle before a step (``host_stall``).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .engines import CostModel, EngineSpec

FAULTS = ("mixing", "prefill_stall", "ep_hotspot", "pd_transfer", "graph_fallback", "host_stall")
DEFAULT_FAULTS = {
    "vllm": ("mixing", "graph_fallback", "host_stall", "pd_transfer"),
    "sglang": ("prefill_stall", "graph_fallback", "host_stall", "pd_transfer"),
    "ep2": ("ep_hotspot", "mixing", "host_stall"),
}


@dataclass
class StepPlan:
    """One engine step as scheduled (all ranks); per-rank rows in ``decode_rows``."""

    step: int
    cause: str
    prefill_tokens: int            # on rank 0 (EP: the rank that admitted the prompt)
    decode_rows: list[int]         # per rank
    waiting_decodes: int = 0       # decodes held back by a prefill-only step
    host_stall_ms: float = 0.0
    pd_bytes: int = 0
    hot_rank: int = -1


def validate_faults(spec: EngineSpec, faults) -> tuple[str, ...]:
    """Faults to inject; ``None`` means the engine's defaults. Raises ``ValueError`` on bad names."""
    faults = DEFAULT_FAULTS[spec.name] if faults is None else tuple(faults)
    bad = [f for f in faults if f not in FAULTS]
    if bad:
        raise ValueError(f"unknown fault(s) {bad}; choose from {FAULTS}")
    if "ep_hotspot" in faults and spec.n_ranks < 2:
        raise ValueError("ep_hotspot needs a multi-rank engine (ep2)")
    return faults


def plan_steps(spec: EngineSpec, cost: CostModel, rng: np.random.Generator, n_steps: int,
               faults: tuple[str, ...]) -> list[StepPlan]:
    """Draw ``n_steps`` steps; each fault fires with a seeded rate of ~3-8 % (episodes for some)."""
    # episode faults (several steps per firing) fire less often so each stays a minority of steps
    per_episode = {"mixing": 1.5, "prefill_stall": 1.5, "graph_fallback": 3.0, "ep_hotspot": 2.0}
    rates = {f: float(rng.uniform(0.03, 0.08)) / per_episode.get(f, 1.0) for f in faults}
    rows = int(rng.integers(cost.rows_lo, cost.rows_hi + 1))
    plans: list[StepPlan] = []

    def rank_rows(r: int) -> list[int]:
        return [max(1, r + (int(rng.integers(-2, 3)) if k else 0)) for k in range(spec.n_ranks)]

    def prompt() -> int:
        return int(np.clip(rng.lognormal(np.log(1500), 0.6), 200, 8000))

    while len(plans) < n_steps:
        u, cause = rng.random(), "none"
        acc = 0.0
        for f in faults:
            acc += rates[f]
            if u < acc:
                cause = f
                break
        i = len(plans)
        if cause == "mixing":
            left = prompt()
            while left > 0 and len(plans) < n_steps:
                chunk = min(left, max(64, cost.chunk - rows))
                plans.append(StepPlan(len(plans), "mixing", chunk, rank_rows(rows)))
                left -= chunk
            rows = min(rows + 1, cost.rows_hi)
        elif cause == "prefill_stall":
            left = prompt()
            while left > 0 and len(plans) < n_steps:
                chunk = min(left, cost.chunk)
                plans.append(StepPlan(len(plans), "prefill_stall", chunk, [0] * spec.n_ranks, waiting_decodes=rows))
                left -= chunk
            rows = min(rows + 1, cost.rows_hi)
        elif cause == "graph_fallback":
            for _ in range(int(rng.integers(3, 9))):
                if len(plans) >= n_steps:
                    break
                big = int(rng.integers(cost.max_capture + 1, int(cost.max_capture * 1.4) + 2))
                plans.append(StepPlan(len(plans), "graph_fallback", 0, [big] * spec.n_ranks))
        elif cause == "host_stall":
            plans.append(StepPlan(i, "host_stall", 0, rank_rows(rows), host_stall_ms=float(rng.uniform(15, 120))))
        elif cause == "pd_transfer":
            plans.append(StepPlan(i, "pd_transfer", 0, rank_rows(rows), pd_bytes=prompt() * cost.kv_bytes_per_token))
            rows = min(rows + 1, cost.rows_hi)
        elif cause == "ep_hotspot":
            hot = int(rng.integers(0, spec.n_ranks))
            for _ in range(int(rng.integers(1, 5))):
                if len(plans) >= n_steps:
                    break
                plans.append(StepPlan(len(plans), "ep_hotspot", 0, rank_rows(rows), hot_rank=hot))
        else:
            rows = int(np.clip(rows + rng.integers(-2, 3), cost.rows_lo, cost.rows_hi))
            plans.append(StepPlan(i, "none", 0, rank_rows(rows)))
    return plans[:n_steps]
