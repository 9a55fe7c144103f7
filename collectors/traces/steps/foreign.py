"""Steps of engines we did not write, from what any CUDA trace holds (trace-format independent).

Input is an :class:`Activity` (column arrays of GPU work, runtime calls and ranges; the Nsight
reader builds it in :mod:`..nsys.activity`). Per process, steps are found by, best first:

1. ``range``: a known step range name (:data:`.ranges.STEP_RANGES`, or ``--step-range``);
   work launched inside a range on its thread is the step's;
2. ``sync``: the engine thread's sampled-token pattern - every step ends with a device-to-host
   copy of the sampled ids that some thread of the process waits for (``cudaStreamSynchronize`` /
   ``cudaEventSynchronize``); the engine thread is the one that launches most kernels;
3. ``launch``: the engine thread's bursts of calls between host gaps (scheduling between forwards),
   when those gaps are bimodal and the GPU's own idle gaps do not show the iterations;
4. ``gap``: GPU idle gaps longer than a threshold taken from the trace's own gap distribution
   (Otsu split of the log-gap histogram) unless given.

The finders of 1-3 live in :mod:`.boundaries`.

Each GPU item is joined to its launch call by correlation id inside its process, so the step of a
kernel or copy is the step of its call; no Python loop runs per kernel. Token allocation comes from
:mod:`.token_inference`; the remaining per-step evidence (graph mode, comm share, KV transfer, idle
before, rank skew) is computed here.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from mixdiag.collectors.traces.steps.activity import (D2H, GRAPH_LAUNCH, H2D, LAUNCH, MEMCPY, SYNC,  # noqa: F401
                                                      Activity, Calls, Items)
from mixdiag.collectors.traces.steps.boundaries import (call_signature, gap_threshold, launch_gap_steps, otsu_gap,
                                                        range_steps, sync_steps)
from mixdiag.collectors.traces.steps.evidence import rank_comm_spread, rank_skew, transfers
from mixdiag.collectors.traces.steps.kernel_names import COMM
from mixdiag.collectors.traces.steps.kv_overlap import compute_streams, kv_overlap
from mixdiag.collectors.traces.steps.token_inference import infer_tokens
from mixdiag.collectors.traces.steps.reconstruct import graph_counts, graph_modes, split_on_gaps

#: Per-row step_source -> meta step_source, best method first.
SOURCES = {"range": "nvtx-engine-naming", "sync": "sync-pattern", "launch": "launch-gaps", "gap": "kernel-gaps"}


def _sub(obj, sel):
    return type(obj)(**{k: v[sel] for k, v in obj.__dict__.items()})


def reconstruct(act: Activity, *, step_range: str | None = None, gap_ns: int | None = None,
                range_names: tuple[str, ...] = ()) -> tuple[pd.DataFrame, list[str], str | None]:
    """Steps of every process in ``act``; returns (steps, notes, meta step_source)."""
    notes: list[str] = []
    frames, sources = [], []
    names = (step_range,) if step_range else range_names
    it = act.items
    act.item_step = np.full(len(it.start), -1, dtype=np.int64)
    single = len(it.grp) and it.grp.min() == it.grp.max()  # one process: no per-group copies
    order = None if single else np.argsort(it.grp, kind="stable")
    bounds = np.zeros(1, dtype=np.int64) if single else np.flatnonzero(np.diff(it.grp[order], prepend=np.int64(-2**62)))
    cgrp = act.calls.grp if act.calls is not None else None
    for gi, lo in enumerate(bounds):
        hi = bounds[gi + 1] if gi + 1 < len(bounds) else len(it.grp)
        g = int(it.grp[0] if single else it.grp[order[lo]])
        items = it if single else _sub(it, order[lo:hi])
        sel = cgrp == g if cgrp is not None else None
        calls = None if sel is None else (act.calls if sel.all() else _sub(act.calls, sel))
        ranges = act.ranges[act.ranges["grp"] == g] if len(act.ranges) else act.ranges
        steps, how, n, item_step = _group_steps(g, items, calls, ranges, names, gap_ns)
        notes += n
        if item_step is not None:
            act.item_step[slice(None) if single else order[lo:hi]] = item_step
        if len(steps):
            frames.append(steps)
            sources.append(how)
    if not frames:
        return pd.DataFrame(), notes, None
    steps = pd.concat(frames, ignore_index=True)
    rank_skew(steps)
    rank_comm_spread(steps)
    steps["graph_mode"] = graph_modes(steps["graph_launches"], steps["eager_between"])
    return steps, notes, SOURCES[min(sources, key=list(SOURCES).index)]


# ---- one process ---------------------------------------------------------------------------
def _group_steps(g, items: Items, calls: Calls | None, ranges: pd.DataFrame, names, gap_ns):
    notes: list[str] = []
    call_idx = np.full(len(items.start), -1, dtype=np.int64)
    main_tid = None
    if calls is not None and len(calls.start):
        call_idx = join_on(calls.corr, items.corr)
        launches = calls.what <= GRAPH_LAUNCH
        if launches.any():
            tids, counts = np.unique(calls.tid[launches], return_counts=True)
            main_tid = int(tids[np.argmax(counts)])
    on_main = (call_idx >= 0) & (calls.tid[np.maximum(call_idx, 0)] == main_tid) if main_tid is not None else None
    call_step, how = None, None
    if main_tid is not None:
        # a method that puts no GPU work in any step (ranges around host-only calls) is no method
        holds = lambda cs: cs is not None and bool((cs[call_idx[on_main]] >= 0).any())  # noqa: E731
        call_step = range_steps(calls, ranges, names, main_tid)
        how = "range" if holds(call_step) else None
        if how is None:
            call_step = sync_steps(calls, items, call_idx, main_tid)
            how = "sync" if holds(call_step) else None
        if how is None and gap_ns is None:
            call_step = launch_gap_steps(calls, main_tid, call_signature(calls, items, call_idx, COMM))
            if holds(call_step) and _bursts_beat_gpu_gaps(call_step, items, on_main):
                how = "launch"
        if how is None:
            call_step = None
    if call_step is not None:
        step = np.where(on_main, call_step[np.maximum(call_idx, 0)], -1)
        own = on_main
    else:
        # gap: the engine's own work (its thread's launches, else kernels and the busiest stream's copies)
        if on_main is not None and on_main.any():  # kernels of any thread (some lack a runtime row)
            own = on_main | (items.what != 2)
        else:
            streams, counts = np.unique(items.stream[items.what != 2], return_counts=True)
            busiest = streams[np.argmax(counts)] if len(streams) else -1
            own = ((items.what != 2) & (items.flags & 8 == 0)) | ((items.what == 2) & (items.stream == busiest))
        step = np.full(len(items.start), -1, dtype=np.int64)
        idx = np.flatnonzero(own & (items.what != 2))   # kernels and graph rows make steps; copies join them
        idx = idx[np.argsort(items.start[idx], kind="stable")]
        threshold = gap_ns if gap_ns is not None else gap_threshold(items.start[idx], items.end[idx])
        if gap_ns is None:
            notes.append(f"process {pid_text(g)}: step gap {threshold / 1e6:.3g} ms from the trace's gap distribution")
        step[idx] = split_on_gaps(items.start[idx], items.end[idx], threshold)
        if len(idx):
            n_st = int(step[idx[-1]]) + 1
            heads = np.flatnonzero(np.diff(step[idx], prepend=-1))
            s0 = items.start[idx][heads]
            e0 = np.maximum.accumulate(np.maximum.reduceat(items.end[idx], heads))
            cp = np.flatnonzero(own & (items.what == 2))
            # inputs go to the step they precede, outputs (D2H) to the step they follow
            nxt = np.searchsorted(e0, items.start[cp], side="left")
            prv = np.searchsorted(s0, items.start[cp], side="right") - 1
            k = np.where(items.kind[cp] == D2H, prv, nxt)
            ok = (k >= 0) & (k < n_st)
            step[cp[ok]] = k[ok]
        how = "gap"
    if not (step >= 0).any():
        return pd.DataFrame(), "gap", notes, None
    item_cpu = np.where(call_idx >= 0, calls.start[np.maximum(call_idx, 0)], -1) if calls is not None and len(
        calls.start) else np.full(len(items.start), -1)
    out, renumber = _aggregate(g, items, step, how, np.where(step >= 0, item_cpu, -1) if how != "gap" else None)
    xr = ranges[ranges["transfer"]] if len(ranges) and "transfer" in ranges else None
    transfers(out, items, _transfer_candidates(items, call_idx, on_main), xr,
              item_cpu if how != "gap" else np.full(len(items.start), -1))
    kv_overlap(out, items, compute_streams(items, on_main))
    return out, how, notes, np.where(step >= 0, renumber[np.maximum(step, 0)], -1)


def _bursts_beat_gpu_gaps(call_step: np.ndarray, items: Items, on_main: np.ndarray) -> bool:
    """Host bursts are the engine's iterations; GPU idle gaps are too, unless the GPU never idles
    between them (async scheduling, overlap): prefer the bursts when the GPU shows no bimodal gaps
    or fewer than half as many gap-separated windows as the engine thread has bursts."""
    k = np.flatnonzero(on_main & (items.what != 2))
    if not len(k):
        return False
    k = k[np.argsort(items.start[k], kind="stable")]
    thr = otsu_gap(items.start[k], items.end[k])
    if thr is None:
        return True
    run_end = np.maximum.accumulate(items.end[k])
    windows = 1 + int(((items.start[k][1:] - run_end[:-1]) > thr).sum())
    bursts = len(np.unique(call_step[call_step >= 0]))
    return windows < 0.5 * bursts


def _transfer_candidates(items: Items, call_idx: np.ndarray, on_main) -> np.ndarray:
    """Copies and transfer kernels that may move KV: off the compute streams (those the engine
    thread's kernels run on, else the busiest kernel stream) and issued by another thread. Items
    without a launch call (the export lost it) are not another thread's: they need a peer copy."""
    kern = items.what != 2
    src = kern & on_main if on_main is not None and (kern & on_main).any() else kern
    streams, counts = np.unique(items.stream[src], return_counts=True)
    compute = streams if on_main is not None and (kern & on_main).any() or not len(streams) else \
        streams[[np.argmax(counts)]]
    off = ~np.isin(items.stream, compute)
    other_thread = (call_idx >= 0) & ~on_main if on_main is not None else np.zeros(len(off), dtype=bool)
    unknown = call_idx < 0
    xfer = (items.what == 2) | ((items.what == 0) & (items.flags & 8 > 0))
    return xfer & off & (other_thread | (unknown & (items.what == 2) & (items.kind == 10)))


def join_on(keys: np.ndarray, probe: np.ndarray) -> np.ndarray:
    """Index into ``keys`` of each ``probe`` value (the last row of a repeated key), -1 where absent.

    Correlation ids are dense small integers, so a lookup table beats sorting (O(n), no sort)
    when the id range is within a few times the row count; otherwise sort + binary search."""
    out = np.full(len(probe), -1, dtype=np.int64)
    if not len(keys) or not len(probe):
        return out
    lo, hi = int(keys.min()), int(keys.max())
    if lo >= 0 and hi < 8 * (len(keys) + len(probe)) + 1024:
        table = np.full(hi + 2, -1, dtype=np.int64)
        table[keys] = np.arange(len(keys))
        p = np.where((probe >= 0) & (probe <= hi), probe, hi + 1)
        return table[p]
    co = np.argsort(keys, kind="stable")
    pos = np.clip(np.searchsorted(keys[co], probe), 0, len(co) - 1)
    return np.where(keys[co][pos] == probe, co[pos], -1)


def pid_text(g) -> str:
    return str(int(g) >> 24 & 0xFFFFFF) if int(g) > 0xFFFFFF else f"group {int(g)}"


def _aggregate(g, items: Items, step: np.ndarray, how: str, item_cpu) -> pd.DataFrame:
    sel = step >= 0
    if sel.all():  # every item in a step (the usual case): views, not 2 M-row copies
        sel = slice(None)
    st = step[sel]
    n = int(st.max()) + 1
    start, end, what = items.start[sel], items.end[sel], items.what[sel]
    first = np.full(n, np.iinfo(np.int64).max)
    last = np.full(n, np.iinfo(np.int64).min)
    np.minimum.at(first, st, start)
    np.maximum.at(last, st, end)
    present = first < np.iinfo(np.int64).max
    is_k = what == 0
    dur = (end - start).astype("float64")
    flags = items.flags[sel]
    gkey = np.where(what == 1, items.corr[sel], np.where(is_k & (items.graph[sel] > 0), items.corr[sel], -1))
    gk = what != 2
    launches, between = graph_counts(st[gk], start[gk].astype("float64"), gkey[gk], n)
    kind, nbytes = items.kind[sel], items.nbytes[sel].astype("float64")
    copy = what == 2
    h2d, d2h = copy & (kind == H2D), copy & (kind == D2H)
    dev = np.zeros(n)
    dev[st] = items.dev[sel]
    cpu = first.copy()
    if item_cpu is not None:
        c = item_cpu[sel]
        cpu = np.full(n, np.iinfo(np.int64).max)
        np.minimum.at(cpu, st[c >= 0], c[c >= 0])
        cpu = np.where(cpu == np.iinfo(np.int64).max, first, cpu)
    graph_rows = what == 1
    fl = np.where(is_k, flags, 0)  # kernel flags only (copies and graph rows carry none)
    out = pd.DataFrame({
        "group": g, "step": np.arange(n), "step_source": how,
        "gpu_start_ns": first, "gpu_end_ns": last, "start_ns": first, "end_ns": last,
        "gpu_kernels": np.bincount(st[is_k], minlength=n),
        "gpu_kernel_ns": np.bincount(st[is_k], dur[is_k], minlength=n), "cpu_start_ns": cpu,
        "opaque_ns": np.bincount(st[graph_rows], dur[graph_rows], minlength=n),
        "graph_launches": launches, "eager_between": between, "device": dev,
        "comm_ns": np.bincount(st[fl & 4 > 0], dur[fl & 4 > 0], minlength=n),
        "ep_kernels": np.bincount(st[fl & 16 > 0], minlength=n),
        "prefill_family": np.bincount(st[fl & 1 > 0], minlength=n) > 0,
        "decode_family": np.bincount(st[fl & 2 > 0], minlength=n) > 0,
        "h2d_bytes": np.bincount(st[h2d], nbytes[h2d], minlength=n),
        "d2h_bytes": np.bincount(st[d2h], nbytes[d2h], minlength=n),
    })
    # H2D copies by their order inside the step: token- vs request-proportional buffers
    hs, hst, hb = st[h2d], start[h2d], nbytes[h2d]
    o = np.lexsort((hst, hs))
    hs, hb = hs[o], hb[o]
    heads = np.searchsorted(hs, hs, side="left")
    ordinal = np.arange(len(hs)) - heads
    out["h2d_copies"] = np.bincount(hs, minlength=n)
    tok = infer_tokens(out, hs, ordinal, hb)
    out = pd.concat([out, tok], axis=1)
    out = out[present].reset_index(drop=True)
    out["step"] = np.arange(len(out))
    _idle_before(out, items)
    return out, np.where(present, np.cumsum(present) - 1, -1)  # old step number -> the one in ``out``


def _idle_before(out: pd.DataFrame, items: Items) -> None:
    """GPU idle time before each step's first item (any stream of the process)."""
    o = np.argsort(items.start, kind="stable")
    s, e = items.start[o], np.maximum.accumulate(items.end[o])
    t = out["gpu_start_ns"].to_numpy()
    k = np.searchsorted(s, t, side="left") - 1
    prev = np.where(k >= 0, e[np.maximum(k, 0)], t)
    out["device_idle_before_s"] = np.maximum(t - prev, 0) / 1e9


def method_notes(steps, step_range: str | None, step_source: str) -> list[str]:
    """The source notes that say how steps were found (shared by the Nsight and Kineto readers)."""
    notes = []
    if step_range and not (len(steps) and (steps["step_source"] == "range").any()):
        notes.append(f"no '{step_range}' ranges on an engine thread: steps found another way")
    if step_source == "kernel-gaps":
        notes.append("no step ranges and no sync pattern: steps split on GPU idle gaps (heuristic)")
    elif step_source == "launch-gaps":
        notes.append("no step ranges and no sampled-token copy per step: steps are the engine thread's bursts "
                     "of launches between host gaps (heuristic)")
    elif step_source == "sync-pattern":
        notes.append("steps from the engine thread's sampled-token copy + synchronize pattern (heuristic)")
    return notes
