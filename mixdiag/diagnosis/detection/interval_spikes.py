"""Spikes on interval rows (scrapes, periodic stats lines): which intervals the decodes felt.

An interval row has no step of its own, only the ITL histogram's increase over it (and counters).
Four ways an interval is felt, each measured by the engine's own histogram or counters:

* **tail**: ITL P99 above ``interval_ratio`` x the baseline (the rolling median of P50 over the
  instance's intervals) - a few tokens waited long;
* **shift**: the interval's *typical* token slowed - ITL P50 above ``spikes.ratio`` x that baseline
  and above the noise of the P50s (``mad_k`` x robust sigma). A fault that lasts the whole interval
  (an expert-parallel hotspot, a run of eager decode passes) moves the median, while the P99 is
  held under a bucket edge of the engine's coarse ladder; the ratio is the one a single step must
  reach to be felt (``SpikeConfig.ratio``);
* **starved**: no decode produced a token (the ITL histogram got no observation; a completed
  prefill's first token is no ITL) while requests were running and prompt tokens were computed - the decodes waited
  through the whole interval. Requests counted running may all be prefilling (vLLM counts them
  running), so the wait must also be *measured*: the next interval with ITL observations records
  an ITL P99 of at least ``SpikeConfig.starve_confirm`` x the starved stretch (a request that waited
  through it logs that wait as one ITL when it resumes). The interval's latency is then its duration, a lower
  bound of every running decode's wait. SGLang without mixed chunk runs prefill batches alone
  while decodes wait (its ``get_new_batch_prefill`` path), which is exactly this.
* **lone tail**: only the slowest tokens waited - one per running request, under every quantile of a busy
  interval - read from the highest ITL bucket that grew (``itl_tail_floor_s``) where the engine measured
  what makes such tokens: a preemption (the request's recompute), a pause it timed itself (a GC), or a
  step with a large prompt chunk in its iteration histogram (every running decode of that step waited it).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from mixdiag.diagnosis import groupwise as gw
from mixdiag.diagnosis.config import RegimeConfig, SpikeConfig
from mixdiag.diagnosis.detection.chunk_step import large_chunk
from mixdiag.diagnosis.detection.host_wait import measured_pause
from mixdiag.diagnosis.detection.regimes import _log2_bins, sustained_rows
from mixdiag.diagnosis.detection.spikes import grouped_baseline, rolling_baseline


@dataclass(frozen=True)
class IntervalSpikes:
    """Per row: latency (P99, or the duration of a starved interval), baseline, spike mask, and
    which rule made it a spike (``starved``, ``shift``, ``preempted_tail``, ``paused_tail``, ``chunk_tail``)."""

    latency_s: pd.Series
    baseline_s: pd.Series
    is_spike: pd.Series
    has_itl: pd.Series
    starved: pd.Series
    shift: pd.Series
    preempted_tail: pd.Series | None = None
    paused_tail: pd.Series | None = None
    chunk_tail: pd.Series | None = None


def _num(sig: pd.DataFrame, col: str) -> pd.Series:
    return pd.to_numeric(sig[col], errors="coerce") if col in sig.columns else pd.Series(np.nan, index=sig.index)


def starved_rows(sig: pd.DataFrame, has_itl: pd.Series, confirm: float) -> pd.Series:
    """Intervals (sorted by time) in which running decodes produced no token while prompt tokens
    were computed, confirmed by the ITL the waiting requests logged on resuming (module doc)."""
    running, work = _num(sig, "running_reqs"), _num(sig, "prefill_tokens")
    # no decode produced a token: the ITL histogram got no observation (a prefill that completes
    # emits its request's first token, counted as generated but not as an ITL); without the
    # histogram's count, the generation counter did not move
    count = _num(sig, "itl_count")
    none_out = count.eq(0).where(count.notna(), _num(sig, "output_tokens").eq(0))
    dur = (_num(sig, "t_end_s") - _num(sig, "t_start_s")).clip(lower=0)
    cand = (~has_itl & none_out.astype(bool) & (running > 0) & (work > 0)).to_numpy()
    p99 = _num(sig, "itl_p99_s").to_numpy()
    itl = has_itl.to_numpy()
    d = dur.to_numpy()
    starved = np.zeros(len(sig), dtype=bool)
    i = 0
    while i < len(sig):
        if not cand[i]:
            i += 1
            continue
        j = i
        while j + 1 < len(sig) and cand[j + 1]:
            j += 1
        span = float(np.nansum(d[i:j + 1]))
        k = j + 1
        while k < len(sig) and not itl[k]:
            k += 1  # an interval between with neither ITL nor starvation (idle): look past it
        if k < len(sig) and np.isfinite(p99[k]) and p99[k] >= confirm * span:
            starved[i:j + 1] = True
        i = j + 1
    return pd.Series(starved, index=sig.index)


def _grouped_baseline(p50: pd.Series, ref: pd.Series, window: int, groups: np.ndarray) -> tuple[pd.Series, pd.Series]:
    """What :func:`~mixdiag.diagnosis.detection.spikes.rolling_baseline` (``min_periods`` 1) gives each
    group's rows alone: the baseline, and the robust sigma of the reference rows around it."""
    base = grouped_baseline(p50, ref, window, 1, groups)
    v = p50.astype("float64")
    r = ref.fillna(False).astype(bool) & v.notna()
    none = gw.per_group(r.to_numpy().astype(np.int64), groups, np.add) < 1  # no reference: all rows are
    r = r | (pd.Series(none[groups], index=v.index) & v.notna())
    dev = (v.where(r) - base).abs()
    mad = gw.rolling_median(dev, window, 1, groups)
    sigma = gw.bfill(gw.ffill(1.4826 * mad, groups), groups).fillna(0.0)
    return base, sigma


