"""Top kernels by device time per rank and step class, with their share of the class's kernel time.

``time_s`` is the sum of the kernel's durations (not a union: two streams running the same kernel
count twice, as Nsight's ``cuda_gpu_kern_sum`` does); ``share`` = time_s / the rank's kernel time in the
class. A CUDA-graph replay traced as one row is one entry, :data:`GRAPH_NAME`: its kernels are not in
the trace. The frame's columns (instance, rank, step_class, kernel, time_s, calls, share) are what
``mixdiag diff`` reads: keep them.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from mixdiag.diagnosis.breakdown.classes import StepIndex, class_steps
from mixdiag.diagnosis.breakdown.ranks import RankView

KERNEL_COLUMNS = ["instance", "rank", "step_class", "kernel", "time_s", "calls", "share"]
GRAPH_NAME = "(CUDA graph replay: kernels not traced)"


def per_step_name(code: np.ndarray, step_row: np.ndarray, dur: np.ndarray, n_codes: int):
    """Rows summed per (step row, code): (code, step row, summed duration ns, rows) - a few thousand
    entries instead of millions of kernels, so each class reads the small table."""
    key = (step_row.astype(np.int64) + 1) * n_codes + code
    span = (int(step_row.max()) + 2) * n_codes if len(key) else 0
    if span <= 2 * len(key) + 1024:
        # (step, name) pairs fill a small grid: count into it directly, no hashing of millions of keys
        n = np.bincount(key, minlength=span)
        uniq = np.flatnonzero(n)
        t = np.bincount(key, dur.astype("float64"), minlength=span)[uniq]
        n = n[uniq].astype("float64")
    else:
        ids, uniq = pd.factorize(key, sort=False)
        t = np.bincount(ids, dur.astype("float64"), minlength=len(uniq))
        n = np.bincount(ids, minlength=len(uniq)).astype("float64")
    return uniq % n_codes, uniq // n_codes - 1, t, n


def top_kernels(views: list[RankView], member: np.ndarray, kind: np.ndarray, name_code: np.ndarray,
                names: list[str], class_names: tuple[str, ...], top: int) -> pd.DataFrame:
    """``member``: the step classes' membership (n_steps, n_classes); ``kind``: 0 kernel, 1 graph, 2+
    others; ``name_code``: index into ``names`` per activity row."""
    n_names = len(names) + 1  # the last code: graph replays
    labels = list(names) + [GRAPH_NAME]
    steps_of = class_steps(member)
    out = []
    for rv in views:
        k = kind[rv.rows]
        sel = k <= 1
        if not sel.any():
            continue
        code, srow, dur, cnt = per_step_name(np.where(k[sel] == 1, n_names - 1, name_code[rv.rows[sel]]),
                                             rv.step_row[sel], rv.end[sel] - rv.start[sel], n_names)
        index = StepIndex(srow, member.shape[0])
        for c, cname in enumerate(class_names):
            if not rv.has_class[c]:
                continue
            # durations are integer ns: the sums are exact whatever order the rows are read in
            m = slice(None) if c == 0 else index.rows_of(steps_of[c])
            if c and not len(m):
                continue
            t = np.bincount(code[m], dur[m], minlength=n_names)
            n = np.bincount(code[m], cnt[m], minlength=n_names).astype(np.int64)
            total = t.sum()
            best = np.argsort(-t, kind="stable")[:top]
            best = best[n[best] > 0]
            for b in best:
                out.append((rv.instance, rv.device, cname, labels[b], t[b] / 1e9, int(n[b]),
                            t[b] / total if total > 0 else np.nan))
    return pd.DataFrame(out, columns=KERNEL_COLUMNS)
