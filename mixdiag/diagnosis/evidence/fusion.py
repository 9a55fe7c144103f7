"""One engine seen through several sources: step views (log lines, traces) and interval views
(Prometheus scrapes), fused into evidence columns on each view's rows, so each spike is attributed
once (by :mod:`mixdiag.diagnosis.rules.attribution`, the only place causes are decided) with the best
evidence either view has.

Instances named ``X@source`` (how ``collectors.load`` names clashing inputs) are views of engine
``X``; a lone step-only view and a lone interval-only view that overlap in time are one engine too -
unless the collectors already decided which inputs are one server (``meta["instance_sources"]``,
collectors/join.py: ``--instance NAME=PATH,...``, labels, overlap and identity hints): then their
decision stands, and inputs the user named as separate instances are never merged by inference.
The interval rows' per-kind step counts (``prefill_steps``, ``decode_steps``, ``mixed_steps``) tell
which steps each interval covers, which lets interval gauges and counters (EP imbalance, off-FULL
decode dispatches, KV transfers, preemptions) speak for the log steps inside, and lets the ITL sum
of an interval expose host time between steps.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from mixdiag.diagnosis.config import DiagnosisConfig
from mixdiag.diagnosis.detection.log_windows import stalled_prefill_rows
from mixdiag.diagnosis.detection.signals import chunk_rows, graph_off_decode_column
from mixdiag.diagnosis.evidence.host_wait_fusion import fuse_host_wait
from mixdiag.diagnosis.labels import equal
from mixdiag.schema import Timeline, nan_columns, nan_series


def engine_of(instance: str) -> str:
    """The engine an instance name belongs to: ``engine0@scrapes`` and ``engine0@log`` are two
    views (sources) of ``engine0`` (the collectors' naming of clashing inputs)."""
    return instance.split("@", 1)[0]


def listed_servers(meta: dict | None) -> dict[str, str]:
    """view -> server from the collectors' listing of which inputs are one server
    (``meta["instance_sources"]``: NAME -> its ``views``; collectors/join.py). Empty without one
    (a single input, a Timeline built by hand)."""
    out: dict[str, str] = {}
    for name, entry in ((meta or {}).get("instance_sources") or {}).items():
        for view in (entry or {}).get("views") or [name]:
            out[str(view)] = str(name)
    return out


def engine_keys(frames: list[pd.DataFrame], listed: dict[str, str] | None = None):
    """instance -> engine. ``X@source`` names are views of ``X``, or of the server ``listed`` (from
    :func:`listed_servers`) puts them in; and when the input holds exactly one step-only and one
    interval-only view overlapping in time (a log and a scrape directory of one server, named after
    the files) that no listing placed, they are one engine. A listing is the collectors' decision with
    every hint (explicit ``--instance`` names first, then labels, model names, URLs): inference on time
    overlap alone never overrides it - two inputs the user named apart stay two servers."""
    listed = listed or {}
    keys = {str(f["instance"].iloc[0]): listed.get(str(f["instance"].iloc[0]), engine_of(str(f["instance"].iloc[0])))
            for f in frames if len(f)}
    step_only = [f for f in frames if len(f) and equal(f["granularity"], "step").all()]
    iv_only = [f for f in frames if len(f) and equal(f["granularity"], "interval").all()]
    placed = any(str(f["instance"].iloc[0]) in listed for f in step_only + iv_only)
    if len(keys) == 2 and len(step_only) == 1 and len(iv_only) == 1 and not placed:
        a, b = step_only[0], iv_only[0]
        lo = max(a["t_start_s"].min(), b["t_start_s"].min())
        hi = min(a["t_end_s"].max(), b["t_end_s"].max())
        shorter = min(a["t_end_s"].max() - a["t_start_s"].min(), b["t_end_s"].max() - b["t_start_s"].min())
        if shorter > 0 and hi - lo >= 0.5 * shorter:
            keys[str(b["instance"].iloc[0])] = keys[str(a["instance"].iloc[0])]
    return lambda inst: keys.get(inst, engine_of(inst))


def _interval_step_ranges(iv: pd.DataFrame, steps: pd.DataFrame) -> list[tuple[int, int]] | None:
    """Positions [a, b) of the step rows each interval row covers, from the per-kind step counts
    of the scrapes, else None. Steps the counters did not see ran before the first scrape (the
    engine writes a final scrape at exit, so the last interval reaches the last step); more
    counted steps than the step view has, or a shortfall above half of them, means the views do
    not match: None."""
    kinds = [c for c in ("prefill_steps", "decode_steps", "mixed_steps", "idle_steps") if c in iv.columns]
    if len(kinds) < 3:
        return None
    n_steps = len(steps)
    for use in (kinds, [k for k in kinds if k != "idle_steps"]):
        n = iv[use].fillna(0).sum(axis=1).round().astype(int).to_numpy()
        before = n_steps - int(n.sum())
        if 0 <= before <= n_steps // 2:
            ends = before + np.cumsum(n)
            return list(zip((ends - n).tolist(), ends.tolist()))
    return None


def install_steps(st: pd.DataFrame) -> pd.Series:
    """Step rows that are PD installs by their shape: mixed, every context request one token."""
    if "prefill_reqs" not in st.columns:
        return pd.Series(False, index=st.index)
    tok, reqs = st["prefill_tokens"], st["prefill_reqs"]
    return (st["kind"] == "mixed") & (tok > 0) & (tok <= reqs)


def _among_largest_batches(st: pd.DataFrame | None, ab: tuple[int, int] | None, pos: int, n_off: int) -> bool:
    """Whether the decode-only step at position ``pos`` is among the ``n_off`` largest decode
    batches of its interval (ties included). Decode leaves the FULL graph when its batch exceeds
    the largest captured size (smaller ones are padded up to a captured size), so the off-FULL
    dispatches an interval counted are its largest batches. True when the log gives no sizes."""
    if st is None or ab is None or "decode_reqs" not in st.columns:
        return True
    win = st.iloc[ab[0]:ab[1]]
    sizes = win.loc[win["kind"] == "decode", "decode_reqs"].dropna().sort_values(ascending=False)
    me = st["decode_reqs"].iloc[pos] if 0 <= pos < len(st) else np.nan
    if not len(sizes) or not np.isfinite(me):
        return True
    return bool(me >= sizes.iloc[min(n_off, len(sizes)) - 1])


def _host_gaps(frames, step_views, ranges, cfg: DiagnosisConfig, key):
    """Per interval view: (instance, interval rows, host gap per waiting request, its excess over
    the rolling median, the threshold, the gap beyond the usual per-step gap x steps): ITL time
    observed in an interval (``itl_mean_s x itl_count``) minus the time its steps took per decode
    request is time requests waited *between* steps. NaN where the step view
    does not cover the interval or the scrapes carry no ITL sum."""
    for f in frames:
        iv = f[equal(f["granularity"], "interval")].sort_values("step")
        if not len(iv):
            continue
        inst = str(iv["instance"].iloc[0])
        st = step_views.get(key(inst))
        if st is None or iv["itl_count"].isna().all():
            continue
        # requests waiting through each step: its decode requests, or, in a prefill-only step that
        # stalled them, those of the last decode step
        d = st["decode_reqs"].fillna(st["decode_rows"])
        d = d.where(st["has_decode"]).ffill().where(st["has_decode"] | st["decodes_before"], d)
        dreq = d.fillna(0).to_numpy()
        lat = st["latency_s"].to_numpy()
        gap, n_steps = np.full(len(iv), np.nan), np.full(len(iv), np.nan)
        since = None  # first step after the last interval that observed an ITL
        for j, (k, n, mean) in enumerate(zip(iv["step"], iv["itl_count"], iv["itl_mean_s"])):
            ab = ranges.get((inst, int(k)))
            if ab is not None and since is None:
                since = ab[0]
            if ab is None or not n or not np.isfinite(mean) or ab[1] <= ab[0]:
                if ab is not None and n:
                    since = None
                continue
            # an ITL observed here spans back to the request's previous token: through every
            # interval since the last one that observed any (a stall across scrapes lands whole here)
            lo, since = min(ab[0], since), None
            d = dreq[lo:ab[1]]
            if d.sum() <= 0:
                continue
            gap[j] = (n * mean - float((d * lat[lo:ab[1]]).sum())) / float(d.mean())
            n_steps[j] = ab[1] - lo
        g = pd.Series(gap, index=iv.index)
        excess = g - g.rolling(cfg.spikes.window_intervals, center=True, min_periods=1).median()
        # the ordinary host time between steps grows with the steps an interval holds: what is
        # left after the usual per-step gap x its steps is the unusual part. Usual = a low
        # percentile over the view's intervals (FusionConfig.host_gap_percentile).
        per_step = (np.nanpercentile(gap / n_steps, cfg.fusion.host_gap_percentile)
                    if np.isfinite(gap / n_steps).any() else np.nan)
        unusual = g - n_steps * per_step
        thr = (cfg.interval_ratio - 1.0) * iv["baseline_s"]
        yield inst, iv, g, excess, thr, unusual


#: Evidence columns :func:`fuse_evidence` adds (NaN where the other view says nothing).
INTERVAL_EVIDENCE = ("fused_steps_in_interval", "fused_slow_steps_in_interval", "fused_host_gap_per_request_s",
                     "fused_host_gap_excess_s", "fused_host_gap_threshold_s", "fused_host_gap_unusual_s")
#: What the step view's rows inside an interval show of its prefill work (NaN without a step view):
#: steps that held prefill and decode rows (a mixed forward - for SGLang, a Prefill line with running
#: requests under ``--enable-mixed-chunk``), prefill-only steps that decodes waited through, and
#: PD installs (mixed rows of 1-token extends).
LOG_SHAPE_EVIDENCE = ("fused_mixed_steps_in_interval", "fused_stall_steps_in_interval",
                      "fused_install_steps_in_interval", "fused_recent_stall_steps")
STEP_EVIDENCE = ("fused_interval", "fused_interval_expert_imbalance", "fused_interval_imbalance_median",
                 "fused_interval_graph_off_decode_steps", "fused_among_largest_batches",
                 "fused_interval_kv_transfer_bytes", "fused_pd_install", "fused_interval_preempted_reqs",
                 "fused_recent_kv_transfer_bytes", "fused_interval_host_wait_per_pass_s",
                 "fused_interval_host_pause_s", "fused_interval_host_stopped_s")


def _time_or_count_window(st: pd.DataFrame, ab, r) -> pd.DataFrame:
    """The step rows an interval row covers: by the step counters (plus the step before: the
    interval's first ITL spans it), else by time. A stamp truncated to a grid (whole-second log
    stamps) says the line was printed within [stamp, stamp + grid): it is placed at that span's
    middle, so a line lands in the one interval that holds most of its second - with 1 s of slack
    instead, a mixed Prefill line stamped in the second two 1 s scrapes share was the evidence of
    both (tier (e2): graph-fallback intervals named mixing by the line of the interval before)."""
    if ab is not None:
        return st.iloc[max(ab[0] - 1, 0):ab[1]]
    t = st["t_end_s"]
    if "stamp_resolution_s" in st.columns:
        t = t + 0.5 * pd.to_numeric(st["stamp_resolution_s"], errors="coerce").fillna(0.0)
    return st[(t > r.t_start_s) & (t <= r.t_end_s)]


def fuse_evidence(frames: list[pd.DataFrame], cfg: DiagnosisConfig, listed: dict[str, str] | None = None) -> bool:
    """One engine seen through step rows (log lines, a trace) and interval rows (scrapes): each
    view's rows get the other view's evidence as ``fused_*`` columns (in place); the causes are
    :mod:`~mixdiag.diagnosis.rules.attribution`'s. Returns whether the input has a step view at all.

    Interval rows: the steps inside (``fused_steps_in_interval``), how many were slow, and the host
    gap the ITL sum leaves between steps (see :func:`_host_gaps`). An interval spike that holds a
    slow step of the same engine is that step's spike seen coarser: it stops being a spike of its own
    (``is_spike`` False), so each spike is attributed once. Step rows: the interval (scrape) that
    holds them, its expert imbalance and the intervals' median, its off-FULL decode dispatches and
    whether this step is among the batches that left FULL, its KV transfer, whether a step of its
    own installed that transfer (``fused_pd_install``), its preemptions.
    Intervals are matched to steps by the scrapes' step counters when they add up to the step
    view's steps, else by time. ``listed``: which views the collectors placed in one server
    (:func:`listed_servers`).
    """
    key = engine_keys(frames, listed)
    step_views: dict[str, pd.DataFrame] = {}
    for f in frames:
        st = f[equal(f["granularity"], "step")]
        if len(st):
            step_views[key(str(f["instance"].iloc[0]))] = st.sort_values("step")
    fused = list(INTERVAL_EVIDENCE + LOG_SHAPE_EVIDENCE + STEP_EVIDENCE)
    for f in frames:
        empty = nan_columns(fused, f.index)  # NaN without memory per row until a value is written
        for col in fused:
            f[col] = empty[col]
    if not step_views:
        return False
    ranges: dict[tuple[str, int], tuple[int, int]] = {}
    for f in frames:
        iv = f[equal(f["granularity"], "interval")].sort_values("step")
        eng = key(str(f["instance"].iloc[0])) if len(f) else None
        if len(iv) and eng in step_views:
            r = _interval_step_ranges(iv, step_views[eng])
            if r is not None:
                ranges.update({(str(f["instance"].iloc[0]), int(k)): ab for k, ab in zip(iv["step"], r)})
    by_inst = {str(f["instance"].iloc[0]): f for f in frames if len(f)}
    for inst, iv, g, excess, thr, unusual in _host_gaps(frames, step_views, ranges, cfg, key):
        by_inst[inst].loc[iv.index, list(INTERVAL_EVIDENCE[2:])] = np.column_stack(
            [g.to_numpy(dtype=float), excess.to_numpy(dtype=float), thr.to_numpy(dtype=float),
             np.asarray(unusual, dtype=float)])
    ivs = {}
    for f in frames:
        iv = f[equal(f["granularity"], "interval")]
        if not len(iv):
            continue
        inst = str(iv["instance"].iloc[0])
        ivs[key(inst)] = (inst, iv.set_index("step"))
        st = step_views.get(key(inst))
        if st is None:
            continue
        inside = [_time_or_count_window(st, ranges.get((inst, int(r.step))), r) for r in iv.itertuples(index=False)]
        f.loc[iv.index, "fused_steps_in_interval"] = [float(len(x)) for x in inside]
        slow = [float(x["is_spike"].sum()) for x in inside]
        f.loc[iv.index, "fused_slow_steps_in_interval"] = slow
        # a mixed row whose context requests took one token each installs KV a prefill worker
        # sent (PD), it is no prompt chunk; nor is a short prompt (about one decode pass)
        f.loc[iv.index, "fused_mixed_steps_in_interval"] = [
            float((chunk_rows(x, cfg.attribution.chunk_min_tokens) & ~install_steps(x)).sum()) for x in inside]
        f.loc[iv.index, "fused_install_steps_in_interval"] = [float(install_steps(x).sum()) for x in inside]
        xfer = iv.sort_values("t_end_s")["kv_transfer_bytes"]
        f.loc[xfer.index, "fused_recent_kv_transfer_bytes"] = np.fmax(xfer.to_numpy(dtype=float),
                                                                      xfer.shift(1).to_numpy(dtype=float))
        f.loc[iv.index, "fused_stall_steps_in_interval"] = [float(stalled_prefill_rows(x).sum()) for x in inside]
        stall = f.loc[iv.index, "fused_stall_steps_in_interval"].astype(float)
        f.loc[iv.index, "fused_recent_stall_steps"] = np.fmax(stall.to_numpy(), stall.shift(1).to_numpy())
        f.loc[iv.index, "is_spike"] = iv["is_spike"].to_numpy(dtype=bool) & ~(np.asarray(slow) > 0)
    for f in frames:
        st_mask = equal(f["granularity"], "step")
        if not st_mask.any() or key(str(f["instance"].iloc[0])) not in ivs:
            continue
        eng = key(str(f["instance"].iloc[0]))
        inst, iv = ivs[eng]
        med = float(iv["expert_imbalance"].median()) if iv["expert_imbalance"].notna().any() else np.nan
        for (i, k), (lo, hi) in ranges.items():
            if i != inst or lo >= len(f):
                continue
            r = iv.loc[k]
            goff = float(r["graph_off_decode_steps"]) if "graph_off_decode_steps" in iv.columns else np.nan
            sv = step_views.get(eng)
            pos = np.arange(lo, min(hi, len(f)))
            idx = f.index[pos]
            f.loc[idx, "fused_interval"] = float(k)
            f.loc[idx, "fused_interval_expert_imbalance"] = float(r["expert_imbalance"])
            f.loc[idx, "fused_interval_imbalance_median"] = med
            f.loc[idx, "fused_interval_graph_off_decode_steps"] = goff
            if goff > 0:
                f.loc[idx, "fused_among_largest_batches"] = [
                    float(_among_largest_batches(sv, ranges.get((inst, k)), int(p), int(goff))) for p in pos]
            f.loc[idx, "fused_interval_kv_transfer_bytes"] = float(r["kv_transfer_bytes"])
            f.loc[idx, "fused_pd_install"] = float(bool(install_steps(sv.iloc[lo:hi]).any()))
            f.loc[idx, "fused_interval_preempted_reqs"] = float(r["preempted_reqs"])
        if not any(i == inst for i, _ in ranges):
            _fuse_steps_by_time(f, st_mask, iv)
        fuse_host_wait(f, st_mask, iv, cfg.attribution.host_wait_k)
    return True


def _fuse_steps_by_time(f: pd.DataFrame, st_mask: pd.Series, iv: pd.DataFrame) -> None:
    """Step rows of a view whose scrapes carry no per-kind step counters (vLLM's, SGLang's): each
    step belongs to the interval its end falls in (scrape k covers (end of k-1, end of k]), and gets
    ``fused_recent_kv_transfer_bytes``: the KV transfer counted in that interval or the one before
    (a transfer completes before the step that installs its KV; whole-second stamps blur the edge),
    read only for steps shaped like a PD install."""
    ivs = iv.sort_values("t_end_s")
    ends = ivs["t_end_s"].to_numpy(dtype=float)
    st = f[st_mask]
    pos = np.searchsorted(ends, st["t_end_s"].to_numpy(dtype=float), side="left")
    ok = pos < len(ends)
    if not ok.any():
        return
    idx, pos = st.index[ok], pos[ok]
    xfer = ivs["kv_transfer_bytes"].to_numpy(dtype=float)
    prev = np.r_[np.nan, xfer[:-1]]
    # time is too coarse to pin gauges and counters on one step: only the transfer that a step
    # shaped like a PD install (1-token extends) took is handed over
    f.loc[idx, "fused_interval"] = ivs.index.to_numpy(dtype=float)[pos]
    f.loc[idx, "fused_recent_kv_transfer_bytes"] = np.fmax(xfer, prev)[pos]


#: Columns :func:`couple_ranks` adds to the step rows of ranks that meet in collectives.
RANK_EVIDENCE = ("peer_prefill", "peer_prefill_tokens", "peer_graph_off", "peer_gap_excess_s")


def couple_ranks(frames: list[pd.DataFrame], align: float) -> None:
    """Expert-parallel ranks meet in the all-to-all every step, so a step is as slow as its slowest
    rank: a decode step on one rank waits for a peer whose same step held a prompt chunk. Step views
    (no intervals) whose rows share step numbers, exchange collectives (``comm_share`` > 0 on some
    steps) and end each shared step together (median |end difference| below ``align`` x the median
    step duration: ``FusionConfig.rank_align``) are ranks of one engine; each row gets ``peer_prefill``
    (a peer's same step held prefill tokens; ``peer_prefill_tokens`` the largest such chunk), ``peer_graph_off`` (a peer's same step left the
    graph) and ``peer_gap_excess_s`` (the largest host gap above the usual one among the peers' same
    step: a peer whose host stalled kept every rank waiting in the all-to-all), in place; NaN elsewhere."""
    for f in frames:
        for col in RANK_EVIDENCE:
            f[col] = nan_series(f.index)  # no memory per row until a value is written
    # ranks exchange in visible steps, or the collector found them EP ranks by co-terminating replays
    cand = [f for f in frames if len(f) and equal(f["granularity"], "step").all() and (
            ("comm_share" in f.columns and f["comm_share"].fillna(0).gt(0).any())
            or ("rank_sm_skew" in f.columns and f["rank_sm_skew"].notna().any()))]
    for f in cand:
        me = f.set_index("step")
        if not me.index.is_unique:
            continue
        dur = float((me["t_end_s"] - me["t_start_s"]).median())
        pre, off = pd.Series(False, index=me.index), pd.Series(False, index=me.index)
        gap = pd.Series(np.nan, index=me.index)
        chunk = pd.Series(np.nan, index=me.index)
        coupled = False
        for g in cand:
            if g is f:
                continue
            peer = g.set_index("step")
            if not peer.index.is_unique:
                continue
            common = me.index.intersection(peer.index)
            if len(common) < 0.5 * len(me) or not dur > 0:
                continue
            if float((me.loc[common, "t_end_s"] - peer.loc[common, "t_end_s"]).abs().median()) > align * dur:
                continue
            coupled = True
            pre = pre | peer["has_prefill"].astype(bool).reindex(me.index, fill_value=False)
            off = off | peer["graph_off"].astype(bool).reindex(me.index, fill_value=False)
            if "prefill_tokens" in peer.columns:
                chunk = np.fmax(chunk, pd.to_numeric(peer["prefill_tokens"], errors="coerce").reindex(me.index))
            if "gap_excess_s" in peer.columns:
                gap = np.fmax(gap, pd.to_numeric(peer["gap_excess_s"], errors="coerce").reindex(me.index))
        if coupled:
            f["peer_prefill"] = pre.to_numpy(dtype=float)
            f["peer_graph_off"] = off.to_numpy(dtype=float)
            f["peer_gap_excess_s"] = pd.Series(gap).to_numpy(dtype=float)
            f["peer_prefill_tokens"] = pd.Series(chunk).to_numpy(dtype=float)


def faults_seen_by_intervals(timeline: Timeline, cfg: DiagnosisConfig) -> dict[str, np.ndarray]:
    """For step-only views (log lines) fused with an interval view (scrapes) of one engine: the
    step positions inside intervals whose gauges/counters show a fault (EP imbalance well above
    the intervals' median, a KV transfer, a preemption). They are kept out of the step view's
    baseline, so a fault window longer than half the baseline window still stands out."""
    steps = timeline.steps
    if not len(steps) or equal(steps["instance"], steps["instance"].iloc[0]).all():
        return {}  # one instance: no second view to pair it with (and no copy of its rows by the groupby)
    frames = [g.assign(instance=i) for i, g in steps.groupby("instance", sort=True)]
    key = engine_keys(frames, listed_servers(timeline.meta))
    by_eng: dict[str, dict] = {}
    for f in frames:
        inst = str(f["instance"].iloc[0])
        kind = "step" if equal(f["granularity"], "step").all() else ("interval" if equal(f["granularity"], "interval").all() else None)
        if kind:
            by_eng.setdefault(key(inst), {})[kind] = (inst, f)
    out = {}
    a = cfg.attribution
    for views in by_eng.values():
        if "step" not in views or "interval" not in views:
            continue
        s_inst, st = views["step"]
        _, iv = views["interval"]
        iv = graph_off_decode_column(iv).sort_values("step")
        st = st.sort_values("step")
        ranges = _interval_step_ranges(iv, st)
        if ranges is None:
            continue
        imb = iv["expert_imbalance"]
        med = imb.median() if imb.notna().any() else np.nan
        goff = iv["graph_off_decode_steps"].fillna(0) > 0 if "graph_off_decode_steps" in iv else False
        bad = (((imb >= a.imbalance_abs) & (imb >= a.imbalance_rel * med)).fillna(False) | goff
               | (iv["preempted_reqs"].fillna(0) > 0)).to_numpy(dtype=bool)
        xfer = (iv["kv_transfer_bytes"].fillna(0) > 0).to_numpy(dtype=bool)
        inst_mask = install_steps(st).to_numpy(dtype=bool)
        mask = np.zeros(len(st), dtype=bool)
        for (lo, hi), b, x in zip(ranges, bad, xfer):
            if b:
                mask[lo:hi] = True
            elif x:  # the install step took the transfer when the log shows one; else any step may have
                mask[lo:hi] |= inst_mask[lo:hi] if inst_mask[lo:hi].any() else True
        out[s_inst] = mask
    return out