def _unsustained(ref: pd.Series, p50: pd.Series, running: pd.Series, spikes: SpikeConfig, regimes: RegimeConfig | None,
                 groups: np.ndarray | None) -> pd.Series:
    """``ref`` without the intervals of an episode (detection/regimes.py: a stretch whose rolling median of
    P50 stands above the instance's low-side reference, per log2 bin of the running batch), where enough
    reference intervals remain. Measured on tier (e2) tuning captures: a sustained run of mixed steps (a
    stream of long prompts, 8+ scrape intervals) lifted the 15-interval centred baseline onto itself, and
    105 of 168 intervals where mixing was visible got no spike at all; the step path does the same
    (step_view.py)."""
    if regimes is None:
        return ref
    v, r, run = p50.to_numpy(dtype=float), ref.fillna(False).to_numpy(dtype=bool), running.to_numpy(dtype=float)
    b = np.array([0, len(v)]) if groups is None else gw.bounds(groups)
    out = r.copy()
    for g in range(len(b) - 1):
        part = slice(b[g], b[g + 1])
        if r[part].sum() < spikes.min_periods:
            continue
        held = sustained_rows(v[part], _log2_bins(run[part]), r[part], regimes, run[part])
        if held.any() and (r[part] & ~held).sum() >= spikes.min_periods:
            out[part] = r[part] & ~held
    return pd.Series(out, index=ref.index)


def _preempted_tail(sig: pd.DataFrame, base: pd.Series, interval_ratio: float, groups: np.ndarray | None) -> pd.Series:
    """Intervals whose slowest token (the lowest bound of the highest ITL bucket that grew) waited
    ``interval_ratio`` x the baseline or more, where the engine counted a preemption in the interval or
    the one before. Basis: vLLM V1 preempts by recompute (the request goes back to the waiting queue
    and re-prefills) and SGLang retracts the same way; the request's next token then carries the
    whole wait as one ITL (its last-token time was kept), one token among the hundreds a busy
    interval holds, so no quantile shows it, and it comes a few steps after the preemption."""
    floor = _num(sig, "itl_tail_floor_s")
    if floor.isna().all() or "preempt" not in sig.columns:
        return pd.Series(False, index=sig.index)
    pre = sig["preempt"].fillna(False).astype(bool)
    near = pre | (gw.shift(pre.astype(float), 1, 0.0, groups) > 0)
    return (near & (floor >= interval_ratio * base)).fillna(False).astype(bool)


def _paused_tail(sig: pd.DataFrame, base: pd.Series, interval_ratio: float, groups: np.ndarray | None) -> pd.Series:
    """Intervals whose slowest token waited ``interval_ratio`` x the baseline or more, where the engine timed a
    pause of its own (``host_pause_s``: vLLM's GC debugger) of at least half that wait in the interval or the
    one before. Basis: a collection stops the engine's Python, so every running request's next token
    carries the pause as one ITL - one token per request, under every quantile of a busy interval, as with
    a preempted request (:func:`_preempted_tail`)."""
    floor = _num(sig, "itl_tail_floor_s")
    pause = pd.Series(measured_pause(sig), index=sig.index)   # GC the engine timed, or a stop the OS saw
    if floor.isna().all() or pause.isna().all():
        return pd.Series(False, index=sig.index)
    near = np.fmax(pause.to_numpy(dtype=float), gw.shift(pause, 1, np.nan, groups).to_numpy(dtype=float))
    ok = (floor >= interval_ratio * base) & (pd.Series(near, index=sig.index) >= 0.5 * floor)
    return ok.fillna(False).astype(bool)


#: a chunk's lone tail stands for the chunk only up to this many times the tail floor the instance's chunk
#: intervals usually show: a longer wait beside a chunk is something else (a stall the engine does not time)
CHUNK_TAIL_SPAN = 4.0


