"""``diagnose(timeline) -> Diagnosis``: detect TPOT spikes, line up the signals, attribute each
spike to a cause with evidence and confidence (docs/contracts.md section 5).

Works with whatever the Timeline holds, per instance:

* step rows with token events (per-step records): ITL charged to culprit steps;
* step rows only (a profiler trace, engine log lines): step-to-step latency, or the step's own
  duration when the step clock is too coarse to give gaps (log timestamps in whole seconds);
* interval rows only (Prometheus scrapes, periodic stats lines): ITL P99 against the P50 baseline.

Missing signals are listed per spike and lower the confidence; nothing is guessed.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace

import numpy as np
import pandas as pd

from mixdiag.diagnosis.attribution import (AttributionConfig, InstanceContext, attribute, attribute_between_steps,
                                           attribute_fused, attribute_preemptions)
from mixdiag.schema import Timeline
from mixdiag.causes import VERDICT_LEAD
from mixdiag.diagnosis.signals import (SIGNALS, SignalConfig, decode_graph_norm, looks_like_llm_serving, periodicity,
                                      prefill_since_last_decode,
                                      prefill_events, row_qualities, signal_quality, step_signals)
from mixdiag.diagnosis.fusion import couple_ranks, engine_of, faults_seen_by_intervals, fuse_evidence, graph_off_decode_column  # noqa: F401
from mixdiag.diagnosis.spikes import (SpikeConfig, charge_itl, is_spike, itl_events, rolling_baseline, rows_of,
                                      spike_rows, step_timing)
from mixdiag.diagnosis.budget import budget_of
from mixdiag.diagnosis.interval_batch import interval_pipeline, interval_views
from mixdiag.diagnosis.result import SPIKE_COLUMNS, Diagnosis, count_by_cause, itl_summary, last_spike_of, make_headline  # noqa: F401

@dataclass(frozen=True)
class DiagnosisConfig:
    """All thresholds of the diagnosis, one setting for every workload (docs/analyze.md)."""

    spikes: SpikeConfig = field(default_factory=SpikeConfig)
    signals: SignalConfig = field(default_factory=SignalConfig)
    attribution: AttributionConfig = field(default_factory=AttributionConfig)
    #: interval rows: ITL P99 above this x the rolling P50 is a spike (healthy decode keeps
    #: P99 within 2x P50, per the article; bucketed histogram quantiles add slack).
    interval_ratio: float = 2.0

    def __post_init__(self):
        if not self.interval_ratio > 1:
            raise ValueError("DiagnosisConfig.interval_ratio must be > 1")


#: Highest confidence of any cause on an input with no decode-like structure.
NOT_LLM_CAP = 0.5


def _json_num(v):
    """A plain JSON value: bools and ints as they are, non-finite floats as None."""
    if isinstance(v, (bool, np.bool_)):
        return bool(v)
    if isinstance(v, (int, np.integer)):
        return int(v)
    try:
        f = float(v)
    except (TypeError, ValueError):
        return None
    return round(f, 6) if np.isfinite(f) else None


def _coarse_clock(st: pd.DataFrame) -> bool:
    """Step times too coarse for gaps: many steps start before the previous one ended or at the
    same instant (log lines stamped in whole seconds)."""
    if len(st) < 3:
        return False
    prev_end = st["t_end_s"].shift(1)
    # back-to-back steps whose boundaries a collector placed a few microseconds apart (a trace's
    # sync points, float rounding at unix-epoch scale) are contiguous, not overlapping
    tol = max(1e-6, 0.01 * float((st["t_end_s"] - st["t_start_s"]).median()))
    bad = (st["t_start_s"] < prev_end - tol) | (st["t_start_s"] == st["t_start_s"].shift(1))
    return bool(bad.iloc[1:].mean() > 0.1)


def _window_mean_latency(meta: dict, inst: str) -> bool:
    """Whether the instance's ``elapsed_s`` is an estimated mean over the steps since the previous
    decode line (the collector declares it ``estimated``) rather than one step's own time."""
    return ((meta or {}).get("signals", {}).get(inst, {}) or {}).get("elapsed_s") == "estimated"


