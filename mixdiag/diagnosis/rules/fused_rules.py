"""Fused rules: one engine seen through step rows (log lines, a trace) and interval rows
(scrapes). A spike's own attribution is refined with the other view's evidence (the ``fused_*``
columns of :mod:`mixdiag.diagnosis.evidence.fusion`), and interval rows that are no spike of their own are
judged for waits between steps and preemptions."""
from __future__ import annotations

import math

import pandas as pd

from mixdiag.diagnosis.config import AttributionConfig
from mixdiag.diagnosis.rules.rule_context import Attribution, num


def _pos(v) -> bool:
    """``(v or 0) > 0`` for a cell that may be missing or NaN."""
    f = num(v)
    return f is not None and f > 0


def _extend_only(ev: dict) -> bool:
    """A mixed step whose context requests scheduled one token each: 1-token EXTENDs of requests
    whose KV was installed from a prefill worker (PD), not a prompt chunk mixed into decode."""
    tok, reqs = ev.get("prefill_tokens"), ev.get("prefill_reqs")
    return tok is not None and reqs is not None and math.isfinite(tok) and math.isfinite(reqs) and 0 < tok <= reqs


def _prefill_in_log(row: pd.Series, a: Attribution, cfg: AttributionConfig = AttributionConfig()) -> Attribution | None:
    """An interval spike whose step view (log lines) holds prefill work but no slow step: log lines
    without a duration (SGLang's ``Prefill batch`` lines are stamped when the batch is scheduled, in
    whole seconds) cannot be slow, so the interval's ITL is the only latency. A step in the interval
    that held prefill and decode rows (SGLang: a Prefill line with ``#running-req`` > 0 under
    ``--enable-mixed-chunk``) -> mixing; prefill-only steps that running decodes waited through
    (the same line without mixed chunk: SGLang runs the prefill batch alone) -> prefill_stall; only
    1-token extends after a KV transfer in this or the previous interval -> pd_transfer. The
    lines show the work, not its duration, so confidence stays below the step rules'; it rises with
    the whole-run prefill/ITL relation (interval_rules.relation_confidence), never decided by it."""
    mixed, stall = num(row.get("fused_mixed_steps_in_interval")), num(row.get("fused_stall_steps_in_interval"))
    if num(row.get("prefill_tokens")) == 0:
        return None  # the interval's own prompt-token counter saw no prefill finish in it
    installs, recent = num(row.get("fused_install_steps_in_interval")), num(row.get("fused_recent_kv_transfer_bytes"))
    if installs and recent and not mixed:  # KV arrived just before; the log's extends installed it
        return Attribution("pd_transfer", round(0.7 * cfg.interval_factor, 3),
                           dict(a.evidence) | {"install_steps_in_log": installs, "recent_kv_transfer_bytes": recent,
                                               "reason": "a KV transfer was counted in this or the previous "
                                                         "interval and the log's only prefill lines are 1-token "
                                                         "extends of transferred requests"})
    bonus = num(a.evidence.get("relation_confidence")) or 0.0  # the whole-run relation: confidence only
    ev = dict(a.evidence) | {"mixed_steps_in_log": mixed, "stall_steps_in_log": stall}
    if mixed:
        return Attribution("mixing", round((0.7 + bonus) * cfg.interval_factor, 3),
                           ev | {"reason": "the log shows prefill batches forwarded with running decodes "
                                           "(mixed chunk) in the interval whose ITL spiked"})
    if stall:
        return Attribution("prefill_stall", round(0.7 * cfg.interval_factor, 3),
                           ev | {"reason": "the log shows prefill-only batches while decodes were running "
                                           "(no mixed chunk: they waited) in the interval whose ITL spiked"})
    return None


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
        n = num(row.get("fused_steps_in_interval"))
        if not n:
            return a  # no step view covers the interval
        ev = dict(a.evidence)
        ev["steps_in_interval"] = int(n)
        ev["slow_steps_in_interval"] = 0
        if ev.get("kv_transfer_bytes", 0) or ev.get("kv_transfer_s", 0):
            cause, conf = "pd_transfer", 0.75
        elif ev.get("preempted_reqs", 0):
            cause, conf = "kv_pressure", 0.75
        elif a.cause in ("ep_hotspot", "graph_fallback") or a.evidence.get("starved_interval") \
                or (a.cause == "host_stall" and "interval_host_wait_excess_s" in a.evidence):
            return a  # the interval's own gauges/counters named it; the log's lines say nothing against it
        elif (prefill := _prefill_in_log(row, a)) is not None:
            return prefill
        else:
            # host_stall only where the gap is measured: the ITL sum minus the steps' own time
            # leaves time between steps. Never by elimination.
            cause, conf = "unknown", 0.3
            ev["reason"] = ("ITL spiked but no step in the log explains it (none was slow) and nothing measures "
                            "time between steps")
            thr, gap = num(row.get("fused_host_gap_threshold_s")), num(row.get("fused_host_gap_unusual_s"))
            if gap is not None and thr is not None:
                ev["host_gap_unusual_s"] = gap
                if gap > thr and _pos(row.get("fused_recent_stall_steps")):
                    ev["reason"] = ("ITL spiked and the ITL sum leaves time between steps, but decodes waited "
                                    "through prefill-only steps here or just before (a wait across the scrape "
                                    "boundary cannot be told from host time)")
                elif gap > thr:
                    cause, conf = "host_stall", 0.6
                    ev["reason"] = ("no step in the interval was slow and the ITL sum leaves time between steps: "
                                    "requests waited between steps")
                else:  # the ITL sum says requests did not wait between steps either
                    ev["reason"] = ("ITL P99 spiked, but no step was slow and the ITL sum leaves no time between "
                                    "steps (a histogram-bucket or interval-edge effect)")
        return Attribution(cause, round(conf * cfg.interval_factor, 3), ev)
    if a.cause in ("unknown", "mixing", "prefill_stall") and _host_pause_holds(row, cfg):
        # measured: the engine timed a pause of its own (a garbage collection) in the step's span, as long
        # as most of the step's excess, and the step lasted at least half of it (it spanned the pause). Any
        # step kind: requests that arrived during the pause join the step that ends it; a prompt chunk in
        # that step costs what a chunk costs, the pause carries the rest (the headline is the larger part)
        pause, seen = num(row.get("fused_interval_host_pause_s")), num(row.get("fused_interval_host_stopped_s"))
        seen = seen if seen is not None and seen > 0 else None
        gc = pause - (seen or 0.0)
        said = ([f"the engine logged {gc:.3f} s of garbage collection"] if gc > 1e-9 else []) + (
            [f"the OS saw the engine process stopped {seen:.3f} s (host sampler)"] if seen else [])
        return Attribution("host_stall", round(0.7 * cfg.interval_factor, 3), dict(a.evidence) | {
            "interval_host_pause_s": pause, **({"interval_host_stopped_s": seen} if seen else {}),
            "reason": " and ".join(said) + " where this step ran, most of the step's excess"})
    k = num(row.get("fused_interval"))
    # a step called mixing, or left unknown for a chunk too small to slow a step (step rule 4), whose
    # context requests scheduled one token each: the shape of a PD install
    pd_install = a.cause in ("mixing", "unknown") and a.evidence.get("kind") == "mixed" and _extend_only(a.evidence)
    if k is None or (a.cause != "unknown" and not pd_install) \
            or a.evidence.get("kind") != ("mixed" if pd_install else "decode"):
        return a
    conf = round(0.6 * cfg.interval_factor, 3)
    xfer = num(row.get("fused_interval_kv_transfer_bytes"))
    if pd_install:  # only a transfer can explain it; with none counted, the step's own verdict stands
        # the KV arrived in the step's interval or just before it (the transfer precedes the install)
        xfer = max((x for x in (xfer, num(row.get("fused_recent_kv_transfer_bytes"))) if x is not None),
                   default=None)
        if _pos(xfer):  # the step's shape (1-token installs) and a measured transfer: two pieces
            return Attribution("pd_transfer", round(0.75 * cfg.interval_factor, 3), dict(a.evidence) | {"interval": int(k),
                                                                        "interval_kv_transfer_bytes": xfer})
        return a
    ev = dict(a.evidence) | {"interval": int(k)}
    imb, med = num(row.get("fused_interval_expert_imbalance")), num(row.get("fused_interval_imbalance_median"))
    goff = num(row.get("fused_interval_graph_off_decode_steps"))
    if imb is not None and imb >= cfg.imbalance_abs and med is not None and imb >= cfg.imbalance_rel * med:
        cause, ev["interval_expert_imbalance"] = "ep_hotspot", imb
    elif _pos(goff) and bool(num(row.get("fused_among_largest_batches"))):
        cause, ev["interval_graph_off_decode_steps"] = "graph_fallback", goff
    elif _pos(xfer) and not num(row.get("fused_pd_install")):
        cause, ev["interval_kv_transfer_bytes"] = "pd_transfer", xfer
    elif _pos(row.get("fused_interval_preempted_reqs")):
        cause, ev["interval_preempted_reqs"] = "kv_pressure", num(row.get("fused_interval_preempted_reqs"))
    elif _host_wait_holds(row, cfg):
        # measured, not by elimination: the engine counted its GPU waiting on the host, per forward, this
        # much beyond the usual throughout the step's span - most of the step's excess
        cause, ev["interval_host_wait_per_pass_s"] = "host_stall", num(row.get("fused_interval_host_wait_per_pass_s"))
    else:
        return a
    return Attribution(cause, conf, ev)


