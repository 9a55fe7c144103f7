"""What every attribution rule shares: the verdict (:class:`Attribution`) and how a
row's signals and their quality are read (only ``measured`` signals corroborate: an ``estimated``
one - a graph mode planned from the batch shape, SM activity from a cost model - is modelled from
the token allocation and would only repeat it, and an ``inferred`` one is itself derived from
other rows; both may be shown as context, neither raises a cause's confidence)."""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import pandas as pd

from mixdiag.diagnosis.detection.context import InstanceContext


@dataclass(frozen=True)
class Attribution:
    """The verdict for one spike."""

    cause: str
    confidence: float
    evidence: dict = field(default_factory=dict)


def num(v) -> float | None:
    """``v`` as a finite float, else None (missing, NaN, text)."""
    if v is None:  # a column the row lacks (most of a spike's ~50 reads): no exception raised and caught
        return None
    try:
        f = float(v)
    except (TypeError, ValueError):
        return None
    return f if math.isfinite(f) else None


def have(ctx: InstanceContext, sig: str) -> bool:
    """Whether the instance has ``sig`` at all (any quality but absent)."""
    return ctx.quality.get(sig, "absent") != "absent"


def row_quality(row: pd.Series, ctx: InstanceContext, sig: str) -> str:
    """The row's quality of ``sig`` (its ``rq_*`` column), else the instance's."""
    v = row.get("rq_" + sig)
    return v if isinstance(v, str) and v else ctx.quality.get(sig, "absent")


def corroborates(q: str) -> bool:
    """Only measured signals corroborate (see the module doc)."""
    return q == "measured"


def near_prefill(row: pd.Series, ctx: InstanceContext) -> bool | None:
    """In step with prefill work: the instance's spikes fall near arrivals far above chance (a
    binomial test, signals.periodicity) and this spike is one of them. None when untestable."""
    p = ctx.period or {}
    if not p.get("events"):
        return None
    return bool(p.get("significant")) and bool(row.get("near_prefill_event"))


#: signals whose quality a row carries itself (its ``rq_*`` column)
_ROW_QUALITIES = frozenset(("token_allocation", "graph_mode", "sm_active", "expert_imbalance", "kv_transfer"))


def evidence_of(row: pd.Series, ctx: InstanceContext) -> dict:
    """The evidence record of a spike: its height, the signal values it has and their quality."""
    lat, base = num(row.get("latency_s")), num(row.get("baseline_s"))
    ev: dict = {"kind": row.get("kind"), "granularity": row.get("granularity"),
                "latency_s": lat, "baseline_s": base,
                "height_x": (lat / base) if lat and base else None}
    for col in ("prefill_tokens", "prefill_reqs", "decode_rows", "decode_reqs", "graph_mode", "sm_active",
                "expert_imbalance", "kv_transfer_bytes", "kv_transfer_s", "preempted_reqs", "gap_before_s",
                "comm_share", "rank_skew", "rank_sm_skew", "rank_comm_spread", "kv_overlap_s", "kv_wait_s", "device_idle_before_s", "arrivals", "large_step_share", "prefill_work_tokens"):
        v = row.get(col)
        if isinstance(v, str):
            if v != "unknown":
                ev[col] = v
        elif (f := num(v)) is not None:  # one conversion a value (20 000 spikes read 21 columns each)
            ev[col] = f
    ev["signal_quality"] = {s: row_quality(row, ctx, s) if s in _ROW_QUALITIES else ctx.quality.get(s, "absent")
                            for s in ctx.quality}
    return ev


def _prefill_passes(row) -> float | None:
    """Prefill (extend) passes of an interval whose engine counts passes by graph mode and kind but not
    mixed steps: SGLang's per-forward pass counter by graph mode counts every forward (decode_/prefill_ x
    cuda_graph/none, formats.md §2), the collector keeps their kind split as ``large_step_share``; with
    mixed chunk on, the decodes ride in those extend passes, so they are the interval's mixed steps at
    most. None without both."""
    share = num(row.get("large_step_share"))
    modes = [num(row.get(c)) for c in ("graph_full_steps", "graph_piecewise_steps", "graph_none_steps")]
    if share is None or all(m is None for m in modes):
        return None
    if share == 0 and (num(row.get("prefill_tokens")) or 0) > 0:
        # prompt tokens counted, no extend pass: a counter that counts decode passes only (SGLang releases
        # whose process_batch_result_decode alone increments it, modes decode_cuda_graph / decode_none) -
        # the extend passes are not counted, not absent
        return None
    return float(round(share * sum(m or 0.0 for m in modes)))


def off_graph_dominates(row, chunk_min_tokens: float = 0.0) -> bool:
    """An interval that ran both decode passes off the captured graph (counted by the engine,
    ``graph_off_decode_steps``) and mixed steps: whether the eager decode passes are the larger
    share of its slow forwards. They are when there were at least as many of them as mixed steps
    and each mixed step added no more prompt tokens than the decode batch holds (a step's cost
    grows with its tokens - the shape ledger - so such a chunk costs about one more decode pass,
    while every eager pass pays the per-kernel launches the graph saves). Unknown mixed-step
    counts: False (nothing to weigh). A chunk under ``chunk_min_tokens`` per mixed step counts as small
    too (the roofline basis of AttributionConfig.chunk_min_tokens)."""
    goff = num(row.get("graph_off_decode_steps"))
    if goff is None or goff <= 0:
        return False
    mixed = num(row.get("mixed_steps"))
    if mixed is None:
        mixed = num(row.get("fused_mixed_steps_in_interval"))
    if mixed is None:
        mixed = _prefill_passes(row)
    if mixed is None:
        return False
    if mixed == 0:
        return True
    pre, batch = num(row.get("prefill_tokens")), num(row.get("running_reqs"))
    passes = sum(num(row.get(c)) or 0.0 for c in ("graph_full_steps", "graph_piecewise_steps", "graph_none_steps"))
    if batch is None and num(row.get("decode_rows")) is not None and passes > 0:
        # the running gauge is stale or absent (SGLang sets it only when a log line is printed): the
        # decode tokens the interval computed per forward are its mean decode batch, counted
        batch = num(row.get("decode_rows")) / passes
    # a chunk under chunk_min_tokens keeps its step below the roofline ridge: about one decode pass
    # whatever the batch (AttributionConfig.chunk_min_tokens)
    small = pre is not None and mixed > 0 and ((batch is not None and batch > 0 and pre / mixed <= batch)
                                               or pre / mixed < chunk_min_tokens)
    return goff >= mixed and small
