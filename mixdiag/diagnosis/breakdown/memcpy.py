"""Copy volume and bandwidth per rank, step class, direction (H2D, D2H, D2D, P2P, other) and stream.

``bandwidth_gb_per_s`` = bytes / the copies' summed device time / 1e9: the rate the copies achieved
while they ran (Nsight's ``cuda_gpu_mem_size_sum`` / ``cuda_gpu_mem_time_sum`` pair), not bytes over
the wall time.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from mixdiag.diagnosis.breakdown.classes import StepIndex, class_steps
from mixdiag.diagnosis.breakdown.ranks import RankView

MEMCPY_COLUMNS = ["instance", "rank", "step_class", "direction", "stream", "copies", "bytes", "time_s",
                  "bandwidth_gb_per_s"]


def copies(views: list[RankView], member: np.ndarray, is_copy: np.ndarray, direction: np.ndarray,
           labels: list[str], stream: np.ndarray, nbytes: np.ndarray, class_names: tuple[str, ...]) -> pd.DataFrame:
    """``direction``: the copy-kind code per activity row, into ``labels``; the rest row-aligned with the
    activity. Copies are few next to kernels: only their rows are grouped."""
    out = []
    steps_of = class_steps(member)
    for rv in views:
        sel = is_copy[rv.rows]
        if not sel.any():
            continue
        rows = rv.rows[sel]
        # one group per (direction, stream), then per (step, group): a small table each class reads
        grp, groups = pd.factorize(direction[rows].astype(np.int64) << 32 | (stream[rows].astype(np.int64) & 0xFFFFFFFF),
                                   sort=True)
        ng = len(groups)
        key = (rv.step_row[sel].astype(np.int64) + 1) * ng + grp
        ids, uniq = pd.factorize(key)
        agg = [np.bincount(ids, w, minlength=len(uniq)) for w in
               (None, nbytes[rows].astype("float64"), (rv.end[sel] - rv.start[sel]).astype("float64"))]
        g_of, srow = uniq % ng, uniq // ng - 1
        index = StepIndex(srow, member.shape[0])
        for c, cname in enumerate(class_names):
            if not rv.has_class[c]:
                continue
            # counts, bytes and ns are integers: the sums are exact whatever order the rows are read in
            m = slice(None) if c == 0 else index.rows_of(steps_of[c])
            if c and not len(m):
                continue
            n, b, t = (np.bincount(g_of[m], a[m], minlength=ng) for a in agg)
            for gi in np.flatnonzero(n > 0):
                d, st = int(groups[gi]) >> 32, np.int32(int(groups[gi]) & 0xFFFFFFFF)  # stream ids may be -1
                out.append((rv.instance, rv.device, cname, labels[int(d)], int(st), int(n[gi]), int(b[gi]), t[gi] / 1e9,
                            b[gi] / t[gi] if t[gi] > 0 else np.nan))  # bytes per ns = GB/s
    return pd.DataFrame(out, columns=MEMCPY_COLUMNS)
