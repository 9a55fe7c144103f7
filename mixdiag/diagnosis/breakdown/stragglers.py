"""Straggler ranks: per step of a multi-rank job, the rank whose compute ran long while the others waited.

Basis: a collective (NCCL all-reduce, all-to-all, DeepEP dispatch/combine) completes only when every
rank has arrived, so the ranks that arrive early spend the difference inside the collective kernel
(HTA's straggler analysis looks for the rank whose communication kernels start late for the same
reason). Per matched step: each rank's compute time (kernels that are not communication) and comm time;
the straggler is the rank with the most compute when that is >= ``straggler_ratio`` x the (lower)
median rank's **and** the other ranks' median comm time exceeds the straggler's (they waited). A rank
whose step replayed a CUDA graph traced as one row hides its compute: that step is not judged.

Ranks are the (instance, device) pairs of one job (``job``: one capture) that run communication
kernels. Steps are matched across ranks by order when every rank has as many, else by nearest first
start against the first rank (as the collectors' rank skew does).
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from mixdiag.diagnosis.breakdown.classes import StepClasses
from mixdiag.diagnosis.breakdown.ranks import RankView

STRAGGLER_COLUMNS = ["job", "step", "t_s", "step_classes", "instance", "rank", "label", "compute_s",
                     "median_compute_s", "ratio", "kernel", "kernel_ratio", "waiting", "wait_s", "comm_kernel"]
SUMMARY_COLUMNS = ["job", "step_class", "instance", "rank", "label", "steps", "straggler_steps", "straggler_share"]


def _labels(views: list[RankView]) -> list[str]:
    devs = [v.device for v in views]
    if len(set(devs)) == len(devs):
        return [f"rank {d}" for d in devs]
    return [f"{v.instance} gpu{v.device}" for v in views]


def _per_step(rv: RankView, role: np.ndarray):
    """(step rows sorted by first start, first start, compute ns, comm ns, opaque ns) of one rank."""
    has = rv.step_row >= 0
    rows, inv = np.unique(rv.step_row[has], return_inverse=True)
    dur = (rv.end - rv.start)[has].astype("float64")
    r = role[rv.rows][has]
    first = np.full(len(rows), np.iinfo(np.int64).max)
    np.minimum.at(first, inv, rv.start[has])
    sums = [np.bincount(inv, np.where(r == k, dur, 0.0), minlength=len(rows)) for k in (0, 1, 3)]
    o = np.argsort(first, kind="stable")
    return rows[o], first[o], *(s[o] for s in sums), inv, o


def stragglers(views: list[RankView], role: np.ndarray, name_code: np.ndarray, names: list[str],
               classes: StepClasses, ratio_min: float):
    """(stragglers frame, summary frame, notes) over every job with >= 2 communicating ranks."""
    member, class_names = classes.member, classes.names
    out, summary = [], []
    jobs: dict[str, list[RankView]] = {}
    for rv in views:
        if (role[rv.rows] == 1).any():
            jobs.setdefault(rv.job, []).append(rv)
    notes = []
    for job, ranks in jobs.items():
        if len(ranks) < 2:
            continue
        if any(not classes.matchable[rv.step_row[rv.step_row >= 0]].all() for rv in ranks):
            notes.append(f"{job}: steps split on GPU idle gaps do not correspond across ranks: stragglers not judged")
            continue
        labels = _labels(ranks)
        per = [_per_step(rv, role) for rv in ranks]
        n = len(per[0][0])
        if n == 0 or any(len(p[0]) == 0 for p in per):
            continue
        if all(len(p[0]) == n for p in per):
            match = [np.arange(n) for _ in per]
        else:
            ref = per[0][1]
            match = [np.clip(np.searchsorted(ref, p[1]), 0, n - 1) for p in per]
        R = len(ranks)
        compute = np.full((R, n), np.nan)
        comm = np.full((R, n), np.nan)
        srow = np.full((R, n), -1, dtype=np.int64)
        for i, (p, m) in enumerate(zip(per, match)):
            compute[i, m] = np.where(p[4] > 0, np.nan, p[2])  # graph replays hide the compute
            comm[i, m] = p[3]
            srow[i, m] = p[0]
        ok = ~np.isnan(compute).any(axis=0) & ~np.isnan(comm).any(axis=0)
        med = np.sort(compute, axis=0)[(R - 1) // 2]
        top = np.argmax(np.where(np.isnan(compute), -np.inf, compute), axis=0)
        cols = np.arange(n)
        with np.errstate(invalid="ignore", divide="ignore"):
            ratio = compute[top, cols] / med
        others_comm = np.array([np.median(np.delete(comm[:, j], top[j])) for j in range(n)]) if R > 1 else comm[0]
        flag = ok & (ratio >= ratio_min) & (others_comm > comm[top, cols])
        in_class = np.zeros((n, len(class_names)), dtype=bool)
        for i in range(R):
            got = srow[i] >= 0
            in_class[got] |= member[srow[i][got]]
        in_class[:, 0] = True
        for c, cname in enumerate(class_names):  # straggler counts per rank and class
            cm = in_class[:, c] & ok
            if not cm.any():
                continue
            for i, rv in enumerate(ranks):
                k = int((flag & cm & (top == i)).sum())
                summary.append((job, cname, rv.instance, rv.device, labels[i], int(cm.sum()), k, k / cm.sum()))
        if not flag.any():
            continue
        kern, kratio = _excess_kernels(ranks, per, match, role, name_code, names, np.flatnonzero(flag), top, 0)
        comm_k, _ = _excess_kernels(ranks, per, match, role, name_code, names, np.flatnonzero(flag), top, 1)
        for j in np.flatnonzero(flag):
            s = top[j]
            rv = ranks[s]
            k = np.flatnonzero(match[s] == j)[0]
            step_no, t_s = int(classes.step[per[s][0][k]]), per[s][1][k] / 1e9
            waiting = ", ".join(labels[i] for i in range(R) if i != s and comm[i, j] > comm[s, j])  # those that waited
            out.append((job, step_no, t_s, ", ".join(n_ for c, n_ in enumerate(class_names) if in_class[j, c]),
                        rv.instance, rv.device, labels[s], compute[s, j] / 1e9, med[j] / 1e9, float(ratio[j]),
                        kern.get(j, ""), kratio.get(j, np.nan), waiting,
                        float(others_comm[j] - comm[s, j]) / 1e9, comm_k.get(j, "")))
    frame = pd.DataFrame(out, columns=STRAGGLER_COLUMNS)
    return frame, pd.DataFrame(summary, columns=SUMMARY_COLUMNS), notes


def _excess_kernels(ranks, per, match, role, name_code, names, steps, top, want_role):
    """Per flagged matched step: for compute (``want_role`` 0) the straggler's kernel with the largest
    excess over the other ranks' median time of the same kernel, and its ratio; for comm (1) the
    communication kernel the other ranks spent the most time in."""
    flagged = np.zeros(len(per[0][0]) if len(per) else 0, dtype=bool)
    flagged[steps] = True
    parts = []
    for i, (rv, p, m) in enumerate(zip(ranks, per, match)):
        has = np.flatnonzero(rv.step_row >= 0)
        pos = np.empty(len(p[0]), dtype=np.int64)
        pos[p[6]] = np.arange(len(p[0]))  # unique-row index -> position in first-start order
        mj = m[pos[p[5]]]                 # matched step of each item with a step
        r = role[rv.rows][has]
        keep = (r == want_role) & flagged[mj]
        if keep.any():
            parts.append(pd.DataFrame({"m": mj[keep], "rank": i, "code": name_code[rv.rows][has][keep],
                                       "dur": (rv.end - rv.start)[has][keep].astype("float64")}))
    if not parts:
        return {}, {}
    t = pd.concat(parts).groupby(["m", "code", "rank"])["dur"].sum().unstack("rank", fill_value=0.0)
    t = t.reindex(columns=range(len(ranks)), fill_value=0.0)
    mat = t.to_numpy()
    m_idx = t.index.get_level_values("m").to_numpy()
    codes = t.index.get_level_values("code").to_numpy()
    strag = top[m_idx]
    own = mat[np.arange(len(mat)), strag]
    masked = mat.copy()
    masked[np.arange(len(mat)), strag] = np.nan
    others = np.nanmedian(masked, axis=1) if mat.shape[1] > 1 else np.zeros(len(mat))
    score = own - others if want_role == 0 else np.nansum(masked, axis=1)
    df = pd.DataFrame({"m": m_idx, "code": codes, "score": score, "own": own, "others": others})
    best = df.loc[df.groupby("m")["score"].idxmax()]
    kern = {int(r.m): names[int(r.code)] if 0 <= int(r.code) < len(names) else "" for r in best.itertuples()}
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = {int(r.m): float(r.own / r.others) if r.others > 0 else np.inf for r in best.itertuples()}
    return kern, ratio
