"""Detection, fusion and attribution for a group of instances: a :class:`Part` of the diagnosis
(all instances, or a group that shares no evidence with the rest: parallel.py). Detection runs per
instance (or in one pass over interval-only instances), fusion across the views of each engine, then
the rules attribute each spike.
"""
from __future__ import annotations

import warnings
from dataclasses import dataclass, field, replace

import numpy as np
import pandas as pd

from mixdiag.causes import SIGNALS
from mixdiag.diagnosis.config import DiagnosisConfig
from mixdiag.diagnosis.detection.interval_batch import interval_pipeline, interval_views
from mixdiag.diagnosis.detection.signals import graph_off_decode_column, looks_like_llm_serving, signal_quality
from mixdiag.diagnosis.detection.spikes import itl_events, rows_of, spike_rows
from mixdiag.diagnosis.detection.step_view import step_pipeline, window_mean_latency
from mixdiag.diagnosis.evidence.fusion import (couple_ranks, engine_of, faults_seen_by_intervals, fuse_evidence,
                                               listed_servers)
from mixdiag.diagnosis.labels import equal
from mixdiag.diagnosis.rules.attribution import attribute_spike
from mixdiag.diagnosis.rules.fused_rules import attribute_between_steps, attribute_preemptions
from mixdiag.schema import Timeline


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


def _spike(inst: str, row: pd.Series, itl_s, baseline_s, a, missing: list) -> dict:
    """One spike record (mixdiag.diagnosis.result.SPIKE_COLUMNS) from its row and attribution. A row whose
    latency is a mean over a window (an SGLang Decode line: the forwards since the previous one) spans that
    window: the spike speaks of it, not of the line's stamp alone."""
    t0, t1 = float(row["t_start_s"]), float(row["t_end_s"])
    w0, w1 = row.get("window_start_s"), row.get("window_end_s")
    if w0 is not None and np.isfinite(w0):
        t0 = min(t0, float(w0))
        t1 = max(t1, float(w1)) if w1 is not None and np.isfinite(w1) else t1
    return {"instance": inst, "step": int(row["step"]), "t_s": float(row["t_end_s"]), "itl_s": float(itl_s),
            "baseline_s": float(baseline_s), "cause": a.cause, "confidence": a.confidence, "evidence": a.evidence,
            "missing_signals": missing, "t_start_s": t0, "t_end_s": t1, "granularity": row["granularity"]}


@dataclass
class Part:
    """What detection and attribution found for some instances: their signal frames (in instance
    order), spike records (per instance in the order attribution made them), per-instance
    summaries, which instances do not look like LLM serving, and the ITL events detection built from
    each instance's tokens (instance -> ``itl_events`` frame: the budget and the ITL summary read
    them instead of sorting a million token events again) with how many token rows they cover."""

    frames: list
    spikes: list
    instances: dict
    not_llm: list
    itl: dict = field(default_factory=dict)
    itl_token_rows: int = 0


def _instance_rows(steps: pd.DataFrame, insts) -> dict:
    """instance -> its rows of ``steps`` (what ``steps[steps.instance == inst]`` holds), from one
    factorisation instead of one full-column compare per instance."""
    if not len(steps):
        return {}
    codes, names = pd.factorize(steps["instance"].to_numpy(), sort=False)
    order = np.argsort(codes, kind="stable")
    bounds = np.searchsorted(codes[order], np.arange(len(names) + 1))
    pos = {str(n): order[bounds[i]:bounds[i + 1]] for i, n in enumerate(names)}

    def rows(p: np.ndarray) -> pd.DataFrame:
        if len(p) == len(steps):  # one instance: the frame itself (a million-row copy costs seconds)
            return steps
        if p[-1] - p[0] + 1 == len(p):  # the Timeline sorts by instance: one run, a slice
            return steps.iloc[int(p[0]):int(p[-1]) + 1]
        return steps.iloc[p]

    return {inst: rows(pos[inst]) for inst in insts if inst in pos}