def _host_wait_holds(row: pd.Series, cfg: AttributionConfig) -> bool:
    """The interval's measured host wait per forward beyond the usual (evidence/host_wait_fusion.py) is at least
    ``host_gap_share`` of the step's latency excess - the interval rule's test, per forward."""
    per, lat, base = (num(row.get(c)) for c in ("fused_interval_host_wait_per_pass_s", "latency_s", "baseline_s"))
    return _pos(per) and lat is not None and base is not None and lat > base \
        and per >= cfg.host_gap_share * (lat - base)


def _host_pause_holds(row: pd.Series, cfg: AttributionConfig) -> bool:
    """A pause the engine timed, or the OS saw, in the step's intervals (evidence/host_wait_fusion.py ``fuse_host_pause``) is
    at least ``host_gap_share`` of the step's excess, and the excess at least half the pause: a pause of d
    seconds makes the step that spans it last d longer, and a step much shorter than the pause did not."""
    pause, lat, base = (num(row.get(c)) for c in ("fused_interval_host_pause_s", "latency_s", "baseline_s"))
    if not _pos(pause) or lat is None or base is None or not lat > base:
        return False
    # a pause shorter than one usual step (a young collection: well under a millisecond) is inside a step's
    # own spread and explains no spike
    return pause >= base and pause >= cfg.host_gap_share * (lat - base) and lat - base >= 0.5 * pause


def attribute_between_steps(row: pd.Series, cfg: AttributionConfig = AttributionConfig()) -> Attribution | None:
    """An interval row that is no spike of its own but whose ITL sum shows requests waiting between
    steps: per decode request, the gap's excess over its rolling median exceeds the threshold (some
    ITL in the interval was then at least ``interval_ratio`` x the baseline) -> host_stall; None
    otherwise, or when the interval counted a preemption or KV transfer (any value, NaN included:
    then the wait is not known to be the host's)."""
    excess, thr = num(row.get("fused_host_gap_excess_s")), num(row.get("fused_host_gap_threshold_s"))
    if excess is None or thr is None or not excess > thr:
        return None
    if _pos(row.get("fused_recent_stall_steps")):
        # decodes waited through prefill-only steps here or just before: a wait that straddled the
        # scrape lands whole in this interval's ITL sum, which cannot tell it from host time
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