def _chunk_tail(sig: pd.DataFrame, base: pd.Series, interval_ratio: float, chunk_min: float,
                groups: np.ndarray | None) -> pd.Series:
    """Intervals whose slowest token waited ``interval_ratio`` x the baseline or more, where vLLM's iteration
    histogram holds a step with a large prompt chunk in or just after the interval (``prompt_chunk_ahead_tokens``,
    chunk_step.py), and that wait is no more than ``CHUNK_TAIL_SPAN`` x the median slowest token of the
    instance's chunk intervals. Basis: vLLM V1 schedules the chunk in one step with every running decode, so
    each running request's token of that step waits the whole step - one token per request. With a few
    requests running, an interval of hundreds of tokens holds a handful of them, under its P99 (real vLLM
    tier g, 6 req/s: 512-token chunks at 22-45 ms beside 6-9 ms decodes, P99 still in the first bucket)."""
    floor = _num(sig, "itl_tail_floor_s")
    ahead = _num(sig, "prompt_chunk_ahead_tokens")
    if floor.isna().all() or ahead.isna().all():
        return pd.Series(False, index=sig.index)
    running = _num(sig, "running_reqs")
    batch = np.fmax(running.to_numpy(dtype=float), gw.shift(running, 1, np.nan, groups).to_numpy(dtype=float))
    chunk = large_chunk(ahead.to_numpy(dtype=float), batch, chunk_min)
    fl = floor.to_numpy(dtype=float)
    # the instance's usual slowest token of a chunk interval (NaN where it has none)
    usual = gw.quantile(pd.Series(np.where(chunk & (fl > 0), fl, np.nan), index=sig.index), 0.5, groups).to_numpy()
    with np.errstate(invalid="ignore"):
        ok = chunk & (fl >= interval_ratio * base.to_numpy(dtype=float)) & (fl <= CHUNK_TAIL_SPAN * usual)
    return pd.Series(ok, index=sig.index)


def interval_spikes(sig: pd.DataFrame, interval_ratio: float, spikes: SpikeConfig, faulty: pd.Series | None = None,
                    groups: np.ndarray | None = None, regimes: RegimeConfig | None = None,
                    chunk_min: float | None = None) -> IntervalSpikes:
    """The three interval spike tests of the module doc over one instance's rows (sorted by time).

    ``faulty``: intervals whose counters or gauges measured a fault (an expert imbalance well above
    the usual, a KV transfer, a preemption); as in the step path, they do not set the baseline, so
    a fault window lasting several intervals stands out instead of becoming the norm. ``groups``:
    rows of several instances, numbered as in :mod:`~mixdiag.diagnosis.groupwise` (each instance's
    rows contiguous and sorted); every test then runs within each instance."""
    lat = _num(sig, "itl_p99_s").fillna(_num(sig, "itl_p90_s")).fillna(_num(sig, "itl_mean_s"))
    p50 = _num(sig, "itl_p50_s").fillna(_num(sig, "itl_mean_s")).fillna(lat)
    count = _num(sig, "itl_count")
    has_itl = lat.notna() & (count.fillna(1) > 0)
    ref = has_itl if faulty is None else has_itl & ~faulty.fillna(False).astype(bool)
    # too few fault-free intervals in an instance: all of its intervals with ITL set the baseline
    if groups is None:
        few = pd.Series(bool(ref.sum() < spikes.min_periods), index=sig.index)
    else:
        n_ref = gw.per_group(ref.to_numpy(dtype=np.int64), groups, np.add)
        few = pd.Series(n_ref[groups] < spikes.min_periods, index=sig.index)
    ref = ref.where(~few, has_itl)
    ref = _unsustained(ref, p50, _num(sig, "running_reqs"), spikes, regimes, groups)
    if groups is None:
        base, sigma = rolling_baseline(p50, ref, spikes.window_intervals, 1)
        starved = starved_rows(sig, has_itl, spikes.starve_confirm)
    else:
        base, sigma = _grouped_baseline(p50, ref, spikes.window_intervals, groups)
        starved = pd.Series(False, index=sig.index)
        b = gw.bounds(groups)
        maybe = gw.per_group((~has_itl & _num(sig, "prefill_tokens").gt(0)).to_numpy(dtype=bool), groups, np.logical_or)
        for g in np.flatnonzero(maybe):  # a fleet's steady instances have no candidate: no loop
            part = slice(b[g], b[g + 1])
            starved.iloc[part] = starved_rows(sig.iloc[part], has_itl.iloc[part], spikes.starve_confirm).to_numpy()
    tail = has_itl & (lat > interval_ratio * base)
    shift = has_itl & ~tail & (p50 > np.maximum(spikes.ratio * base, base + spikes.mad_k * sigma))
    preempted = _preempted_tail(sig, base, interval_ratio, groups)
    paused = _paused_tail(sig, base, interval_ratio, groups)
    chunked = (pd.Series(False, index=sig.index) if chunk_min is None
               else _chunk_tail(sig, base, interval_ratio, chunk_min, groups))
    lone = has_itl & ~tail & ~shift & (preempted | paused | chunked)
    lat = lat.where(~lone, _num(sig, "itl_tail_floor_s"))
    dur = (_num(sig, "t_end_s") - _num(sig, "t_start_s")).clip(lower=0)
    lat = lat.where(~starved, dur)
    spike = tail | shift | lone | (starved & (lat > spikes.ratio * base))
    return IntervalSpikes(latency_s=lat, baseline_s=base, is_spike=spike.fillna(False).astype(bool),
                          has_itl=has_itl, starved=starved, shift=shift, preempted_tail=lone & preempted,
                          paused_tail=lone & paused, chunk_tail=lone & chunked & ~preempted & ~paused)
