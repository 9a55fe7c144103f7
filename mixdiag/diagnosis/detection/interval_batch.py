"""Detection on interval rows (Prometheus, scrape directories, periodic stats lines): ITL P99
against the rolling P50, the signals of each interval, periodicity and the prefill/ITL relation.

:func:`interval_pipeline` does one instance. :func:`interval_views` does every instance of an
interval-only input in one pass over one frame: the per-row work is a handful of vectorised and
grouped operations whatever the number of instances (a 500-target Prometheus fleet), and only the
per-instance figures (periodicity, the rank relation, graph norm) loop over instances, on numpy
slices. Row for row and figure for figure it gives what :func:`interval_pipeline` gives each
instance alone (``tests/mixdiag/test_interval_batch.py`` holds the two side by side); the signal
code is shared (:func:`~mixdiag.diagnosis.detection.signals.step_signals` and friends take ``groups``).
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from mixdiag.diagnosis import groupwise as gw
from mixdiag.diagnosis.config import DiagnosisConfig
from mixdiag.diagnosis.detection import host_wait
from mixdiag.diagnosis.detection.context import InstanceContext
from mixdiag.diagnosis.detection.chunk_step import large_chunk
from mixdiag.diagnosis.detection.interval_spikes import interval_spikes
from mixdiag.diagnosis.detection.signals import (HOST_TIME_COLUMNS, SIGNAL_COLUMNS, decode_graph_norm,
                                                 graph_off_decode_column, interval_decode_evidence, period_stats, periodicity, prefill_events,
                                                 qualities, rank_relation, row_qualities, step_signals,
                                                 counted_work, work_near)
from mixdiag.schema import Timeline

#: Columns whose presence per instance decides the signal qualities (signals.qualities).
_PRESENCE = tuple(dict.fromkeys([*(c for cols in SIGNAL_COLUMNS.values() for c in cols), *HOST_TIME_COLUMNS]))
_MODES = ("graph_full_steps", "graph_piecewise_steps", "graph_none_steps")


def interval_segments(sig: pd.DataFrame) -> pd.DataFrame:
    """Interval rows: token sums over many steps do not say that one step held both segments.

    With per-kind step counts (``mixed_steps``, ``prefill_steps``, ``decode_steps``): a mixed step
    ran -> both segments; prefill-only steps next to decode steps -> a prefill stall. Otherwise only
    the row's ``kind`` speaks; ``unknown`` claims nothing.
    """
    def col(name):
        return sig[name].fillna(0) if name in sig.columns else None

    mixed, pre, dec = col("mixed_steps"), col("prefill_steps"), col("decode_steps")
    if mixed is not None and pre is not None and dec is not None:
        both = mixed > 0
        stall = ~both & (pre > 0) & (dec > 0)
        sig["has_prefill"] = both | (pre > 0)
        sig["has_decode"] = both | (~stall & (dec > 0))
        sig["decodes_before"] = stall
    else:
        k = sig["kind"]
        sig["has_prefill"] = k.isin(["prefill", "mixed"])
        sig["has_decode"] = k.isin(["decode", "mixed"])
        sig["decodes_before"] = sig["has_prefill"] & ~sig["has_decode"] & sig["decodes_before"]
    sig["decode_only"] = sig["has_decode"] & ~sig["has_prefill"]
    return sig


def wait_stands_out(sig: pd.DataFrame, acfg) -> np.ndarray:
    """Rows whose measured host wait beyond the usual (``gap_excess_s``) stands ``acfg.host_wait_k``
    robust sigmas above the instance's own spread of it, and above nothing (host_wait.py)."""
    return host_wait.stands_out(sig["gap_excess_s"], sig["gap_excess_sigma_s"], acfg.host_wait_k)


