"""Attribution: give each spike one cause from the closed taxonomy, a confidence in [0, 1] and the
evidence (signal values) behind it - or ``unknown`` when no cause is supported.

Rules are checked in a fixed order, from the most direct evidence to the most circumstantial:

1. ``host_stall``     the idle gap before the step, not the step, holds most of the excess;
2. ``pd_transfer``    the step installed KV transferred from a prefill instance;
3. ``kv_pressure``    the step preempted / retracted requests for lack of KV blocks;
4. ``mixing``         the step held prefill tokens *and* decode rows;
5. ``prefill_stall``  a prefill-only step while decodes were running (their rows were left out);
6. ``ep_hotspot``     a decode-only step with expert imbalance well above its neighbours';
7. ``graph_fallback`` a decode-only step that left the graph mode decode steps normally replay;
8. ``unknown``.

Confidence = the rule's base (its defining evidence) plus a share for each corroborating signal;
signals the source lacks corroborate nothing, so confidence falls with missing data. Coarse
(interval) rows scale it by ``interval_factor``.

When one engine is seen through step rows and interval rows, :func:`attribute_fused` then weighs
the other view's evidence (the ``fused_*`` columns of :mod:`mixdiag.diagnosis.fusion`), and
:func:`attribute_between_steps` / :func:`attribute_preemptions` judge interval rows that are no
spike of their own. This module is the only place evidence becomes a cause and a confidence.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import pandas as pd

from mixdiag.causes import CAUSES  # noqa: F401  (re-exported for callers)


@dataclass(frozen=True)
class AttributionConfig:
    """Evidence thresholds; one setting for every workload (justified in docs/analyze.md)."""

    host_gap_share: float = 0.5     # host_stall: gap excess >= this share of the latency excess
    imbalance_rel: float = 1.5      # ep_hotspot: imbalance >= this x the neighbourhood's ...
    imbalance_abs: float = 1.5      # ... and >= this absolute max/mean ratio
    sm_delta: float = 0.10          # mixing: SM activity this much above decode-only neighbours
    period_tolerance: float = 1.5   # mixing: spike period within [1/t, t] x prefill period
    interval_factor: float = 0.8    # confidence scale for interval (log/scrape) rows

    def __post_init__(self):
        if not 0 < self.host_gap_share <= 1:
            raise ValueError("AttributionConfig.host_gap_share must be in (0, 1]")
        if self.imbalance_rel < 1 or self.imbalance_abs < 1 or self.period_tolerance < 1:
            raise ValueError("AttributionConfig imbalance/period thresholds must be >= 1")
        if not 0 < self.interval_factor <= 1:
            raise ValueError("AttributionConfig.interval_factor must be in (0, 1]")


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
    period: dict             # signals.periodicity(...)
    full_batch_sizes: frozenset = frozenset()  # decode_reqs values seen replaying FULL


def _num(v) -> float | None:
    try:
        f = float(v)
    except (TypeError, ValueError):
        return None
    return f if math.isfinite(f) else None


def _have(ctx: InstanceContext, sig: str) -> bool:
    return ctx.quality.get(sig, "absent") != "absent"


def attribute(row: pd.Series, ctx: InstanceContext, cfg: AttributionConfig = AttributionConfig()) -> Attribution:
    """Attribute one spike row (step signals plus ``latency_s``, ``baseline_s``)."""
    lat, base = _num(row.get("latency_s")), _num(row.get("baseline_s"))
    excess = (lat - base) if lat is not None and base is not None else None
    ev: dict = {"kind": row.get("kind"), "granularity": row.get("granularity"),
                "latency_s": lat, "baseline_s": base,
                "height_x": (lat / base) if lat and base else None}
    for col in ("prefill_tokens", "prefill_reqs", "decode_rows", "decode_reqs", "graph_mode", "sm_active", "expert_imbalance",
                "kv_transfer_bytes", "kv_transfer_s", "preempted_reqs", "gap_before_s"):
        v = row.get(col)
        if isinstance(v, str):
            if v != "unknown":
                ev[col] = v
        elif _num(v) is not None:
            ev[col] = _num(v)
    coarse = row.get("granularity") == "interval"
    scale = cfg.interval_factor if coarse else 1.0

    def done(cause: str, conf: float, **extra) -> Attribution:
        ev.update({k: v for k, v in extra.items() if v is not None})
        return Attribution(cause, round(max(0.0, min(1.0, conf * scale)), 3), ev)

    # 1. host stall: the gap before the step is the long part.
    gap_x = _num(row.get("gap_excess_s"))
    if _have(ctx, "host_time") and not coarse and excess and excess > 0 and gap_x is not None \
            and gap_x >= cfg.host_gap_share * excess:
        share = min(1.0, gap_x / excess)
        return done("host_stall", 0.6 + 0.4 * share, gap_share_of_excess=round(share, 3))

    # 2. PD KV transfer overlapping the step.
    if bool(row.get("kv_xfer")):
        kv_s = _num(row.get("kv_transfer_s"))
        share = min(1.0, kv_s / excess) if kv_s is not None and excess and excess > 0 else None
        conf = 0.75 + (0.25 * share if share is not None else 0.0)
        return done("pd_transfer", conf, kv_transfer_share_of_excess=None if share is None else round(share, 3))

    # 3. KV pressure: preemptions / retractions in the step.
    if bool(row.get("preempt")):
        kvu = _num(row.get("kv_usage"))
        return done("kv_pressure", 0.8 + (0.2 if kvu is not None and kvu >= 0.9 else 0.0), kv_usage=kvu)

    has_p, has_d = bool(row.get("has_prefill")), bool(row.get("has_decode"))
    alloc = _have(ctx, "token_allocation") or row.get("kind") in ("prefill", "decode", "mixed")

    # 4. mixing: both segments in one step; corroborated by graph mode, SM sawtooth, period.
    if alloc and has_p and has_d:
        graph_left = bool(row.get("graph_off")) if _have(ctx, "graph_mode") else None
        smd = _num(row.get("sm_delta")) if _have(ctx, "sm_active") else None
        sm_high = None if smd is None else smd >= cfg.sm_delta
        r = _num(ctx.period.get("period_ratio"))
        periodic = None if r is None else (1 / cfg.period_tolerance <= r <= cfg.period_tolerance)
        support = sum(bool(x) for x in (graph_left, sm_high, periodic))
        conf = 0.55 + 0.15 * support
        pt, dr = _num(row.get("prefill_tokens")), _num(row.get("decode_rows"))
        if pt is not None and dr is not None and pt < dr:  # a tiny chunk explains little
            conf -= 0.15
        return done("mixing", conf, graph_left_full=graph_left, sm_delta=smd, sm_high=sm_high,
                    period_ratio=r, periodic=periodic)

    # 5. prefill stall: a prefill-only step while decodes were running.
    if alloc and has_p and not has_d and bool(row.get("decodes_before")):
        return done("prefill_stall", 0.85, decodes_before=True)

    decode_only = alloc and has_d and not has_p
    # 6. EP hotspot / 7. graph fallback, on decode-only steps; the better-supported one wins.
    cands = []
    if decode_only and _have(ctx, "expert_imbalance"):
        imb, rel = _num(row.get("expert_imbalance")), _num(row.get("imbalance_rel"))
        if imb is not None and imb >= cfg.imbalance_abs and (rel is None or rel >= cfg.imbalance_rel):
            strength = min(1.0, ((rel or imb) - 1.0) / 2.0)
            cands.append(("ep_hotspot", 0.6 + 0.4 * strength, {"imbalance_rel": rel}))
    if decode_only and _have(ctx, "graph_mode") and bool(row.get("graph_off")) and ctx.graph_norm == "FULL":
        dreq = _num(row.get("decode_reqs"))
        outside = None if dreq is None or not ctx.full_batch_sizes else dreq not in ctx.full_batch_sizes
        cands.append(("graph_fallback", 0.75 + (0.2 if outside else 0.0),
                      {"graph_norm": ctx.graph_norm, "batch_outside_full_sizes": outside}))
    if cands:
        cause, conf, extra = max(cands, key=lambda c: c[1])
        return done(cause, conf, **extra)

    # 8. unknown: confidence = the share of causes the available signals could rule out.
    checkable = ["host_time", "kv_transfer", "preemption", "token_allocation", "expert_imbalance", "graph_mode"]
    ruled = sum(_have(ctx, s) for s in checkable) / len(checkable)
    return Attribution("unknown", round(ruled * scale, 3), ev | {"reason": "no cause's evidence present"})


def _pos(v) -> bool:
    """``(v or 0) > 0`` for a cell that may be missing or NaN."""
    f = _num(v)
    return f is not None and f > 0


def _extend_only(ev: dict) -> bool:
    """A mixed step whose context requests scheduled one token each: 1-token EXTENDs of requests
    whose KV was installed from a prefill worker (PD), not a prompt chunk mixed into decode."""
    tok, reqs = ev.get("prefill_tokens"), ev.get("prefill_reqs")
    return tok is not None and reqs is not None and math.isfinite(tok) and math.isfinite(reqs) and 0 < tok <= reqs


def attribute_fused(row: pd.Series, a: Attribution, cfg: AttributionConfig = AttributionConfig()) -> Attribution:
    """Refine ``a`` (the row's own attribution) with the other view of its engine.

    Interval spike with steps of the step view inside, none slow: the ITL excess happened *between*
    steps - a KV transfer or preemption if the interval counted one, else a host stall, unless the
    ITL sum leaves no time between steps either (``unknown``: a bucketed P99 or an ITL that began in
    the previous interval). Step spike the step view left ``unknown`` (log lines carry no imbalance,
    transfers or preemptions): the evidence of the scrape interval that holds it - imbalance well
    above the intervals' median -> ep_hotspot; decode-only steps dispatched off the FULL graph
    (this batch among the largest) -> graph_fallback; a KV transfer no step of the interval
    installed -> pd_transfer; a preemption -> kv_pressure. A step called mixing whose context
    requests scheduled one token each (the 1-token EXTENDs a PD install schedules) is pd_transfer
    when its interval counted a KV transfer. Interval evidence is coarser than the step's, so
    confidence is scaled twice.
    """
    if row.get("granularity") == "interval":
        n = _num(row.get("fused_steps_in_interval"))
        if not n:
            return a  # no step view covers the interval
        ev = dict(a.evidence)
        ev["steps_in_interval"] = int(n)
        ev["slow_steps_in_interval"] = 0
        if ev.get("kv_transfer_bytes", 0) or ev.get("kv_transfer_s", 0):
            cause, conf = "pd_transfer", 0.75
        elif ev.get("preempted_reqs", 0):
            cause, conf = "kv_pressure", 0.75
        else:
            cause, conf = "host_stall", 0.6
            ev["reason"] = "ITL spiked but no step in the interval was slow: the time went between steps"
            thr, gap = _num(row.get("fused_host_gap_threshold_s")), _num(row.get("fused_host_gap_unusual_s"))
            if gap is not None and thr is not None:
                ev["host_gap_unusual_s"] = gap
                if gap <= thr:  # the ITL sum says requests did not wait between steps either
                    cause = "unknown"
                    ev["reason"] = ("ITL P99 spiked, but no step was slow and the ITL sum leaves no time between "
                                    "steps (a histogram-bucket or interval-edge effect)")
        return Attribution(cause, round(conf * cfg.interval_factor, 3), ev)
    k = _num(row.get("fused_interval"))
    pd_install = a.cause == "mixing" and _extend_only(a.evidence)
    if k is None or (a.cause != "unknown" and not pd_install) \
            or a.evidence.get("kind") != ("mixed" if pd_install else "decode"):
        return a
    conf = round(0.6 * cfg.interval_factor, 3)
    xfer = _num(row.get("fused_interval_kv_transfer_bytes"))
    if pd_install:  # only a transfer can explain it; with none counted, mixing stands
        if _pos(xfer):
            return Attribution("pd_transfer", conf, dict(a.evidence) | {"interval": int(k),
                                                                        "interval_kv_transfer_bytes": xfer})
        return a
    ev = dict(a.evidence) | {"interval": int(k)}
    imb, med = _num(row.get("fused_interval_expert_imbalance")), _num(row.get("fused_interval_imbalance_median"))
    goff = _num(row.get("fused_interval_graph_off_decode_steps"))
    if imb is not None and imb >= cfg.imbalance_abs and med is not None and imb >= cfg.imbalance_rel * med:
        cause, ev["interval_expert_imbalance"] = "ep_hotspot", imb
    elif _pos(goff) and bool(_num(row.get("fused_among_largest_batches"))):
        cause, ev["interval_graph_off_decode_steps"] = "graph_fallback", goff
    elif _pos(xfer) and not _num(row.get("fused_pd_install")):
        cause, ev["interval_kv_transfer_bytes"] = "pd_transfer", xfer
    elif _pos(row.get("fused_interval_preempted_reqs")):
        cause, ev["interval_preempted_reqs"] = "kv_pressure", _num(row.get("fused_interval_preempted_reqs"))
    else:
        return a
    return Attribution(cause, conf, ev)


def attribute_between_steps(row: pd.Series, cfg: AttributionConfig = AttributionConfig()) -> Attribution | None:
    """An interval row that is no spike of its own but whose ITL sum shows requests waiting between
    steps: per decode request, the gap's excess over its rolling median exceeds the threshold (some
    ITL in the interval was then at least ``interval_ratio`` x the baseline) -> host_stall; None
    otherwise, or when the interval counted a preemption or KV transfer (any value, NaN included:
    then the wait is not known to be the host's)."""
    excess, thr = _num(row.get("fused_host_gap_excess_s")), _num(row.get("fused_host_gap_threshold_s"))
    if excess is None or thr is None or not excess > thr:
        return None
    if row.get("preempted_reqs", 0) or row.get("kv_transfer_bytes", 0):
        return None
    ev = {"granularity": "interval", "host_gap_per_request_s": float(row["fused_host_gap_per_request_s"]),
          "host_gap_excess_s": excess, "baseline_s": float(row["baseline_s"]),
          "reason": "ITL time in the interval exceeds the time its steps took: requests waited between steps"}
    return Attribution("host_stall", round(0.6 * cfg.interval_factor, 3), ev)


def attribute_preemptions(row: pd.Series, cfg: AttributionConfig = AttributionConfig()) -> Attribution | None:
    """An interval row that counted preemptions and is no spike: kv_pressure. A recompute preemption
    evicts a running request until it is re-admitted and re-prefilled: its next token comes steps
    later, a stall its user feels even when no step is slow (tier (a) sees it as a request stall).
    Log lines do not show the victims; the counter places the stall's start to the interval."""
    if not _pos(row.get("preempted_reqs")):
        return None
    ev = {"granularity": "interval", "preempted_reqs": float(row["preempted_reqs"]),
          "reason": "requests were preempted in the interval: each waits to be re-admitted and re-prefilled"}
    return Attribution("kv_pressure", round(0.8 * cfg.interval_factor, 3), ev)
