"""The signals attribution looks at, per step: the article's four (two-segment token allocation,
TPOT spikes and their period, the SM-activity sawtooth, CUDA-graph mode) and the evidence of the
other causes (expert imbalance, KV transfer, preemptions, inter-step gaps).

Every signal is computed relative to the step's own instance and neighbourhood, so one threshold
setting serves every model size and load. Which signals a source could not provide is decided
once, here (:func:`signal_quality`), from ``meta["signals"]`` and from which columns are empty.
"""
from __future__ import annotations

import functools
import math
import numpy as np
import pandas as pd

from mixdiag.causes import SIGNAL_COLUMNS, SIGNALS  # noqa: F401  (SIGNALS re-exported)
from mixdiag.diagnosis import groupwise as gw
from mixdiag.diagnosis.config import SignalConfig
from mixdiag.diagnosis.detection.regimes import low_side_reference
from mixdiag.diagnosis.labels import label_codes, label_in


def _has_data(df: pd.DataFrame, col: str) -> bool:
    if col not in df.columns or not len(df):
        return False
    s = df[col]
    if col == "graph_mode":
        return bool((s != "unknown").any())
    return bool(s.notna().any())


def signal_quality(meta: dict, instance: str, steps: pd.DataFrame, has_tokens: bool) -> dict[str, str]:
    """Quality of each signal for one instance: measured | estimated | inferred | absent.

    Data decides presence (an all-NaN column is absent whatever meta claims); meta refines the
    quality of present data (e.g. ``sm_active: estimated`` on CPU).
    """
    return qualities(meta, instance, lambda col: _has_data(steps, col), has_tokens,
                     bool(len(steps)) and bool((steps["granularity"] == "step").any()))


def qualities(meta: dict, instance: str, has_data, has_tokens: bool, has_step_rows: bool) -> dict[str, str]:
    """:func:`signal_quality` from ``has_data(column)`` (whether the instance's rows hold any of it)."""
    declared = (meta or {}).get("signals", {}).get(instance, {}) or {}
    out = {}
    for sig in SIGNALS:
        if sig == "itl":
            present = has_tokens or any(has_data(c) for c in SIGNAL_COLUMNS["itl"])
        elif sig == "host_time":
            present = has_step_rows
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
    for k in np.unique(g):
        mine = g == k
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


def chunk_rows(rows: pd.DataFrame, min_tokens: float) -> pd.Series:
    """Rows that held decodes and a prompt chunk of at least ``min_tokens`` (unknown counts: any
    prefill). A smaller chunk keeps the step below the roofline ridge, about one decode pass
    (``AttributionConfig.chunk_min_tokens``): SGLang's ``#new-token`` of a mixed Prefill line is what
    that forward computed."""
    hp, hd = rows["has_prefill"].astype(bool), rows["has_decode"].astype(bool)
    if "prefill_tokens" not in rows.columns:
        return hp & hd
    tok = pd.to_numeric(rows["prefill_tokens"], errors="coerce")
    return hp & hd & (tok.isna() | (tok >= min_tokens))


def prefill_since_last_decode(sig: pd.DataFrame, min_tokens: float = 0.0) -> tuple[pd.Series, pd.Series]:
    """Per row: how many rows since the previous decode-only row held prefill and decode rows
    (mixed forwards) and how many were prefill-only with decodes waiting (running requests or
    decodes before). For a log that prints a decode line every N forwards with the mean step time
    since the last one (SGLang's ``Decode batch`` gen throughput), these are the prefill batches
    inside the window that mean covers."""
    hp, hd = sig["has_prefill"].astype(bool), sig["has_decode"].astype(bool)
    running = sig["running_reqs"].fillna(0).gt(0) if "running_reqs" in sig.columns else False
    mixed = chunk_rows(sig, min_tokens).astype(int)
    stall = (hp & ~hd & (sig["decodes_before"].astype(bool) | running)).astype(int)
    dec = hd & ~hp

    def since(x: pd.Series) -> pd.Series:  # x's rows after the previous decode-only row, up to this one
        c = x.cumsum()
        return (c - c.where(dec).ffill().shift(1).fillna(0)).astype(float)

    return since(mixed), since(stall)


