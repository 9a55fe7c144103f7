"""Regimes: a healthy reference per instance that a sustained fault cannot move, and **episodes** -
sustained stretches of elevated latency found against it.

Why not a rolling baseline: a centred rolling median follows any level shift that lasts longer than
half its window, so a 3-minute EP hotspot becomes its own baseline and only its two edges stand out.
Here the reference is read from the *whole* capture, and only from its low side:

* every cause in the taxonomy adds time (a fault never makes a step faster), so contamination of the
  latency distribution is one-sided, upwards;
* the reference centre and noise scale are therefore first read from the 5th and 25th percentiles of
  the reference rows (``sigma = (q25 - q05) / 0.971``, ``centre = q25 + 0.674 sigma``: the normal
  quantiles at 0.05 and 0.25), which hold no faulty row until faults cover three quarters of the rows,
  then refined by the median and MAD of the rows within centre + 3 sigma (the healthy ones);
* rows are compared with rows of comparable work: strata (e.g. decode batch-size bins), each with
  its own reference where it holds enough rows, the capture-wide one otherwise - on interval rows never
  above the next smaller stratum's reference scaled by their batch ratio (x a margin): a healthy decode
  step reads the weights once for the whole batch and each row's KV, so its time grows at most linearly
  with the batch. A sustained fault that also grows the batch (a stream of long prompts queues requests:
  15 -> 33 running on a tier (e2) capture, ITL 22 -> 150 ms) would otherwise be its own stratum's
  reference. Not on step rows: a client's smallest "steps" are single-stream reads split into sub-steps
  (0.2 ms on the real-vLLM testbed), no bound on anything.

An episode is a run of rows whose *centred rolling median* (``smooth_rows`` wide) is elevated: an
isolated spike cannot lift a median of 9 rows, a fault covering most of them does. Runs closer than
``merge_gap_rows`` merge; runs shorter than ``min_rows`` are not episodes (they are spikes). This is a
documented robust level-shift detector in O(n log w), chosen over PELT (`ruptures`) because it needs no
penalty tuned per trace and runs on 200 k steps in milliseconds.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from mixdiag.diagnosis.config import RegimeConfig
from mixdiag.diagnosis.row_arrays import RowArrays, as_rows

#: standard-normal quantiles at 0.25 and 0.05 (the low side the reference is read from)
_Z25, _Z05 = -0.6745, -1.6449

EPISODE_COLUMNS = ["instance", "episode", "row_start", "row_end", "t_start_s", "t_end_s", "rows",
                   "reference_s", "median_latency_s", "ratio", "excess_s"]


#: samples up to this size take their median from a full sort (np.median's per-call overhead, ~20 us,
#: is most of the cost on a fleet instance's 60 rows); larger ones use np.median's partition
_SORT_MEDIAN_MAX = 2048


def _median(v: np.ndarray) -> float:
    """``np.median`` of a non-empty finite 1-D sample, bit for bit (the middle value, or the mean of the
    two middle ones computed as numpy does: their sum / 2)."""
    n = len(v)
    if n > _SORT_MEDIAN_MAX:
        return float(np.median(v))
    s = np.sort(v)
    h = n // 2
    return float(s[h]) if n % 2 else float((s[h - 1] + s[h]) / 2)


def low_side_reference(values: np.ndarray, rounds: int = 3) -> tuple[float, float]:
    """(centre, sigma) of a latency sample whose contamination is upwards only (see module doc).
    NaN for an empty sample.

    A first estimate from the 5th and 25th percentiles, then ``rounds`` of median and MAD over the rows
    within centre + 3 sigma: the low percentiles hold no faulty row until faults cover ~3/4 of the rows,
    and the trimmed median/MAD remove the bias the faulty rows put on those percentiles."""
    v = values[np.isfinite(values)]
    if not len(v):
        return float("nan"), float("nan")
    q05, q25 = np.quantile(v, [0.05, 0.25])
    sigma = max((q25 - q05) / (_Z25 - _Z05), 0.0)
    centre = q25 - _Z25 * sigma
    kept = -1
    for _ in range(rounds):
        inl = v[v <= centre + 3.0 * sigma]
        if len(inl) < 3 or len(inl) == kept:  # as many rows as the last round: the same rows, centre and sigma
            break
        kept = len(inl)
        centre = _median(inl)
        sigma = float(1.4826 * _median(np.abs(inl - centre)))
    return float(centre), float(sigma)


def reference(latency: np.ndarray, strata: np.ndarray | None = None, use: np.ndarray | None = None,
              cfg: RegimeConfig = RegimeConfig(), batch: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Per-row healthy reference (centre, sigma): from the rows ``use`` marks (default all finite), in
    the row's stratum when that holds ``min_stratum_rows`` such rows, capture-wide otherwise. ``batch``
    (the rows' decode batch, the strata's measure): a stratum's own reference is capped at the next
    smaller one's scaled by their median batches (module doc)."""
    lat = np.asarray(latency, dtype=float)
    use = np.isfinite(lat) if use is None else (np.asarray(use, dtype=bool) & np.isfinite(lat))
    c0, s0 = low_side_reference(lat[use])
    centre = np.full(len(lat), c0)
    sigma = np.full(len(lat), s0)
    if strata is not None and len(lat):
        strata = np.asarray(strata)
        if strata.dtype.kind in "iub":  # integer bins (LatencyView): the same sorted codes, without a Series
            uniq, codes = np.unique(strata, return_inverse=True)
        else:
            codes, uniq = pd.factorize(pd.Series(strata), sort=True)
        n_use = int(use.sum())
        b = None if batch is None else np.asarray(batch, dtype=float)
        below = None  # (centre, sigma, median batch) of the last stratum with a reference of its own ...
        if b is not None:  # ... first the capture-wide one, at the batch of the rows its low side holds
            low = use & (lat <= c0 + 3.0 * s0) & np.isfinite(b)
            if low.any():
                below = (c0, s0, float(np.median(b[low])))
        for k in range(len(uniq)):  # ascending: integer bins sort by batch
            mine = codes == k
            pick = mine & use
            n_pick = int(pick.sum())
            if n_pick >= cfg.min_stratum_rows:
                # a stratum holding every used row (one decode batch size) has the capture-wide sample itself
                c, sg = (c0, s0) if n_pick == n_use else low_side_reference(lat[pick])
                size = float(np.nanmedian(b[pick])) if b is not None and np.isfinite(b[pick]).any() else np.nan
                if below is not None and np.isfinite(size) and below[2] > 0:
                    cap = below[0] * max(1.0, size / below[2]) * cfg.stratum_growth_margin
                    if c > cap:  # more than the batch explains: a fault as long as the stratum
                        sg = below[1] * cap / below[0] if below[0] > 0 else sg
                        c = cap
                centre[mine], sigma[mine] = c, sg
                if np.isfinite(size):
                    below = (c, sg, size)
    return centre, sigma


