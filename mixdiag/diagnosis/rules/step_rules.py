"""Step rules: one spike on a step row (a record, a log line, a trace step) gets its cause, first
rule that holds (the table with the signals each rule needs and the confidence each subset
reaches is in docs/analyze.md):

1. ``pd_transfer``    KV traffic overlapping or preceding the step (before any host-stall call);
2. ``host_stall``     a measured idle gap before the step holds most of the excess;
3. ``kv_pressure``    the step preempted / retracted requests for lack of KV blocks;
4. ``mixing``         the token allocation holds prefill tokens *and* decode rows;
5. ``prefill_stall``  a prefill-only step that running decodes waited through (token gaps spanning
   it, or decode rows on both sides with decoders that predate it);
6. ``mixing`` / ``graph_fallback`` without token counts: left the FULL decode graph, and SM
   activity above (compute-heavy: mixing) or at (memory-bound: fallback) the decode level, or
   recurring with prefill arrivals; ``unknown`` with the reason when the subset cannot separate;
   6b. ``mixing`` on a peer EP rank: a decode step whose peer rank's same step held prefill tokens;
7. ``ep_hotspot``     decode-only, an imbalance gauge, comm-bound decode or high rank skew (kernel
   time, or the ranks' SM-busy time on FULL replays whose kernels a graph-level trace hides);
8. ``graph_fallback`` decode-only step that left the graph mode decode steps normally replay
   (a measured graph mode), or - graph mode only planned - whose batch size measurably costs far
   more than the size below it (detection/shape_cost.py);
   8b. a decode line whose latency is a mean over a window (SGLang ``Decode batch``): the prefill
   batches logged inside the window -> ``mixing`` (mixed forwards) or ``prefill_stall``;
9. ``unknown``.
"""
from __future__ import annotations


import pandas as pd

from mixdiag.diagnosis.config import AttributionConfig
from mixdiag.diagnosis.detection.context import InstanceContext
from mixdiag.diagnosis.rules.rule_context import (Attribution, corroborates, evidence_of, have, near_prefill, num,
                                                  row_quality)