def interval_signals(sig: pd.DataFrame, quality: dict, cfg: DiagnosisConfig, groups: np.ndarray | None = None):
    """Signals, baseline and spikes of interval rows sorted by step - of one instance, or of several
    numbered by ``groups`` (:func:`interval_views`); ``quality`` per signal, a value or one per row.
    Returns the frame, the rows with ITL, their latency and their baseline."""
    sig["gap_before_s"] = np.nan
    sig = interval_segments(step_signals(sig, cfg.signals, groups))
    sig["gap_excess_s"], sig["gap_excess_sigma_s"] = host_wait.wait_excess(sig, groups)
    faulty = sig["kv_xfer"] | sig["preempt"] | (sig["imbalance_rel"] >= cfg.attribution.imbalance_rel).fillna(False)
    # an interval whose GPU measurably waited on the host far beyond its usual share (host_wait): a host
    # stall, a fault the baseline must not absorb either
    faulty = faulty | pd.Series(wait_stands_out(sig, cfg.attribution), index=sig.index)
    batch = None
    if "running_reqs" in sig.columns:
        # the running gauge at the interval's start (the previous scrape): the batch its first steps ran
        running = pd.to_numeric(sig["running_reqs"], errors="coerce")
        start = gw.shift(running, 1, np.nan, groups)
        batch = np.fmax(running.to_numpy(dtype=float), start.to_numpy(dtype=float))
    if "graph_none_min_tokens" in sig.columns and batch is not None:
        sig["running_reqs_start"] = start
        # a batch the engine runs without a graph (its CUDA-graph table, or above its largest capture size) at
        # either end of the interval: eager decode, a fault the baseline must not absorb (as for the gauges above)
        eager = batch >= sig["graph_none_min_tokens"].to_numpy(dtype=float)
        faulty = faulty | pd.Series(eager, index=sig.index)
    if "iteration_tokens_floor" in sig.columns and batch is not None:
        # a step with a chunk of chunk_min tokens ran in the interval (the engine's own iteration-tokens histogram;
        # each decode adds one token; chunk_step.py): a large prompt chunk beside the decodes (vLLM V1 schedules
        # them in one step), measured - no healthy decode interval for the baseline, as a counted fault is not
        floor = pd.to_numeric(sig["iteration_tokens_floor"], errors="coerce").to_numpy(dtype=float)
        chunk = large_chunk(floor - batch, batch, cfg.attribution.chunk_min_tokens)
        faulty = faulty | pd.Series(chunk, index=sig.index)
        if "graph_none_min_tokens" in sig.columns:
            # the decomposition's graph-fallback evidence on vLLM interval rows (rules/decomposition.py): the batch
            # ran eager and no large chunk made the interval's steps mixed ones (which leave the FULL graph by
            # design) - the evidence of the interval graph-fallback rule, without its spike-only tests
            lss = pd.to_numeric(sig.get("large_step_share"), errors="coerce").to_numpy(dtype=float) \
                if "large_step_share" in sig.columns else np.full(len(sig), np.nan)
            sig["eager_decode_interval"] = eager & ~(chunk & ~(lss < 1.0))
    if "graph_off_decode_steps" in sig.columns:
        # decode passes the engine itself counted as run off the captured graph (SGLang's per-forward pass
        # counter, its decode_none mode; log_windows.graph_off_decode_column): eager decode, measured, a
        # fault the baseline must not absorb either
        faulty = faulty | (pd.to_numeric(sig["graph_off_decode_steps"], errors="coerce") > 0).fillna(False)
    # the regime stage reads its healthy reference from the intervals no counter or gauge measured a fault in
    # (regimes.latency_view), as the spike baseline does: a capture whose faults (PD, EP, a host stall) cover
    # three quarters of its intervals has no healthy low side otherwise
    sig["reference_row"] = ~faulty.fillna(False).astype(bool).to_numpy()
    felt = interval_spikes(sig, cfg.interval_ratio, cfg.spikes, faulty, groups=groups, regimes=cfg.regimes,
                           chunk_min=cfg.attribution.chunk_min_tokens)
    lat, base = felt.latency_s, felt.baseline_s
    has_itl = felt.has_itl | felt.starved  # a starved interval's wait is measured on resuming
    sig["latency_s"] = lat
    sig["baseline_s"] = base
    sig["itl_max_s"] = lat
    sig["is_spike"] = felt.is_spike
    sig["starved"] = felt.starved
    # a lone long token after a counted preemption (this interval or the one before): the wait is that request's
    sig["preempted_tail"] = felt.preempted_tail
    # ... or after a pause the engine timed itself (a GC): named by the host rule, which reads the pause
    sig["paused_tail"] = felt.paused_tail
    # ... or beside a large prompt chunk the engine's iteration histogram measured (every running decode of that
    # step waited it): a mixing spike seen only in the tail, which the rule says in its evidence
    sig["chunk_tail"] = felt.chunk_tail
    # the hotspot window's edge is read next to its full intervals
    rel = sig["imbalance_rel"].astype("float64")
    prev, nxt = gw.shift(rel, 1, np.nan, groups), gw.shift(rel, -1, np.nan, groups)
    sig["imbalance_rel_neighbour"] = np.fmax(prev.to_numpy(dtype=float), nxt.to_numpy(dtype=float))
    return pd.concat([sig, row_qualities(sig, quality)], axis=1), has_itl, lat, base