def _step_pipeline(inst: str, rows: pd.DataFrame, tokens: pd.DataFrame, quality: dict, cfg: DiagnosisConfig,
                   outside_faulty: np.ndarray | None = None, window_latency: bool = False):
    st = step_timing(rows).reset_index(drop=True)
    coarse = _coarse_clock(st)
    if coarse:  # gaps unknown: the step's own duration (or the time the log line states) is the latency
        st["gap_before_s"] = np.nan
        st["latency_s"] = st["duration_s"]
        if "elapsed_s" in st.columns and st["elapsed_s"].notna().any():
            st["latency_s"] = pd.to_numeric(st["elapsed_s"], errors="coerce").fillna(st["duration_s"])
        quality = quality | {"host_time": "absent"}
    has_tokens = len(tokens) > 0
    if has_tokens:
        st[["itl_max_s", "itl_events", "stall_max_s"]] = charge_itl(st, itl_events(tokens)).to_numpy()
    else:
        st["itl_max_s"], st["itl_events"], st["stall_max_s"] = np.nan, 0, np.nan
    sig = step_signals(st, cfg.signals)
    sig = pd.concat([sig, row_qualities(sig, quality)], axis=1)
    if coarse:
        sig["gap_excess_s"] = np.nan
    # A decode row whose latency is the collector's estimate of the mean step time since the
    # previous decode row (SGLang's gen throughput) covers a window: the prefill batches logged
    # inside it are evidence for its height (step_rules reads window_*_steps).
    sig["window_mixed_steps"] = sig["window_stall_steps"] = np.nan
    if coarse and window_latency and "elapsed_s" in sig.columns:
        mixed, stall = prefill_since_last_decode(sig)
        win = sig["decode_only"] & pd.to_numeric(sig.get("elapsed_s"), errors="coerce").notna()
        sig["window_mixed_steps"] = mixed.where(win)
        sig["window_stall_steps"] = stall.where(win)
    if has_tokens:
        visible = sig["itl_events"] > 0
        # a request that already had tokens waited through this prefill-only step: decodes were
        # running even if no step before held decode rows (a burst of prompts at start-up)
        sig["decodes_before"] |= sig["has_prefill"] & ~sig["has_decode"] & visible
    elif quality.get("token_allocation") != "absent" or sig["kind"].isin(["prefill", "decode", "mixed"]).any():
        visible = sig["has_decode"] | (sig["has_prefill"] & sig["decodes_before"])
    else:
        visible = pd.Series(True, index=sig.index)
    # Healthy decode steps set the baseline: a fault window (an EP hotspot lasting 30 steps, a run
    # of KV transfers) must stand out against it, not become the norm of a rolling median.
    faulty = sig["kv_xfer"] | sig["preempt"] | (sig["imbalance_rel"] >= cfg.attribution.imbalance_rel).fillna(False)
    if outside_faulty is not None and len(outside_faulty) == len(sig):
        faulty |= outside_faulty  # another view of this engine (scrapes) saw a fault there
    ref = visible & sig["decode_only"] & ~faulty
    if not sig["decode_only"].any():  # no token counts: every visible step, then its usual graph mode
        ref = visible & ~faulty
    # Decode steps in their usual graph mode set the baseline, so a stretch of graph fallback
    # stands out against it instead of becoming the norm.
    norm = decode_graph_norm(sig)
    if norm != "unknown" and (ref & (sig["graph_mode"] == norm)).sum() >= cfg.spikes.min_periods:
        ref &= sig["graph_mode"] == norm
    if ref.sum() < cfg.spikes.min_periods:
        ref = visible
    base, sigma = rolling_baseline(sig["latency_s"], ref, cfg.spikes.window_steps, cfg.spikes.min_periods)
    sig["baseline_s"] = base
    spike = is_spike(sig["latency_s"], base, sigma, cfg.spikes) & visible
    # A request that sat out steps (preempted, left out) felt a spike where its wait began,
    # even when no single step was slow.
    stall = is_spike(sig["stall_max_s"], base, sigma, cfg.spikes) & ~spike
    sig["request_stall"] = stall
    spike = spike | stall
    sig["is_spike"] = spike
    period = periodicity(sig, spike, prefill_events(sig, use_allocation=False), candidates=visible)
    sig["near_prefill_event"] = period.pop("near")
    full = sig.loc[sig["decode_only"] & (sig["graph_mode"] == "FULL"), "decode_reqs"].dropna()
    ctx = InstanceContext(quality=quality, graph_norm=decode_graph_norm(sig), period=period,
                          full_batch_sizes=frozenset(float(x) for x in full.unique()))
    return sig, ctx, period, ("step_duration" if coarse else ("token_itl" if has_tokens else "step_latency"))


