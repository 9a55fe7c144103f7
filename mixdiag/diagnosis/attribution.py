"""Attribution: give each spike one cause from the closed taxonomy, a confidence in [0, 1] and the
evidence (signal values and their quality) behind it - or ``unknown`` when no cause is supported.

Step rows, first rule that holds (docs/analyze.md has the table: signals each rule needs and the
confidence each subset reaches):

1. ``pd_transfer``    KV traffic overlapping or preceding the step (before any host-stall call);
2. ``host_stall``     a measured idle gap before the step holds most of the excess;
3. ``kv_pressure``    the step preempted / retracted requests for lack of KV blocks;
4. ``mixing``         the token allocation holds prefill tokens *and* decode rows;
5. ``prefill_stall``  a prefill-only step while decodes were running;
6. ``mixing`` / ``graph_fallback`` without token counts: left the FULL decode graph, and SM
   activity above (compute-heavy: mixing) or at (memory-bound: fallback) the decode level, or
   recurring with prefill arrivals; ``unknown`` with the reason when the subset cannot separate;
7. ``ep_hotspot``     decode-only, an imbalance gauge, comm-bound decode or high rank skew;
8. ``graph_fallback`` decode-only step that left the graph mode decode steps normally replay;
9. ``unknown``.

Only ``measured`` or ``inferred`` signals corroborate: an ``estimated`` one (SM activity from a
cost model, a graph mode planned from the batch shape) is modelled from the token allocation and
would only repeat it. Interval rows go to :func:`attribute_interval`.

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
    interval_factor: float = 0.8    # confidence scale for interval (log/scrape) rows
    comm_delta: float = 0.10        # ep_hotspot: collective share this much above decode neighbours
    rank_skew: float = 1.2          # ep_hotspot: slowest rank / median rank compute time
    eager_height: float = 2.5       # graph_fallback without counts: eager decode stays below this x baseline
    relation_p: float = 0.01        # interval mixing: permutation p-value of prefill work vs ITL excess

    def __post_init__(self):
        if not 0 < self.host_gap_share <= 1:
            raise ValueError("AttributionConfig.host_gap_share must be in (0, 1]")
        if self.imbalance_rel < 1 or self.imbalance_abs < 1 or self.rank_skew < 1:
            raise ValueError("AttributionConfig imbalance/rank-skew thresholds must be >= 1")
        if not 0 < self.interval_factor <= 1:
            raise ValueError("AttributionConfig.interval_factor must be in (0, 1]")
        if not 0 < self.relation_p < 1 or self.comm_delta <= 0:
            raise ValueError("AttributionConfig.relation_p must be in (0, 1) and comm_delta > 0")


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


def _num(v) -> float | None:
    try:
        f = float(v)
    except (TypeError, ValueError):
        return None
    return f if math.isfinite(f) else None


def _have(ctx: InstanceContext, sig: str) -> bool:
    return ctx.quality.get(sig, "absent") != "absent"


def _q(row: pd.Series, ctx: InstanceContext, sig: str) -> str:
    """The row's quality of ``sig`` (its ``rq_*`` column), else the instance's."""
    v = row.get("rq_" + sig)
    return v if isinstance(v, str) and v else ctx.quality.get(sig, "absent")


def _indep(q: str) -> bool:
    """Only measured or inferred signals corroborate; estimated ones repeat the token allocation."""
    return q in ("measured", "inferred")


def _near_prefill(row: pd.Series, ctx: InstanceContext) -> bool | None:
    """In step with prefill work: the instance's spikes fall near arrivals far above chance (a
    binomial test, signals.periodicity) and this spike is one of them. None when untestable."""
    p = ctx.period or {}
    if not p.get("events"):
        return None
    return bool(p.get("significant")) and bool(row.get("near_prefill_event"))


def _evidence(row: pd.Series, ctx: InstanceContext) -> dict:
    lat, base = _num(row.get("latency_s")), _num(row.get("baseline_s"))
    ev: dict = {"kind": row.get("kind"), "granularity": row.get("granularity"),
                "latency_s": lat, "baseline_s": base,
                "height_x": (lat / base) if lat and base else None}
    for col in ("prefill_tokens", "prefill_reqs", "decode_rows", "decode_reqs", "graph_mode", "sm_active",
                "expert_imbalance", "kv_transfer_bytes", "kv_transfer_s", "preempted_reqs", "gap_before_s",
                "comm_share", "rank_skew", "device_idle_before_s", "arrivals", "large_step_share"):
        v = row.get(col)
        if isinstance(v, str):
            if v != "unknown":
                ev[col] = v
        elif _num(v) is not None:
            ev[col] = _num(v)
    ev["signal_quality"] = {s: _q(row, ctx, s) if s in ("token_allocation", "graph_mode", "sm_active",
                                                        "expert_imbalance", "kv_transfer")
                            else ctx.quality.get(s, "absent") for s in ctx.quality}
    return ev


def attribute(row: pd.Series, ctx: InstanceContext, cfg: AttributionConfig = AttributionConfig()) -> Attribution:
    """Attribute one spike row (step signals plus ``latency_s``, ``baseline_s``); the rules and the
    confidence each reaches with each subset of signals are in docs/analyze.md."""
    if row.get("granularity") == "interval":
        return attribute_interval(row, ctx, cfg)
    lat, base = _num(row.get("latency_s")), _num(row.get("baseline_s"))
    excess = (lat - base) if lat is not None and base is not None else None
    ev = _evidence(row, ctx)

    def done(cause: str, conf: float, **extra) -> Attribution:
        ev.update({k: v for k, v in extra.items() if v is not None})
        return Attribution(cause, round(max(0.0, min(1.0, conf)), 3), ev)

    qa, qg, qs = _q(row, ctx, "token_allocation"), _q(row, ctx, "graph_mode"), _q(row, ctx, "sm_active")
    # 1. PD KV transfer overlapping or preceding the step: measured traffic, before any host call.
    if bool(row.get("kv_xfer")):
        kv_s = _num(row.get("kv_transfer_s"))
        share = min(1.0, kv_s / excess) if kv_s is not None and excess and excess > 0 else None
        conf = (0.75 if _q(row, ctx, "kv_transfer") == "measured" else 0.6) + (0.25 * share if share is not None else 0.0)
        return done("pd_transfer", conf, kv_transfer_share_of_excess=None if share is None else round(share, 3))

    # 2. host stall: a measured idle gap before the step holds most of the excess (never by elimination).
    gap_x = _num(row.get("gap_excess_s"))
    if _have(ctx, "host_time") and excess and excess > 0 and gap_x is not None \
            and gap_x >= cfg.host_gap_share * excess:
        share = min(1.0, gap_x / excess)
        return done("host_stall", 0.6 + 0.4 * share, gap_share_of_excess=round(share, 3))

    # 3. KV pressure: preemptions / retractions in the step.
    if bool(row.get("preempt")):
        kvu = _num(row.get("kv_usage"))
        return done("kv_pressure", 0.8 + (0.2 if kvu is not None and kvu >= 0.9 else 0.0), kv_usage=kvu)

    has_p, has_d = bool(row.get("has_prefill")), bool(row.get("has_decode"))
    alloc = qa != "absent" or row.get("kind") in ("prefill", "decode", "mixed")
    graph_left = bool(row.get("graph_off")) if _indep(qg) else None
    smd = _num(row.get("sm_delta")) if _indep(qs) else None
    sm_high = None if smd is None else smd >= cfg.sm_delta
    periodic = _near_prefill(row, ctx)

    # 4. mixing: both segments in one step; corroborated only by independent signals.
    if alloc and has_p and has_d:
        measured = qa == "measured"
        support = sum(bool(x) for x in (graph_left, sm_high, periodic))
        conf = (0.8 + 0.07 * support) if measured else (0.65 + 0.15 * support)
        if not measured:  # inferred counts: an independent signal that contradicts them weighs
            if graph_left is False and ctx.graph_norm == "FULL":
                conf -= 0.2  # a mixed step cannot replay the FULL decode graph
            if smd is not None and smd <= -cfg.sm_delta:
                conf -= 0.1
        pt, dr = _num(row.get("prefill_tokens")), _num(row.get("decode_rows"))
        if pt is not None and dr is not None and pt < dr:  # a tiny chunk explains little
            conf -= 0.15
        return done("mixing", conf, graph_left_full=graph_left, sm_delta=smd, sm_high=sm_high, periodic=periodic)

    # 5. prefill stall: a prefill-only step while decodes were running.
    if alloc and has_p and not has_d and bool(row.get("decodes_before")):
        conf = 0.85 if qa == "measured" else 0.6 + (0.1 if graph_left else 0.0)
        return done("prefill_stall", conf, decodes_before=True)

    # 6. mixing without token counts: the article's other three signals.
    if not alloc:
        a = _without_counts(row, ctx, cfg, graph_left, smd, sm_high, periodic, done)
        if a is not None:
            return a

    full_replay = row.get("graph_mode") == "FULL" and _indep(qg)
    decode_only = (alloc and has_d and not has_p) or (not alloc and full_replay)
    # 7. EP hotspot / 8. graph fallback, on decode-only steps; the better-supported one wins.
    cands = []
    if decode_only:
        ep = _ep_hotspot(row, ctx, cfg, smd)
        if ep is not None:
            cands.append(ep)
    if decode_only and alloc and qg != "absent" and bool(row.get("graph_off")) and ctx.graph_norm == "FULL":
        dreq = _num(row.get("decode_reqs"))
        outside = None if dreq is None or not ctx.full_batch_sizes else dreq not in ctx.full_batch_sizes
        # engines pad a decode batch up to a captured size: one whose size replayed FULL elsewhere
        # should replay FULL again, so leaving it points elsewhere (e.g. a peer rank's mixed step)
        conf = 0.75 if outside is None else (0.95 if outside else 0.45)
        cands.append(("graph_fallback", conf - (0.0 if _indep(qg) else 0.1),
                      {"graph_norm": ctx.graph_norm, "batch_outside_full_sizes": outside}))
    if cands:
        cause, conf, extra = max(cands, key=lambda c: c[1])
        return done(cause, conf, **extra)

    # 9. unknown: confidence = the share of causes the available signals could rule out.
    checkable = ["host_time", "kv_transfer", "preemption", "token_allocation", "expert_imbalance", "graph_mode"]
    ruled = sum(_have(ctx, s) for s in checkable) / len(checkable)
    return Attribution("unknown", round(ruled, 3), ev | {"reason": ev.get("reason", "no cause's evidence present")})


def _without_counts(row, ctx, cfg, graph_left, smd, sm_high, periodic, done) -> Attribution | None:
    """No token counts: a step that left the decode graph the instance replays is a mixed step
    when it is compute-heavy (SM activity above its decode neighbours) or recurs with prefill
    arrivals, and a graph fallback when it stays memory-bound like its neighbours (a decode batch
    that missed the captured sizes only adds eager launch overhead). Returns None when no rule
    applies, ``unknown`` with the reason when the subset cannot separate the two."""
    left = bool(graph_left) and ctx.graph_norm == "FULL"
    sm_flat = None if smd is None else smd < cfg.sm_delta / 2
    extra = {"graph_left_full": graph_left, "graph_norm": ctx.graph_norm, "sm_delta": smd, "sm_high": sm_high,
             "periodic": periodic}
    if left and sm_high:
        return done("mixing", 0.6 + (0.15 if periodic else 0.0), **extra)
    h = _num(row.get("latency_s")) / _num(row.get("baseline_s")) if _num(row.get("latency_s")) and \
        _num(row.get("baseline_s")) else None
    modest = h is not None and h < cfg.eager_height
    if left and sm_flat:
        if periodic or not modest:
            return done("unknown", 0.3, **extra, reason="left the FULL graph with SM activity at decode level, but "
                        + ("in step with prefill arrivals" if periodic else f"ran {h:.1f}x the baseline, more than "
                           "eager launches of a decode batch add") + ": mixed step and graph fallback disagree")
        return done("graph_fallback", 0.6, **extra)
    if left and periodic:
        return done("mixing", 0.5, **extra)
    if left:
        return done("unknown", 0.3, **extra, reason="left the FULL graph, but without token counts, SM activity or "
                    "prefill arrivals a mixed step cannot be told from a graph fallback")
    if sm_high and periodic:
        return done("mixing", 0.45, **extra)
    return None


def _ep_hotspot(row, ctx, cfg, smd) -> tuple | None:
    """EP hotspot evidence on a decode-only step: an imbalance gauge well above its neighbourhood,
    or comm-bound decode - the collective share of the step up vs its neighbours with SM activity
    not up (ranks wait in the all-to-all), or one rank's compute far slower (rank skew)."""
    qi = _q(row, ctx, "expert_imbalance")
    imb, rel = _num(row.get("expert_imbalance")), _num(row.get("imbalance_rel"))
    if imb is not None and imb >= cfg.imbalance_abs and (rel is None or rel >= cfg.imbalance_rel):
        strength = min(1.0, ((rel or imb) - 1.0) / 2.0)
        return ("ep_hotspot", (0.6 + 0.4 * strength) * (1.0 if qi == "measured" else 0.85), {"imbalance_rel": rel})
    cd, skew = _num(row.get("comm_delta")), _num(row.get("rank_skew"))
    comm_up = cd is not None and cd >= cfg.comm_delta and (smd is None or smd < cfg.sm_delta)
    skewed = skew is not None and skew >= cfg.rank_skew
    if comm_up or skewed:
        conf = 0.55 + 0.15 * (comm_up and skewed) + 0.1 * (smd is not None and smd <= -cfg.sm_delta / 2)
        return ("ep_hotspot", conf, {"comm_delta": cd, "rank_skew_high": skewed})
    return None


