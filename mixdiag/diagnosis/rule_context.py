"""What every attribution rule shares: the thresholds (:class:`AttributionConfig`), the verdict
(:class:`Attribution`), what is known of the spike's instance (:class:`InstanceContext`), and how a
row's signals and their quality are read (only ``measured`` or ``inferred`` signals corroborate:
an ``estimated`` one is modelled from the token allocation and would only repeat it)."""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import pandas as pd


@dataclass(frozen=True)
class AttributionConfig:
    """Evidence thresholds; one setting for every workload (justified in docs/analyze.md)."""

    host_gap_share: float = 0.5     # host_stall: gap excess >= this share of the latency excess
    imbalance_rel: float = 1.5      # ep_hotspot: imbalance >= this x the neighbourhood's ...
    imbalance_abs: float = 1.5      # ... and >= this absolute max/mean ratio
    imbalance_edge_rel: float = 1.1  # interval next to a hotspot interval: imbalance >= this x the usual
    sm_delta: float = 0.10          # mixing: SM activity this much above decode-only neighbours
    interval_factor: float = 0.8    # confidence scale for interval (log/scrape) rows
    comm_delta: float = 0.10        # ep_hotspot: collective share this much above decode neighbours
    rank_skew: float = 1.2          # ep_hotspot: slowest rank / median rank compute time
    rank_sm_skew: float = 1.05      # ep_hotspot, graph-hidden compute: largest / median rank SM-busy time ...
    sm_skew_delta: float = 0.03     # ... and this much above its decode neighbourhood's
    eager_height: float = 2.5       # graph_fallback without counts: eager decode stays below this x baseline
    relation_p: float = 0.01        # interval mixing: permutation p-value of prefill work vs ITL excess

    def __post_init__(self):
        if not 0 < self.host_gap_share <= 1:
            raise ValueError("AttributionConfig.host_gap_share must be in (0, 1]")
        if min(self.imbalance_rel, self.imbalance_abs, self.imbalance_edge_rel, self.rank_skew, self.rank_sm_skew) < 1:
            raise ValueError("AttributionConfig imbalance/rank-skew thresholds must be >= 1")
        if not 0 < self.interval_factor <= 1:
            raise ValueError("AttributionConfig.interval_factor must be in (0, 1]")
        if not 0 < self.relation_p < 1 or self.comm_delta <= 0 or self.sm_skew_delta <= 0:
            raise ValueError("AttributionConfig.relation_p must be in (0, 1), comm_delta and sm_skew_delta > 0")


@dataclass(frozen=True)
class Attribution:
    """The verdict for one spike."""

    cause: str
    confidence: float
    evidence: dict = field(default_factory=dict)


@dataclass(frozen=True)
class InstanceContext:
    """What attribution needs to know about the spike's instance as a whole."""

    quality: dict            # signal -> measured | estimated | inferred | absent
    graph_norm: str          # graph mode decode-only steps normally run in
    period: dict             # signals.periodicity(...) against arrivals (never the token counts)
    full_batch_sizes: frozenset = frozenset()  # decode_reqs values seen replaying FULL
    relation: dict = field(default_factory=dict)  # interval rows: signals.rank_relation(work, ITL excess)
    llm_like: bool = True    # the input has decode-like structure (pipeline.looks_like_llm_serving)


def num(v) -> float | None:
    """``v`` as a finite float, else None (missing, NaN, text)."""
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
    """Only measured or inferred signals corroborate; estimated ones repeat the token allocation."""
    return q in ("measured", "inferred")


def near_prefill(row: pd.Series, ctx: InstanceContext) -> bool | None:
    """In step with prefill work: the instance's spikes fall near arrivals far above chance (a
    binomial test, signals.periodicity) and this spike is one of them. None when untestable."""
    p = ctx.period or {}
    if not p.get("events"):
        return None
    return bool(p.get("significant")) and bool(row.get("near_prefill_event"))


def evidence_of(row: pd.Series, ctx: InstanceContext) -> dict:
    """The evidence record of a spike: its height, the signal values it has and their quality."""
    lat, base = num(row.get("latency_s")), num(row.get("baseline_s"))
    ev: dict = {"kind": row.get("kind"), "granularity": row.get("granularity"),
                "latency_s": lat, "baseline_s": base,
                "height_x": (lat / base) if lat and base else None}
    for col in ("prefill_tokens", "prefill_reqs", "decode_rows", "decode_reqs", "graph_mode", "sm_active",
                "expert_imbalance", "kv_transfer_bytes", "kv_transfer_s", "preempted_reqs", "gap_before_s",
                "comm_share", "rank_skew", "rank_sm_skew", "device_idle_before_s", "arrivals", "large_step_share", "prefill_work_tokens"):
        v = row.get(col)
        if isinstance(v, str):
            if v != "unknown":
                ev[col] = v
        elif num(v) is not None:
            ev[col] = num(v)
    ev["signal_quality"] = {s: row_quality(row, ctx, s) if s in ("token_allocation", "graph_mode", "sm_active",
                                                        "expert_imbalance", "kv_transfer")
                            else ctx.quality.get(s, "absent") for s in ctx.quality}
    return ev


def off_graph_dominates(row) -> bool:
    """An interval that ran both decode passes off the captured graph (counted by the engine,
    ``graph_off_decode_steps``) and mixed steps: whether the eager decode passes are the larger
    share of its slow forwards. They are when there were at least as many of them as mixed steps
    and each mixed step added no more prompt tokens than the decode batch holds (a step's cost
    grows with its tokens - the shape ledger - so such a chunk costs about one more decode pass,
    while every eager pass pays the per-kernel launches the graph saves). Unknown mixed-step
    counts: False (nothing to weigh)."""
    goff = num(row.get("graph_off_decode_steps"))
    if goff is None or goff <= 0:
        return False
    mixed = num(row.get("mixed_steps"))
    if mixed is None:
        mixed = num(row.get("fused_mixed_steps_in_interval"))
    if mixed is None:
        return False
    if mixed == 0:
        return True
    pre, batch = num(row.get("prefill_tokens")), num(row.get("running_reqs"))
    small = pre is not None and batch is not None and batch > 0 and pre / mixed <= batch
    return goff >= mixed and small