def graph_off_decode_column(rows: pd.DataFrame) -> pd.DataFrame:
    """Interval rows get ``graph_off_decode_steps``: decode-only steps that left the FULL graph,
    i.e. off-FULL dispatches (``graph_piecewise_steps + graph_none_steps``) beyond the interval's
    prefill and mixed steps (per-kind step counts, else the large-step share of all passes). Only
    when the rows carry per-mode counts and one of those, and only from counts of what ran: a row
    whose ``q_graph_mode`` is not ``measured`` (a dispatcher's plan, ``estimated``) gets NaN - a
    planned mode never shows that a decode pass left the graph."""
    iv = rows["granularity"] == "interval"
    modes = [c for c in ("graph_full_steps", "graph_piecewise_steps", "graph_none_steps") if c in rows.columns]
    if not iv.any() or len(modes) < 3 or not rows.loc[iv, modes].notna().any().any():
        return rows
    if {"mixed_steps", "prefill_steps"} <= set(rows.columns) and rows.loc[iv, "prefill_steps"].notna().any():
        other = rows.loc[iv, "mixed_steps"].fillna(0) + rows.loc[iv, "prefill_steps"].fillna(0)
    elif "large_step_share" in rows.columns and rows.loc[iv, "large_step_share"].notna().any():
        # SGLang counts passes by mode (decode_/prefill_ x cuda_graph/none) and the collector merges
        # prefill_none into the eager count: the prefill passes (large_step_share of all) come off it
        total = rows.loc[iv, modes].fillna(0).sum(axis=1)
        other = (rows.loc[iv, "large_step_share"].fillna(0) * total).round()
    else:
        return rows
    rows = rows.copy()
    n_off = rows.loc[iv, "graph_piecewise_steps"].fillna(0) + rows.loc[iv, "graph_none_steps"].fillna(0)
    off = (n_off - other).clip(lower=0)
    if "q_graph_mode" in rows.columns:
        q = rows.loc[iv, "q_graph_mode"].fillna("").astype(str)
        off = off.where(q.isin(["", "measured"]))
    rows.loc[iv, "graph_off_decode_steps"] = off
    return rows


def decode_graph_norm(sig: pd.DataFrame) -> str:
    """The graph mode most decode-only steps of the instance ran in ('unknown' if none known).
    Without token counts: the mode most steps ran in, when one mode holds at least half of them
    (decode steps are the bulk of serving)."""
    m = sig.loc[sig["decode_only"] & (sig["graph_mode"] != "unknown"), "graph_mode"]
    if len(m):
        return str(m.mode().iloc[0])
    m = sig.loc[sig["graph_mode"] != "unknown", "graph_mode"]
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


def row_qualities(s: pd.DataFrame, quality: dict) -> pd.DataFrame:
    """Per-row quality of each signal with a ``q_*`` column: ``rq_<signal>`` columns.

    The row's own ``q_*`` value wins, else the instance's quality; an empty cell is ``absent``.
    A graph mode that claims a graph (FULL/PIECEWISE) on a row whose ``graph_replayed`` is 0 was
    planned from the batch shape, not replayed: ``estimated``, unless the row says ``measured``.
    """
    out = pd.DataFrame(index=s.index)
    n = len(s)
    for sig, col in QUALITY_COLUMNS.items():
        q = np.full(n, quality.get(sig, "absent"), dtype=object)
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
            q = np.where(planned & (q != "absent"), "estimated", q)
        elif sig == "token_allocation":
            empty = s[["prefill_tokens", "decode_rows", "decode_reqs"]].isna().all(axis=1).to_numpy() & \
                ~label_in(s["kind"], ["prefill", "decode", "mixed"], na="\0")
        elif sig == "expert_imbalance":
            empty = (s["expert_imbalance"].isna() & s.get("rank_skew", pd.Series(np.nan, index=s.index)).isna()).to_numpy()
        else:
            empty = s[data].isna().all(axis=1).to_numpy() if data else np.ones(n, dtype=bool)
        out["rq_" + sig] = pd.Series(np.where(empty, "absent", q), index=s.index, dtype=object)
    return out


def independent(q) -> bool:
    """Whether a signal of quality ``q`` may corroborate the token allocation."""
    return q in INDEPENDENT


def prefill_events(sig: pd.DataFrame, use_allocation: bool) -> pd.Series:
    """Rows where prefill work began: requests arrived (``arrivals`` > 0), and - only when the
    caller may use it - the token allocation says the row held prefill tokens. Events taken from
    the token counts never corroborate the token counts (the caller decides)."""
    ev = sig["arrivals"].fillna(0).gt(0) if "arrivals" in sig.columns else pd.Series(False, index=sig.index)
    if use_allocation:
        ev |= sig["has_prefill"].astype(bool)
    return ev.astype(bool)


