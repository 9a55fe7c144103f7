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
#: A graph-level trace shows a rank's exchange kernels only on its eager steps: at least this many
#: such steps must show them before its SM activity is compared with the other ranks'.
EP_MIN_VISIBLE = 3
#: Graph-level traces that show no exchange kernel at all (every decode step a replay): ranks count as
#: EP ranks when their matched steps end together - |end - end of the first rank| at most this share
#: of the median step span in at least ``EP_STEP_SHARE`` of the matched steps. Basis: EP ranks meet in
#: the dispatch/combine all-to-all of every MoE layer, so no rank's step can end before the slowest
#: rank's last combine (DeepEP ``low_latency_dispatch/combine``; vLLM ``coordinate_batch_across_dp`` keeps
#: DP ranks in lock-step with dummy batches). 0.1: ``FusionConfig.rank_align``, the same tolerance the
#: fusion stage uses to call views ranks of one engine. Independent engines drift by whole steps.
CO_TERMINATE = 0.1
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


def _ep_ranks(steps: pd.DataFrame, visible_only: bool) -> list | None:
    """Row indices per rank of a multi-rank EP export, or None when the ranks are not EP ranks.

    Every rank must exchange (EP kernels) in >= ``EP_STEP_SHARE`` of its steps - of the steps whose
    kernels the trace shows, with ``visible_only`` (graph-level traces hide the kernels of replays;
    then >= ``EP_MIN_VISIBLE`` visible exchanging steps are required) - and the steps must be the
    engine's (ranges, sync pattern): GPU-gap windows do not correspond across ranks."""
    groups = list(steps.groupby("group").groups.items())
    if len(groups) < 2 or (steps["step_source"] == "gap").any():
        return None
    ixs = [ix for _, ix in groups]
    for _, ix in groups:
        g = steps.loc[ix]
        if visible_only:
            g = g[g["opaque_ns"] <= 0]
            if (g["ep_kernels"] > 0).sum() < EP_MIN_VISIBLE:
                # every step hidden in replays: only co-terminating steps show the ranks meet
                return ixs if visible_only and _no_exchange_visible(steps) and co_terminating(steps, ixs) else None
        if not len(g) or (g["ep_kernels"] > 0).mean() < EP_STEP_SHARE:
            return None
    return ixs


def _no_exchange_visible(steps: pd.DataFrame) -> bool:
    """No eager step of any rank shows kernels without an exchange among them: ranks whose visible
    steps run kernels but never exchange are not EP ranks (tensor-parallel or unrelated processes)."""
    kernels = steps["gpu_kernels"] if "gpu_kernels" in steps else steps["ep_kernels"]
    vis = (steps["opaque_ns"] <= 0) & (kernels > 0)
    return not (vis & (steps["ep_kernels"] <= 0)).any()


def co_terminating(steps: pd.DataFrame, groups: list) -> bool:
    """The ranks' matched steps end together (``CO_TERMINATE``; step counts must agree)."""
    pos = [steps.index.get_indexer(ix) for ix in groups]
    if len({len(p) for p in pos}) != 1 or len(pos[0]) < EP_MIN_VISIBLE:
        return False
    start, end = steps["gpu_start_ns"].to_numpy(dtype="float64"), steps["gpu_end_ns"].to_numpy(dtype="float64")
    pos = [p[np.argsort(start[p], kind="stable")] for p in pos]
    span = np.nanmedian(end[pos[0]] - start[pos[0]])
    if not np.isfinite(span) or span <= 0:
        return False
    close = np.ones(len(pos[0]), bool)
    for p in pos[1:]:
        close &= np.abs(end[p] - end[pos[0]]) <= CO_TERMINATE * span
    return bool(close.mean() >= EP_STEP_SHARE)