def attribute_step(row: pd.Series, ctx: InstanceContext, cfg: AttributionConfig = AttributionConfig()) -> Attribution:
    """Attribute one spike row (step signals plus ``latency_s``, ``baseline_s``); the rules and the
    confidence each reaches with each subset of signals are in docs/analyze.md."""
    lat, base = num(row.get("latency_s")), num(row.get("baseline_s"))
    excess = (lat - base) if lat is not None and base is not None else None
    ev = evidence_of(row, ctx)

    def done(cause: str, conf: float, **extra) -> Attribution:
        ev.update({k: v for k, v in extra.items() if v is not None})
        return Attribution(cause, round(max(0.0, min(1.0, conf)), 3), ev)

    qa, qg, qs = row_quality(row, ctx, "token_allocation"), row_quality(row, ctx, "graph_mode"), row_quality(row, ctx, "sm_active")
    # 1. PD KV transfer overlapping or preceding the step: measured traffic, before any host call.
    if bool(row.get("kv_xfer")):
        # the step's own wait on a side-stream transfer (compute stream idle while it ran) is the measured
        # part of the excess; else the transfer time charged to the step
        wait = num(row.get("kv_wait_s"))
        kv_s = wait if wait else num(row.get("kv_transfer_s"))
        share = min(1.0, kv_s / excess) if kv_s is not None and excess and excess > 0 else None
        conf = (0.75 if row_quality(row, ctx, "kv_transfer") == "measured" else 0.6) + (0.25 * share if share is not None else 0.0)
        return done("pd_transfer", conf, kv_transfer_share_of_excess=None if share is None else round(share, 3),
                    kv_wait_s=wait, kv_overlap_s=num(row.get("kv_overlap_s")))

    # 2. host stall: a measured idle gap before the step holds most of the excess (never by elimination).
    gap_x = num(row.get("gap_excess_s"))
    if have(ctx, "host_time") and excess and excess > 0 and gap_x is not None \
            and gap_x >= cfg.host_gap_share * excess:
        share = min(1.0, gap_x / excess)
        return done("host_stall", 0.6 + 0.4 * share, gap_share_of_excess=round(share, 3))

    # 2b. a peer EP rank's host stall: ranks meet in the all-to-all every step, so this rank's step lasted
    # until the stalled peer launched its part - the peer's measured gap holds most of this step's excess
    # (basis: the all-to-all ends when the last rank arrives; DeepEP / NCCL collectives block on every peer)
    pgap = num(row.get("peer_gap_excess_s"))
    if have(ctx, "host_time") and excess and excess > 0 and pgap is not None and not bool(row.get("has_prefill")) \
            and pgap >= cfg.host_gap_share * excess:
        share = min(1.0, pgap / excess)
        return done("host_stall", 0.5 + 0.3 * share, peer_gap_share_of_excess=round(share, 3),
                    reason="a peer EP rank's host stalled before this step; this rank waited for it in the all-to-all")

    # 3. KV pressure: preemptions / retractions in the step.
    if bool(row.get("preempt")):
        kvu = num(row.get("kv_usage"))
        return done("kv_pressure", 0.8 + (0.2 if kvu is not None and kvu >= 0.9 else 0.0), kv_usage=kvu)

    has_p, has_d = bool(row.get("has_prefill")), bool(row.get("has_decode"))
    alloc = qa != "absent" or row.get("kind") in ("prefill", "decode", "mixed")
    graph_left = bool(row.get("graph_off")) if corroborates(qg) else None
    smd = num(row.get("sm_delta")) if corroborates(qs) else None
    sm_high = None if smd is None else smd >= cfg.sm_delta
    periodic = near_prefill(row, ctx)

    # 4. mixing: both segments in one step; corroborated only by independent signals.
    pt, dr = num(row.get("prefill_tokens")), num(row.get("decode_rows"))
    if alloc and has_p and has_d and pt is not None and pt < cfg.chunk_min_tokens:
        # A chunk below one that can slow a step (cfg.chunk_min_tokens, the roofline ridge: under it a
        # forward stays memory-bound and costs about a decode pass) does not explain a spike, measured or
        # inferred. The strict rules of tiers (e2) and (g) count the same way; measured there: 641 of 773
        # wrong mixing calls of the real-vLLM client view sat on steps a 32-128-token prompt joined, and
        # the independent generator's vLLM Iteration lines gave 5.8 % false mixing on 18-92-token chunks.
        return done("unknown", 0.3, prefill_tokens=pt, reason=(
            f"a short prompt ({pt:.0f} tokens, {qa}) joined this step: below a chunk that slows a step "
            f"({cfg.chunk_min_tokens:.0f}), and nothing else measured here names a cause"))
    if alloc and has_p and has_d:
        measured = qa == "measured"
        support = sum(bool(x) for x in (graph_left, sm_high, periodic))
        conf = (0.8 + 0.07 * support) if measured else (0.65 + 0.15 * support)
        if not measured:  # inferred counts: an independent signal that contradicts them weighs
            if graph_left is False and ctx.graph_norm == "FULL":
                conf -= 0.2  # a mixed step cannot replay the FULL decode graph
            if smd is not None and smd <= -cfg.sm_delta:
                conf -= 0.1
        if pt is not None and dr is not None and pt < dr:  # a tiny chunk explains little
            conf -= 0.15
        return done("mixing", conf, graph_left_full=graph_left, sm_delta=smd, sm_high=sm_high, periodic=periodic)

    # 5. prefill stall: a prefill-only step that running decodes waited through - a token gap spans
    # it (token events), else decode rows before and after it with more decoders after than it
    # prefilled (signals.decodes_waited). A prefill-only step nobody was decoding through (vLLM V1
    # runs one only then) stalls nobody.
    if alloc and has_p and not has_d and _decodes_waited(row):
        conf = 0.85 if qa == "measured" else 0.6 + (0.1 if graph_left else 0.0)
        return done("prefill_stall", conf, decodes_before=True, decodes_waited=True)

    # 6. mixing without token counts: the article's other three signals.
    if not alloc:
        a = _without_counts(row, ctx, cfg, graph_left, smd, sm_high, periodic, done)
        if a is not None:
            return a

    full_replay = row.get("graph_mode") == "FULL" and corroborates(qg)
    decode_only = (alloc and has_d and not has_p) or (not alloc and full_replay)
    # 6b. an EP rank's decode step whose peer rank ran prefill tokens in the same step: they meet in
    # the all-to-all, so this rank waited for the peer's mixed step (and engines that keep ranks in
    # one graph mode run the whole step eager) - mixing, on the peer; never this rank's fallback.
    if decode_only and bool(num(row.get("peer_prefill"))):
        both_off = bool(row.get("graph_off")) and bool(num(row.get("peer_graph_off")))
        return done("mixing", 0.55 + (0.1 if both_off else 0.0), peer_rank_prefill=True,
                    reason="a peer EP rank's same step held prefill tokens; this rank waited for it in the "
                           "all-to-all")
    # 6c. every EP rank left the FULL graph on a step whose batch size replays FULL elsewhere, with no gauge:
    # ranks share one graph mode (vLLM coordinate_batch_across_dp, SGLang DP attention), so a peer's prompt
    # chunk is the likely reason - but no peer counted one. This rank waited in the all-to-all; whether the
    # peer computed a chunk or its experts is not measured, so neither a hotspot nor a fallback is named.
    dreq = num(row.get("decode_reqs"))
    if decode_only and alloc and corroborates(qg) and bool(row.get("graph_off")) and bool(num(row.get("peer_graph_off"))) \
            and ctx.graph_norm == "FULL" and dreq is not None and dreq in ctx.full_batch_sizes \
            and num(row.get("expert_imbalance")) is None:
        checkable = ["host_time", "kv_transfer", "preemption", "token_allocation", "expert_imbalance", "graph_mode"]
        ruled = sum(have(ctx, c) for c in checkable) / len(checkable)
        return done("unknown", round(ruled, 3), peer_graph_off=True, reason=(
            "every EP rank left the FULL graph although this batch size replays FULL elsewhere: a peer rank's prompt "
            "chunk is likely (ranks share one graph mode), but no peer's prefill tokens were counted; this rank "
            "waited in the all-to-all, so neither an expert hotspot nor a graph fallback is measured"))
    # 7. EP hotspot / 8. graph fallback, on decode-only steps; the better-supported one wins.
    cands = []
    if decode_only:
        ep = _ep_hotspot(row, ctx, cfg, smd)
        if ep is not None:
            cands.append(ep)
    if decode_only and alloc and corroborates(qg) and bool(row.get("graph_off")) and ctx.graph_norm == "FULL":
        dreq = num(row.get("decode_reqs"))
        outside = None if dreq is None or not ctx.full_batch_sizes else dreq not in ctx.full_batch_sizes
        # engines pad a decode batch up to a captured size: one whose size replayed FULL elsewhere
        # should replay FULL again, so leaving it points elsewhere (e.g. a peer rank's mixed step)
        conf = 0.75 if outside is None else (0.95 if outside else 0.45)
        cands.append(("graph_fallback", conf, {"graph_norm": ctx.graph_norm, "batch_outside_full_sizes": outside}))
    elif decode_only and alloc and not corroborates(qg) and row.get("step_source") != "client":
        # (not on client-timed steps: their batch size is the count of streams whose chunks one read
        # delivered, and their cost includes the client's own timing noise - neither is the batch
        # the engine ran nor what it cost)
        # no measured graph mode (a planned one is context only): the cost of the batch shape,
        # measured - every decode step of this size costs far more than the size below it
        sx = num(row.get("shape_cost_x"))
        if sx is not None and sx >= cfg.shape_jump:
            cands.append(("graph_fallback", 0.7, {"shape_cost_x": round(sx, 3),
                                                  "shape_ref_reqs": num(row.get("shape_ref_reqs"))}))
    # 7b. a KV transfer that ran beside the step on a side stream without the forward waiting for it (copy
    # engines share HBM / PCIe with the forward): weaker than a wait, so only a candidate among the others
    if bool(row.get("kv_beside")) and (decode_only or not alloc):
        cands.append(("pd_transfer", 0.55, {"kv_overlap_s": num(row.get("kv_overlap_s")),
                                            "kv_transfer_share_of_excess": None}))
    if cands:
        cause, conf, extra = max(cands, key=lambda c: c[1])
        return done(cause, conf, **extra)
    # 8b. a decode line whose height is a mean over the forwards since the previous decode line
    # (SGLang's gen throughput), run in its usual graph mode: the prefill batches logged inside
    # that window explain it - mixed forwards (mixing) or prefill-only batches decodes waited
    # through (prefill_stall). The mean cannot say which forward was slow: lower confidence.
    wm, ws = num(row.get("window_mixed_steps")), num(row.get("window_stall_steps"))
    if decode_only and (wm or ws):
        cause = "mixing" if (wm or 0) >= (ws or 0) else "prefill_stall"
        return done(cause, 0.5 + (0.1 if periodic else 0.0), window_mixed_steps=wm, window_stall_steps=ws)

    # 9. unknown: confidence = the share of causes the available signals could rule out.
    checkable = ["host_time", "kv_transfer", "preemption", "token_allocation", "expert_imbalance", "graph_mode"]
    # a planned (estimated) graph mode rules nothing out: it cannot raise this confidence either
    ruled = sum(have(ctx, s) and not (s == "graph_mode" and not corroborates(qg)) for s in checkable) / len(checkable)
    if full_replay and decode_only and not (num(row.get("comm_share")) or 0) and num(row.get("rank_skew")) is None:
        ev["reason"] = ("a decode step replayed the FULL graph slower than usual; a graph replay hides its kernels "
                        "(no collective time, no per-rank compute), so an EP hotspot cannot be told from other "
                        "in-graph slowdowns" + (" (the ranks' SM-busy time was even)"
                                                if num(row.get("rank_sm_skew")) is not None else ""))
    return Attribution("unknown", round(ruled, 3), ev | {"reason": ev.get("reason", "no cause's evidence present")})