def _verdict(by_cause: dict, n_spikes: int, n_rows: int, itl: dict, unit: str = "") -> str:
    if n_rows == 0:
        return "No steps or intervals in the input: nothing to diagnose."
    if n_spikes == 0:
        p50, p99 = itl.get("p50_s"), itl.get("p99_s")
        ratio = f" (ITL P99 is {p99 / p50:.1f}x P50)" if p50 and p99 else ""
        return f"No TPOT spikes found in {unit}{ratio}."
    ranked = sorted(((c, n) for c, n in by_cause.items() if n), key=lambda x: -x[1])
    top, n_top = ranked[0]
    rest = ", ".join(f"{n} {c}" for c, n in ranked[1:])
    lead = VERDICT_LEAD[top]
    if n_top * 2 <= n_spikes and len(ranked) > 1:
        parts = ", ".join(f"{n} {c}" for c, n in ranked)
        return f"{n_spikes} TPOT spikes in {unit} have several causes: {parts}."
    tail = f"; the rest: {rest}" if rest else ""
    if top == "unknown":
        return f"{n_top} of {n_spikes} TPOT spikes in {unit} have no cause the available signals support (unknown){tail}."
    return f"{n_top} of {n_spikes} TPOT spikes in {unit} are caused by {lead}{tail}."


def _spike(inst: str, row: pd.Series, itl_s, baseline_s, a, missing: list) -> dict:
    """One spike record (mixdiag.schema.SPIKE_COLUMNS) from its row and attribution."""
    return {"instance": inst, "step": int(row["step"]), "t_s": float(row["t_end_s"]), "itl_s": float(itl_s),
            "baseline_s": float(baseline_s), "cause": a.cause, "confidence": a.confidence, "evidence": a.evidence,
            "missing_signals": missing, "t_start_s": float(row["t_start_s"]), "t_end_s": float(row["t_end_s"]),
            "granularity": row["granularity"]}


def diagnose(timeline: Timeline, config: DiagnosisConfig | None = None, jobs: int = 1) -> Diagnosis:
    """Detect and attribute TPOT spikes in ``timeline``; never reads ground truth.

    ``jobs`` > 1 diagnoses groups of instances in worker processes when the instances are
    independent (see :mod:`~mixdiag.diagnosis.parallel`); the result equals the serial one."""
    cfg = config or DiagnosisConfig()
    if jobs > 1:
        from mixdiag.diagnosis.parallel import diagnose_parallel

        d = diagnose_parallel(timeline, cfg, jobs)
        if d is not None:
            return d
    part = diagnose_part(timeline, cfg, timeline.instances)
    return finish(timeline, cfg, part)


@dataclass
class Part:
    """What detection and attribution found for some instances: their signal frames (in instance
    order), spike records (per instance in the order attribution made them), per-instance
    summaries, and which instances do not look like LLM serving."""

    frames: list
    spikes: list
    instances: dict
    not_llm: list


def _instance_rows(steps: pd.DataFrame, insts) -> dict:
    """instance -> its rows of ``steps`` (what ``steps[steps.instance == inst]`` holds), from one
    factorisation instead of one full-column compare per instance."""
    if not len(steps):
        return {}
    codes, names = pd.factorize(steps["instance"].to_numpy(), sort=False)
    order = np.argsort(codes, kind="stable")
    bounds = np.searchsorted(codes[order], np.arange(len(names) + 1))
    pos = {str(n): order[bounds[i]:bounds[i + 1]] for i, n in enumerate(names)}
    return {inst: steps.iloc[pos[inst]] for inst in insts if inst in pos}