def attribute_interval(row: pd.Series, ctx: InstanceContext, cfg: AttributionConfig = AttributionConfig()) -> Attribution:
    """An interval (scrape, periodic log) spike: its counters and gauges, and for mixing the relation
    between prefill work per interval and ITL excess across the instance's intervals - one
    interval's sums alone never show that a prefill shared a step with decodes."""
    ev = _evidence(row, ctx)
    f = cfg.interval_factor

    def done(cause: str, conf: float, **extra) -> Attribution:
        ev.update({k: v for k, v in extra.items() if v is not None})
        return Attribution(cause, round(max(0.0, min(1.0, conf * f)), 3), ev)

    if bool(row.get("kv_xfer")):
        return done("pd_transfer", 0.75 if _q(row, ctx, "kv_transfer") == "measured" else 0.65)
    if bool(row.get("preempt")):
        return done("kv_pressure", 0.8)
    imb, rel = _num(row.get("expert_imbalance")), _num(row.get("imbalance_rel"))
    if imb is not None and imb >= cfg.imbalance_abs and (rel is None or rel >= cfg.imbalance_rel):
        return done("ep_hotspot", 0.6 + 0.4 * min(1.0, ((rel or imb) - 1.0) / 2.0), imbalance_rel=rel)

    def pos(c):
        return _num(row.get(c)) is not None and _num(row.get(c)) > 0

    work = any(pos(c) for c in ("prefill_tokens", "large_step_share", "arrivals", "mixed_steps", "prefill_steps"))
    running = any(pos(c) for c in ("running_reqs", "decode_steps", "mixed_steps", "itl_count", "output_tokens"))
    counted = _num(row.get("mixed_steps")) is not None and _num(row.get("prefill_steps")) is not None
    rho, p = _num(ctx.relation.get("rho")), _num(ctx.relation.get("p_value"))
    related = rho is not None and p is not None and rho > 0 and p < cfg.relation_p
    rel_ev = {"prefill_itl_rho": None if rho is None else round(rho, 3),
              "prefill_itl_p_value": None if p is None else round(p, 4)}
    if work and running:
        # the engine counted a mixed step in the interval, or the row states it (measured kind)
        if pos("mixed_steps") or (row.get("kind") == "mixed" and _q(row, ctx, "token_allocation") == "measured"):
            return done("mixing", 0.7 + (0.15 if related else 0.0), **rel_ev)
        if counted and pos("prefill_steps") and pos("decode_steps"):
            return done("prefill_stall", 0.7 + (0.1 if related else 0.0), decodes_before=True, **rel_ev)
        if related:
            return done("mixing", 0.55 + 0.25 * min(1.0, rho / 0.6), **rel_ev)
        return done("unknown", 0.3, **rel_ev, reason="prefill work ran in the interval, but across intervals ITL "
                    "does not rise with prefill work, so it does not show that the prefill slowed the decodes")
    goff = _num(row.get("graph_off_decode_steps"))
    if goff is not None and goff > 0 and not work:
        return done("graph_fallback", 0.6, interval_graph_off_decode_steps=goff)
    return done("unknown", 0.3, reason="no prefill work, transfer, preemption, imbalance or off-graph decode "
                "counted in the interval")


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

    Interval spike with steps of the step view inside, none slow: a KV transfer or preemption if the
    interval counted one; a host stall only when the ITL sum measures time between steps beyond the
    usual; else ``unknown`` ("no step in the log explains it") - never host_stall by elimination. Step spike the step view left ``unknown`` (log lines carry no imbalance,
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
            # host_stall only where the gap is measured: the ITL sum minus the steps' own time
            # leaves time between steps. Never by elimination.
            cause, conf = "unknown", 0.3
            ev["reason"] = ("ITL spiked but no step in the log explains it (none was slow) and nothing measures "
                            "time between steps")
            thr, gap = _num(row.get("fused_host_gap_threshold_s")), _num(row.get("fused_host_gap_unusual_s"))
            if gap is not None and thr is not None:
                ev["host_gap_unusual_s"] = gap
                if gap > thr:
                    cause, conf = "host_stall", 0.6
                    ev["reason"] = ("no step in the interval was slow and the ITL sum leaves time between steps: "
                                    "requests waited between steps")
                else:  # the ITL sum says requests did not wait between steps either
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