def _runs(mask: np.ndarray) -> list[tuple[int, int]]:
    """[start, end] (inclusive) of each run of True."""
    if not mask.any():
        return []
    d = np.diff(np.concatenate([[0], mask.astype(np.int8), [0]]))
    starts = np.flatnonzero(d == 1)
    ends = np.flatnonzero(d == -1) - 1
    return list(zip(starts.tolist(), ends.tolist()))


def _median_may_exceed(lat: np.ndarray, level: float, window: int, min_periods: int) -> bool:
    """Whether some centred rolling median of ``lat`` (``window`` rows, at least ``min_periods`` values)
    can exceed ``level``. The median of k values exceeds ``level`` only if at least ceil(k / 2) of them
    do (an even count's median, the mean of the two middle values, is at most ``level`` when both are),
    and k >= min_periods; counted over a window of 2 x ``window`` + 1 rows, which holds every centred
    one. False: no median exceeds ``level`` (a million steps where only every 50th step is slow skip
    the rolling median)."""
    with np.errstate(invalid="ignore"):
        hi = np.concatenate([[0], np.cumsum(lat > level)])
    n = len(lat)
    i = np.arange(n)
    near = hi[np.minimum(i + window + 1, n)] - hi[np.maximum(i - window, 0)]
    return bool((near >= (min_periods + 1) // 2).any())


def elevated(latency: np.ndarray, centre: np.ndarray, sigma: np.ndarray, cfg: RegimeConfig = RegimeConfig()) -> np.ndarray:
    """Rows whose centred rolling median stands above the reference (ratio and noise guard)."""
    lat = np.asarray(latency, dtype=float)
    bar = np.maximum(cfg.ratio * centre, centre + cfg.sigma_k * sigma)
    with np.errstate(invalid="ignore"):
        # a rolling median never exceeds the largest value it covers: no row above the lowest bar, none elevated
        finite = lat[np.isfinite(lat)]
        if not len(finite) or not np.isfinite(bar).any() or finite.max() <= np.nanmin(bar):
            return np.zeros(len(lat), dtype=bool)
    min_periods = max(1, cfg.smooth_rows // 2 + 1)
    if not _median_may_exceed(lat, float(np.nanmin(bar)), cfg.smooth_rows, min_periods):
        return np.zeros(len(lat), dtype=bool)
    smooth = pd.Series(lat).rolling(cfg.smooth_rows, center=True, min_periods=min_periods).median().to_numpy()
    with np.errstate(invalid="ignore"):
        return np.isfinite(smooth) & np.isfinite(bar) & (smooth > bar)


def episode_runs(latency: np.ndarray, centre: np.ndarray, sigma: np.ndarray,
                 cfg: RegimeConfig = RegimeConfig()) -> list[tuple[int, int]]:
    """[start, end] (inclusive row positions) of each episode: elevated runs merged across gaps of at most
    ``merge_gap_rows`` rows, kept when at least ``min_rows`` long (shorter ones are spikes)."""
    return merged_runs(elevated(np.asarray(latency, dtype=float), centre, sigma, cfg), cfg)


def merged_runs(mask: np.ndarray, cfg: RegimeConfig = RegimeConfig()) -> list[tuple[int, int]]:
    """[start, end] (inclusive) of the runs of True merged across gaps of at most ``merge_gap_rows`` rows,
    kept when at least ``min_rows`` long."""
    merged: list[list[int]] = []
    for a, b in _runs(mask):
        if merged and a - merged[-1][1] - 1 <= cfg.merge_gap_rows:
            merged[-1][1] = b
        else:
            merged.append([a, b])
    return [(a, b) for a, b in merged if b - a + 1 >= cfg.min_rows]


def sustained_rows(latency: np.ndarray, strata: np.ndarray | None, use: np.ndarray,
                   cfg: RegimeConfig = RegimeConfig(), batch: np.ndarray | None = None) -> np.ndarray:
    """Rows inside an episode against the low-side reference of the ``use`` rows (per stratum): the rows a
    rolling baseline must not learn from, or a fault lasting longer than half its window becomes its own norm."""
    lat = np.asarray(latency, dtype=float)
    centre, sigma = reference(lat, strata, use, cfg, batch)
    out = np.zeros(len(lat), dtype=bool)
    for a, b in episode_runs(lat, centre, sigma, cfg):
        out[a:b + 1] = True
    return out


def find_episodes(instance: str, t_s: np.ndarray, latency: np.ndarray, centre: np.ndarray, sigma: np.ndarray,
                  cfg: RegimeConfig = RegimeConfig(), weight: np.ndarray | None = None) -> pd.DataFrame:
    """Episodes of one instance's rows in time order, columns EPISODE_COLUMNS.

    ``weight`` is how many token gaps each row's latency stands for (1 per step; an interval's ITL count),
    so ``excess_s`` is the latency the episode added over the reference, in seconds of token time."""
    return pd.DataFrame(episode_rows(instance, t_s, latency, centre, sigma, cfg, weight), columns=EPISODE_COLUMNS)


def episode_rows(instance: str, t_s: np.ndarray, latency: np.ndarray, centre: np.ndarray, sigma: np.ndarray,
                 cfg: RegimeConfig = RegimeConfig(), weight: np.ndarray | None = None) -> list[tuple]:
    """:func:`find_episodes` as a list of row tuples (no frame per instance: a fleet has thousands)."""
    lat = np.asarray(latency, dtype=float)
    t = np.asarray(t_s, dtype=float)
    w = np.ones(len(lat)) if weight is None else np.asarray(weight, dtype=float)
    return [episode_row(instance, k, a, b, t, lat, centre, w)
            for k, (a, b) in enumerate(episode_runs(lat, centre, sigma, cfg))]


def episode_row(instance: str, k: int, a: int, b: int, t: np.ndarray, lat: np.ndarray, centre: np.ndarray,
                w: np.ndarray) -> tuple:
    """One EPISODE_COLUMNS tuple for rows ``a..b`` (inclusive) of one instance's view."""
    seg = slice(a, b + 1)
    lat_seg, ref_seg = lat[seg], centre[seg]
    ok = np.isfinite(lat_seg) & np.isfinite(ref_seg)
    excess = float(np.sum(np.clip(lat_seg[ok] - ref_seg[ok], 0, None) * w[seg][ok]))
    med = float(np.median(lat_seg[ok])) if ok.any() else float("nan")
    ref = float(np.median(ref_seg[ok])) if ok.any() else float("nan")
    return (instance, k, a, b, float(t[a]), float(t[b]), b - a + 1, ref, med, med / ref if ref > 0 else float("nan"),
            excess)


@dataclass(frozen=True)
class LatencyView:
    """One instance's latency as decodes felt it, row by row, for the regime stage.

    Step rows: ``latency_s`` (the time the step added between two tokens of a decoding request), each row
    standing for the decode requests that waited through it (``weight``). Interval rows: the mean gap between
    tokens in the interval (``itl_mean_s`` = Δsum / Δcount of the ITL histogram), standing for ``itl_count``
    gaps. ``use`` marks the rows a healthy reference may be read from (pure-decode steps; intervals with
    observations), ``strata`` groups rows of comparable work (log2 bins of the decode batch / running requests:
    a decode step's cost grows with its batch)."""

    granularity: str
    positions: np.ndarray  # positions of these rows in the instance's frame
    t_s: np.ndarray
    latency_s: np.ndarray
    weight: np.ndarray
    use: np.ndarray
    strata: np.ndarray
    batch: np.ndarray | None = None  # interval rows: the running batch the strata bin (reference()'s cap)


def _log2_bins(v: np.ndarray) -> np.ndarray:
    with np.errstate(divide="ignore", invalid="ignore"):
        b = np.floor(np.log2(np.where(np.isfinite(v) & (v >= 1), v, np.nan)))
    return np.where(np.isfinite(b), b, -1).astype(int)


def latency_view(rows: pd.DataFrame | RowArrays) -> LatencyView | None:
    """The rows of one instance (the diagnosis's steps frame) as a :class:`LatencyView`: step rows when
    they carry a latency, interval rows otherwise; None when neither does."""
    if not len(rows):
        return None
    rows = as_rows(rows)
    gran = rows.raw("granularity")
    lat_steps = rows.num("latency_s")
    # a step row of zero length has no measured latency (a log line's stamp alone: SGLang's Prefill line)
    steps = (gran == "step") & np.isfinite(lat_steps) & (lat_steps > 0)
    if steps.sum() >= 3:
        pos = np.flatnonzero(steps)
        sub = rows.take(pos)
        dec = sub.num("decode_reqs")
        weight = np.where(np.isfinite(dec) & (dec >= 1), dec, 1.0)
        use = sub.bools("decode_only") if sub.has("decode_only") else np.ones(len(sub), bool)
        if sub.has("reference_row") and sub.flag("reference_row").sum() >= 3:
            # the spike baseline's healthy rows (detection/step_view.py): decode steps in the graph mode decode
            # usually replays, no measured fault - a stretch of eager fallback at a batch size no healthy step ran
            # must not become its own stratum's reference
            use = sub.flag("reference_row")
        if use.sum() < 3:
            use = np.ones(len(sub), bool)
        # no batch for the cap (reference()): a step view's smallest batches may be no steps at all (a client's
        # single-stream reads split into sub-steps: 0.2 ms "steps" on the real-vLLM testbed), so a stratum
        # below is no bound on one above
        return LatencyView("step", pos, sub.num("t_end_s"), lat_steps[pos], weight, use, _log2_bins(dec))
    count = rows.num("itl_count")
    mean = rows.num("itl_mean_s")
    ivl = (gran == "interval") & np.isfinite(mean) & (count > 0)
    if ivl.sum() >= 3:
        pos = np.flatnonzero(ivl)
        sub = rows.take(pos)
        run = sub.num("running_reqs")
        use = np.ones(len(pos), bool)
        if sub.has("reference_row") and sub.flag("reference_row").sum() >= 3:
            use = sub.flag("reference_row")  # no measured fault (interval_batch.interval_signals)
        return LatencyView("interval", pos, sub.num("t_end_s"), mean[pos], count[pos], use, _log2_bins(run), run)
    return None


def saturation(rows: pd.DataFrame | RowArrays, cfg: RegimeConfig = RegimeConfig()) -> dict:
    """Whether the instance ran saturated: requests waited after most rows while the running batch stood at
    its ceiling. Basis: vLLM and SGLang admit a waiting request as soon as the token budget, the batch limit
    (max-num-seqs / max-running-requests) and KV blocks allow, so a queue that persists while the batch is
    at its largest size means admission is capacity-bound, and every token's latency carries the load.
    Where the engine says why requests wait (vLLM 0.32 ``waiting_capacity_reqs``), only those waiting for
    capacity count: a request deferred by a LoRA budget or a KV transfer waits on something else."""
    rows = as_rows(rows)
    waiting = rows.num("waiting_capacity_reqs")
    capacity = bool(np.isfinite(waiting).any())
    if not capacity:
        waiting = rows.num("waiting_reqs")
    running = rows.num("running_reqs")
    seen = np.isfinite(waiting)
    out = {"saturated": False, "rows": int(seen.sum())}
    if capacity:
        out["waiting_column"] = "waiting_capacity_reqs"
    if seen.sum() < max(3, cfg.min_rows) or not np.isfinite(running).any():
        out["why"] = "no waiting/running counts" if not seen.any() else "too few rows with queue counts"
        return out
    queued = seen & (waiting >= 1)
    top = float(np.nanmax(running))
    at_top = queued & np.isfinite(running) & (running >= cfg.saturated_running_share * top)
    share_q = float(queued.sum() / seen.sum())
    share_top = float(at_top.sum() / max(1, queued.sum()))
    out.update({"waiting_share": round(share_q, 3), "running_at_limit_share": round(share_top, 3),
                "running_max": top, "waiting_median": float(np.nanmedian(waiting[queued])) if queued.any() else 0.0})
    out["saturated"] = bool(top >= 1 and share_q >= cfg.saturated_waiting_share and share_top >= 0.5)
    return out