def _summary(ctx, source: str) -> dict:
    """``Diagnosis.instances[inst]``: signal qualities, latency source, periodicity, relation."""
    return {"signals": ctx.quality, "latency_source": source, "llm_serving": ctx.llm_like,
            "periodicity": {k: _json_num(v) for k, v in ctx.period.items()},
            **({"prefill_itl_relation": {k: _json_num(v) for k, v in ctx.relation.items()}} if ctx.relation else {})}


def _views(timeline: Timeline, cfg: DiagnosisConfig, insts, has_steps: bool):
    """Detection: ``[(frame, [(instance, context, latency source), ...])]`` - one frame for all interval-only
    instances (interval_batch.py), else one per instance - and ``[(instance, frame)]`` per instance
    where frames are per instance."""
    if not has_steps:
        batch = interval_views(timeline, cfg, insts)
        if batch is not None:
            return [(batch[0], [(inst, ctx, "interval_itl_quantiles") for inst, ctx in batch[2]])], []
    # interval-only inputs have no step view to protect from interval-seen faults
    seen_faulty = faults_seen_by_intervals(timeline, cfg) if has_steps else {}
    by_inst = _instance_rows(timeline.steps, insts)
    owners, views = [], []
    for inst in insts:  # detection, per instance
        rows = by_inst.get(inst)
        if rows is None or not len(rows):
            continue
        tokens = rows_of(timeline.tokens, inst)
        rows = graph_off_decode_column(rows)
        quality = signal_quality(timeline.meta, inst, rows, len(tokens) > 0)
        step_rows = rows[rows["granularity"] == "step"]
        if len(step_rows):
            sig, ctx, period, source = _step_pipeline(inst, step_rows, tokens, quality, cfg, seen_faulty.get(inst),
                                                      _window_mean_latency(timeline.meta, inst))
        else:
            sig, ctx, period, source = interval_pipeline(rows, quality, cfg)
        sig["instance"] = inst
        ctx = replace(ctx, llm_like=looks_like_llm_serving(sig, len(tokens) > 0))
        owners.append((sig, [(inst, ctx, source)]))
        views.append((inst, sig))
    return owners, views


def diagnose_part(timeline: Timeline, cfg: DiagnosisConfig, insts) -> Part:
    """Detection and attribution for the instances ``insts`` of ``timeline`` (all of them, or a
    group with no evidence shared outside it: parallel.py)."""
    spikes = []
    has_steps = bool(len(timeline.steps)) and bool((timeline.steps["granularity"] == "step").any())
    owners, views = _views(timeline, cfg, insts, has_steps)
    instances = {inst: _summary(ctx, source) for _, ctxs in owners for inst, ctx, source in ctxs}
    frames = [sig for sig, _ in owners]
    has_step_view = fuse_evidence(frames, cfg)  # each view's rows get the other view's evidence
    couple_ranks(frames)  # EP ranks of one engine: each step row learns what its peers' same step held
    for sig, ctxs in owners:  # attribution, per spike
        ctx_of = {inst: (ctx, [s for s in SIGNALS if ctx.quality.get(s) == "absent"]) for inst, ctx, _ in ctxs}
        one = ctxs[0][0] if len(ctxs) == 1 else None
        causes = [None] * len(sig)
        at = np.flatnonzero(sig["is_spike"].to_numpy())
        for i, row in zip(at, spike_rows(sig, at)):  # plain rows: attribution reads each many times
            inst = one or str(row["instance"])
            ctx, missing = ctx_of[inst]
            a = attribute(row, ctx, cfg.attribution)
            if row.get("request_stall", False):
                itl_s = row["stall_max_s"]
                a.evidence["request_stall_s"] = float(itl_s)
            else:
                itl_s = row["itl_max_s"] if pd.notna(row["itl_max_s"]) else row["latency_s"]
            a = attribute_fused(row, a, cfg.attribution)
            if not ctx.llm_like:  # no decode-like structure: nothing is called with certainty
                a = replace(a, confidence=min(a.confidence, NOT_LLM_CAP),
                            evidence=a.evidence | {"llm_serving": False})
            causes[i] = a.cause
            spikes.append(_spike(inst, row, itl_s, row["baseline_s"], a, missing))
        sig["cause"] = pd.Series(causes, index=sig.index, dtype=object)
    # interval rows that are no spike of their own but show waits between steps, then preemptions
    for judge in ((attribute_between_steps, attribute_preemptions) if has_step_view else ()):
        have = {(sp["instance"], sp["step"]) for sp in spikes if sp["granularity"] == "interval"}
        for inst, sig in views:
            iv = sig[sig["granularity"] == "interval"].sort_values("step", kind="stable")
            for _, row in iv.iterrows():
                if (inst, int(row["step"])) in have or (a := judge(row, cfg.attribution)) is None:
                    continue
                base = float(row["baseline_s"]) if pd.notna(row["baseline_s"]) else np.nan
                lat = row["latency_s"]
                if pd.isna(lat):
                    lat = base + a.evidence["host_gap_excess_s"] if "host_gap_excess_s" in a.evidence else base
                spikes.append(_spike(inst, row, lat, base, a, []))
    # keep the steps frame in line with the spikes
    kept = {(sp["instance"], sp["step"]): sp["cause"] for sp in spikes if sp["granularity"] == "interval"}
    for f in frames:
        iv = f["granularity"] == "interval"
        if iv.any():
            keys = list(zip(f.loc[iv, "instance"], f.loc[iv, "step"].astype(int)))
            f.loc[iv, "cause"] = [kept.get(k) for k in keys]
            f.loc[iv, "is_spike"] = [k in kept for k in keys]
    return Part(frames=frames, spikes=spikes, instances=instances,
                not_llm=[inst for _, ctxs in owners for inst, ctx, _ in ctxs if not ctx.llm_like])


