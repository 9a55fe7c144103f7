"""Detection on step rows (per-step records, profiler traces, engine log lines): the latency decodes
felt per step - step-to-step, charged token gaps, or the step's own duration when the step clock is too
coarse to give gaps (log timestamps in whole seconds) - its baseline over healthy decode steps, and the
steps (and request stalls) that spike."""
from __future__ import annotations

import numpy as np
import pandas as pd

from mixdiag.diagnosis.config import DiagnosisConfig
from mixdiag.diagnosis.detection.context import InstanceContext
from mixdiag.diagnosis.detection.signals import (decode_graph_norm, decode_like, kind_unread, periodicity, stamp_resolution,
                                                 prefill_events, prefill_since_last_decode, row_qualities,
                                                 step_signals)
from mixdiag.diagnosis.detection.regimes import sustained_rows
from mixdiag.diagnosis.detection.shape_cost import shape_cost
from mixdiag.diagnosis.detection.spikes import charge_itl, is_spike, itl_events, rolling_baseline, step_timing
from mixdiag.diagnosis.labels import equal
from mixdiag.schema import nan_series


def _mixed_size_episodes(sig: pd.DataFrame) -> pd.Series:
    """Rows of ``sig["sustained"]`` runs whose decode-only rows hold more than one ``decode_reqs`` value."""
    held = sig["sustained"].fillna(False).to_numpy(dtype=bool)
    out = np.zeros(len(sig), dtype=bool)
    if not held.any() or "decode_reqs" not in sig.columns:
        return pd.Series(out, index=sig.index)
    reqs = pd.to_numeric(sig["decode_reqs"], errors="coerce").to_numpy(dtype=float)
    dec = sig["decode_only"].fillna(False).to_numpy(dtype=bool)
    edges = np.diff(np.concatenate(([0], held.astype(np.int8), [0])))
    for a, b in zip(np.flatnonzero(edges == 1), np.flatnonzero(edges == -1)):
        sizes = reqs[a:b][dec[a:b] & np.isfinite(reqs[a:b])]
        if len(np.unique(sizes)) > 1:
            out[a:b] = True
    return pd.Series(out, index=sig.index)

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


def _stamps_coarser_than_steps(st: pd.DataFrame) -> bool:
    """Rows whose stamps lie on a grid (whole seconds) at least as coarse as the step time the rows state
    (``elapsed_s``): a gap between two such stamps is no latency - it may be one forward or forty. An SGLang
    operator log prints a Decode line every 40 forwards with whole-second stamps; at 25 ms a forward the lines
    are a second apart and never overlap, so :func:`_coarse_clock` alone took their stamp gaps for latency
    (host_stall on every window of a steady log, confidence capped by the resolution only)."""
    if "elapsed_s" not in st.columns or not len(st):
        return False
    el = pd.to_numeric(st["elapsed_s"], errors="coerce")
    if not el.notna().any():
        return False
    res = float(stamp_resolution(st).iloc[0])
    return res > 0 and res >= float(el.median())


def window_mean_latency(meta: dict, inst: str) -> bool:
    """Whether the instance's ``elapsed_s`` is an estimated mean over the steps since the previous
    decode line (the collector declares it ``estimated``) rather than one step's own time."""
    return ((meta or {}).get("signals", {}).get(inst, {}) or {}).get("elapsed_s") == "estimated"


