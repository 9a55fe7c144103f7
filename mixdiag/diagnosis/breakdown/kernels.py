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

from mixdiag.diagnosis.breakdown.ranks import RankView

KERNEL_COLUMNS = ["instance", "rank", "step_class", "kernel", "time_s", "calls", "share"]
GRAPH_NAME = "(CUDA graph replay: kernels not traced)"


def per_step_name(code: np.ndarray, step_row: np.ndarray, dur: np.ndarray, n_codes: int):
    """Rows summed per (step row, code): (code, step row, summed duration ns, rows) - a few thousand
    entries instead of millions of kernels, so each class reads the small table."""
    key = (step_row.astype(np.int64) + 1) * n_codes + code
    ids, uniq = pd.factorize(key, sort=False)
    t = np.bincount(ids, dur.astype("float64"), minlength=len(uniq))
    n = np.bincount(ids, minlength=len(uniq)).astype("float64")
    return uniq % n_codes, uniq // n_codes - 1, t, n


class StepIndex:
    """Rows of a per-step table grouped by step row, so a class reads only its own steps' rows.

    ``srow``: the step row of each table row (-1 none). Built once per rank: the classes (one per
    episode, hundreds of them) then cost their own rows each, not a pass over the whole table."""

    def __init__(self, srow: np.ndarray, n_steps: int):
        self.order = np.argsort(srow, kind="stable")
        self.bounds = np.searchsorted(srow[self.order], np.arange(-1, n_steps + 1), side="left")

    def rows_of(self, steps: np.ndarray) -> np.ndarray:
        """Table rows whose step row is in ``steps`` (sorted, distinct), in table order per step."""
        lo, hi = self.bounds[steps + 1], self.bounds[steps + 2]
        n = hi - lo
        total = int(n.sum())
        if not total:
            return np.zeros(0, dtype=np.int64)
        shift = np.repeat(lo - np.concatenate([[0], np.cumsum(n)[:-1]]), n)
        return self.order[shift + np.arange(total)]


def class_steps(member: np.ndarray) -> list[np.ndarray]:
    """Step rows of each class (``member``: (n_steps, n_classes) bool)."""
    return [np.flatnonzero(member[:, c]) for c in range(member.shape[1])]


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
        code, srow, dur, cnt = per_step_name(np.where(k[sel] == 1, n_names - 1, name_code[rv.rows][sel]),
                                             rv.step_row[sel], (rv.end - rv.start)[sel], n_names)
        index = StepIndex(srow, member.shape[0])
        for c, cname in enumerate(class_names):
            if not rv.win_member[:, c].any():
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
