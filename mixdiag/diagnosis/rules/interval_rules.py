"""Interval rules: a spike on an interval row (a scrape, a periodic stats line) is judged from its
own evidence - its counters and gauges, its height against the reference, the prefill work in it
and its neighbours against the instance's usual work per interval. The whole-run relation between
prefill work and ITL excess (one permutation p-value for the instance) moves confidence only
(:func:`relation_confidence`): a verdict never flips on it."""
from __future__ import annotations

import pandas as pd

from mixdiag.diagnosis.config import AttributionConfig
from mixdiag.diagnosis.detection.context import InstanceContext
from mixdiag.diagnosis.detection.chunk_step import large_chunk_one
from mixdiag.diagnosis.rules.rule_context import Attribution, evidence_of, num, off_graph_dominates, row_quality


def relation_confidence(relation: dict, cfg: AttributionConfig) -> float:
    """What the whole-run prefill/ITL relation adds to an interval's confidence: up to
    ``cfg.relation_weight`` for a positive rank correlation, linear in rho up to
    ``cfg.relation_rho_full`` and in the p-value down to nothing at ``cfg.relation_p_zero`` - smooth,
    so that two runs of the same traffic (p = 0.002 and p = 0.014) differ by a hundredth of
    confidence, not by a verdict. 0 when untested."""
    rho, p = num(relation.get("rho")), num(relation.get("p_value"))
    if rho is None or p is None or rho <= 0:
        return 0.0
    return cfg.relation_weight * min(1.0, rho / cfg.relation_rho_full) * max(0.0, 1.0 - p / cfg.relation_p_zero)


def _level(near, usual, sigma, cfg: AttributionConfig) -> str | None:
    """``"out"`` above usual + k sigma, ``"usual"`` at least the usual, None below it or no work."""
    if near is None or near <= 0 or (usual is not None and near < usual):
        return None
    thr = None if usual is None else usual + cfg.work_mad_k * (sigma or 0.0)
    return "out" if thr is None or near > thr else "usual"


def work_evidence(row, ctx: InstanceContext, cfg: AttributionConfig) -> tuple[str | None, dict]:
    """How the prefill work in the interval (``prefill_work_near``; beside a spread estimate also the
    prompt counter, ``prefill_count_near``) compares with the instance's usual work per interval:
    ``"out"`` above the median + ``cfg.work_mad_k`` robust sigmas (far more than the usual intervals
    held without spiking), ``"usual"`` at least the median (a typical share of the prefill that runs
    in nearly every interval under steady arrivals), None below it or with none (less work than the
    usual intervals held without spiking does not explain the spike). The higher reading wins."""
    rel = ctx.relation
    near, usual, sigma = num(row.get("prefill_work_near")), num(rel.get("work_median")), num(rel.get("work_sigma"))
    cnear, cusual, csigma = num(row.get("prefill_count_near")), num(rel.get("count_median")), num(rel.get("count_sigma"))
    if near is None and cnear is None:
        return None, {}
    ev = {"prefill_work_near": near, "prefill_work_usual": usual,
          "prefill_work_threshold": None if usual is None else round(usual + cfg.work_mad_k * (sigma or 0.0), 3),
          "prefill_count_near": cnear, "prefill_count_usual": cusual}
    levels = [_level(near, usual, sigma, cfg), _level(cnear, cusual, csigma, cfg)]
    return ("out" if "out" in levels else "usual" if "usual" in levels else None), ev


