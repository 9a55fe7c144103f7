"""One device's timeline per rank (an instance's work on one GPU) and the windows its step classes cover.

A step's window on the device runs from where the device's earlier steps ended (the latest end of any
earlier step's work) to the end of its own last item: each step owns the idle time before it, so a
host stall between two steps counts against the step that waited (as ``device_idle_before_s`` does).
Steps ordered by their first item; a step whose work ended before the earlier ones did has an empty
window. The class ``all`` is one window over the device's whole span, work outside any step included.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import numpy as np
import pandas as pd

from mixdiag.device_activity import NO_LAUNCH
from mixdiag.diagnosis.breakdown.classes import StepClasses
from mixdiag.diagnosis.breakdown.intervals import Segments, union


@dataclass(frozen=True)
class RankView:
    """The rows of one (instance, device), sorted by device start, and its class windows."""

    instance: str
    device: int
    job: str
    rows: np.ndarray      # row positions in the activity frame, sorted by start
    start: np.ndarray     # ns, sorted
    end: np.ndarray
    launch: np.ndarray    # ns, NO_LAUNCH unknown
    step_row: np.ndarray  # StepClasses row of each item, -1 none
    busy: Segments        # union of all device work
    win_lo: np.ndarray    # class windows (ns); the last one is the whole span (class ``all``)
    win_hi: np.ndarray
    win_member: np.ndarray  # bool (n_windows, n_classes)
    win_step_row: np.ndarray  # StepClasses row per window, -1 for the span window

    @property
    def launch_known(self) -> np.ndarray:
        return self.launch != NO_LAUNCH

    @cached_property
    def has_class(self) -> np.ndarray:
        """Per class: whether any window of this device is in it (one pass, not one column scan per class)."""
        return self.win_member.any(axis=0)

    @cached_property
    def _membership(self) -> tuple[np.ndarray, np.ndarray]:
        """(window, class) index pairs of ``win_member``'s True cells: most classes (one per episode) hold a
        handful of windows, so a sum over the pairs is far cheaper than a dense (windows x classes) product."""
        return np.nonzero(self.win_member)

    def per_class(self, values: np.ndarray) -> np.ndarray:
        """Sum of a per-window value over each class's windows (float64; the values are integer
        nanoseconds, so the sum is exact in any order)."""
        win, cls = self._membership
        return np.bincount(cls, np.asarray(values, dtype="float64")[win], minlength=self.win_member.shape[1])


def rank_views(act: pd.DataFrame, classes: StepClasses) -> list[RankView]:
    """A :class:`RankView` per (instance, device) of the activity frame, in (instance, device) order."""
    if not len(act):
        return []
    inst_codes = act["instance"].cat.codes.to_numpy()
    inst_names = np.asarray(act["instance"].cat.categories.astype(str))
    dev = act["device"].to_numpy()
    start = act["t_start_ns"].to_numpy()
    end = act["t_end_ns"].to_numpy()
    launch = act["launch_ns"].to_numpy()
    jobs = act["job"].astype(str).to_numpy() if act["job"].nunique() > 1 else None
    job0 = str(act["job"].iloc[0])
    srow = classes.lookup(inst_codes, inst_names, act["step"].to_numpy())
    # one sort for every rank: by start, then stably by (instance, device)
    order = np.argsort(start, kind="stable")
    if inst_codes.min() == inst_codes.max() and dev.min() == dev.max():  # one rank: no key over every row
        bounds = np.zeros(1, dtype=np.int64)
    else:
        rank_key = inst_codes.astype(np.int64)[order] << 32 | (dev[order].astype(np.int64) & 0xFFFFFFFF)
        by_rank = np.argsort(rank_key, kind="stable")  # several ranks: group them
        order, rank_key = order[by_rank], rank_key[by_rank]
        bounds = np.flatnonzero(np.diff(rank_key, prepend=rank_key[0] - 1))
    out = []
    for i, lo in enumerate(bounds):
        hi = bounds[i + 1] if i + 1 < len(bounds) else len(order)
        rows = order[lo:hi]
        s, e, r = start[rows], end[rows], srow[rows]
        lo_w, hi_w, wrow = _step_windows(s, e, r)
        n_cls = len(classes.names)
        member = np.zeros((len(lo_w) + 1, n_cls), dtype=bool)
        if len(lo_w):
            member[:-1] = classes.member[wrow]
            member[:-1, 0] = False
        member[-1, 0] = True
        out.append(RankView(
            instance=str(inst_names[inst_codes[rows[0]]]), device=int(dev[rows[0]]),
            job=str(jobs[rows[0]]) if jobs is not None else job0, rows=rows, start=s, end=e, launch=launch[rows],
            step_row=r, busy=union(s, e), win_lo=np.append(lo_w, s.min()), win_hi=np.append(hi_w, e.max()),
            win_member=member, win_step_row=np.append(wrow, -1)))
    return out


def _step_windows(start: np.ndarray, end: np.ndarray, step_row: np.ndarray):
    """(lo, hi, step row) of the non-empty step windows of one device (see the module doc)."""
    has = step_row >= 0
    if not has.any():
        z = np.zeros(0, dtype=np.int64)
        return z, z, z
    # first start and last end per step row: a hash group-by (millions of rows, thousands of steps),
    # not a sort of the rows and unbuffered ufunc.at scatters; groups come out sorted by step row
    grouped = pd.DataFrame({"s": start[has], "e": end[has]}, copy=False).groupby(step_row[has], sort=True)
    mins = grouped["s"].min()
    first, rows = mins.to_numpy(dtype=np.int64), mins.index.to_numpy(dtype=np.int64)
    last = grouped["e"].max().to_numpy(dtype=np.int64)
    o = np.argsort(first, kind="stable")
    first, last, rows = first[o], last[o], rows[o]
    # from the end of the earlier steps' work (the first step: from its own start)
    lo = np.concatenate([[first[0]], np.maximum.accumulate(last)[:-1]])
    keep = last > lo
    return lo[keep], last[keep], rows[keep]
