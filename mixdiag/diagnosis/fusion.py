"""One engine seen through several sources: step views (log lines, traces) and interval views
(Prometheus scrapes), fused so each spike is attributed once, with the best evidence either view has.

Instances named ``X@source`` (how ``collectors.load`` names clashing inputs) are views of engine
``X``; a lone step-only view and a lone interval-only view that overlap in time are one engine too.
The scrapes' ``steps_total{kind}`` increases tell which steps each interval covers, which lets
interval gauges and counters (EP imbalance, off-FULL decode dispatches, KV transfers, preemptions)
speak for the log steps inside, and lets the ITL sum of an interval expose host time between steps.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from mixdiag.schema import Timeline

if TYPE_CHECKING:
    from mixdiag.diagnosis.pipeline import DiagnosisConfig


def graph_off_decode_column(rows: pd.DataFrame) -> pd.DataFrame:
    """Interval rows get ``graph_off_decode_steps``: decode-only steps that left the FULL graph,
    i.e. off-FULL dispatches (``graph_piecewise_steps + graph_none_steps``) beyond the interval's
    prefill and mixed steps. Only when the rows carry per-mode counts and per-kind step counts."""
    iv = rows["granularity"] == "interval"
    modes = [c for c in ("graph_full_steps", "graph_piecewise_steps", "graph_none_steps") if c in rows.columns]
    if not iv.any() or len(modes) < 3 or not rows.loc[iv, modes].notna().any().any() \
            or not {"mixed_steps", "prefill_steps"} <= set(rows.columns):
        return rows
    rows = rows.copy()
    n_off = rows.loc[iv, "graph_piecewise_steps"].fillna(0) + rows.loc[iv, "graph_none_steps"].fillna(0)
    other = rows.loc[iv, "mixed_steps"].fillna(0) + rows.loc[iv, "prefill_steps"].fillna(0)
    rows.loc[iv, "graph_off_decode_steps"] = (n_off - other).clip(lower=0)
    return rows


def engine_of(instance: str) -> str:
    """The engine an instance name belongs to: ``engine0@scrapes`` and ``engine0@log`` are two
    views (sources) of ``engine0`` (the collectors' naming of clashing inputs)."""
    return instance.split("@", 1)[0]


def _engine_keys(frames: list[pd.DataFrame]):
    """instance -> engine. ``X@source`` names are views of ``X``; and when the input holds exactly
    one step-only and one interval-only view overlapping in time (a log and a scrape directory
    of one server, named after the files), they are one engine."""
    keys = {str(f["instance"].iloc[0]): engine_of(str(f["instance"].iloc[0])) for f in frames if len(f)}
    step_only = [f for f in frames if len(f) and (f["granularity"] == "step").all()]
    iv_only = [f for f in frames if len(f) and (f["granularity"] == "interval").all()]
    if len(keys) == 2 and len(step_only) == 1 and len(iv_only) == 1:
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


def _extend_only(ev: dict) -> bool:
    """A mixed step whose context requests scheduled one token each: 1-token EXTENDs of requests
    whose KV was installed from a prefill worker (PD), not a prompt chunk mixed into decode."""
    tok, reqs = ev.get("prefill_tokens"), ev.get("prefill_reqs")
    return tok is not None and reqs is not None and np.isfinite(tok) and np.isfinite(reqs) and 0 < tok <= reqs


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


def _interval_evidence(spikes: list[dict], frames, ranges, key, cfg: DiagnosisConfig, step_views) -> list[dict]:
    """A step spike the step view left ``unknown`` (log lines carry no imbalance, transfers or
    preemptions) takes the evidence of the scrape interval that holds it: imbalance well above
    the intervals' median -> ep_hotspot; decode-only steps dispatched off the FULL graph ->
    graph_fallback; a KV transfer -> pd_transfer; a preemption -> kv_pressure. A step the step
    view called mixing whose context requests scheduled one token each (the 1-token EXTENDs a PD
    install schedules) is pd_transfer when its interval counted a KV transfer. Interval evidence
    is coarser than the step's, so confidence is scaled twice."""
    ivs = {}
    for f in frames:
        iv = f[f["granularity"] == "interval"]
        if len(iv):
            inst = str(iv["instance"].iloc[0])
            ivs[key(inst)] = (inst, iv.set_index("step"))
    if not ivs or not ranges:
        return spikes
    a = cfg.attribution
    # intervals whose KV transfer a step of their own installed (1-token EXTENDs): the transfer
    # is that step's, not evidence for the decode steps beside it
    installs = {}
    for (i, k), (lo, hi) in ranges.items():
        st = step_views.get(key(i))
        if st is not None:
            installs[(i, k)] = bool(install_steps(st.iloc[lo:hi]).any())
    out = []
    for sp in spikes:
        eng = key(sp["instance"])
        pd_install = sp["cause"] == "mixing" and _extend_only(sp["evidence"])
        if (sp["cause"] != "unknown" and not pd_install) or sp["granularity"] != "step" or eng not in ivs:
            out.append(sp)
            continue
        inst, iv = ivs[eng]
        pos = int(sp["evidence"].get("_position", -1))
        hit = [k for (i, k), (lo, hi) in ranges.items() if i == inst and lo <= pos < hi]
        if not hit or sp["evidence"].get("kind") != ("mixed" if pd_install else "decode"):
            out.append(sp)
            continue
        r = iv.loc[hit[0]]
        if pd_install:  # only a transfer can explain it; with none counted, mixing stands
            if (r.get("kv_transfer_bytes") or 0) > 0:
                ev = dict(sp["evidence"]) | {"interval": int(hit[0]),
                                             "interval_kv_transfer_bytes": float(r["kv_transfer_bytes"])}
                sp = sp | {"cause": "pd_transfer", "evidence": ev, "confidence": round(0.6 * a.interval_factor, 3)}
            out.append(sp)
            continue
        imb = r.get("expert_imbalance")
        med = float(iv["expert_imbalance"].median()) if iv["expert_imbalance"].notna().any() else np.nan
        ev = dict(sp["evidence"]) | {"interval": int(hit[0])}
        cause = None
        if pd.notna(imb) and imb >= a.imbalance_abs and np.isfinite(med) and imb >= a.imbalance_rel * med:
            cause, ev["interval_expert_imbalance"] = "ep_hotspot", float(imb)
        elif (r.get("graph_off_decode_steps") or 0) > 0 and _among_largest_batches(
                step_views.get(eng), ranges.get((inst, hit[0])), pos, int(r["graph_off_decode_steps"])):
            cause, ev["interval_graph_off_decode_steps"] = "graph_fallback", float(r["graph_off_decode_steps"])
        elif (r.get("kv_transfer_bytes") or 0) > 0 and not installs.get((inst, hit[0]), False):
            cause, ev["interval_kv_transfer_bytes"] = "pd_transfer", float(r["kv_transfer_bytes"])
        elif (r.get("preempted_reqs") or 0) > 0:
            cause, ev["interval_preempted_reqs"] = "kv_pressure", float(r["preempted_reqs"])
        if cause is None:
            out.append(sp)
        else:
            out.append(sp | {"cause": cause, "evidence": ev,
                             "confidence": round(0.6 * a.interval_factor, 3)})
    return out


def _host_gap_spikes(frames, step_views, ranges, kept: list[dict], cfg: DiagnosisConfig, key) -> list[dict]:
    """Host stalls the interval view can still see when a slow step hides them.

    ITL time observed in an interval (``itl_mean_s x itl_count``) minus the time its steps took
    per decode request (sum of ``decode_reqs x latency`` from the step view) is time requests
    waited *between* steps. Per decode request, its excess over the rolling median is a host
    stall when it exceeds ``(interval_ratio - 1) x`` the ITL baseline (some ITL in the interval
    was then at least ``interval_ratio`` x the baseline).
    """
    have = {(sp["instance"], int(sp["step"])) for sp in kept if sp["granularity"] == "interval"}
    out = []
    for inst, iv, g, excess, thr, _ in _host_gaps(frames, step_views, ranges, cfg, key):
        for idx in iv.index[(excess > thr).to_numpy()]:
            r = iv.loc[idx]
            row_key = (inst, int(r["step"]))
            if row_key in have or r.get("preempted_reqs", 0) or r.get("kv_transfer_bytes", 0):
                continue
            ev = {"granularity": "interval", "host_gap_per_request_s": float(g[idx]),
                  "host_gap_excess_s": float(excess[idx]), "baseline_s": float(r["baseline_s"]),
                  "reason": "ITL time in the interval exceeds the time its steps took: requests waited between steps"}
            out.append({"instance": inst, "step": row_key[1], "t_s": float(r["t_end_s"]),
                        "itl_s": float(r["latency_s"]) if pd.notna(r["latency_s"]) else float(r["baseline_s"] + excess[idx]),
                        "baseline_s": float(r["baseline_s"]), "cause": "host_stall",
                        "confidence": round(0.6 * cfg.attribution.interval_factor, 3), "evidence": ev,
                        "missing_signals": [], "t_start_s": float(r["t_start_s"]), "t_end_s": float(r["t_end_s"]),
                        "granularity": "interval"})
    return out


def _preemption_spikes(frames, kept: list[dict], cfg: DiagnosisConfig) -> list[dict]:
    """Intervals that counted preemptions, as kv_pressure spikes when no spike there says so.

    A recompute preemption evicts a running request until it is re-admitted and re-prefilled:
    its next token comes steps later, a stall its user feels even when no step is slow (tier (a)
    sees it as a request stall). Log lines do not show the victims; the counter places the
    stall's start to the interval.
    """
    have = {(sp["instance"], int(sp["step"])) for sp in kept if sp["granularity"] == "interval"}
    out = []
    for f in frames:
        iv = f[f["granularity"] == "interval"]
        if not len(iv) or "preempted_reqs" not in iv.columns:
            continue
        for r in iv[iv["preempted_reqs"].fillna(0) > 0].itertuples(index=False):
            row_key = (str(r.instance), int(r.step))
            if row_key in have:
                continue
            ev = {"granularity": "interval", "preempted_reqs": float(r.preempted_reqs),
                  "reason": "requests were preempted in the interval: each waits to be re-admitted and re-prefilled"}
            base = float(r.baseline_s) if pd.notna(r.baseline_s) else np.nan
            out.append({"instance": row_key[0], "step": row_key[1], "t_s": float(r.t_end_s),
                        "itl_s": float(r.latency_s) if pd.notna(r.latency_s) else base, "baseline_s": base,
                        "cause": "kv_pressure", "confidence": round(0.8 * cfg.attribution.interval_factor, 3),
                        "evidence": ev, "missing_signals": [], "t_start_s": float(r.t_start_s),
                        "t_end_s": float(r.t_end_s), "granularity": "interval"})
    return out


def _host_gaps(frames, step_views, ranges, cfg: DiagnosisConfig, key):
    """Per interval view: (instance, interval rows, host gap per waiting request, its excess over
    the rolling median, the threshold, the gap beyond the usual per-step gap x steps) - see
    :func:`_host_gap_spikes`. NaN where the step view
    does not cover the interval or the scrapes carry no ITL sum."""
    for f in frames:
        iv = f[f["granularity"] == "interval"].sort_values("step")
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
        for j, (k, n, mean) in enumerate(zip(iv["step"], iv["itl_count"], iv["itl_mean_s"])):
            ab = ranges.get((inst, int(k)))
            if ab is None or not n or not np.isfinite(mean) or ab[1] <= ab[0]:
                continue
            d = dreq[ab[0]:ab[1]]
            if d.sum() <= 0:
                continue
            gap[j] = (n * mean - float((d * lat[ab[0]:ab[1]]).sum())) / float(d.mean())
            n_steps[j] = ab[1] - ab[0]
        g = pd.Series(gap, index=iv.index)
        excess = g - g.rolling(cfg.spikes.window_intervals, center=True, min_periods=1).median()
        # the ordinary host time between steps grows with the steps an interval holds: what is
        # left after the usual per-step gap x its steps is the unusual part. Usual = the lower
        # quartile over the view's intervals, so stalls in up to 3/4 of them do not raise it.
        per_step = np.nanpercentile(gap / n_steps, 25) if np.isfinite(gap / n_steps).any() else np.nan
        unusual = g - n_steps * per_step
        thr = (cfg.interval_ratio - 1.0) * iv["baseline_s"]
        yield inst, iv, g, excess, thr, unusual


def fuse_sources(frames: list[pd.DataFrame], spikes: list[dict], cfg: DiagnosisConfig) -> list[dict]:
    """One engine seen through step rows (log lines, a trace) and interval rows (scrapes).

    The step view says which step was slow and why, so an interval spike that holds a step
    spike of the same engine adds nothing and is dropped. An interval spike with no slow step
    inside (while the step view covers the interval) means the ITL excess happened *between*
    steps: a KV transfer or preemption if the interval counted one, else a host stall - unless
    the ITL sum shows no time between steps either (then ``unknown``: a bucketed P99 or an ITL
    that began in the previous interval, not a stall).
    Intervals are matched to steps by the scrapes' step counters when they add up to the step
    view's steps, else by time (log lines stamped in whole seconds: 1 s of slack).
    """
    key = _engine_keys(frames)
    step_views: dict[str, pd.DataFrame] = {}
    for f in frames:
        st = f[f["granularity"] == "step"]
        if len(st):
            step_views[key(str(f["instance"].iloc[0]))] = st.sort_values("step")
    if not step_views:
        return spikes
    ranges: dict[tuple[str, int], tuple[int, int]] = {}
    for f in frames:
        iv = f[f["granularity"] == "interval"].sort_values("step")
        eng = key(str(f["instance"].iloc[0])) if len(f) else None
        if len(iv) and eng in step_views:
            r = _interval_step_ranges(iv, step_views[eng])
            if r is not None:
                ranges.update({(str(f["instance"].iloc[0]), int(k)): ab for k, ab in zip(iv["step"], r)})
    # (instance, interval) -> (excess, threshold, unusual host gap per waiting request); see _host_gaps
    gaps = {(inst, int(k)): (float(e), float(t), float(u))
            for inst, iv, _, excess, thr, unusual in _host_gaps(frames, step_views, ranges, cfg, key)
            for k, e, t, u in zip(iv["step"], excess, thr, unusual)}
    out = []
    for sp in spikes:
        eng = key(sp["instance"])
        if sp["granularity"] != "interval" or eng not in step_views:
            out.append(sp)
            continue
        st = step_views[eng]
        ab = ranges.get((sp["instance"], int(sp["step"])))
        if ab is not None:  # plus the step before: the first ITL of the interval spans it
            inside = st.iloc[max(ab[0] - 1, 0):ab[1]]
        else:
            t = st["t_end_s"]
            inside = st[(t >= sp["t_start_s"] - 1.0) & (t <= sp["t_end_s"])]
        if not len(inside):
            out.append(sp)  # the step view does not cover this interval
            continue
        if inside["is_spike"].any():
            continue  # a slow step explains it; the step spike carries the attribution
        ev = dict(sp["evidence"])
        ev["steps_in_interval"] = int(len(inside))
        ev["slow_steps_in_interval"] = 0
        if ev.get("kv_transfer_bytes", 0) or ev.get("kv_transfer_s", 0):
            cause, conf = "pd_transfer", 0.75
        elif ev.get("preempted_reqs", 0):
            cause, conf = "kv_pressure", 0.75
        else:
            cause, conf = "host_stall", 0.6
            ev["reason"] = "ITL spiked but no step in the interval was slow: the time went between steps"
            _, thr, gap = gaps.get((sp["instance"], int(sp["step"])), (np.nan, np.nan, np.nan))
            if np.isfinite(gap) and np.isfinite(thr):
                ev["host_gap_unusual_s"] = gap
                if gap <= thr:  # the ITL sum says requests did not wait between steps either
                    cause = "unknown"
                    ev["reason"] = ("ITL P99 spiked, but no step was slow and the ITL sum leaves no time between "
                                    "steps (a histogram-bucket or interval-edge effect)")
        out.append(sp | {"cause": cause, "confidence": round(conf * cfg.attribution.interval_factor, 3),
                         "evidence": ev})
    out = _interval_evidence(out, frames, ranges, key, cfg, step_views)
    out += _host_gap_spikes(frames, step_views, ranges, out, cfg, key)
    out += _preemption_spikes(frames, out, cfg)
    # keep the steps frame in line with the spikes that remain
    kept = {(sp["instance"], sp["step"]): sp["cause"] for sp in out if sp["granularity"] == "interval"}
    for f in frames:
        iv = f["granularity"] == "interval"
        if iv.any():
            keys = list(zip(f.loc[iv, "instance"], f.loc[iv, "step"].astype(int)))
            f.loc[iv, "cause"] = [kept.get(k) for k in keys]
            f.loc[iv, "is_spike"] = [k in kept for k in keys]
    return out


def faults_seen_by_intervals(timeline: Timeline, cfg: DiagnosisConfig) -> dict[str, np.ndarray]:
    """For step-only views (log lines) fused with an interval view (scrapes) of one engine: the
    step positions inside intervals whose gauges/counters show a fault (EP imbalance well above
    the intervals' median, a KV transfer, a preemption). They are kept out of the step view's
    baseline, so a fault window longer than half the baseline window still stands out."""
    steps = timeline.steps
    frames = [g.assign(instance=i) for i, g in steps.groupby("instance", sort=True)]
    key = _engine_keys(frames)
    by_eng: dict[str, dict] = {}
    for f in frames:
        inst = str(f["instance"].iloc[0])
        kind = "step" if (f["granularity"] == "step").all() else ("interval" if (f["granularity"] == "interval").all() else None)
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
