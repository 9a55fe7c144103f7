"""``prefill_work_tokens``: the prompt tokens vLLM computed in each scrape interval, spread back to when
they ran.

vLLM counts a prompt's tokens late: ``prompt_tokens`` (and ``prompt_tokens_by_source``) when the
request's first token comes, ``request_prefill_kv_computed_tokens`` (0.32+: new KV tokens, cached
ones excluded) when the request *finishes*. Either way the intervals in which the chunks actually
ran show none of them. The request histograms ``request_prefill_time_seconds`` (first scheduling ->
first token) and ``request_decode_time_seconds`` (first token -> finish), observed at finish like
the KV-computed histogram, say how far back the work reached. Basis: formats.md §1.1 traps, vLLM
``IterationStats`` / ``FinishedRequestStats``.

Two bases, the KV-computed one preferred (it counts only computed tokens, and it is observed with
the very requests whose prefill and decode times are observed in the same interval):

* :func:`spread_finished_work` - ``request_prefill_kv_computed_tokens`` increases;
* :func:`spread_prefill_work` - the interval's prompt-token counter (``prefill_tokens``).
"""
from __future__ import annotations

import math

import numpy as np

from mixdiag.collectors.prometheus.prom_common import INFERRED, View, counter_increase

PREFILL_TIME = "vllm:request_prefill_time_seconds"
DECODE_TIME = "vllm:request_decode_time_seconds"
KV_COMPUTED = "vllm:request_prefill_kv_computed_tokens"


def _relative(t0, t1) -> tuple[np.ndarray, np.ndarray]:
    """Times relative to the first stamp: the prefix sums below multiply times by rates, and at epoch
    stamps (~1.7e9 s) that product loses whole tokens to float64 cancellation."""
    t0, t1 = np.asarray(t0, dtype=float), np.asarray(t1, dtype=float)
    if len(t0):
        ref = float(np.nanmin(t0))
        t0, t1 = t0 - ref, t1 - ref
    return t0, t1


def _ramp_work(t0: np.ndarray, t1: np.ndarray, f: np.ndarray, d: np.ndarray, w: np.ndarray) -> np.ndarray:
    """Work per interval ``[t0, t1]`` of points that each did ``w`` evenly over ``[f - d, f]`` (all at
    ``f`` when ``d`` = 0). Work outside every interval is dropped."""
    ramp = d > 0
    a, fr, rate = f[ramp] - d[ramp], f[ramp], w[ramp] / d[ramp]
    ia, ifr = np.argsort(a), np.argsort(fr)
    a_s, fr_s = a[ia], fr[ifr]
    ra, rf = np.concatenate(([0.0], np.cumsum(rate[ia]))), np.concatenate(([0.0], np.cumsum(rate[ifr])))
    rxa, rxf = (np.concatenate(([0.0], np.cumsum(rate[ia] * a_s))),
                np.concatenate(([0.0], np.cumsum(rate[ifr] * fr_s))))
    fp = np.sort(f[~ramp])
    wp = np.concatenate(([0.0], np.cumsum(w[~ramp][np.argsort(f[~ramp])])))

    def done_by(x):
        """(cumulative work by x, the magnitude of the terms it cancels: its round-off scale)"""
        ka, kf = np.searchsorted(a_s, x, side="right"), np.searchsorted(fr_s, x, side="right")
        started = x * ra[ka] - rxa[ka]      # sum over a <= x of rate * (x - a)
        ended = x * rf[kf] - rxf[kf]        # minus, for f <= x, rate * (x - f)
        done = started - ended + wp[np.searchsorted(fp, x, side="left")]
        scale = np.abs(x) * (ra[ka] + rf[kf]) + np.abs(rxa[ka]) + np.abs(rxf[kf]) + wp[-1]
        return done, scale

    (c1, s1), (c0, s0) = done_by(t1), done_by(t0)
    work = c1 - c0
    # Each ramp's share of an interval is >= 0, so a negative is round-off of the prefix sums (bounded
    # by the number of terms summed x eps x their magnitude): clip that to 0. A larger negative is no
    # round-off and is left for the schema check to report.
    tol = (len(f) + 4) * np.finfo(float).eps * (s1 + s0)
    return np.where((work < 0) & (work >= -tol), 0.0, work)


def _points(t0: np.ndarray, t1: np.ndarray, shift: np.ndarray, points: int) -> np.ndarray:
    """``points`` first-token times per interval, spread evenly over ``[t0 - shift, t1 - shift]``."""
    frac = (np.arange(points) + 0.5) / points
    return ((t0 - shift)[:, None] + frac[None, :] * (t1 - t0)[:, None]).ravel()