#: Per-interval prefill work for the rank relation, first column with ``SignalConfig.relation_min_rows``
#: values on ITL rows wins.
#: ``prefill_work_tokens`` (vLLM prompt tokens spread back over their prefill time) comes first:
#: vLLM's prompt counter lands every token in the interval of the last chunk, not where the
#: chunks ran (formats.md §1.1), so ``prefill_tokens`` misses the intervals the chunks slowed.
RELATION_WORK = ("prefill_work_tokens", "prefill_tokens", "large_step_share", "arrivals")
#: The work column that already sits in the interval where the prefill ran (the others may land later).
SPREAD_WORK = "prefill_work_tokens"


def interval_pipeline(rows: pd.DataFrame, quality: dict, cfg: DiagnosisConfig):
    """Detection on one instance's interval rows: its signal frame, context, periodicity, source."""
    sig = rows.sort_values("step", kind="stable").reset_index(drop=True)
    sig, has_itl, lat, base = interval_signals(sig, quality, cfg)
    period = periodicity(sig, sig["is_spike"], cfg.signals, prefill_events(sig, use_allocation=False),
                         candidates=has_itl)
    sig["near_prefill_event"] = period.pop("near")
    # prefill work per interval vs ITL excess across the instance's intervals (the mixing evidence)
    enough = cfg.signals.relation_min_rows
    work = next((sig[c] for c in RELATION_WORK if c in sig.columns and sig.loc[has_itl, c].notna().sum() >= enough),
                pd.Series(np.nan, index=sig.index))
    relation = rank_relation(work.where(has_itl), (lat / base).where(has_itl), cfg.signals)
    # the interval rule's per-interval evidence; a starved interval's prefill ran alone, mixed with nothing
    sig["prefill_work_near"] = work_near(work.where(~sig["starved"]).to_numpy(dtype=float),
                                         counted_late=work.name != SPREAD_WORK)
    sig["prefill_count_near"] = np.nan
    if work.name == SPREAD_WORK and "prefill_tokens" in sig.columns:
        sig["prefill_count_near"], counted = counted_work(sig["prefill_tokens"], has_itl, sig["starved"])
        relation = relation | counted
    ctx = InstanceContext(quality=quality, graph_norm=decode_graph_norm(sig), period=period, relation=relation)
    return sig, ctx, period, "interval_itl_quantiles"


def _batch_frame(timeline: Timeline, insts) -> tuple[pd.DataFrame, np.ndarray, list[str]] | None:
    """The rows of ``insts`` in one frame (instance order, then step), their group codes and the
    instances present, with the columns signals.graph_off_decode_column adds to an instance's rows.
    None when such a column would not stand where the concatenated per-instance frames put it (the
    first instance without it, a later one with it)."""
    st = timeline.steps
    rank = {inst: i for i, inst in enumerate(insts)}
    r = pd.Series(st["instance"].to_numpy()).map(rank).to_numpy(dtype=float)
    keep = np.flatnonzero(~np.isnan(r))
    order = keep[np.lexsort((st["step"].to_numpy()[keep], r[keep]))]
    big = st.take(order).reset_index(drop=True)
    groups = pd.factorize(r[order], sort=False)[0].astype(np.intp)
    b = gw.bounds(groups)
    present = [str(big["instance"].iat[b[g]]) for g in range(len(b) - 1)]
    if all(c in big.columns for c in _MODES) and len(big):
        has = gw.per_group(big[list(_MODES)].notna().any(axis=1).to_numpy(), groups, np.logical_or)
        added: dict[int, pd.DataFrame] = {}
        for g in np.flatnonzero(has):  # the instances with graph modes: the column it adds to them
            part = graph_off_decode_column(big.iloc[b[g]:b[g + 1]])
            new = part[part.columns.difference(st.columns, sort=False)]
            if len(new.columns):
                added[int(g)] = new
        if added and 0 not in added:
            return None  # concatenated per-instance frames would hold the column last, not here
        for g, new in added.items():
            for c in new.columns:
                if c not in big.columns:
                    big[c] = np.nan
                big.iloc[b[g]:b[g + 1], big.columns.get_loc(c)] = new[c].to_numpy()
    return big, groups, present