def _binom_sf(k: int, n: int, p: float) -> float:
    """P(X >= k) for X ~ Binomial(n, p), exact, summed in log space (no scipy).

    ``math.comb(n, i) * p ** i`` overflows a float once n passes ~1000 (an hour of spikes), so each
    term is ``exp(log pmf)``: log pmf(k) from ``math.lgamma``, the next ones by the ratio
    pmf(i+1)/pmf(i) = (n-i)/(i+1) * p/(1-p) (a cumulative sum of logs), then log-sum-exp. No normal
    approximation: the exact sum is O(n - k) vectorised, 10^6 terms in milliseconds."""
    if k <= 0:
        return 1.0
    if k > n or p <= 0:
        return 0.0
    if p >= 1:
        return 1.0
    lp, lq = math.log(p), math.log1p(-p)
    head = math.lgamma(n + 1) - math.lgamma(k + 1) - math.lgamma(n - k + 1) + k * lp + (n - k) * lq
    i = np.arange(k, n, dtype="float64")
    logs = head + np.concatenate(([0.0], np.cumsum(np.log((n - i) / (i + 1)) + (lp - lq))))
    top = float(logs.max())
    return float(min(1.0, math.exp(top + math.log(float(np.exp(logs - top).sum())))))


def periodicity(sig: pd.DataFrame, spike_mask: pd.Series, cfg: SignalConfig, events: pd.Series | None = None,
                candidates: pd.Series | None = None) -> dict:
    """Do spikes recur in step with prefill work? A binomial test, not a period ratio.

    ``events`` (default: :func:`prefill_events` without the allocation) marks rows where prefill
    work began. A spike is *near* an event when an event falls on its row or the row before or
    after. Under the null (spikes placed at random among the ``candidates`` rows - decode-visible
    rows by default), a spike is near an event with the chance rate ``p0`` = share of candidate
    rows near one; the test is P(X >= k) for X ~ Binomial(n spikes, p0). ``significant`` when
    that p-value < ``cfg.period_alpha`` and at least ``cfg.period_min_near`` spikes are near events.
    Also reports the median spacing of spikes and events (informational only).
    """
    if events is None:
        events = prefill_events(sig, use_allocation=False)
    events = events.fillna(False).astype(bool)
    near = events | events.shift(1, fill_value=False) | events.shift(-1, fill_value=False)
    cand = candidates.fillna(False).astype(bool) if candidates is not None else pd.Series(True, index=sig.index)
    spikes = spike_mask.fillna(False).astype(bool) & cand
    n, k = int(spikes.sum()), int((spikes & near).sum())
    p0 = float(near[cand].mean()) if cand.any() else float("nan")
    t = sig["t_start_s"]
    return period_stats(int(events.sum()), n, k, p0, t[events].to_numpy(), t[spikes].to_numpy(), cfg) | {"near": near}


def period_stats(n_events: int, n: int, k: int, p0: float, te: np.ndarray, ts: np.ndarray, cfg: SignalConfig) -> dict:
    """:func:`periodicity`'s figures from its counts: ``n`` spikes, ``k`` of them near an event, the
    chance rate ``p0``, event times ``te`` and spike times ``ts``."""
    p = _binom_sf(k, n, p0) if n and np.isfinite(p0) and n_events else float("nan")
    return {"events": n_events, "spikes": n, "near_share": (k / n) if n else float("nan"),
            "chance_share": p0, "p_value": p,
            "significant": bool(np.isfinite(p) and p < cfg.period_alpha and k >= cfg.period_min_near),
            "spike_period_s": float(np.median(np.diff(ts))) if len(ts) >= 3 else float("nan"),
            "prefill_period_s": float(np.median(np.diff(te))) if len(te) >= 3 else float("nan")}


def rank_relation(work: pd.Series, excess: pd.Series, cfg: SignalConfig) -> dict:
    """Spearman rank correlation of prefill work per interval with the ITL excess, and a one-sided
    permutation p-value (``cfg.relation_perms`` shuffles seeded by ``cfg.relation_seed``: the same input gives
    the same answer). NaN with fewer than ``cfg.relation_min_rows`` intervals or ``cfg.relation_min_work``
    of them holding prefill work."""
    w, e = np.asarray(work, dtype=float), np.asarray(excess, dtype=float)
    m = ~(np.isnan(w) | np.isnan(e))
    w, e = w[m], e[m]
    n_work = int((w > 0).sum())
    # the usual work is what the intervals that did NOT rise held: the half with the least excess (a
    # spike's own work must not set the level it is judged against; under steady mixing most intervals
    # hold some prompt work, and only the ones whose decodes waited on more of it spiked)
    quiet = e <= np.median(e) if len(e) else np.zeros(0, dtype=bool)
    usual = work_usual(w[quiet] if quiet.sum() >= 3 else w)
    # one or two intervals with prefill work are a coincidence, not a relation
    if len(w) < cfg.relation_min_rows or n_work < cfg.relation_min_work or np.ptp(w) == 0 or np.ptp(e) == 0:
        return {"rho": float("nan"), "p_value": float("nan"), "n": int(len(w)), "n_work": n_work} | usual
    rw, re_ = average_ranks(w), average_ranks(e)
    rw, re_ = rw - rw.mean(), re_ - re_.mean()
    den = float(np.sqrt((rw ** 2).sum() * (re_ ** 2).sum()))
    rho = float((rw * re_).sum() / den)
    perm = (rw[_permutations(len(rw), cfg.relation_perms, cfg.relation_seed)] * re_).sum(axis=1) / den
    p = float((1 + (perm >= rho).sum()) / (cfg.relation_perms + 1))
    return {"rho": rho, "p_value": p, "n": int(len(w)), "n_work": n_work} | usual


