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

from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from mixdiag.attribution import CAUSES, AttributionConfig, InstanceContext, attribute
from mixdiag.schema import Timeline
from mixdiag.signals import SIGNALS, SignalConfig, decode_graph_norm, periodicity, signal_quality, step_signals
from mixdiag.spikes import SpikeConfig, charge_itl, is_spike, itl_events, rolling_baseline, step_timing

SPIKE_COLUMNS = ["instance", "step", "t_s", "itl_s", "baseline_s", "cause", "confidence", "evidence",
                 "missing_signals", "t_start_s", "t_end_s", "granularity"]


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


@dataclass
class Diagnosis:
    """The result of :func:`diagnose`; see docs/contracts.md section 5 and docs/analyze.md."""

    spikes: pd.DataFrame
    steps: pd.DataFrame
    by_cause: dict
    verdict: str
    itl: dict
    instances: dict = field(default_factory=dict)  # instance -> {signals, periodicity, latency_source}
    config: DiagnosisConfig = field(default_factory=DiagnosisConfig)

    def to_json(self, top: int | None = None) -> dict:
        """The ``mixdiag analyze --json`` document (docs/analyze.md)."""
        st = self.steps
        step_rows = st[st["granularity"] == "step"] if len(st) else st
        by_kind = {k: int(v) for k, v in step_rows["kind"].value_counts().sort_index().items()} if len(st) else {}
        spikes = self.spikes.sort_values("t_s", kind="stable")
        if top is not None:
            spikes = spikes.head(top)
        rows = []
        for r in spikes.itertuples(index=False):
            rows.append({"instance": r.instance, "step": int(r.step), "t_s": float(r.t_s), "itl_s": float(r.itl_s),
                         "baseline_s": float(r.baseline_s), "cause": r.cause, "confidence": float(r.confidence),
                         "evidence": r.evidence, "missing_signals": list(r.missing_signals)})
        return {"verdict": self.verdict,
                "steps": {"total": int(len(step_rows)), "by_kind": by_kind,
                          "intervals": int((st["granularity"] == "interval").sum()) if len(st) else 0},
                "itl": self.itl,
                "spikes": rows,
                "by_cause": dict(self.by_cause),
                "instances": self.instances}


def _coarse_clock(st: pd.DataFrame) -> bool:
    """Step times too coarse for gaps: many steps start before the previous one ended or at the
    same instant (log lines stamped in whole seconds)."""
    if len(st) < 3:
        return False
    prev_end = st["t_end_s"].shift(1)
    bad = (st["t_start_s"] < prev_end - 1e-6) | (st["t_start_s"] == st["t_start_s"].shift(1))
    return bool(bad.iloc[1:].mean() > 0.1)


def _step_pipeline(inst: str, rows: pd.DataFrame, tokens: pd.DataFrame, quality: dict, cfg: DiagnosisConfig,
                   outside_faulty: np.ndarray | None = None):
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
    if coarse:
        sig["gap_excess_s"] = np.nan
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
    period = periodicity(sig, spike)
    full = sig.loc[sig["decode_only"] & (sig["graph_mode"] == "FULL"), "decode_reqs"].dropna()
    ctx = InstanceContext(quality=quality, graph_norm=decode_graph_norm(sig), period=period,
                          full_batch_sizes=frozenset(float(x) for x in full.unique()))
    return sig, ctx, period, ("step_duration" if coarse else ("token_itl" if has_tokens else "step_latency"))