def interval_views(timeline: Timeline, cfg: DiagnosisConfig, insts):
    """Detection for interval-only ``insts``: one signal frame for all of them (instance order, then
    step) and per instance its context and the periodicity reported; None when the batch cannot
    reproduce the per-instance frames (the caller then runs them one by one)."""
    made = _batch_frame(timeline, insts)
    if made is None:
        return None
    sig, groups, present = made
    b = gw.bounds(groups)
    tok = set(timeline.tokens["instance"].unique()) if len(timeline.tokens) else set()
    # presence of each signal's columns per instance (signals.signal_quality, vectorised)
    pres = {}
    for c in _PRESENCE + ("granularity",):
        if c not in sig.columns:
            continue
        col = sig[c]
        if c == "graph_mode":
            m = (col != "unknown").to_numpy(dtype=bool)
        elif c == "granularity":
            m = (col == "step").to_numpy(dtype=bool)
        else:
            m = col.notna().to_numpy()
        pres[c] = gw.per_group(m, groups, np.logical_or)
    quality = [qualities(timeline.meta, inst, lambda c, g=g: bool(c in pres and pres[c][g]), inst in tok,
                         bool(pres["granularity"][g])) for g, inst in enumerate(present)]
    per_row = {k: np.array([q[k] for q in quality], dtype=object)[groups] for k in quality[0]} if quality else {}
    sig, has_itl, lat, base = interval_signals(sig, per_row, cfg, groups)
    # the dtype a per-instance frame gets from ``sig["instance"] = inst`` (pandas' string dtype)
    sig["instance"] = sig["instance"].astype(pd.Series([""]).dtype)
    # periodicity against arrivals (signals.periodicity per instance, from grouped counts)
    events = prefill_events(sig, use_allocation=False).fillna(False).astype(bool)
    near = events | gw.shift(events, 1, False, groups) | gw.shift(events, -1, False, groups)
    cand = has_itl.fillna(False).astype(bool)
    spikes = sig["is_spike"].fillna(False).astype(bool) & cand
    add = lambda m: gw.per_group(np.asarray(m, dtype=np.int64), groups, np.add)  # noqa: E731
    n_ev, n_sp, n_near, n_cand, n_cand_near = add(events), add(spikes), add(spikes & near), add(cand), add(cand & near)
    sig["near_prefill_event"] = near
    t = sig["t_start_s"].to_numpy()
    ev_np, sp_np = events.to_numpy(), spikes.to_numpy()
    # work per interval for the rank relation: the first column with enough values on ITL rows
    work_cols = [c for c in RELATION_WORK if c in sig.columns]
    n_work = {c: add(sig[c].notna() & has_itl) for c in work_cols}
    itl_rows = has_itl.to_numpy(dtype=bool)
    work_of = {c: np.where(itl_rows, sig[c].to_numpy(dtype=float), np.nan) for c in work_cols}
    excess = (lat / base).where(has_itl).to_numpy(dtype=float)
    known_mode = gw.per_group((sig["graph_mode"] != "unknown").to_numpy(dtype=bool), groups, np.logical_or)
    llm = interval_decode_evidence(sig, groups)
    near, count_near = np.full(len(sig), np.nan), np.full(len(sig), np.nan)
    tokens = sig["prefill_tokens"].to_numpy(dtype=float) if "prefill_tokens" in sig.columns else None
    starved = sig["starved"].to_numpy(dtype=bool)
    out = []
    for g, inst in enumerate(present):
        lo, hi = b[g], b[g + 1]
        p0 = float(n_cand_near[g] / n_cand[g]) if n_cand[g] else float("nan")
        te = t[lo:hi][ev_np[lo:hi]] if n_ev[g] >= 3 else t[:0]
        ts = t[lo:hi][sp_np[lo:hi]] if n_sp[g] >= 3 else t[:0]
        period = period_stats(int(n_ev[g]), int(n_sp[g]), int(n_near[g]), p0, te, ts, cfg.signals)
        wc = next((c for c in work_cols if n_work[c][g] >= cfg.signals.relation_min_rows), None)
        work = work_of[wc][lo:hi] if wc is not None else np.full(hi - lo, np.nan)
        relation = rank_relation(work, excess[lo:hi], cfg.signals)
        if wc is not None:
            near[lo:hi] = work_near(np.where(starved[lo:hi], np.nan, sig[wc].to_numpy(dtype=float)[lo:hi]),
                                    counted_late=wc != SPREAD_WORK)
        if wc == SPREAD_WORK and tokens is not None:
            count_near[lo:hi], counted = counted_work(tokens[lo:hi], itl_rows[lo:hi], starved[lo:hi])
            relation = relation | counted
        norm = decode_graph_norm(sig.iloc[lo:hi]) if known_mode[g] else "unknown"
        # looks_like_llm_serving on interval rows: token events, too few rows to judge, or decode evidence
        llm_like = bool(inst in tok or hi - lo < cfg.signals.llm_min_rows or llm[g])
        out.append((inst, InstanceContext(quality=quality[g], graph_norm=norm, period=period, relation=relation,
                                          llm_like=llm_like)))
    sig["prefill_work_near"] = near
    sig["prefill_count_near"] = count_near
    return sig, groups, out
