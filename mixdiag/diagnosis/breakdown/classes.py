"""Classes of steps the breakdown is computed for, from the diagnosis result: ``all`` (the whole capture
on the device), ``decode``, ``mixed``, ``prefill`` (prefill-only), ``spike`` (the diagnosis's spike steps)
and ``episode N`` (the steps of each episode of :mod:`~mixdiag.diagnosis.detection.regimes`). A step can
sit in several classes (a decode step that spiked inside an episode is in three).

Kinds come from the Timeline (measured or inferred by the collector); a step of kind ``unknown`` is in
no kind class, so a capture whose kinds cannot be told shows ``all``, ``spike`` and episodes only.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

ALL = "all"
KIND_CLASSES = {"decode": "decode", "mixed": "mixed", "prefill": "prefill"}  # Timeline kind -> class


@dataclass(frozen=True)
class StepClasses:
    """Steps of every instance (``instance``, ``step`` sorted) and their class membership.

    ``member[i, c]``: step row ``i`` is in class ``names[c]``; ``names[0]`` is ``all``.
    """

    instance: np.ndarray  # str per step row
    step: np.ndarray      # int64 per step row
    names: tuple[str, ...]
    member: np.ndarray    # bool (n_steps, n_classes)
    #: per step row: found by the engine's own marks (ranges, the sync pattern, records), so step n of
    #: one rank is step n of another; False for steps split on GPU idle gaps (``step_source == "gap"``)
    matchable: np.ndarray

    def lookup(self, inst_codes: np.ndarray, inst_names, step: np.ndarray) -> np.ndarray:
        """Row of each ``(instance, step)`` pair, -1 when the diagnosis has no such step; instances given
        as codes into ``inst_names`` (a categorical's), so no string is compared per row."""
        out = np.full(len(step), -1, dtype=np.int64)
        if not len(self.step) or not len(step):
            return out
        names, codes = np.unique(self.instance, return_inverse=True)
        key = codes.astype(np.int64) << 40 | (self.step & ((1 << 40) - 1))
        order = np.argsort(key, kind="stable")
        pos = {n: i for i, n in enumerate(names)}
        table = np.array([pos.get(str(n), -1) for n in inst_names] + [-1], dtype=np.int64)
        q_code = table[inst_codes]  # code -1 (missing) reads the sentinel
        lo, span = int(self.step.min()), int(self.step.max()) - int(self.step.min()) + 1
        if len(names) * span <= 4 * len(key) + 1024 and len(np.unique(key)) == len(key):
            # step numbers run densely (the usual case): a direct table, one gather per row, no hashing
            dense = np.full(len(names) * span + 1, -1, dtype=np.int64)  # the last cell: not found
            dense[codes.astype(np.int64) * span + (self.step - lo)] = np.arange(len(key))
            ok = (q_code >= 0) & (step >= 0) & (step >= lo) & (step < lo + span)
            return dense[np.where(ok, q_code * span + (step - lo), len(dense) - 1)]
        q = np.where((q_code >= 0) & (step >= 0), q_code << 40 | (step & ((1 << 40) - 1)), -1)
        ids, uq = pd.factorize(q)  # millions of rows, a few thousand distinct steps: search those only
        pos = np.clip(np.searchsorted(key[order], uq), 0, len(order) - 1)
        got = np.where((uq >= 0) & (key[order][pos] == uq), order[pos], -1)
        return got[ids]


def step_classes(steps: pd.DataFrame, episodes: pd.DataFrame | None) -> StepClasses:
    """Membership of every step row of the diagnosis (``steps``: instance, step, kind, is_spike,
    granularity; ``episodes``: instance, episode, step_start, step_end) in each class."""
    st = steps[steps["granularity"] == "step"] if "granularity" in steps else steps
    inst = st["instance"].astype(str).to_numpy()
    step = st["step"].to_numpy(dtype=np.int64)
    kind = st["kind"].astype(str).to_numpy()
    cols = [np.ones(len(st), dtype=bool)]
    names = [ALL]
    for k, label in KIND_CLASSES.items():
        cols.append(kind == k)
        names.append(label)
    spike = st["is_spike"].fillna(False).to_numpy(dtype=bool) if "is_spike" in st else np.zeros(len(st), bool)
    cols.append(spike)
    names.append("spike")
    if episodes is not None and len(episodes):
        # instances as integer codes: hundreds of episodes x thousands of steps compare ints, not strings
        inst_names, inst_code = np.unique(inst, return_inverse=True)
        code_of = {n: i for i, n in enumerate(inst_names)}
        for ep in episodes.itertuples(index=False):  # one column per episode (a handful), not per step
            m = (inst_code == code_of.get(str(ep.instance), -1)) & (step >= int(ep.step_start)) & (step <= int(ep.step_end))
            if m.any():
                cols.append(m)
                names.append(f"episode {int(ep.episode)}")  # rows carry their instance
    src = st["step_source"].astype(str).to_numpy() if "step_source" in st else np.full(len(st), "")
    return StepClasses(inst, step, tuple(names), np.stack(cols, axis=1), src != "gap")


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
    by_class = np.ascontiguousarray(member.T)  # one transpose, not a strided copy per class
    return [np.flatnonzero(row) for row in by_class]