def _interval_segments(sig: pd.DataFrame) -> pd.DataFrame:
    """Interval rows: token sums over many steps do not say that one step held both segments.

    With per-kind step counts (``mixed_steps``, ``prefill_steps``, ``decode_steps``, from
    ``steps_total{kind}``): a mixed step ran -> both segments; prefill-only steps next to decode
    steps -> a prefill stall. Otherwise only the row's ``kind`` speaks; ``unknown`` claims nothing.
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


def _interval_pipeline(rows: pd.DataFrame, quality: dict, cfg: DiagnosisConfig):
    sig = rows.sort_values("step", kind="stable").reset_index(drop=True)
    sig["gap_before_s"] = np.nan
    sig = _interval_segments(step_signals(sig, cfg.signals))
    sig["gap_excess_s"] = np.nan
    lat = sig["itl_p99_s"].fillna(sig["itl_p90_s"]).fillna(sig["itl_mean_s"])
    p50 = sig["itl_p50_s"].fillna(sig["itl_mean_s"]).fillna(lat)
    sig["latency_s"] = lat
    has_itl = lat.notna() & (sig["itl_count"].fillna(1) > 0)
    base, _ = rolling_baseline(p50, has_itl, cfg.spikes.window_intervals, 1)
    sig["baseline_s"] = base
    sig["itl_max_s"] = lat
    sig["is_spike"] = has_itl & (lat > cfg.interval_ratio * base)
    period = periodicity(sig, sig["is_spike"])
    ctx = InstanceContext(quality=quality, graph_norm=decode_graph_norm(sig), period=period)
    return sig, ctx, period, "interval_itl_quantiles"


def _itl_summary(tl: Timeline, steps: pd.DataFrame) -> dict:
    if len(tl.tokens):
        v = tl.itl()["itl_s"].to_numpy()
        src = "token_events"
    else:
        st = steps[(steps["granularity"] == "step")]
        if "latency_s" in st.columns and len(st):
            v = st.loc[st["has_decode"], "latency_s"].dropna().to_numpy()
            src = "step_latency"
        else:
            iv = steps[steps["granularity"] == "interval"] if len(steps) else steps
            p50 = iv["itl_p50_s"].dropna() if len(iv) else pd.Series(dtype=float)
            p99 = iv["itl_p99_s"].dropna() if len(iv) else pd.Series(dtype=float)
            return {"p50_s": float(p50.median()) if len(p50) else None,
                    "p99_s": float(p99.median()) if len(p99) else None,
                    "max_s": float(p99.max()) if len(p99) else None, "source": "interval_quantiles"}
    if not len(v):
        return {"p50_s": None, "p99_s": None, "max_s": None, "source": src}
    return {"p50_s": float(np.quantile(v, 0.5)), "p99_s": float(np.quantile(v, 0.99)), "max_s": float(v.max()),
            "source": src}


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
    lead = {"mixing": "mixed batching (prefill chunks sharing the step with decodes)",
            "prefill_stall": "prefill-only steps stalling running decodes",
            "ep_hotspot": "expert-parallel hotspots on decode-only steps",
            "pd_transfer": "PD KV transfer overlapping decode steps",
            "graph_fallback": "decode steps falling out of the FULL CUDA graph",
            "kv_pressure": "KV-cache pressure (preemptions)",
            "host_stall": "host stalls (idle gaps between steps)",
            "unknown": "no cause the available signals support (unknown)"}[top]
    if n_top * 2 <= n_spikes and len(ranked) > 1:
        parts = ", ".join(f"{n} {c}" for c, n in ranked)
        return f"{n_spikes} TPOT spikes in {unit} have several causes: {parts}."
    tail = f"; the rest: {rest}" if rest else ""
    return f"{n_top} of {n_spikes} TPOT spikes in {unit} are caused by {lead}{tail}."


#: Gauge series that fill an empty interval column (value of the last sample in the interval).
GAUGE_SERIES = {"expert_imbalance": ("mixdiag_engine_expert_imbalance_ratio",)}


def _gauge_columns(rows: pd.DataFrame, series: pd.DataFrame) -> pd.DataFrame:
    """Interval rows whose ``expert_imbalance`` is empty take the gauge sampled in the interval
    (the last step's max/mean per EP rank at scrape time: a sample, not a mean)."""
    iv = rows["granularity"] == "interval"
    if not iv.any() or not len(series):
        return rows
    rows = rows.copy()
    for col, names in GAUGE_SERIES.items():
        if rows.loc[iv, col].notna().any():
            continue
        g = series[series["name"].isin(names)].sort_values("t_s")
        if not len(g):
            continue
        g = g.groupby("t_s", as_index=False)["value"].max()
        ends = rows.loc[iv, "t_end_s"].to_numpy()
        idx = np.searchsorted(g["t_s"].to_numpy(), ends + 1e-6, side="right") - 1
        vals = np.where(idx >= 0, g["value"].to_numpy()[np.clip(idx, 0, None)], np.nan)
        rows.loc[iv, col] = vals
    # decode-only steps that left the FULL graph: off-FULL dispatches beyond the prefill/mixed steps
    g = series[series["name"] == "mixdiag_engine_graph_dispatch_total:increase"]
    if len(g) and {"mixed_steps", "prefill_steps"} <= set(rows.columns):
        off = g[g["labels"].isin(["mode=NONE", "mode=PIECEWISE"])].groupby("t_s")["value"].sum()
        ends = rows.loc[iv, "t_end_s"]
        n_off = ends.map(lambda t: float(off[(off.index > t - 1e-6) & (off.index < t + 1e-6)].sum()))
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


def _interval_evidence(spikes: list[dict], frames, ranges, key, cfg: DiagnosisConfig) -> list[dict]:
    """A step spike the step view left ``unknown`` (log lines carry no imbalance, transfers or
    preemptions) takes the evidence of the scrape interval that holds it: imbalance well above
    the intervals' median -> ep_hotspot; decode-only steps dispatched off the FULL graph ->
    graph_fallback; a KV transfer -> pd_transfer; a preemption -> kv_pressure. Interval evidence is coarser than the step's, so confidence is scaled twice."""
    ivs = {}
    for f in frames:
        iv = f[f["granularity"] == "interval"]
        if len(iv):
            inst = str(iv["instance"].iloc[0])
            ivs[key(inst)] = (inst, iv.set_index("step"))
    if not ivs or not ranges:
        return spikes
    a = cfg.attribution
    out = []
    for sp in spikes:
        eng = key(sp["instance"])
        if sp["cause"] != "unknown" or sp["granularity"] != "step" or eng not in ivs:
            out.append(sp)
            continue
        inst, iv = ivs[eng]
        pos = int(sp["evidence"].get("_position", -1))
        hit = [k for (i, k), (lo, hi) in ranges.items() if i == inst and lo <= pos < hi]
        if not hit or sp["evidence"].get("kind") != "decode":
            out.append(sp)
            continue
        r = iv.loc[hit[0]]
        imb = r.get("expert_imbalance")
        med = float(iv["expert_imbalance"].median()) if iv["expert_imbalance"].notna().any() else np.nan
        ev = dict(sp["evidence"]) | {"interval": int(hit[0])}
        cause = None
        if pd.notna(imb) and imb >= a.imbalance_abs and np.isfinite(med) and imb >= a.imbalance_rel * med:
            cause, ev["interval_expert_imbalance"] = "ep_hotspot", float(imb)
        elif (r.get("graph_off_decode_steps") or 0) > 0:
            cause, ev["interval_graph_off_decode_steps"] = "graph_fallback", float(r["graph_off_decode_steps"])
        elif (r.get("kv_transfer_bytes") or 0) > 0:
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
        gap = np.full(len(iv), np.nan)
        for j, (k, n, mean) in enumerate(zip(iv["step"], iv["itl_count"], iv["itl_mean_s"])):
            ab = ranges.get((inst, int(k)))
            if ab is None or not n or not np.isfinite(mean) or ab[1] <= ab[0]:
                continue
            d = dreq[ab[0]:ab[1]]
            if d.sum() <= 0:
                continue
            gap[j] = (n * mean - float((d * lat[ab[0]:ab[1]]).sum())) / float(d.mean())
        g = pd.Series(gap, index=iv.index)
        excess = g - g.rolling(cfg.spikes.window_intervals, center=True, min_periods=1).median()
        thr = (cfg.interval_ratio - 1.0) * iv["baseline_s"]
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


def _fuse_sources(frames: list[pd.DataFrame], spikes: list[dict], cfg: DiagnosisConfig) -> list[dict]:
    """One engine seen through step rows (log lines, a trace) and interval rows (scrapes).

    The step view says which step was slow and why, so an interval spike that holds a step
    spike of the same engine adds nothing and is dropped. An interval spike with no slow step
    inside (while the step view covers the interval) means the ITL excess happened *between*
    steps: a KV transfer or preemption if the interval counted one, else a host stall.
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
        out.append(sp | {"cause": cause, "confidence": round(conf * cfg.attribution.interval_factor, 3),
                         "evidence": ev})
    out = _interval_evidence(out, frames, ranges, key, cfg)
    out += _host_gap_spikes(frames, step_views, ranges, out, cfg, key)
    # keep the steps frame in line with the spikes that remain
    kept = {(sp["instance"], sp["step"]): sp["cause"] for sp in out if sp["granularity"] == "interval"}
    for f in frames:
        iv = f["granularity"] == "interval"
        if iv.any():
            keys = list(zip(f.loc[iv, "instance"], f.loc[iv, "step"].astype(int)))
            f.loc[iv, "cause"] = [kept.get(k) for k in keys]
            f.loc[iv, "is_spike"] = [k in kept for k in keys]
    return out


def _faults_seen_by_intervals(timeline: Timeline, cfg: DiagnosisConfig) -> dict[str, np.ndarray]:
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
        i_inst, iv = views["interval"]
        iv = _gauge_columns(iv, timeline.series[timeline.series["instance"] == i_inst]).sort_values("step")
        st = st.sort_values("step")
        ranges = _interval_step_ranges(iv, st)
        if ranges is None:
            continue
        imb = iv["expert_imbalance"]
        med = imb.median() if imb.notna().any() else np.nan
        goff = iv["graph_off_decode_steps"].fillna(0) > 0 if "graph_off_decode_steps" in iv else False
        bad = (((imb >= a.imbalance_abs) & (imb >= a.imbalance_rel * med)).fillna(False) | goff
               | (iv["kv_transfer_bytes"].fillna(0) > 0) | (iv["preempted_reqs"].fillna(0) > 0)).to_numpy(dtype=bool)
        mask = np.zeros(len(st), dtype=bool)
        for (lo, hi), b in zip(ranges, bad):
            if b:
                mask[lo:hi] = True
        out[s_inst] = mask
    return out


def diagnose(timeline: Timeline, config: DiagnosisConfig | None = None) -> Diagnosis:
    """Detect and attribute TPOT spikes in ``timeline``; never reads ground truth."""
    cfg = config or DiagnosisConfig()
    frames, spikes, instances = [], [], {}
    seen_faulty = _faults_seen_by_intervals(timeline, cfg)
    for inst in timeline.instances:
        rows = timeline.steps[timeline.steps["instance"] == inst]
        tokens = timeline.tokens[timeline.tokens["instance"] == inst]
        if not len(rows):
            continue
        rows = _gauge_columns(rows, timeline.series[timeline.series["instance"] == inst])
        quality = signal_quality(timeline.meta, inst, rows, len(tokens) > 0)
        step_rows = rows[rows["granularity"] == "step"]
        if len(step_rows):
            sig, ctx, period, source = _step_pipeline(inst, step_rows, tokens, quality, cfg, seen_faulty.get(inst))
        else:
            sig, ctx, period, source = _interval_pipeline(rows, quality, cfg)
        quality = ctx.quality
        missing = [s for s in SIGNALS if quality.get(s) == "absent"]
        causes = [None] * len(sig)
        for i in np.flatnonzero(sig["is_spike"].to_numpy()):
            row = sig.iloc[i]
            a = attribute(row, ctx, cfg.attribution)
            causes[i] = a.cause
            if row.get("request_stall", False):
                itl_s = row["stall_max_s"]
                a.evidence["request_stall_s"] = float(itl_s)
            else:
                itl_s = row["itl_max_s"] if pd.notna(row["itl_max_s"]) else row["latency_s"]
            if row["granularity"] == "step":
                a.evidence["_position"] = int(i)
            spikes.append({"instance": inst, "step": int(row["step"]), "t_s": float(row["t_end_s"]),
                           "itl_s": float(itl_s), "baseline_s": float(row["baseline_s"]), "cause": a.cause,
                           "confidence": a.confidence, "evidence": a.evidence, "missing_signals": missing,
                           "t_start_s": float(row["t_start_s"]), "t_end_s": float(row["t_end_s"]),
                           "granularity": row["granularity"]})
        sig["cause"] = pd.Series(causes, index=sig.index, dtype=object)
        sig["instance"] = inst
        frames.append(sig)
        instances[inst] = {"signals": quality, "latency_source": source,
                           "periodicity": {k: (None if not np.isfinite(v) else round(float(v), 6))
                                           for k, v in period.items()}}
    spikes = _fuse_sources(frames, spikes, cfg)
    for sp in spikes:
        sp["evidence"].pop("_position", None)
    steps = pd.concat(frames, ignore_index=True) if frames else timeline.steps.assign(
        gap_before_s=pd.Series(dtype=float), is_spike=pd.Series(dtype=bool), cause=pd.Series(dtype=object),
        itl_max_s=pd.Series(dtype=float), latency_s=pd.Series(dtype=float), baseline_s=pd.Series(dtype=float),
        has_decode=pd.Series(dtype=bool))
    sp = pd.DataFrame(spikes, columns=SPIKE_COLUMNS)
    if len(sp):
        sp = sp.sort_values(["t_s", "instance"], kind="stable").reset_index(drop=True)
    by_cause = {c: int((sp["cause"] == c).sum()) for c in CAUSES}
    itl = _itl_summary(timeline, steps)
    n_step = int((steps["granularity"] == "step").sum()) if len(steps) else 0
    unit = f"{n_step} steps" if n_step else f"{len(steps)} intervals"
    verdict = _verdict(by_cause, len(sp), int(len(steps)), itl, unit)
    return Diagnosis(spikes=sp, steps=steps, by_cause=by_cause, verdict=verdict, itl=itl, instances=instances,
                     config=cfg)