def _frames_or_empty(timeline: Timeline, frames: list) -> pd.DataFrame:
    """``Diagnosis.steps``: the views' frames in order, or the input's (empty) rows with the columns."""
    return pd.concat(frames, ignore_index=True) if frames else timeline.steps.assign(
        gap_before_s=pd.Series(dtype=float), is_spike=pd.Series(dtype=bool), cause=pd.Series(dtype=object),
        itl_max_s=pd.Series(dtype=float), latency_s=pd.Series(dtype=float), baseline_s=pd.Series(dtype=float),
        has_decode=pd.Series(dtype=bool))


def _spike_frame(spikes: list) -> pd.DataFrame:
    """``Diagnosis.spikes``: the records sorted by time, then instance (stable: per instance, the
    order attribution made them)."""
    sp = pd.DataFrame(spikes, columns=SPIKE_COLUMNS)
    if len(sp):
        sp = sp.sort_values(["t_s", "instance"], kind="stable").reset_index(drop=True)
    return sp


def finish(timeline: Timeline, cfg: DiagnosisConfig, part: Part, budget=None) -> Diagnosis:
    """The Diagnosis of ``timeline`` from the detection/attribution of all its instances (one
    :class:`Part`, or the parts of parallel.py merged): counts, ITL, verdict, headline, and the budget
    (computed here unless the parts computed it)."""
    steps = _frames_or_empty(timeline, part.frames)
    sp = _spike_frame(part.spikes)
    by_cause = count_by_cause(sp["cause"])
    itl = itl_summary(timeline, steps)
    n_step = int((steps["granularity"] == "step").sum()) if len(steps) else 0
    unit = f"{n_step} steps" if n_step else f"{len(steps)} intervals"
    verdict = _verdict(by_cause, len(sp), int(len(steps)), itl, unit)
    not_llm = part.not_llm
    if part.instances and len(not_llm) == len(part.instances):
        verdict = (f"This input does not look like LLM serving (no decode-like steps: no output tokens or decode "
                   f"rows, no repeated FULL-graph replays, no ITL); causes are named with confidence <= "
                   f"{NOT_LLM_CAP}. {verdict}")
    elif not_llm:
        verdict += f" {', '.join(not_llm)} do(es) not look like LLM serving (confidence <= {NOT_LLM_CAP})."
    headline = make_headline(timeline, verdict, by_cause, itl, last_spike_of(sp))
    return Diagnosis(spikes=sp, steps=steps, by_cause=by_cause, verdict=verdict, itl=itl, headline=headline,
                     instances=part.instances, config=cfg,
                     budget=budget if budget is not None else budget_of(timeline.tokens, steps, sp))