def _matched_ratio(steps: pd.DataFrame, groups: list, value: np.ndarray, two_sided: bool = False) -> np.ndarray:
    """Per row: the largest rank's ``value`` over the (lower) median rank's in its matched step;
    ``two_sided``: the rank farthest from the median either way (largest/median or median/smallest).

    Steps are matched across processes by order when every process has the same count, else by
    nearest GPU start time against the first process; NaN where any rank's value is missing."""
    pos = [steps.index.get_indexer(ix) for ix in groups]
    pos = [p[np.argsort(steps["gpu_start_ns"].to_numpy()[p], kind="stable")] for p in pos]
    ref = pos[0]
    n = len(ref)
    if all(len(p) == n for p in pos):
        match = [np.arange(n) for _ in pos]
    else:
        rs = steps["gpu_start_ns"].to_numpy()[ref]
        match = [np.clip(np.searchsorted(rs, steps["gpu_start_ns"].to_numpy()[p]), 0, n - 1) for p in pos]
    table = np.full((len(pos), n), np.nan)
    for r, (p, m) in enumerate(zip(pos, match)):
        table[r, m] = value[p]
    srt = np.sort(table, axis=0)
    cnt = np.sum(~np.isnan(table), axis=0)
    med = srt[np.maximum((cnt - 1) // 2, 0), np.arange(n)]
    with np.errstate(invalid="ignore", divide="ignore"):
        ratio = np.where(cnt == len(pos), np.nanmax(np.where(np.isnan(table), -np.inf, table), axis=0) / med, np.nan)
        if two_sided:
            low = med / np.nanmin(np.where(np.isnan(table), np.inf, table), axis=0)
            ratio = np.where(cnt == len(pos), np.maximum(ratio, low), np.nan)
    out = np.full(len(steps), np.nan)
    for p, m in zip(pos, match):
        out[p] = ratio[m]
    return out


def rank_skew(steps: pd.DataFrame) -> None:
    """Multi-process exports of EP ranks: slowest rank's compute time over the (lower) median rank's, per step.

    Only for steps an engine marked (ranges) or the sync pattern found, of ranks that exchange
    in most steps. A graph-level trace hides the compute inside replayed graphs: NaN there.
    """
    steps["rank_skew"] = np.nan
    groups = _ep_ranks(steps, visible_only=False)
    if groups is None:
        return
    compute = np.where(steps["opaque_ns"] > 0, np.nan, steps["gpu_kernel_ns"] - steps["comm_ns"]).astype("float64")
    steps["rank_skew"] = _matched_ratio(steps, groups, compute)


def sm_rank_skew(steps: pd.DataFrame) -> None:
    """``rank_sm_skew``: where the compute hides inside replayed graphs (``rank_skew`` NaN), the
    rank whose SM-busy time (mean SMs-active over the step's GPU window x its span) stands farthest from
    the (lower) median rank's for the matched step, as a ratio >= 1 (largest/median or median/smallest);
    NaN elsewhere and when there is no ``sm_active``. Ranks are EP ranks by their visible exchange
    kernels or, where every step is a replay, by co-terminating steps (:func:`co_terminating`).

    Why it carries skew: EP ranks meet in every all-to-all, so their steps end together; the hot
    rank spends the wait computing on (nearly) all SMs while the others wait inside the
    dispatch/combine kernel, which keeps only its own CTAs resident (NCCL: one per channel, DeepEP
    normal mode: ``num_sms`` ~20). NaN where the ranks began the step apart (a late host, not experts).
    """
    steps["rank_sm_skew"] = np.nan
    if "sm_active" not in steps or steps["sm_active"].isna().all():
        return
    groups = _ep_ranks(steps, visible_only=True)
    if groups is None:
        return
    span = (steps["gpu_end_ns"] - steps["gpu_start_ns"]).to_numpy(dtype="float64")
    busy = steps["sm_active"].to_numpy(dtype="float64") * np.where(span > 0, span, np.nan)
    # two-sided: with more than two ranks the odd one out may be the hot rank (fewer SM-busy time when the
    # waiting ranks' low-latency all-to-all keeps ~all SMs resident) or a waiting rank (NCCL / DeepEP normal
    # mode: ~20 of 132 SMs) - the asymmetry, not its sign, carries the skew; with two ranks both readings agree
    ratio = _matched_ratio(steps, groups, busy, two_sided=True)
    # only where some rank's matched step replayed a graph (NaN marks it, so the match is NaN) and
    # no kernel-level skew exists: eager steps show their kernels and need no proxy
    visible = ~np.isnan(_matched_ratio(steps, groups, np.where(steps["opaque_ns"] > 0, np.nan, 1.0)))
    kernel_level = steps["rank_skew"].notna().to_numpy() if "rank_skew" in steps else np.zeros(len(steps), bool)
    # ranks that began the step at different times: the late rank's host launched late (a host stall the
    # others waited out in the all-to-all), so the SM-busy asymmetry says nothing about its experts
    late = _start_spread_ns(steps, groups) > CO_TERMINATE * np.where(span > 0, span, np.nan)
    steps["rank_sm_skew"] = np.where(visible | kernel_level | late, np.nan, ratio)


def _start_spread_ns(steps: pd.DataFrame, groups: list) -> np.ndarray:
    """Per row: latest minus earliest GPU start of its matched step across the ranks (NaN unmatched)."""
    return _matched_range(steps, groups, steps["gpu_start_ns"].to_numpy(dtype="float64"))


def _matched_range(steps: pd.DataFrame, groups: list, value: np.ndarray) -> np.ndarray:
    """Per row: largest minus smallest ``value`` of its matched step across the ranks (steps matched by
    order of GPU start; NaN when the ranks' step counts differ or any rank's value is NaN)."""
    start = steps["gpu_start_ns"].to_numpy(dtype="float64")
    pos = [steps.index.get_indexer(ix) for ix in groups]
    pos = [p[np.argsort(start[p], kind="stable")] for p in pos]
    n = len(pos[0])
    out = np.full(len(steps), np.nan)
    if not all(len(p) == n for p in pos):
        return out
    table = np.stack([value[p] for p in pos])
    spread = table.max(axis=0) - table.min(axis=0)
    for p in pos:
        out[p] = spread
    return out


def rank_comm_spread(steps: pd.DataFrame) -> None:
    """``rank_comm_spread``: per matched step of EP ranks, the largest minus the smallest rank's exchange-kernel
    share of its GPU span, where every rank's kernels are visible (eager steps; node-level traces). A rank
    waiting long inside dispatch/combine while another computes its experts spreads it (DeepEP / NCCL
    all-to-all end when the last rank arrives); NaN elsewhere. Evidence context, not yet a rule input."""
    steps["rank_comm_spread"] = np.nan
    groups = _ep_ranks(steps, visible_only=False)
    if groups is None:
        return
    span = (steps["gpu_end_ns"] - steps["gpu_start_ns"]).to_numpy(dtype="float64")
    share = np.where((steps["opaque_ns"] > 0) | ~(span > 0), np.nan, steps["comm_ns"] / np.where(span > 0, span, 1.0))
    steps["rank_comm_spread"] = _matched_range(steps, groups, share.astype("float64"))


def ep_ranks_basis(steps: pd.DataFrame) -> str | None:
    """How the processes were found to be EP ranks: ``exchange-kernels`` (visible exchanges in their steps),
    ``co-terminating`` (every step a replay; matched steps end together), or None (not EP ranks)."""
    if _ep_ranks(steps, visible_only=False) is not None:
        return "exchange-kernels"
    groups = _ep_ranks(steps, visible_only=True)
    if groups is None:
        return None
    vis = steps[steps["opaque_ns"] <= 0]
    return "exchange-kernels" if all((vis.loc[vis.index.intersection(ix), "ep_kernels"] > 0).sum() >= EP_MIN_VISIBLE
                                     for ix in groups) else "co-terminating"
