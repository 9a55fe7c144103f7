"""Where one forward step of a foreign engine ends and the next begins, from the engine thread's calls.

Each finder returns, per runtime call, the step it belongs to (-1: not the engine thread's, or
outside every step), or None when the trace does not show the marker it needs. Best first:

1. :func:`range_steps` - a known step range (``execute_model``, ``run_batch``, ...) on the engine thread;
2. :func:`sync_steps` - the sampled ids come back every step: the engine thread issues a device-to-host
   copy as the step's last GPU work, and some thread of the process waits for it. vLLM sync scheduling
   waits on the engine thread (``cudaStreamSynchronize``); vLLM ``--async-scheduling`` issues the copy on
   a side stream from the engine thread and waits in the worker's output thread
   (``vllm/v1/worker/gpu/async_utils.py`` ``AsyncOutput``: ``copy_event.synchronize()`` in ``get_output``,
   called by ``async_output_busy_loop`` in ``vllm/v1/executor/multiproc_executor.py``); SGLang's overlap
   loop waits for batch n's copy after launching batch n+1 (``scheduler.py`` ``event_loop_overlap``,
   ``copy_done.synchronize()``). So the wait may be on any thread of the process and after the next
   launch; the copy call still closes its step.
3. :func:`launch_gap_steps` - no per-step copy at all (a pipeline stage that does not sample, a trace
   without the output copy): the engine thread schedules and prepares the next batch on the CPU
   between two forwards (vLLM ``EngineCore.step``: schedule -> ``execute_model``; SGLang
   ``event_loop_*``: ``get_next_batch_to_run`` -> ``run_batch``), so its calls come in bursts
   separated by host gaps longer than the gaps inside a forward - even when the GPU never idles
   (async scheduling, overlap). Used only when the host gaps are bimodal.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from mixdiag.collectors.traces.steps.activity import D2H, GRAPH_LAUNCH, H2D, LAUNCH, SYNC, Calls, Items

#: Fewer positive gaps than this are too few for a distribution.
MIN_GAPS = 16
#: Otsu's two classes must lie at least this many decades apart to count as bimodal.
MIN_DECADES = 1.0
#: Inside one class of a bimodal split, a further valley is a candidate at half that separation
#: (per-layer pauses of 30-100 µs against a 0.3-1 ms scheduling gap).
SUB_DECADES = 0.5


def range_steps(calls: Calls, ranges: pd.DataFrame, names, main_tid) -> np.ndarray | None:
    """Per call: index of the outermost range of the first name in ``names`` present on ``main_tid``."""
    if ranges is None or not len(ranges):
        return None
    for name in names:
        r = ranges[(ranges["name"] == name) & (ranges["tid"] == main_tid)]
        if len(r) < 2:
            continue
        s = r["start"].to_numpy(dtype=np.int64)
        e = r["end"].to_numpy(dtype=np.int64)
        o = np.argsort(s, kind="stable")
        s, e = s[o], e[o]
        outer = s >= np.concatenate([[np.iinfo(np.int64).min], np.maximum.accumulate(e)[:-1]])
        s, e = s[outer], e[outer]
        k = np.searchsorted(s, calls.start, side="right") - 1
        ok = (k >= 0) & (calls.tid == main_tid) & (calls.start <= e[np.maximum(k, 0)])
        return np.where(ok, k, -1)
    return None


def sync_steps(calls: Calls, items: Items, call_idx: np.ndarray, main_tid) -> np.ndarray | None:
    """Boundaries = the engine thread's D2H copy calls followed by launches of the next step, when the
    process (any thread) synchronizes at least half as often as those copies are issued."""
    main = calls.tid == main_tid
    d2h_calls = call_idx[(items.what == 2) & (items.kind == D2H) & (call_idx >= 0)]
    d2h_calls = d2h_calls[main[d2h_calls]]
    n_sync = int((calls.what == SYNC).sum())
    if len(d2h_calls) < 2 or n_sync < 0.5 * len(np.unique(d2h_calls)):
        return None
    b = np.unique(calls.start[d2h_calls])
    lt = np.sort(calls.start[main & (calls.what <= GRAPH_LAUNCH)])
    # keep the last copy of a run of copies with no launch between them (the step's last output)
    nxt = np.searchsorted(lt, np.append(b[1:], np.iinfo(np.int64).max)) - np.searchsorted(lt, b)
    b = b[(nxt > 0) | (np.arange(len(b)) == len(b) - 1)]
    if len(b) < 2:
        return None
    step = np.searchsorted(b, calls.start, side="left")
    return np.where(main, step, -1)


def launch_gap_steps(calls: Calls, main_tid, signature: np.ndarray) -> np.ndarray | None:
    """Per call: the host burst it belongs to on the engine thread, or None when the thread's gaps
    are not bimodal.

    The thread's gaps often have more than two classes: a few µs between launches, 10-100 µs of Python
    between layers in eager mode, the scheduling (or waiting) gap between forwards, rare host stalls.
    Every valley of the log-gap histogram (Otsu, recursively on each side) is a candidate split. Walking
    from the coarsest split to finer ones, a refinement is kept while the bursts it adds look like
    steps: of the work kinds every coarser burst held (``signature`` bits other than a plain launch:
    input / output copies, graph launches, collectives, waits), at least half are held by at least half
    of the new bursts. Splitting at stalls merges steps (the refinement to the scheduling gap adds
    bursts that hold copies and sends: kept); splitting at per-layer pauses adds fragments without the
    step's input copies (dropped). Failure cases: an engine that issues nothing but launches splits at
    its finest valley (per-layer pauses read as steps); one whose once-per-step work sits in under half
    of its steps stays at a coarser split (steps merge between stalls).
    """
    main = calls.tid == main_tid
    idx = np.flatnonzero(main)
    if len(idx) < MIN_GAPS:
        return None
    idx = idx[np.argsort(calls.start[idx], kind="stable")]
    s, e = calls.start[idx], calls.end[idx]
    run_end = np.maximum.accumulate(e)
    gaps = np.concatenate([[0], s[1:] - run_end[:-1]])
    sig = signature[idx]
    present = [m for b, m in ((b, (sig >> b & 1) > 0) for b in range(int(sig.max()).bit_length()))
               if b != LAUNCH and m.any()]
    best, held = None, None
    for thr in sorted(valleys(gaps[1:]), reverse=True):          # coarsest first
        burst = np.cumsum(gaps > thr)
        n = int(burst[-1]) + 1
        if n < 2:
            continue
        now = np.array([int((np.bincount(burst[m], minlength=n) > 0).sum()) for m in present], dtype=np.int64)
        if best is not None:
            n_old = int(best[-1]) + 1
            full = held >= COMPLETE_SHARE * n_old                  # work every coarser burst held
            new_share = (now - held) / max(n - n_old, 1)
            if full.any() and (new_share[full] >= 0.5).sum() < 0.5 * full.sum():
                break                                              # the new bursts are fragments
        best, held = burst, now
    if best is None:
        return None
    out = np.full(len(calls.start), -1, dtype=np.int64)
    out[idx] = best
    return out


#: A work kind held by at least this share of a split's bursts counts as held by every burst.
COMPLETE_SHARE = 0.9


def call_signature(calls: Calls, items: Items, call_idx: np.ndarray, comm_flag: int) -> np.ndarray:
    """Per call: bit ``what`` (launch, graph launch, copy, wait) plus 16 when it issued an H2D copy,
    32 a D2H copy, 64 a collective kernel (``comm_flag`` in the item flags)."""
    sig = np.left_shift(1, np.clip(calls.what, 0, 3)).astype(np.int64)
    ok = call_idx >= 0
    bits = np.where((items.what == 2) & (items.kind == H2D), 16, 0) | np.where((items.what == 2) & (items.kind == D2H), 32, 0)
    bits = bits | np.where((items.what == 0) & (items.flags & comm_flag > 0), 64, 0)
    np.bitwise_or.at(sig, call_idx[ok], bits[ok])
    return sig


def valleys(gaps: np.ndarray, depth: int = 3, min_decades: float = MIN_DECADES) -> list[int]:
    """Every Otsu threshold of ``gaps`` (ns): the first where the classes lie ``min_decades`` apart,
    then each side again while its classes lie :data:`SUB_DECADES` apart (candidates only: the caller
    judges them)."""
    g = gaps[gaps > 100]
    thr = _otsu(g, min_decades)
    if thr is None or depth == 0:
        return []
    return valleys(g[g <= thr], depth - 1, SUB_DECADES) + [thr] + valleys(g[g > thr], depth - 1, SUB_DECADES)


def otsu_gap(start: np.ndarray, end: np.ndarray) -> int | None:
    """Idle gap separating two classes of gaps between items sorted by ``start`` (Otsu split of the
    log10 histogram of positive gaps); None when fewer than :data:`MIN_GAPS` gaps or not bimodal."""
    if len(start) < 3:
        return None
    run_end = np.maximum.accumulate(end)
    return _otsu(start[1:] - run_end[:-1])


def _otsu(gaps: np.ndarray, min_decades: float = MIN_DECADES) -> int | None:
    gaps = gaps[gaps > 100]
    if len(gaps) < MIN_GAPS:
        return None
    lg = np.log10(gaps.astype("float64"))
    hist, edges = np.histogram(lg, bins=64)
    p = hist / hist.sum()
    mids = (edges[:-1] + edges[1:]) / 2
    w0 = np.cumsum(p)
    m0 = np.cumsum(p * mids)
    mt = m0[-1]
    with np.errstate(invalid="ignore", divide="ignore"):
        between = (mt * w0 - m0) ** 2 / (w0 * (1 - w0))
    if not np.isfinite(between[:-1]).any():
        return None
    k = int(np.nanargmax(between[:-1]))
    lo_mean = m0[k] / w0[k]
    hi_mean = (mt - m0[k]) / (1 - w0[k])
    if hi_mean - lo_mean < min_decades:
        return None
    return int(10 ** edges[k + 1])


def gap_threshold(start: np.ndarray, end: np.ndarray, default_ns: int = 500_000) -> int:
    """GPU idle gap that separates steps (:func:`otsu_gap` of GPU items), ``default_ns`` when unclear."""
    thr = otsu_gap(start, end)
    return default_ns if thr is None else thr
