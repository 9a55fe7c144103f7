"""Per-step evidence of foreign engines' steps beyond their boundaries: KV transfer and rank skew.

Both are claims the diagnosis acts on, so both demand what the real thing looks like and stay NaN
(unknown) otherwise; docs/collectors-traces.md lists the rules and their failure cases.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

#: Items closer than this form one transfer episode.
EPISODE_GAP_NS = 100_000
#: Copies of one episode that make a layer- or block-wise KV pattern: at least this many ...
KV_PATTERN_MIN_COPIES = 4
#: ... with one size among at least this share of them.
KV_PATTERN_SAME_SIZE = 0.5
#: A rank must exchange (all-to-all, dispatch/combine, send/recv) in at least this share of its
#: steps for its compute time to be compared with the other ranks' (an EP engine exchanges in
#: every MoE layer of every step; a training job's occasional point-to-point sends do not).
EP_STEP_SHARE = 0.5
P2P = 10


def transfers(steps: pd.DataFrame, items, cand: np.ndarray, ranges: pd.DataFrame | None,
              item_cpu: np.ndarray) -> None:
    """KV transfer per step of one process from candidate items (``cand``: copies and transfer
    kernels off the compute streams that the engine thread did not issue) and connector ranges.

    Items closer than 100 us form one episode. An episode is a KV transfer when it holds a
    connector range, a transfer kernel, a peer (P2P) copy, or >= 4 copies most of one size (KV
    moves layer by layer or block by block in equal pieces); anything else is other traffic.
    A transfer is charged whole to the first step that starts (on the host when launch calls are
    known, else on the GPU) at or after the episode's start: the step that consumes the KV."""
    n = len(steps)
    nbytes, secs = np.zeros(n), np.zeros(n)
    s, e = items.start[cand], items.end[cand]
    b = items.nbytes[cand].astype("float64")
    is_copy = items.what[cand] == 2
    strong = ~is_copy | (items.kind[cand] == P2P)          # transfer kernels and peer copies
    key = np.where(item_cpu[cand] >= 0, item_cpu[cand], s)
    if ranges is not None and len(ranges):
        r0, r1 = ranges["start"].to_numpy(), ranges["end"].to_numpy()
        z = np.zeros(len(r0))
        s, e, b, key = np.concatenate([s, r0]), np.concatenate([e, r1]), np.concatenate([b, z]), np.concatenate([key, r0])
        is_copy = np.concatenate([is_copy, z.astype(bool)])
        strong = np.concatenate([strong, z == 0])
    if not len(s):  # nothing seen: unknown, not zero (the export may not trace the connector)
        steps["kv_transfer_bytes"], steps["kv_transfer_s"] = np.nan, np.nan
        return
    o = np.argsort(s, kind="stable")
    s, e, b, key, is_copy, strong = s[o], e[o], b[o], key[o], is_copy[o], strong[o]
    run = np.maximum.accumulate(e)
    ep = np.cumsum(np.concatenate([[True], s[1:] > run[:-1] + EPISODE_GAP_NS])) - 1
    n_ep = int(ep[-1]) + 1
    ok = np.bincount(ep, strong, minlength=n_ep) > 0
    # copy pattern: the most common copy size of each episode and how many copies share it
    n_copies = np.bincount(ep, is_copy, minlength=n_ep)
    pair, cnt = np.unique(np.stack([ep[is_copy], b[is_copy]]), axis=1, return_counts=True)
    same = np.zeros(n_ep)
    np.maximum.at(same, pair[0].astype(np.int64), cnt)
    ok |= (n_copies >= KV_PATTERN_MIN_COPIES) & (same >= KV_PATTERN_SAME_SIZE * np.maximum(n_copies, 1))
    keep = ok[ep]
    if not keep.any():
        steps["kv_transfer_bytes"], steps["kv_transfer_s"] = np.nan, np.nan
        return
    heads = np.flatnonzero(np.diff(ep, prepend=-1))
    starts = np.maximum.accumulate(steps["cpu_start_ns"].to_numpy())
    k = np.minimum(np.searchsorted(starts, key[heads], side="left"), n - 1)[ep]
    np.add.at(nbytes, k[keep], b[keep])
    np.add.at(secs, k[keep], (e - s)[keep] / 1e9)
    # transfer kernels carry no byte count: time known, bytes not
    steps["kv_transfer_bytes"] = np.where((secs > 0) & (nbytes == 0), np.nan, nbytes)
    steps["kv_transfer_s"] = secs


def rank_skew(steps: pd.DataFrame) -> None:
    """Multi-process exports of EP ranks: slowest rank's compute time over the (lower) median rank's, per step.

    Only for steps an engine marked (ranges) or the sync pattern found, of ranks that exchange
    in most steps. Steps are matched across processes by order when every process has the same count, else by
    nearest GPU start time against the first process.
    """
    steps["rank_skew"] = np.nan
    groups = list(steps.groupby("group").groups.items())
    if len(groups) < 2:
        return
    share = [(steps.loc[ix, "ep_kernels"] > 0).mean() for _, ix in groups]
    if min(share) < EP_STEP_SHARE:  # ranks that do not exchange every step are not EP ranks
        return
    if (steps["step_source"] == "gap").any():  # GPU-gap windows are not the engine's steps: nothing to match
        return
    # graph-level trace: kernels inside a replayed graph are invisible, so is the rank's compute
    compute = np.where(steps["opaque_ns"] > 0, np.nan, steps["gpu_kernel_ns"] - steps["comm_ns"]).astype("float64")
    pos = [steps.index.get_indexer(ix) for _, ix in groups]
    pos = [p[np.argsort(steps["gpu_start_ns"].to_numpy()[p], kind="stable")] for p in pos]
    ref = pos[0]
    n = len(ref)
    if all(len(p) == n for p in pos):
        match = [np.arange(n) for _ in pos]
    else:
        rs = steps["gpu_start_ns"].to_numpy()[ref]
        match = []
        for p in pos:
            k = np.clip(np.searchsorted(rs, steps["gpu_start_ns"].to_numpy()[p]), 0, n - 1)
            match.append(k)
    table = np.full((len(pos), n), np.nan)
    for r, (p, m) in enumerate(zip(pos, match)):
        table[r, m] = compute[p]
    srt = np.sort(table, axis=0)
    cnt = np.sum(~np.isnan(table), axis=0)
    med = srt[np.maximum((cnt - 1) // 2, 0), np.arange(n)]
    with np.errstate(invalid="ignore", divide="ignore"):
        skew = np.where(cnt == len(pos), np.nanmax(np.where(np.isnan(table), -np.inf, table), axis=0) / med, np.nan)
    vals = steps["rank_skew"].to_numpy().copy()
    for p, m in zip(pos, match):
        vals[p] = skew[m]
    steps["rank_skew"] = vals