def _summary(ctx, source: str) -> dict:
    """``Diagnosis.instances[inst]``: signal qualities, latency source, periodicity, relation."""
    return {"signals": ctx.quality, "latency_source": source, "llm_serving": ctx.llm_like,
            "periodicity": {k: _json_num(v) for k, v in ctx.period.items()},
            **({"prefill_itl_relation": {k: _json_num(v) for k, v in ctx.relation.items()}} if ctx.relation else {})}


def _views(timeline: Timeline, cfg: DiagnosisConfig, insts, has_steps: bool):
    """Detection: ``[(frame, [(instance, context, latency source), ...])]`` - one frame for all interval-only
    instances (detection/interval_batch.py), else one per instance - ``[(instance, frame)]`` per instance
    where frames are per instance, ``{instance: itl_events frame}`` of the instances with token events and
    the token rows those cover."""
    itl: dict = {}
    n_tok = 0
    if not has_steps:
        batch = interval_views(timeline, cfg, insts)
        if batch is not None:
            return [(batch[0], [(inst, ctx, "interval_itl_quantiles") for inst, ctx in batch[2]])], [], itl, n_tok
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
        is_step = equal(rows["granularity"], "step")
        step_rows = rows if is_step.all() else rows[is_step]
        if len(step_rows):
            if len(tokens):
                itl[inst], n_tok = itl_events(tokens), n_tok + len(tokens)
            sig, ctx, period, source = step_pipeline(inst, step_rows, tokens, quality, cfg, seen_faulty.get(inst),
                                                     window_mean_latency(timeline.meta, inst), itl.get(inst))
        else:
            sig, ctx, period, source = interval_pipeline(rows, quality, cfg)
        sig["instance"] = inst
        ctx = replace(ctx, llm_like=looks_like_llm_serving(sig, len(tokens) > 0, cfg.signals))
        owners.append((sig, [(inst, ctx, source)]))
        views.append((inst, sig))
    return owners, views, itl, n_tok


def _token_views_own_latency(owners) -> set:
    """An engine whose step view measures latency per output token (client records, per-step
    records) sees every wait an interval's ITL histogram holds, finer: its interval rows that hold
    steps of that view are evidence only, never spikes of their own (one server, counted once).
    Returns those engines."""
    by_tokens = {engine_of(inst) for _, ctxs in owners for inst, _, source in ctxs if source == "token_itl"}
    for sig, ctxs in owners:
        if len(ctxs) != 1 or engine_of(ctxs[0][0]) not in by_tokens or "fused_steps_in_interval" not in sig.columns:
            continue
        iv = equal(sig["granularity"], "interval") & sig["fused_steps_in_interval"].fillna(0).gt(0)
        sig.loc[iv, "is_spike"] = False
    return by_tokens


def _absorbed(spikes: list, frames: list, inst: str, row: pd.Series, a) -> bool:
    """Whether the step view of the same engine already has spikes inside interval ``row`` (its
    ``fused_interval``): then the interval's judgement (a wait between steps, preemptions) is the
    same wait seen coarser, so it names those of them no cause explained instead of adding a second
    spike - one server seen through several sources counts each spike once."""
    eng, k = engine_of(inst), float(row["step"])
    hit = False
    for f in frames:
        if not len(f) or "fused_interval" not in f.columns or engine_of(str(f["instance"].iloc[0])) != eng:
            continue
        m = (f["granularity"] == "step") & f["is_spike"].astype(bool) & (f["fused_interval"] == k)
        if not m.any():
            continue
        hit = True
        unknown = m & (f["cause"] == "unknown")
        if not unknown.any():
            continue
        f.loc[unknown, "cause"] = a.cause
        named = {(str(i), int(n)) for i, n in zip(f.loc[unknown, "instance"], f.loc[unknown, "step"])}
        for sp in spikes:
            if sp["granularity"] == "step" and (sp["instance"], sp["step"]) in named:
                sp.update(cause=a.cause, confidence=a.confidence, evidence={**sp["evidence"], **{k2: v for k2, v in a.evidence.items() if k2 != "granularity"},
                                                                          "interval": int(k)})
    return hit


