"""Per-step records the engine emits, and their conversion into a :class:`~mixdiag.schema.Timeline`.

One :class:`StepRecord` per ``Engine.step()``: every ``steps`` column the engine knows, plus the
per-request scheduled token counts and the output events of the step (``tokens`` rows).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Iterable

import pandas as pd

from mixdiag.schema import Timeline

NAN = math.nan


@dataclass(frozen=True)
class TokenEvent:
    """Output tokens of one request that became available at ``t_s`` (unix seconds)."""

    request_id: str
    t_s: float
    n_tokens: int
    is_first: bool
    arrival_s: float = NAN          # first events: when the request arrived (unix s)
    prompt_tokens: float = NAN      # first events: the request's prompt length


@dataclass
class StepRecord:
    """What one engine step did. Field names match the Timeline ``steps`` columns where one exists."""

    step: int
    t_start_s: float
    t_end_s: float
    kind: str                       # prefill | decode | mixed | idle
    prefill_tokens: int = 0
    prefill_reqs: int = 0
    decode_reqs: int = 0
    decode_rows: int = 0
    output_tokens: int = 0
    graph_mode: str = "NONE"        # planned: FULL | PIECEWISE | NONE
    graph_bucket: int | None = None  # padded token count of the planned graph (None for NONE)
    graph_replayed: bool = False    # True only when a real CUDA graph was replayed
    graph_mode_ran: str | None = None  # the mode a CUDA-graph runner really executed; None = no runner (CPU)
    sm_active: float = NAN
    sm_active_source: str = "absent"  # measured | estimated | absent (set by whoever fills sm_active)
    expert_imbalance: float = NAN
    kv_transfer_bytes: float = 0.0
    kv_transfer_s: float = 0.0
    prefix_hit_tokens: int = 0
    prefix_query_tokens: int = 0    # prompt tokens looked up in the prefix cache at admission
    spec_draft_tokens: int = 0      # draft tokens verified in the step
    spec_accepted_tokens: int = 0   # of which accepted
    ubatch_split: bool = False      # micro-batching gate: the step may split into two micro-batches
    ubatch_reason: str = "disabled"  # disabled | too_few_requests | too_few_tokens | prefix_readers | split
    preempted_reqs: int = 0
    stalled_decode_reqs: int = 0    # decoding requests that sat out the step (no mixing / no KV room)
    running_reqs: int = 0
    waiting_reqs: int = 0
    kv_usage: float = 0.0
    schedule_s: float = 0.0
    prepare_s: float = 0.0
    forward_s: float = 0.0
    sample_s: float = 0.0
    forward_mode: str = "IDLE"      # the scheduler's forward mode (EXTEND | DECODE | MIXED | IDLE)
    token_budget: int = 0           # the budget the scheduler planned against
    num_scheduled_tokens: dict[str, int] = field(default_factory=dict)
    token_events: list[TokenEvent] = field(default_factory=list)
    per_rank_tokens: list[int] | None = None  # tokens routed to each EP rank (None without EP)

    @property
    def total_tokens(self) -> int:
        return sum(self.num_scheduled_tokens.values())


# steps columns filled straight from StepRecord attributes (same names).
_STEP_FIELDS = ("step", "t_start_s", "t_end_s", "kind", "prefill_tokens", "prefill_reqs", "decode_reqs",
                "decode_rows", "output_tokens", "graph_mode", "sm_active", "expert_imbalance",
                "kv_transfer_bytes", "kv_transfer_s", "prefix_hit_tokens", "preempted_reqs", "running_reqs",
                "waiting_reqs", "kv_usage", "schedule_s", "prepare_s", "forward_s")
# Extra (undocumented) columns the engine adds after the documented ones.
_EXTRA_FIELDS = ("sample_s", "forward_mode", "token_budget", "stalled_decode_reqs", "prefix_query_tokens",
                 "spec_draft_tokens", "spec_accepted_tokens", "ubatch_split", "ubatch_reason")


def steps_frame(records: Iterable[StepRecord], instance: str = "engine0") -> pd.DataFrame:
    """The ``steps`` rows of ``records`` (not yet validated)."""
    rows = []
    for r in records:
        row = {"instance": instance, "granularity": "step"}
        for f in _STEP_FIELDS + _EXTRA_FIELDS:
            row[f] = getattr(r, f)
        row["graph_replayed"] = 1.0 if r.graph_replayed else 0.0
        # Without a graph runner (CPU) the mode is the dispatcher's plan from the batch shape:
        # estimated, so it never corroborates the token counts it was derived from. With a runner
        # the row carries the mode that really ran (a stale graph runs eager) and is measured.
        if r.graph_mode_ran is not None:
            row["graph_mode"], row["q_graph_mode"] = r.graph_mode_ran, "measured"
        else:
            row["q_graph_mode"] = "estimated"
        row["graph_bucket"] = float(r.graph_bucket) if r.graph_bucket is not None else NAN
        row["scheduled_tokens"] = r.total_tokens
        rows.append(row)
    return pd.DataFrame(rows)


def tokens_frame(records: Iterable[StepRecord], instance: str = "engine0") -> pd.DataFrame:
    """The ``tokens`` rows (one per :class:`TokenEvent`) of ``records``."""
    rows = [{"instance": instance, "request_id": e.request_id, "t_s": e.t_s, "n_tokens": e.n_tokens,
             "step": float(r.step), "is_first": 1.0 if e.is_first else 0.0, "arrival_s": e.arrival_s,
             "prompt_tokens": e.prompt_tokens}
            for r in records for e in r.token_events]
    return pd.DataFrame(rows, columns=["instance", "request_id", "t_s", "n_tokens", "step", "is_first", "arrival_s",
                                       "prompt_tokens"])


#: Signal qualities the reference engine reports (meta["signals"][instance]) on CPU: the graph
#: mode there is planned from the batch shape (engine/model/graph_dispatch.py), so ``estimated``.
ENGINE_SIGNALS = {
    "token_allocation": "measured", "itl": "measured", "graph_mode": "estimated", "sm_active": "absent",
    "expert_imbalance": "absent", "kv_transfer": "measured", "kv_usage": "measured", "preemption": "measured",
    "host_time": "measured", "prefix_cache": "measured",
}


def to_timeline(records: Iterable[StepRecord], instance: str = "engine0", meta: dict | None = None,
                signals: dict[str, str] | None = None) -> Timeline:
    """Turn step records into a validated Timeline (unix clock)."""
    records = list(records)
    steps = steps_frame(records, instance)
    tokens = tokens_frame(records, instance)
    meta = dict(meta or {})
    meta.setdefault("source", "mixdiag-engine")
    meta.setdefault("clock", "unix")
    sig = dict(ENGINE_SIGNALS)
    sources = {r.sm_active_source for r in records} - {"absent"}
    sig["sm_active"] = "measured" if "measured" in sources else "estimated" if sources else "absent"
    if any(r.per_rank_tokens is not None for r in records):
        sig["expert_imbalance"] = "measured"
    if any(r.graph_mode_ran is not None for r in records):
        sig["graph_mode"] = "measured"  # a CUDA-graph runner executed the steps (rows say which ran)
    sig.update(signals or {})
    meta.setdefault("signals", {})
    meta["signals"] = {**meta["signals"], instance: sig}
    return Timeline(steps if len(steps) else None, tokens if len(tokens) else None, None, meta)
