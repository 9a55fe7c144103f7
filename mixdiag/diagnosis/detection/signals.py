"""The signals attribution looks at, per step: the article's four (two-segment token allocation,
TPOT spikes and their period, the SM-activity sawtooth, CUDA-graph mode) and the evidence of the
other causes (expert imbalance, KV transfer, preemptions, inter-step gaps).

Every signal is computed relative to the step's own instance and neighbourhood, so one threshold
setting serves every model size and load. Which signals a source could not provide is decided
once, here (:func:`signal_quality`), from ``meta["signals"]`` and from which columns are empty.
The periodicity test is in :mod:`.periodicity`, the prefill-work / ITL relation of interval rows
in :mod:`.prefill_relation` (both re-exported here).
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from mixdiag.causes import SIGNAL_COLUMNS, SIGNALS  # noqa: F401  (SIGNALS re-exported)
from mixdiag.diagnosis import groupwise as gw
from mixdiag.diagnosis.config import SignalConfig
from mixdiag.diagnosis.detection.periodicity import _binom_sf, period_stats, periodicity, prefill_events  # noqa: F401
from mixdiag.diagnosis.detection.prefill_relation import (average_ranks, counted_work, rank_relation,  # noqa: F401
                                                          work_near, work_usual)
from mixdiag.diagnosis.detection.regimes import low_side_reference
from mixdiag.diagnosis.detection.log_windows import (chunk_rows, graph_off_decode_column,  # noqa: F401
                                                   prefill_since_last_decode)
from mixdiag.diagnosis.labels import equal, label_codes, label_in
from mixdiag.schema import repeat_label


def _has_data(df: pd.DataFrame, col: str) -> bool:
    if col not in df.columns or not len(df):
        return False
    s = df[col]
    if col == "graph_mode":
        return bool((~equal(s, "unknown")).any())
    return bool(s.notna().any())


def signal_quality(meta: dict, instance: str, steps: pd.DataFrame, has_tokens: bool) -> dict[str, str]:
    """Quality of each signal for one instance: measured | estimated | inferred | absent.

    Data decides presence (an all-NaN column is absent whatever meta claims); meta refines the
    quality of present data (e.g. ``sm_active: estimated`` on CPU).
    """
    return qualities(meta, instance, lambda col: _has_data(steps, col), has_tokens,
                     bool(len(steps)) and bool(equal(steps["granularity"], "step").any()))


#: interval columns that measure host time (detection/host_wait.py)
HOST_TIME_COLUMNS = ("gpu_wait_s", "host_pause_s", "host_stopped_s")


def qualities(meta: dict, instance: str, has_data, has_tokens: bool, has_step_rows: bool) -> dict[str, str]:
    """:func:`signal_quality` from ``has_data(column)`` (whether the instance's rows hold any of it)."""
    declared = (meta or {}).get("signals", {}).get(instance, {}) or {}
    out = {}
    for sig in SIGNALS:
        if sig == "itl":
            present = has_tokens or any(has_data(c) for c in SIGNAL_COLUMNS["itl"])
        elif sig == "host_time":
            # gaps between step rows, or host time an interval row counts itself: the GPU's wait on the host
            # (SGLang), the engine's GC timing (vLLM), the OS's view of the process (host sampler)
            present = has_step_rows or any(has_data(c) for c in HOST_TIME_COLUMNS)
        elif sig == "token_allocation":
            present = has_data("prefill_tokens") and (has_data("decode_rows") or has_data("decode_reqs"))
        else:
            present = any(has_data(c) for c in SIGNAL_COLUMNS[sig])
        if not present:
            out[sig] = "absent"
            continue
        q = declared.get(sig)
        for c in SIGNAL_COLUMNS.get(sig, ()):
            q = q or declared.get(c)
        out[sig] = q if q in ("measured", "estimated", "inferred") else "measured"
    return out


def _rolling_ref_median(values: pd.Series, ref: pd.Series, window: int, groups: np.ndarray | None = None) -> pd.Series:
    x = values.where(ref & values.notna())
    if not values.notna().any():  # nothing to take a median of (a column the source lacks)
        return pd.Series(np.nan, index=values.index)
    med = gw.bfill(gw.ffill(gw.rolling_median(x, window, 1, groups), groups), groups)
    # an instance with no reference row at all: its overall median
    lost = gw.all_(med.isna(), groups) & gw.any_(values.notna(), groups)
    if lost.any():
        med = med.where(~lost, gw.median(values, groups))
    return med


def _low_side_level(values: pd.Series, ref: pd.Series, groups: np.ndarray | None, k: float = 0.0) -> pd.Series:
    """Per row: the healthy level of a signal whose faults only raise it - the low-side centre
    (:func:`~mixdiag.diagnosis.detection.regimes.low_side_reference`) of its group's reference rows
    (all its rows when none is a reference row) plus ``k`` sigma; NaN where the group has no value."""
    v = pd.to_numeric(values, errors="coerce").to_numpy(dtype="float64")
    g = np.zeros(len(v), dtype=np.int64) if groups is None else np.asarray(groups)
    r = ref.to_numpy(dtype=bool) & np.isfinite(v)
    out = np.full(len(v), np.nan)
    for grp in np.unique(g):  # (not ``k``: that is the sigma multiple)
        mine = g == grp
        pick = mine & r if (mine & r).sum() >= 3 else mine & np.isfinite(v)
        if pick.any():
            centre, sigma = low_side_reference(v[pick])
            out[mine] = centre + k * sigma
    return pd.Series(out, index=values.index)


def step_signals(steps: pd.DataFrame, cfg: SignalConfig = SignalConfig(), groups: np.ndarray | None = None
                 ) -> pd.DataFrame:
    """Per-step signal columns for one instance's rows (sorted by step, with ``gap_before_s``), or
    for several instances' rows at once when ``groups`` numbers them (see :mod:`.groupwise`).

    Adds: ``has_prefill``, ``has_decode``, ``decodes_around`` (a neighbour step held decode
    rows), ``decodes_before`` (decodes were running when the step began), ``decodes_waited`` (a
    prefill-only step that running decodes waited through: :func:`decodes_waited`), ``decode_only``, ``graph_off`` (PIECEWISE or NONE), ``sm_delta`` (SM activity minus
    that of neighbouring decode-only steps - FULL-graph steps when token counts are absent),
    ``comm_delta`` (collective share of the step minus its decode neighbourhood's), ``imbalance_rel`` (expert imbalance over its
    decode-only neighbourhood), ``kv_xfer``, ``preempt``, ``gap_excess_s`` (gap minus the
    typical gap).
    """
    s = steps.copy(deep=False)  # columns are only added or replaced here: the caller's frame never changes
    kind = s["kind"]
    pt, dr = s["prefill_tokens"], s["decode_rows"].fillna(s["decode_reqs"])
    s["has_prefill"] = np.where(pt.notna(), pt > 0, kind.isin(["prefill", "mixed"]))
    s["has_decode"] = np.where(dr.notna(), dr > 0, kind.isin(["decode", "mixed"]))
    s["has_prefill"] = s["has_prefill"].astype(bool)
    s["has_decode"] = s["has_decode"].astype(bool)
    hd = s["has_decode"]
    s["decodes_around"] = (gw.shift(hd, 1, False, groups) | gw.shift(hd, -1, False, groups)).astype(bool)
    # Decodes were running before this step: the last step that was not prefill-only held decode
    # rows (a multi-chunk prefill keeps them waiting across several steps).
    prefill_only = s["has_prefill"] & ~hd
    last = gw.shift(gw.ffill(hd.astype(float).where(~prefill_only), groups), 1, np.nan, groups)
    s["decodes_before"] = last.fillna(0.0).astype(bool)
    s["decodes_waited"] = decodes_waited(s, prefill_only, dr, groups)
    s["stamp_resolution_s"] = stamp_resolution(s, groups)
    # the per-forward time a sampled log states (SGLang's Decode line every 40 forwards: the mean
    # step time since the previous line), against which the stamps' resolution is read
    stated = pd.to_numeric(s["elapsed_s"], errors="coerce") if "elapsed_s" in s.columns else None
    s["stated_step_s"] = gw.median(stated, groups) if stated is not None and stated.notna().any() else np.nan
    s["decode_only"] = hd & ~s["has_prefill"]
    s["graph_off"] = s["graph_mode"].isin(["PIECEWISE", "NONE"])
    w = cfg.neighbour_window
    ref = s["decode_only"]
    if not ref.all() and not gw.any_(ref, groups).all():
        # no token counts: a FULL graph replay is a uniform decode batch
        full = s["graph_mode"].eq("FULL") & s.get("graph_replayed", pd.Series(np.nan, index=s.index)).ne(0)
        ref = ref.where(gw.any_(ref, groups), full)
    s["sm_delta"] = s["sm_active"] - _rolling_ref_median(s["sm_active"], ref, w, groups)
    comm = s["comm_share"] if "comm_share" in s.columns else pd.Series(np.nan, index=s.index)
    s["comm_delta"] = comm - _rolling_ref_median(comm, ref, max(w, cfg.wide_window), groups)
    # SM-busy skew across ranks (graph-hidden compute) above the instance's balanced level: balanced
    # steps already differ by their jitter, and that floor varies with the deployment. The level is
    # read from the low side of the whole instance (regimes.low_side_reference): a hotspot lasting
    # hundreds of steps would become a rolling median's own reference, and skew only ever adds
    smsk = s["rank_sm_skew"] if "rank_sm_skew" in s.columns else pd.Series(np.nan, index=s.index)
    s["sm_skew_delta"] = smsk - _low_side_level(smsk, ref, groups)
    # a wide window: hotspot windows last tens of steps and must not become their own reference
    imb_ref = _rolling_ref_median(s["expert_imbalance"], ref, max(w, cfg.wide_window), groups)
    # ... never above the instance's healthy band (low-side level of its reference rows): a hotspot holding
    # most of the window would otherwise be its own reference (regimes.low_side_reference)
    imb_ref = np.fmin(imb_ref, _low_side_level(s["expert_imbalance"], ref, groups, k=cfg.imbalance_band_sigma))
    s["imbalance_rel"] = s["expert_imbalance"] / imb_ref.where(imb_ref > 0)
    s["kv_xfer"] = (s["kv_transfer_bytes"].fillna(0) > 0) | (s["kv_transfer_s"].fillna(0) > 0)
    # KV moving on a side stream inside the step's span (traces): the step waited on it (compute stream idle
    # while it ran) - that is the step's transfer; one that only ran beside the forward is weaker
    # (``kv_beside``: contention at most), and a rule weighs it only where no other cause's evidence holds
    if "kv_wait_s" in s.columns:
        s["kv_xfer"] |= pd.to_numeric(s["kv_wait_s"], errors="coerce").fillna(0) > 0
        s["kv_beside"] = ~s["kv_xfer"] & (pd.to_numeric(s["kv_overlap_s"], errors="coerce").fillna(0) > 0)
    s["preempt"] = s["preempted_reqs"].fillna(0) > 0
    gap = s["gap_before_s"] if "gap_before_s" in s.columns else pd.Series(0.0, index=s.index)
    if gap.isna().all():
        s["gap_excess_s"] = gap - gap
    else:
        # the usual gap follows load (rolling median), but never above the instance's healthy band (low-side
        # centre + 3 sigma, regimes.low_side_reference): a stall lasting longer than half the window would
        # otherwise become its own usual gap - a stall only ever adds time
        usual = gw.rolling_median(gap, cfg.gap_window, 1, groups)
        band = _low_side_level(gap, pd.Series(True, index=s.index), groups, k=cfg.gap_band_sigma)
        s["gap_excess_s"] = gap - np.fmin(usual, band)
    return s


#: Clock grids a source may stamp on, coarsest first (whole seconds: vLLM and SGLang log prefixes).
STAMP_GRIDS_S = (1.0, 0.1, 0.01, 0.001)


def stamp_resolution(s: pd.DataFrame, groups: np.ndarray | None = None) -> pd.Series:
    """Per row, its instance's stamp resolution: the coarsest grid of :data:`STAMP_GRIDS_S` that
    every start and end stamp of the instance's rows lies on, 0 when they are finer than 1 ms (a
    trace, per-step records). A latency below it is not measured: two stamps a resolution apart
    may be one forward or forty."""
    t = np.concatenate([s["t_start_s"].to_numpy(dtype=float), s["t_end_s"].to_numpy(dtype=float)])
    g = np.zeros(len(s), dtype=np.intp) if groups is None else np.asarray(groups)
    g2 = np.concatenate([g, g])
    n_groups = int(g.max()) + 1 if len(g) else 0
    res = np.zeros(n_groups)
    fin = np.isfinite(t)
    cand = np.bincount(g2[fin], minlength=n_groups) > 0  # groups still on every grid tried so far
    for grid in STAMP_GRIDS_S[::-1]:  # finest first: stamps off it are off every coarser one (a trace: one pass)
        rows = fin & cand[g2]
        if not rows.any():
            break
        with np.errstate(invalid="ignore"):
            off = np.abs(t[rows] - np.round(t[rows] / grid) * grid) > 1e-6  # float stamps at unix scale: ~1e-7 s
        cand &= ~(np.bincount(g2[rows], weights=off, minlength=n_groups) > 0)
        res[cand] = grid
    return pd.Series(res[g] if len(g) else np.zeros(0), index=s.index)


def decodes_waited(s: pd.DataFrame, prefill_only: pd.Series, decoders: pd.Series,
                   groups: np.ndarray | None = None) -> pd.Series:
    """Prefill-only rows that running decodes waited through, from the step rows alone: decode rows
    before the run of prefill-only steps and after it, and - where the counts say - more decoding
    requests after it than the run prefilled (so some decoded before it too: they were running and
    got no token during the prefill). vLLM V1 schedules running decodes first, so its prefill-only
    steps run only when nothing decodes; decode rows on both sides then hold different requests (the
    last tokens of finished ones, the first of the new ones) and the counts tell them apart. SGLang
    without mixed chunk runs a prefill batch alone while its decode batch waits. Token events, where
    present, say it directly (a gap spanning the step: step_view)."""
    hd = s["has_decode"].astype(float)
    after = gw.bfill(hd.where(~prefill_only), groups).fillna(0.0).astype(bool)
    n_after = gw.bfill(decoders.where(~prefill_only), groups)
    run = (~prefill_only).cumsum()
    keys = [run] if groups is None else [pd.Series(groups, index=s.index), run]
    new = s["prefill_reqs"] if "prefill_reqs" in s.columns else pd.Series(np.nan, index=s.index)
    g = new.where(prefill_only).groupby(keys, sort=False)
    run_new = g.transform("sum").where(g.transform("count") > 0)
    more = (n_after > run_new) | n_after.isna() | run_new.isna()  # counts unknown: decode rows both sides
    return (prefill_only & s["decodes_before"] & after & more).astype(bool)


def kind_unread(sig: pd.DataFrame) -> pd.Series:
    """Rows whose token allocation the source could not read (no counts, kind unknown)."""
    if "rq_token_allocation" in sig.columns:
        return pd.Series(label_in(sig["rq_token_allocation"], ["absent"]), index=sig.index)
    return pd.Series(~label_in(sig["kind"], ["prefill", "decode", "mixed"]), index=sig.index)


def decode_like(sig: pd.DataFrame) -> pd.Series:
    """Decode-only rows, and rows whose allocation could not be read that replayed the FULL graph (measured):
    a FULL replay is a uniform decode batch (vLLM CudagraphDispatcher keys FULL on uniform decode, SGLang's cuda
    graph runner captures decode only), while a graph-level trace hides the attention kernels that would say so
    and a rank that uploaded no prompt calibrates no copies."""
    full = label_in(sig["graph_mode"], ["FULL"]) & sig.get("graph_replayed", pd.Series(np.nan, index=sig.index)).ne(0)
    if "rq_graph_mode" in sig.columns:  # label_in: per distinct value, not per row (labels.py)
        full &= label_in(sig["rq_graph_mode"], ["measured"])
    return sig["decode_only"].astype(bool) | (kind_unread(sig) & full)


def decode_graph_norm(sig: pd.DataFrame, full_share: float | None = None) -> str:
    """The graph mode most decode-only steps of the instance ran in ('unknown' if none known; rows of unread
    allocation that replayed FULL count as decode, :func:`decode_like`).
    ``full_share`` (step rows): FULL is the norm once at least this share of the decode steps replayed it,
    even when a long eager stretch holds most of them - engines replay the decode graph whenever they can
    (SGLang ``CudaGraphRunner.can_run``: a decode batch up to the largest captured size, and with DP attention
    ``forward_batch.can_run_dp_cuda_graph``, agreed across DP ranks, so a peer rank's extend batch sends every
    rank eager; vLLM ``CudagraphDispatcher.dispatch``: FULL for a uniform decode batch of a captured size).
    A decode step that did not replay is the exception a fault or a peer made, never the healthy path
    (SignalConfig.full_norm_share has the margin).
    Without token counts: the mode most steps ran in, when one mode holds at least half of them
    (decode steps are the bulk of serving)."""
    dl = sig["decode_like"].astype(bool) if "decode_like" in sig.columns else decode_like(sig)  # step_view keeps it
    m = sig.loc[dl & ~equal(sig["graph_mode"], "unknown"), "graph_mode"]
    if len(m):
        if full_share is not None and float(equal(m, "FULL").mean()) >= full_share:
            return "FULL"
        return str(m.mode().iloc[0])
    m = sig.loc[~equal(sig["graph_mode"], "unknown"), "graph_mode"]
    if not len(m):
        return "unknown"
    top = m.value_counts()
    return str(top.index[0]) if top.iloc[0] >= 0.5 * len(sig) else "unknown"


#: Per-row quality column of each signal (schema ``q_*``); '' there means "see meta['signals']".
QUALITY_COLUMNS = {"token_allocation": "q_token_allocation", "graph_mode": "q_graph_mode",
                   "sm_active": "q_sm_active", "expert_imbalance": "q_expert_imbalance",
                   "kv_transfer": "q_kv_transfer"}
#: Qualities that may corroborate another signal: ``estimated`` values are modelled from the token
#: allocation (SM activity from a cost model, a graph mode planned from the batch shape), so they
#: repeat the allocation instead of checking it; ``inferred`` ones are derived from other rows.
INDEPENDENT = ("measured",)
# 0-d object arrays: ``np.where(mask, "absent", objects)`` would cast the literal to a new str object
# per row (a million rows x five signals: ~300 MB); these put one shared object in every row.
_ABSENT, _ESTIMATED = np.array("absent", dtype=object), np.array("estimated", dtype=object)


def row_qualities(s: pd.DataFrame, quality: dict) -> pd.DataFrame:
    """Per-row quality of each signal with a ``q_*`` column: ``rq_<signal>`` columns.

    The row's own ``q_*`` value wins, else the instance's quality; an empty cell is ``absent``.
    A graph mode that claims a graph (FULL/PIECEWISE) on a row whose ``graph_replayed`` is 0 was
    planned from the batch shape, not replayed: ``estimated``, unless the row says ``measured``.
    """
    out = pd.DataFrame(index=s.index)
    n = len(s)
    for sig, col in QUALITY_COLUMNS.items():
        q = repeat_label(n, quality.get(sig, "absent"))
        if col in s.columns:  # per distinct value, not per row (labels.py)
            codes, labels = label_codes(s[col])
            q = np.where(np.isin(labels, ["measured", "inferred", "estimated", "absent"])[codes], labels[codes], q)
        data = [c for c in SIGNAL_COLUMNS.get(sig, ()) if c in s.columns]
        if sig == "graph_mode":
            empty = label_in(s["graph_mode"], ["unknown"], na="unknown")
            planned = label_in(s["graph_mode"], ["FULL", "PIECEWISE"], na="\0") & s.get(
                "graph_replayed", pd.Series(np.nan, index=s.index)).eq(0).to_numpy()
            if col in s.columns:
                planned &= ~label_in(s[col], ["measured"])
            q = np.where(planned & (q != "absent"), _ESTIMATED, q)
        elif sig == "token_allocation":
            empty = s[["prefill_tokens", "decode_rows", "decode_reqs"]].isna().all(axis=1).to_numpy() & \
                ~label_in(s["kind"], ["prefill", "decode", "mixed"], na="\0")
        elif sig == "expert_imbalance":
            empty = (s["expert_imbalance"].isna() & s.get("rank_skew", pd.Series(np.nan, index=s.index)).isna()).to_numpy()
        else:
            empty = s[data].isna().all(axis=1).to_numpy() if data else np.ones(n, dtype=bool)
        out["rq_" + sig] = pd.Series(np.where(empty, _ABSENT, q), index=s.index, dtype=object)
    return out


def independent(q) -> bool:
    """Whether a signal of quality ``q`` may corroborate the token allocation."""
    return q in INDEPENDENT


def looks_like_llm_serving(sig: pd.DataFrame, has_tokens: bool, cfg: SignalConfig) -> bool:
    """Whether an instance's rows have the decode-like structure of LLM serving: output token
    events or interval ITL; or step rows of which at least ``cfg.llm_min_share`` held decode rows / output
    tokens; or replayed the FULL graph with one duration scale (repeated short decode steps: the
    robust spread of their durations is within half their median). Fewer than ``cfg.llm_min_rows``
    rows: True (too little to judge)."""
    if has_tokens or len(sig) < cfg.llm_min_rows:  # too few rows to judge: no claim either way
        return True
    iv = equal(sig["granularity"], "interval")
    if iv.any() and interval_decode_evidence(sig[iv], np.zeros(int(iv.sum()), dtype=np.intp))[0]:
        return True
    st = sig[~iv]
    if not len(st):
        return False
    out = st["output_tokens"].fillna(0).gt(0) if "output_tokens" in st.columns else pd.Series(False, index=st.index)
    if float((st["has_decode"].astype(bool) | out).mean()) >= cfg.llm_min_share:
        return True
    # a log that samples decode lines (SGLang: one per decode_log_interval forwards) between many
    # prefill lines: several rows that state a running decode batch are decode structure
    if "decode_reqs" in st.columns and int((st["has_decode"].astype(bool) & st["decode_reqs"].fillna(0).gt(0)
                                            & ~st["has_prefill"].astype(bool)).sum()) >= 3:
        return True
    full = st["graph_mode"].eq("FULL") & st.get("graph_replayed", pd.Series(np.nan, index=st.index)).eq(1)
    if float(full.mean()) < cfg.llm_min_share or full.sum() < 5:
        return False
    d = (st["t_end_s"] - st["t_start_s"])[full]
    med = float(d.median())
    return med > 0 and float(1.4826 * (d - med).abs().median()) <= 0.5 * med


def interval_decode_evidence(ivr: pd.DataFrame, groups: np.ndarray) -> np.ndarray:
    """Per group of interval rows: whether any holds an ITL quantile or mean, or counted ITL
    observations or output tokens (decode structure, :func:`looks_like_llm_serving`)."""
    ev = np.zeros(len(ivr), dtype=bool)
    for c in ("itl_p99_s", "itl_p50_s", "itl_mean_s"):
        if c in ivr.columns:
            ev |= ivr[c].notna().to_numpy()
    for c in ("itl_count", "output_tokens"):
        if c in ivr.columns:
            ev |= ivr[c].fillna(0).gt(0).to_numpy()
    return gw.per_group(ev, groups, np.logical_or)