def diagnose_part(timeline: Timeline, cfg: DiagnosisConfig, insts) -> Part:
    """Detection and attribution for the instances ``insts`` of ``timeline`` (all of them, or a
    group with no evidence shared outside it: parallel.py)."""
    with warnings.catch_warnings():
        # Signal frames grow column by column and are left unconsolidated on purpose: consolidating
        # copies every column (seconds and a gigabyte on a million steps); pandas warns past 100 blocks.
        warnings.simplefilter("ignore", pd.errors.PerformanceWarning)
        return _diagnose_part(timeline, cfg, insts)


def _diagnose_part(timeline: Timeline, cfg: DiagnosisConfig, insts) -> Part:
    spikes = []
    has_steps = bool(len(timeline.steps)) and bool(equal(timeline.steps["granularity"], "step").any())
    owners, views, itl, n_tok = _views(timeline, cfg, insts, has_steps)
    instances = {inst: _summary(ctx, source) for _, ctxs in owners for inst, ctx, source in ctxs}
    frames = [sig for sig, _ in owners]
    # each view's rows get the other view's evidence (views of one server only: as the collectors listed them)
    has_step_view = fuse_evidence(frames, cfg, listed_servers(timeline.meta))
    by_tokens = _token_views_own_latency(owners)
    # EP ranks of one engine: each step row learns what its peers' same step held
    couple_ranks(frames, cfg.fusion.rank_align)
    for sig, ctxs in owners:  # attribution, per spike
        ctx_of = {inst: (ctx, [s for s in SIGNALS if ctx.quality.get(s) == "absent"]) for inst, ctx, _ in ctxs}
        one = ctxs[0][0] if len(ctxs) == 1 else None
        causes = [None] * len(sig)
        at = np.flatnonzero(sig["is_spike"].to_numpy())
        for i, row in zip(at, spike_rows(sig, at)):  # plain rows: attribution reads each many times
            inst = one or str(row["instance"])
            ctx, missing = ctx_of[inst]
            a = attribute_spike(row, ctx, cfg.attribution)
            if row.get("request_stall", False):  # the wait of the request that sat out steps
                itl_s = row["stall_max_s"]
            else:
                itl_s = row["itl_max_s"] if pd.notna(row["itl_max_s"]) else row["latency_s"]
            causes[i] = a.cause
            spikes.append(_spike(inst, row, itl_s, row["baseline_s"], a, missing))
        sig["cause"] = pd.Series(causes, index=sig.index, dtype=object)
    # interval rows that are no spike of their own but show waits between steps, then preemptions
    for judge in ((attribute_between_steps, attribute_preemptions) if has_step_view else ()):
        have = {(sp["instance"], sp["step"]) for sp in spikes if sp["granularity"] == "interval"}
        for inst, sig in views:
            iv = sig[equal(sig["granularity"], "interval")].sort_values("step", kind="stable")
            for _, row in iv.iterrows():
                if (inst, int(row["step"])) in have or (a := judge(row, cfg.attribution)) is None:
                    continue
                if _absorbed(spikes, frames, inst, row, a) or engine_of(inst) in by_tokens:
                    continue
                base = float(row["baseline_s"]) if pd.notna(row["baseline_s"]) else np.nan
                lat = row["latency_s"]
                if pd.isna(lat):
                    lat = base + a.evidence["host_gap_excess_s"] if "host_gap_excess_s" in a.evidence else base
                spikes.append(_spike(inst, row, lat, base, a, []))
    # keep the steps frame in line with the spikes
    kept = {(sp["instance"], sp["step"]): sp["cause"] for sp in spikes if sp["granularity"] == "interval"}
    for f in frames:
        iv = equal(f["granularity"], "interval")
        if iv.any():
            keys = list(zip(f.loc[iv, "instance"], f.loc[iv, "step"].astype(int)))
            f.loc[iv, "cause"] = [kept.get(k) for k in keys]
            f.loc[iv, "is_spike"] = [k in kept for k in keys]
    return Part(frames=frames, spikes=spikes, instances=instances,
                not_llm=[inst for _, ctxs in owners for inst, ctx, _ in ctxs if not ctx.llm_like], itl=itl,
                itl_token_rows=n_tok)