def spread_prefill_work(t0, t1, tokens, prefill_sum, prefill_count, decode_sum=None, decode_count=None,
                        points: int = 8) -> np.ndarray:
    """Each interval's prompt tokens counted at first token, spread back over the time their prefill ran.

    ``request_prefill_time_seconds`` is observed when the request *finishes*, so the prefill time of
    the requests that got their first token in interval i is estimated from those finishing one mean
    decode time (``request_decode_time_seconds``) plus one interval later: the pooled ``Δsum /
    Δcount`` over intervals ending in ``[t1_i, t1_i + mean decode + (t1_i - t0_i)]``, else over the
    whole capture. First tokens are taken as spread evenly over interval i (``points`` of them); each
    one's tokens are spread evenly over ``[f - D_i, f]`` and given to the intervals that span
    overlaps. Work before the first interval or in a gap between intervals is dropped. NaN everywhere
    without any prefill time observed.
    """
    t0, t1 = _relative(t0, t1)
    tok = np.nan_to_num(np.asarray(tokens, dtype=float))
    ps = np.nan_to_num(np.asarray(prefill_sum, dtype=float))
    pc = np.nan_to_num(np.asarray(prefill_count, dtype=float))
    n = len(t0)
    if n == 0 or pc.sum() <= 0:
        return np.full(n, np.nan)
    pooled = ps.sum() / pc.sum()
    lag = 0.0
    if decode_sum is not None and decode_count is not None:
        dc = np.nan_to_num(np.asarray(decode_count, dtype=float))
        if dc.sum() > 0:
            lag = float(np.nan_to_num(np.asarray(decode_sum, dtype=float)).sum() / dc.sum())
    # mean prefill time of the requests finishing in the window after each interval (prefix sums over
    # the intervals in end-time order: O(n log n) for hour-long captures)
    order = np.argsort(t1, kind="stable")
    ends, cs, cc = t1[order], np.concatenate(([0.0], np.cumsum(ps[order]))), np.concatenate(([0.0], np.cumsum(pc[order])))
    lo = np.searchsorted(ends, t1, side="left")
    hi = np.searchsorted(ends, t1 + lag + (t1 - t0), side="right")
    c = cc[hi] - cc[lo]
    with np.errstate(invalid="ignore", divide="ignore"):
        dur = np.where(c > 0, (cs[hi] - cs[lo]) / c, pooled)
    f = _points(t0, t1, np.zeros(n), points)
    return _ramp_work(t0, t1, f, np.repeat(np.maximum(dur, 0.0), points), np.repeat(tok / points, points))


def spread_finished_work(t0, t1, tokens, prefill_sum, prefill_count, decode_sum, decode_count,
                         points: int = 8) -> np.ndarray:
    """Each interval's KV-computed prompt tokens (observed at request finish) spread back over the time
    their prefill ran.

    The requests finishing in interval i carry three observations made at the same moment: their
    computed prompt tokens (``tokens``), prefill times and decode times. Their first tokens came one
    mean decode time ``Dd_i`` before they finished (spread evenly over ``[t0_i - Dd_i, t1_i - Dd_i]``,
    ``points`` of them), and each one's tokens are spread over the mean prefill time ``P_i`` before it.
    An interval whose requests' times are missing takes the capture's pooled means. NaN everywhere
    without any prefill time observed.
    """
    t0, t1 = _relative(t0, t1)
    tok = np.nan_to_num(np.asarray(tokens, dtype=float))
    arrays = [np.nan_to_num(np.asarray(a, dtype=float)) for a in (prefill_sum, prefill_count, decode_sum, decode_count)]
    ps, pc, ds, dc = arrays
    n = len(t0)
    if n == 0 or pc.sum() <= 0:
        return np.full(n, np.nan)
    pooled_p = ps.sum() / pc.sum()
    pooled_d = ds.sum() / dc.sum() if dc.sum() > 0 else 0.0
    with np.errstate(invalid="ignore", divide="ignore"):
        prefill = np.where(pc > 0, ps / np.where(pc > 0, pc, 1.0), pooled_p)
        decode = np.where(dc > 0, ds / np.where(dc > 0, dc, 1.0), pooled_d)
    f = _points(t0, t1, np.maximum(decode, 0.0), points)
    return _ramp_work(t0, t1, f, np.repeat(np.maximum(prefill, 0.0), points), np.repeat(tok / points, points))


def prefill_work_column(rows: list[dict], pairs: list[tuple[View, View]], used: dict[str, str]) -> None:
    """Add ``prefill_work_tokens`` to one instance's interval rows (``pairs``: their scrape pairs) when
    vLLM's prefill-time histogram is exposed: from ``request_prefill_kv_computed_tokens`` when that is
    exposed too, else from the interval's vLLM prompt-token counter."""
    if not rows or not any(PREFILL_TIME + "_count" in cur for _, cur in pairs):
        return

    def inc(name):
        return [counter_increase(prev.get(name), cur.get(name)) for prev, cur in pairs]

    t0, t1 = [r["t_start_s"] for r in rows], [r["t_end_s"] for r in rows]
    times = (inc(PREFILL_TIME + "_sum"), inc(PREFILL_TIME + "_count"), inc(DECODE_TIME + "_sum"),
             inc(DECODE_TIME + "_count"))
    if any(KV_COMPUTED + "_sum" in cur for _, cur in pairs):
        work, source = spread_finished_work(t0, t1, inc(KV_COMPUTED + "_sum"), *times), KV_COMPUTED
    elif used.get("prefill_tokens", "").startswith("vllm:"):
        work = spread_prefill_work(t0, t1, [r.get("prefill_tokens", math.nan) for r in rows], *times)
        source = PREFILL_TIME
    else:
        return
    if not np.isfinite(work).any():
        return
    for r, v in zip(rows, work):
        r["prefill_work_tokens"] = float(v)
    used["prefill_work_tokens"] = source + INFERRED