def _decodes_waited(row) -> bool:
    """Running decodes got no token during this prefill-only step (``decodes_waited``: with token
    events a gap spans it, step_view; without, the step rows around it, signals.decodes_waited), or
    a request that sat out steps felt its wait here."""
    return bool(row.get("decodes_waited")) or bool(row.get("request_stall", False))


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
    h = num(row.get("latency_s")) / num(row.get("baseline_s")) if num(row.get("latency_s")) and \
        num(row.get("baseline_s")) else None
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
    qi = row_quality(row, ctx, "expert_imbalance")
    imb, rel = num(row.get("expert_imbalance")), num(row.get("imbalance_rel"))
    if imb is not None and imb >= cfg.imbalance_abs and (rel is None or rel >= cfg.imbalance_rel):
        strength = min(1.0, ((rel or imb) - 1.0) / 2.0)
        return ("ep_hotspot", (0.6 + 0.4 * strength) * (1.0 if qi == "measured" else 0.85), {"imbalance_rel": rel})
    cd, skew = num(row.get("comm_delta")), num(row.get("rank_skew"))
    comm_up = cd is not None and cd >= cfg.comm_delta and (smd is None or smd < cfg.sm_delta)
    skewed = skew is not None and skew >= cfg.rank_skew
    if comm_up or skewed:
        conf = 0.55 + 0.15 * (comm_up and skewed) + 0.1 * (smd is not None and smd <= -cfg.sm_delta / 2)
        return ("ep_hotspot", conf, {"comm_delta": cd, "rank_skew_high": skewed})
    # compute hidden inside graph replays: the ranks' SM-busy time over the step. The waiting rank
    # keeps only its all-to-all kernel's CTAs active, the hot rank computes on all SMs. Weaker than
    # kernel-level skew (which rank is hot is not known, and a wide comm kernel hides the wait), so
    # lower confidence and no SM-down bonus (that is the same measurement).
    sk, skd = num(row.get("rank_sm_skew")), num(row.get("sm_skew_delta"))
    # a replay hides the compute: FULL, or PIECEWISE (the MoE layers sit inside the piece graphs; only
    # attention runs eager between them) - the caller has already required a decode-only step
    replayed = row.get("graph_mode") in ("FULL", "PIECEWISE") and corroborates(row_quality(row, ctx, "graph_mode"))
    if replayed and skew is None and sk is not None and sk >= cfg.rank_sm_skew and skd is not None \
            and skd >= cfg.sm_skew_delta:
        return ("ep_hotspot", 0.5, {"rank_sm_skew": sk, "sm_skew_delta": skd, "rank_skew_method": "sm_busy"})
    return None