def attribute_interval(row: pd.Series, ctx: InstanceContext, cfg: AttributionConfig = AttributionConfig()) -> Attribution:
    """An interval (scrape, periodic log) spike, from its own evidence: counters and gauges, and for
    mixing the prefill work in and around it against the instance's usual work per interval - one
    interval's sums never show that a prefill shared a step with decodes, but work well above the
    usual, beside a spike the usual intervals did not show, does point at it. The whole-run relation
    moves confidence only."""
    ev = evidence_of(row, ctx)
    f = cfg.interval_factor

    def done(cause: str, conf: float, **extra) -> Attribution:
        ev.update({k: v for k, v in extra.items() if v is not None})
        if cause == "mixing" and bool(row.get("chunk_tail")):
            # the spike is the tail alone (detection/interval_spikes._chunk_tail): say what was measured
            ev["tail_only"] = ("only the slowest tokens moved - one per running request, the decodes of the chunk's "
                               "step - read from the highest ITL bucket that grew; the interval's P99 did not")
        return Attribution(cause, round(max(0.0, min(1.0, conf * f)), 3), ev)

    if bool(row.get("kv_xfer")):
        return done("pd_transfer", 0.75 if row_quality(row, ctx, "kv_transfer") == "measured" else 0.65)
    if bool(row.get("preempt")):
        return done("kv_pressure", 0.8)
    if bool(row.get("preempted_tail")):
        # spiked only by one token's wait, after a preemption the engine counted in the interval before: the
        # preempted request's next token (recompute), not the batch (detection/interval_spikes.py)
        return done("kv_pressure", 0.7, reason="one token waited this long right after the engine counted a "
                                               "preemption in the interval before: the preempted request's "
                                               "recompute wait; no quantile of the interval moved")
    imb, rel = num(row.get("expert_imbalance")), num(row.get("imbalance_rel"))
    if imb is not None and imb >= cfg.imbalance_abs and (rel is None or rel >= cfg.imbalance_rel):
        return done("ep_hotspot", 0.6 + 0.4 * min(1.0, ((rel or imb) - 1.0) / 2.0), imbalance_rel=rel)
    nb = num(row.get("imbalance_rel_neighbour"))
    if rel is not None and rel >= cfg.imbalance_edge_rel and nb is not None and nb >= cfg.imbalance_rel:
        # the edge of a hotspot window: the balancedness summary is a mean over the interval's
        # forwards, so a window that began or ended mid-interval shows diluted - above the usual,
        # under the full threshold - next to an interval where it ran throughout
        return done("ep_hotspot", 0.5, imbalance_rel=rel, neighbour_imbalance_rel=nb,
                    reason="expert imbalance above the usual, next to an interval of a full hotspot (a window "
                           "edge); the interval's mean dilutes it")

    def pos(c):
        return num(row.get(c)) is not None and num(row.get(c)) > 0

    lat, base = num(row.get("latency_s")), num(row.get("baseline_s"))
    excess = lat - base if lat is not None and base is not None else None
    gap, gsig = num(row.get("gap_excess_s")), num(row.get("gap_excess_sigma_s"))
    if gap is not None and gap > 0 and excess and excess > 0 and gap >= cfg.host_wait_k * (gsig or 0.0) \
            and gap >= cfg.host_gap_share * excess:
        # measured, never by elimination: the engine counted its GPU idle, waiting on the host, this much
        # beyond its usual share of the interval, and that wait holds most of the interval's ITL excess
        share = min(1.0, gap / excess)
        pause, stopped = num(row.get("host_pause_s")), num(row.get("host_stopped_s"))
        timed = pause is not None and pause > 0   # vLLM's GC debugger timed the collections
        seen = stopped is not None and stopped > 0   # the OS saw the engine process stopped (host sampler)
        said = [f"the engine logged {pause:.3f} s of garbage collection in the interval (its own GC timing)"] if timed else []
        if seen:
            said.append(f"the OS saw the engine process stopped {stopped:.3f} s in the interval "
                        f"(host sampler)")
        reason = " and ".join(said) or (f"the GPU waited {gap:.3f} s on the host beyond its usual share of the "
                                        f"interval (the engine's own count)")
        return done("host_stall", 0.6 + 0.3 * share, gap_share_of_excess=round(share, 3),
                    interval_host_wait_excess_s=round(gap, 4), host_pause_s=round(pause, 4) if timed else None,
                    host_stopped_s=round(stopped, 4) if seen else None,
                    reason=reason + ", most of the interval's ITL excess")

    if bool(row.get("starved")):
        # no token came out while requests ran and prompts were computed, and the waiters logged
        # the wait on resuming (interval_spikes): the prefill ran without the decodes
        return done("prefill_stall", 0.75, decodes_before=True, starved_interval=True,
                    reason="requests were running but no token came out in the interval while prompt tokens "
                           "were computed; the next tokens logged an ITL as long as the wait")
    level, work_ev = work_evidence(row, ctx, cfg)
    work = level is not None or any(pos(c) for c in ("prefill_tokens", "prefill_work_tokens", "large_step_share", "arrivals",
                                         "mixed_steps", "prefill_steps"))
    running = any(pos(c) for c in ("running_reqs", "decode_steps", "mixed_steps", "itl_count", "output_tokens"))
    counted = num(row.get("mixed_steps")) is not None and num(row.get("prefill_steps")) is not None
    rho, p = num(ctx.relation.get("rho")), num(ctx.relation.get("p_value"))
    bonus = relation_confidence(ctx.relation, cfg)
    rel_ev = {"prefill_itl_rho": None if rho is None else round(rho, 3),
              "prefill_itl_p_value": None if p is None else round(p, 4), "relation_confidence": round(bonus, 3)}
    chunk = num(row.get("prompt_chunk_ahead_tokens"))
    # the running batch at either end of the interval (the gauge at the previous scrape and at this one): at
    # the start, the interval's first steps ran that batch; at the end, its last ones
    ends = [v for v in (num(row.get("running_reqs")), num(row.get("running_reqs_start"))) if v is not None]
    umin, batch = num(row.get("graph_none_min_tokens")), (max(ends) if ends else None)
    # no step in or just after the interval held a chunk that slows a step (chunk_step.py: a chunk of chunk_min
    # tokens, or a step of the chunk_min bucket beside a handful of decodes)
    small_chunk = chunk is not None and not large_chunk_one(chunk, batch, cfg.chunk_min_tokens)
    short = level != "out" or small_chunk
    # a large prompt chunk ran in the interval - the engine's own iteration histogram holds a step of at least
    # batch + chunk_min tokens (decodes add one token each), or the prompt ahead was that large - and no step
    # was decode-only (every step scheduled more tokens than the batch: large_step_share 1, or unmeasured).
    # Then the batch's steps were mixed, not decode-only ones off the graph. Judged absolutely, not only by
    # "no more than the intervals that did not spike" (`short`): in a sustained mixing stretch every interval
    # holds that much (e2 tuning seed 23: 71 mixing intervals named graph_fallback)
    floor, lss = num(row.get("iteration_tokens_floor")), num(row.get("large_step_share"))
    big_chunk = (large_chunk_one(chunk, batch, cfg.chunk_min_tokens)
                 or (floor is not None and batch is not None and large_chunk_one(floor - batch, batch, cfg.chunk_min_tokens)))
    chunked = big_chunk and not (lss is not None and lss < 1.0)
    if umin is not None and batch is not None and batch >= umin and short and not chunked and not pos("mixed_steps"):
        # vLLM dispatches NONE above the largest capture size, so a running batch at least as large as
        # the smallest one run without a graph - counted by the engine's own table in this window, or
        # one above the largest capture size its start-up config printed - decoded eager; no chunk that
        # could slow a step beside it
        return done("graph_fallback", 0.6, graph_none_min_tokens=umin, running_reqs=batch,
                    reason=f"vLLM runs a batch of {umin:.0f} tokens or more without a CUDA graph here (its "
                           f"CUDA-graph table or its largest capture size says so), and {batch:.0f} requests "
                           f"were running; no large prompt chunk")
    if work and running and off_graph_dominates(row, cfg.chunk_min_tokens):
        return done("graph_fallback", 0.6, interval_graph_off_decode_steps=num(row.get("graph_off_decode_steps")),
                    reason="decode passes off the captured graph outnumber the interval's mixed steps, whose "
                           "small prompt chunks cost about one decode pass each")
    if work and running:
        # the engine counted a mixed step in the interval, or the row states it (measured kind)
        if pos("mixed_steps") or (row.get("kind") == "mixed" and row_quality(row, ctx, "token_allocation") == "measured"):
            return done("mixing", 0.7 + bonus, **rel_ev)
        if counted and pos("prefill_steps") and pos("decode_steps"):
            return done("prefill_stall", 0.7 + bonus, decodes_before=True, **rel_ev)
        if counted and not pos("mixed_steps") and not pos("prefill_steps"):
            return done("unknown", 0.3, **rel_ev, reason="the engine counted no prefill or mixed step in the interval: "
                        "its prompt tokens were counted here but computed before")
        if level == "out" and small_chunk:
            return done("unknown", 0.3, **rel_ev, **work_ev, prompt_chunk_ahead_tokens=chunk,
                        reason=f"prefill work stands above the usual, but no iteration in or up to one prefill time "
                               f"after the interval held a prompt chunk of {cfg.chunk_min_tokens:.0f} tokens beside the decode "
                               f"batch: only short prompts ran, each about one decode pass")
        most = max((v for v in (num(row.get("prefill_tokens")), num(work_ev.get("prefill_work_near")),
                                num(work_ev.get("prefill_count_near"))) if v is not None), default=None)
        if level == "out" and most is not None and most < cfg.chunk_min_tokens:
            # every reading of the prompt work in and near the interval sums to less than one chunk of
            # chunk_min_tokens, so no step in it carried one: each short prompt cost about one decode
            # pass (the roofline basis of chunk_min_tokens). Measured on tier (e2) tuning seeds: SGLang
            # host-stall stretches with 200 prompt tokens in the interval were named mixing.
            return done("unknown", 0.3, **rel_ev, **work_ev,
                        reason=f"prefill work stands above the usual, but all of it in and near the interval sums "
                               f"to under {cfg.chunk_min_tokens:.0f} prompt tokens: no step held a large chunk")
        if level == "out":
            return done("mixing", 0.55 + bonus, **rel_ev, **work_ev,
                        reason="prefill work in the interval stands far above the usual work of the intervals that "
                               "did not spike, with decodes running and no other fault counted")
        if big_chunk:
            # no more work than the intervals that did not spike, but judged absolutely the engine's own
            # iteration histogram holds a step with a large prompt chunk in or just after the interval. vLLM V1
            # schedules that chunk with the running decodes in one step, and a chunk of chunk_min tokens or
            # more costs several decode passes (the roofline ridge), so it is the measured part of the spike
            # against a reference the sustained stretch cannot move. Sustained mixing puts such a chunk in
            # every interval, which is why "more than the usual" fails there (e2 tuning seeds 10-29: 85 of
            # 430 mixing intervals were `unknown` by that test alone). vLLM's histogram books a prompt's
            # tokens at its last chunk (formats.md), so such a step says a prompt of chunk_min+ tokens finished
            # here; its chunks ran in this interval or just before it, beside the decodes
            return done("mixing", 0.5 + bonus, **rel_ev, **work_ev, prompt_chunk_ahead_tokens=chunk,
                        iteration_tokens_floor=floor,
                        reason="prefill work no higher than the usual, but a step of the interval held a prompt "
                               f"chunk of {cfg.chunk_min_tokens:.0f}+ tokens beside the running decodes (the "
                               "engine's iteration histogram)")
        # at or below the quiet intervals' level: those intervals held as much prefill work without spiking
        # (real vLLM control runs, short prompts in every interval: 'at least the usual' named 75 % of the
        # spikes mixing where no big chunk ran), so the work does not explain this spike
        return done("unknown", 0.3, **rel_ev, **work_ev,
                    reason="prefill work ran in the interval, but no more than the intervals that did not spike "
                           "held: it does not explain the spike")
    goff = num(row.get("graph_off_decode_steps"))
    if goff is not None and goff > 0 and not work:
        # decode passes the engine itself counted as run without a graph: a direct count
        return done("graph_fallback", 0.7, interval_graph_off_decode_steps=goff)
    return done("unknown", 0.3, reason="no prefill work, transfer, preemption, imbalance or off-graph decode "
                "counted in the interval")