def step_pipeline(inst: str, rows: pd.DataFrame, tokens: pd.DataFrame, quality: dict, cfg: DiagnosisConfig,
                   outside_faulty: np.ndarray | None = None, window_latency: bool = False,
                   itl: pd.DataFrame | None = None):
    """Detection on one instance's step rows: its signal frame (latency, baseline, spikes), context,
    periodicity and latency source. ``outside_faulty``: rows another view of the engine saw a fault
    in (kept out of the baseline); ``window_latency``: the rows' ``elapsed_s`` is a window mean;
    ``itl``: ``itl_events(tokens)`` when the caller has it already (the budget reads it too)."""
    st = step_timing(rows).reset_index(drop=True)
    coarse = _coarse_clock(st) or (window_latency and _stamps_coarser_than_steps(st))
    if coarse:  # gaps unknown: the step's own duration (or the time the log line states) is the latency
        st["gap_before_s"] = nan_series(st.index)  # all-NaN columns here hold no memory per row
        st["latency_s"] = st["duration_s"]
        if "elapsed_s" in st.columns and st["elapsed_s"].notna().any():
            st["latency_s"] = pd.to_numeric(st["elapsed_s"], errors="coerce").fillna(st["duration_s"])
        quality = quality | {"host_time": "absent"}
    has_tokens = len(tokens) > 0
    if has_tokens:
        st[["itl_max_s", "itl_events", "stall_max_s"]] = charge_itl(st, itl if itl is not None
                                                                    else itl_events(tokens)).to_numpy()
    else:
        st["itl_max_s"], st["itl_events"], st["stall_max_s"] = nan_series(st.index), 0, nan_series(st.index)
    sig = step_signals(st, cfg.signals)
    sig = _with_columns(sig, row_qualities(sig, quality))
    if coarse:
        sig["gap_excess_s"] = nan_series(sig.index)
    # A decode row whose latency is the collector's estimate of the mean step time since the
    # previous decode row (SGLang's gen throughput) covers a window: the prefill batches logged
    # inside it are evidence for its height (step_rules reads window_*_steps).
    sig["window_mixed_steps"] = sig["window_stall_steps"] = nan_series(sig.index)
    sig["window_start_s"] = sig["window_end_s"] = nan_series(sig.index)
    if coarse and window_latency and "elapsed_s" in sig.columns:
        mixed, stall = prefill_since_last_decode(sig, cfg.attribution.chunk_min_tokens)
        win = sig["decode_only"] & pd.to_numeric(sig.get("elapsed_s"), errors="coerce").notna()
        sig["window_mixed_steps"] = mixed.where(win)
        sig["window_stall_steps"] = stall.where(win)
        # the window the row's latency is a mean over: from the previous decode line to this one - what a
        # spike on it speaks of (the decode line's own stamp is only the window's end)
        prev_end = sig["t_end_s"].where(win).shift(1).ffill()
        sig["window_start_s"] = prev_end.where(win & (prev_end < sig["t_end_s"]))
        # a stamp truncated to its resolution (whole seconds): the line was printed up to one resolution later
        res = pd.to_numeric(sig["stamp_resolution_s"], errors="coerce").fillna(0.0) \
            if "stamp_resolution_s" in sig.columns else 0.0
        sig["window_end_s"] = (sig["t_end_s"] + res).where(sig["window_start_s"].notna())
    if has_tokens:
        visible = sig["itl_events"] > 0
        # a request that already had tokens waited through this prefill-only step: decodes were
        # running even if no step before held decode rows (a burst of prompts at start-up)
        sig["decodes_before"] |= sig["has_prefill"] & ~sig["has_decode"] & visible
        # ... and only such a request shows that decodes waited through it (no gap: nobody did)
        sig["decodes_waited"] = sig["has_prefill"] & ~sig["has_decode"] & visible
    elif quality.get("token_allocation") != "absent" or sig["kind"].isin(["prefill", "decode", "mixed"]).any():
        # a prefill-only step is felt only by decodes that waited through it (signals.decodes_waited); a row
        # whose allocation the source could not read is judged as a source without counts judges every row
        visible = sig["has_decode"] | (sig["has_prefill"] & sig["decodes_waited"]) | kind_unread(sig)
    else:
        visible = pd.Series(True, index=sig.index)
    # Healthy decode steps set the baseline: a fault window (an EP hotspot lasting 30 steps, a run
    # of KV transfers) must stand out against it, not become the norm of a rolling median.
    faulty = sig["kv_xfer"] | sig["preempt"] | (sig["imbalance_rel"] >= cfg.attribution.imbalance_rel).fillna(False)
    # ... and steps whose EP ranks measurably diverged. EP ranks run every forward in lockstep and meet in
    # the all-to-all, which ends when the last rank arrives (DeepEP csrc/kernels/internode_ll.cu /
    # intranode.cu wait on every peer's flag; NCCL grouped send/recv completes with the slowest peer; SGLang
    # DP attention with EP MoE: every DP rank runs the same forward step), so on a healthy step every rank's
    # compute is within noise of the others. One rank's kernel time (or, inside graph replays, SM-busy
    # time) far above the median rank's is a measured imbalance - hot experts, or a peer's prompt chunk - the
    # way the imbalance gauge above is, never a healthy reference: a hotspot covering most rows of a batch
    # stratum would otherwise become the stratum's low side and its own baseline. Thresholds: the EP rule's
    # own (AttributionConfig.rank_skew / rank_sm_skew); a wrong exclusion only leaves a healthy row out.
    a_cfg = cfg.attribution
    faulty |= (pd.to_numeric(sig.get("rank_skew", nan_series(sig.index)), errors="coerce") >= a_cfg.rank_skew
               ).fillna(False).to_numpy(dtype=bool)
    faulty |= (pd.to_numeric(sig.get("rank_sm_skew", nan_series(sig.index)), errors="coerce") >= a_cfg.rank_sm_skew
               ).fillna(False).to_numpy(dtype=bool)
    # ... and steps the host held back: a measured idle gap beyond the usual one (SpikeConfig.ref_gap_share).
    # A host stall lasting hundreds of steps that an overlapped scheduler half hides lifts the rolling median
    # by a quarter, and the steps it makes visible then no longer stand out against it
    gx = pd.to_numeric(sig["gap_excess_s"], errors="coerce").to_numpy(dtype="float64")
    with np.errstate(invalid="ignore"):
        faulty |= np.nan_to_num(gx) >= cfg.spikes.ref_gap_share * sig["latency_s"].to_numpy(dtype="float64")
    if outside_faulty is not None and len(outside_faulty) == len(sig):
        faulty |= outside_faulty  # another view of this engine (scrapes) saw a fault there
    # a measured FULL replay is a uniform decode batch (vLLM CudagraphDispatcher keys FULL on uniform decode,
    # SGLang's cuda graph runner captures decode only): decode rows where the allocation could not be read
    # (a graph-level trace hides the attention kernels; a rank that uploaded no prompt calibrates no copies)
    decodeish = decode_like(sig)
    sig["decode_like"] = decodeish
    ref = visible & decodeish & ~faulty
    if not decodeish.any():  # no token counts: every visible step, then its usual graph mode
        ref = visible & ~faulty
    # Decode steps in their usual graph mode set the baseline, so a stretch of graph fallback
    # stands out against it instead of becoming the norm.
    norm = decode_graph_norm(sig, cfg.signals.full_norm_share)
    if norm != "unknown" and (ref & equal(sig["graph_mode"], norm)).sum() >= cfg.spikes.min_periods:
        ref &= equal(sig["graph_mode"], norm)
    # the regime stage reads its low-side reference from these rows too (regimes.latency_view)
    sig["reference_row"] = ref.to_numpy(dtype=bool)
    # A fault lasting longer than half the rolling window (an EP hotspot, a stall before every step for
    # hundreds of steps) would become its own baseline and only its edges would spike: rows of an episode
    # against the instance's low-side reference (detection/regimes.py, per decode-batch stratum) are no
    # reference rows, so the stretch is judged against the healthy steps around it.
    held = sustained_rows(sig["latency_s"].to_numpy(dtype="float64"), _batch_strata(sig), ref.to_numpy(dtype=bool),
                          cfg.regimes)
    if (ref & ~held).sum() >= cfg.spikes.min_periods:
        ref &= ~held
    sig["sustained"] = held
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
    period = periodicity(sig, spike, cfg.signals, prefill_events(sig, use_allocation=False), candidates=visible)
    sig["near_prefill_event"] = period.pop("near")
    # what each decode batch size costs, measured (graph fallback without a measured graph mode)
    a = cfg.attribution
    # Steps of an episode in which decode batches of several sizes all ran slow measure the episode, not a
    # shape: a batch size seen only during a KV-transfer or hotspot stretch would otherwise 'jump' over the
    # size below it (e2 tuning seeds 0-9, vLLM Iteration-line logs: all 80 wrong graph_fallback calls were
    # such sizes inside pd_transfer stretches). An episode of one batch size only (a size that falls back to
    # eager whenever it runs) is what the shape cost measures, and stays.
    sig = _with_columns(sig, shape_cost(sig, sig["decode_only"] & ~faulty & ~_mixed_size_episodes(sig),
                                        a.shape_min_rows, a.shape_jump))
    full = sig.loc[sig["decode_only"] & equal(sig["graph_mode"], "FULL"), "decode_reqs"].dropna()
    ctx = InstanceContext(quality=quality, graph_norm=decode_graph_norm(sig, cfg.signals.full_norm_share), period=period,
                          full_batch_sizes=frozenset(float(x) for x in full.unique()))
    return sig, ctx, period, ("step_duration" if coarse else ("token_itl" if has_tokens else "step_latency"))


def _batch_strata(sig: pd.DataFrame) -> np.ndarray:
    """log2 bins of the decode batch (-1 unknown): a decode step's cost grows with its batch, so rows are
    compared with rows of comparable work (regimes.latency_view uses the same bins)."""
    dec = pd.to_numeric(sig["decode_reqs"], errors="coerce").to_numpy(dtype="float64")
    with np.errstate(divide="ignore", invalid="ignore"):
        b = np.floor(np.log2(np.where(np.isfinite(dec) & (dec >= 1), dec, np.nan)))
    return np.where(np.isfinite(b), b, -1).astype(int)


def _with_columns(frame: pd.DataFrame, extra: pd.DataFrame) -> pd.DataFrame:
    """``pd.concat([frame, extra], axis=1)`` for new columns on the same index, without copying
    ``frame`` (side-by-side concatenation consolidates every column: seconds on a million rows)."""
    if set(extra.columns) & set(frame.columns) or not frame.index.equals(extra.index):
        return pd.concat([frame, extra], axis=1)
    frame = frame.copy(deep=False)
    for c in extra.columns:
        frame[c] = extra[c]
    return frame