def work_usual(w: np.ndarray) -> dict:
    """The usual prefill work of an instance's quiet intervals (:func:`rank_relation` passes the half
    with the least ITL excess): median and robust sigma (1.4826 x MAD) of ``w`` (NaN-free). Each interval's own work is read against it (rules/interval_rules.py):
    steady arrivals put prefill work in nearly every interval, so only work above the usual
    explains a spike that the usual intervals did not show."""
    if not len(w):
        return {"work_median": float("nan"), "work_sigma": float("nan")}
    med = float(np.median(w))
    return {"work_median": med, "work_sigma": float(1.4826 * np.median(np.abs(w - med)))}


def counted_work(tokens, itl_rows, starved) -> tuple[np.ndarray, dict]:
    """The prompt-token counter beside a spread work column: per interval its tokens there or in the
    next interval (it counts a prompt when its prefill completes), starved intervals left out, and
    its usual level over the intervals with ITL (``count_median``, ``count_sigma``). A second reading
    of the same prefill: the spread column is an estimate, the counter a count."""
    t = np.asarray(tokens, dtype=float)
    near = work_near(np.where(np.asarray(starved, dtype=bool), np.nan, t), counted_late=True)
    on = np.asarray(itl_rows, dtype=bool) & np.isfinite(t)
    usual = work_usual(t[on])
    return near, {"count_median": usual["work_median"], "count_sigma": usual["work_sigma"]}


def work_near(work: np.ndarray, counted_late: bool) -> np.ndarray:
    """Per interval, the prefill work that ran in it: its own, and with ``counted_late`` (a counter
    that lands a prompt's tokens when its prefill completes - vLLM's prompt counter, arrivals) the
    next interval's too, since the chunks that slowed this interval may be counted there. A column
    that already places the work where it ran (``prefill_work_tokens``) is read as it is. NaN where
    none is known."""
    w = np.asarray(work, dtype=float)
    if not counted_late or not len(w):
        return w.copy()
    with np.errstate(invalid="ignore"):
        return np.fmax(w, np.r_[w[1:], np.nan])


@functools.lru_cache(maxsize=64)
def _permutations(n: int, n_perm: int, seed: int) -> np.ndarray:
    """Row ``i``: the order in which the ``i``-th of ``n_perm`` seeded shuffles puts ``n`` values -
    the same draws as ``rng.permuted(np.tile(x, (n_perm, 1)), axis=1)`` (a shuffle's swaps depend on
    the length only), computed once per length for a fleet of same-length instances."""
    idx = np.random.default_rng(seed).permuted(np.tile(np.arange(n), (n_perm, 1)), axis=1)
    idx.flags.writeable = False
    return idx


def average_ranks(x: np.ndarray) -> np.ndarray:
    """1-based ranks, ties sharing their mean rank (``pd.Series(x).rank()`` for values without NaN)."""
    order = np.argsort(x, kind="stable")
    xs = x[order]
    first = np.r_[True, xs[1:] != xs[:-1]]
    start = np.flatnonzero(first)
    end = np.r_[start[1:], len(x)]  # exclusive
    mean_rank = (start + 1 + end) / 2.0  # mean of start+1 .. end
    out = np.empty(len(x), dtype=float)
    out[order] = np.repeat(mean_rank, end - start)
    return out


def looks_like_llm_serving(sig: pd.DataFrame, has_tokens: bool, cfg: SignalConfig) -> bool:
    """Whether an instance's rows have the decode-like structure of LLM serving: output token
    events or interval ITL; or step rows of which at least ``cfg.llm_min_share`` held decode rows / output
    tokens; or replayed the FULL graph with one duration scale (repeated short decode steps: the
    robust spread of their durations is within half their median). Fewer than ``cfg.llm_min_rows``
    rows: True (too little to judge)."""
    if has_tokens or len(sig) < cfg.llm_min_rows:  # too few rows to judge: no claim either way
        return True
    iv = sig["granularity"] == "interval"
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