def chunk_ahead(t0, t1, floor, running, lag_s: float | None) -> np.ndarray:
    """Per interval: prompt tokens, at least, of the largest iteration that finished a prefill in the
    interval or within the longest prefill time after it - ``floor`` (the largest iteration's bucket
    edge) minus the running batch, over intervals ending in ``[t1_i, t1_i + P]``, ``P`` = ``lag_s``,
    the upper edge of the highest ``request_prefill_time_seconds`` bucket observed (a mean would be
    the short prompts' time: the long prompt's middle chunks lie further back).

    vLLM records a prompt's tokens in ``iteration_tokens_total`` only at the step of its first token,
    the last chunk carrying the whole prompt (formats.md §1.1, PR #51261): the chunks that ran in
    interval i show up at the latest one prefill time later. So when no interval up to then logged
    an iteration beyond the decode batch, no prompt of that size was being prefilled in interval i.
    Without the prefill-time histogram ``P`` is one interval: the window over which the interval rule
    reads the late prompt counter. NaN where a needed interval has no reading."""
    t0, t1 = _relative(t0, t1)
    fl, run = np.asarray(floor, dtype=float), np.asarray(running, dtype=float)
    n = len(t0)
    if n == 0:
        return np.full(n, np.nan)
    # without a prefill time: the next interval, the window the late prompt counter is read over
    # (a prompt counted there finished its prefill there)
    lag = float(np.nanmedian(t1 - t0)) if lag_s is None else lag_s
    # the batch may have been larger earlier in the interval (as dialect_columns reads the histogram)
    batch = np.fmax(run, np.concatenate(([np.nan], run[:-1])))
    prompt = np.where(np.isfinite(fl), np.maximum(fl - np.nan_to_num(batch), 0.0), np.nan)
    out = np.full(n, np.nan)
    hi = np.searchsorted(t1, t1 + lag, side="right")  # rows are in time order
    for i in range(n):
        w = prompt[i:max(hi[i], i + 1)]
        if np.isfinite(w).all():
            out[i] = float(w.max())
    return out


def longest_prefill_s(pairs: list[tuple[View, View]]) -> float | None:
    """Upper edge of the highest ``request_prefill_time_seconds`` bucket that gained an observation over
    the capture (twice the last finite edge for ``+Inf``); None without the histogram or observations."""
    first, last = pairs[0][0].get(PREFILL_TIME + "_bucket", {}), pairs[-1][1].get(PREFILL_TIME + "_bucket", {})
    by_le: dict[float, float] = {}
    for labels, v in last.items():
        le = float(dict(labels).get("le", "nan"))
        inc = counter_increase({labels: first[labels]} if labels in first else {}, {labels: v})
        if not math.isnan(le) and math.isfinite(inc):
            by_le[le] = by_le.get(le, 0.0) + inc
    seen = sorted(by_le.items())
    top = next((i for i in range(len(seen) - 1, -1, -1) if seen[i][1] > (seen[i - 1][1] if i else 0.0)), None)
    if top is None:
        return None
    finite = [le for le, _ in seen if math.isfinite(le)]
    return seen[top][0] if math.isfinite(seen[top][0]) else (2 * finite[-1] if finite else None)


def chunk_ahead_column(rows: list[dict], pairs: list[tuple[View, View]], used: dict[str, str]) -> None:
    """Add ``prompt_chunk_ahead_tokens`` (:func:`chunk_ahead`) to one instance's interval rows when
    they carry ``iteration_tokens_floor``."""
    if not rows or "iteration_tokens_floor" not in used:
        return
    ahead = chunk_ahead([r["t_start_s"] for r in rows], [r["t_end_s"] for r in rows],
                        [r.get("iteration_tokens_floor", 0.0 if (r.get("output_tokens") or 0) <= 0 else math.nan)
                         for r in rows],
                        [r.get("running_reqs", math.nan) for r in rows], longest_prefill_s(pairs))
    if not np.isfinite(ahead).any():
        return
    for r, v in zip(rows, ahead):
        if math.isfinite(v):
            r["prompt_chunk_ahead_tokens"] = float(v)
    used["prompt_chunk_ahead_tokens"] = used["iteration_tokens_floor"] + INFERRED
