"""GPU utilisation and the idle time split per rank and step class.

Definitions (per device, every stream together; basis: HTA's idle-time breakdown, hta.readthedocs.io
"Idle Time Breakdown", whose categories are host wait, kernel wait and other):

* busy: time any device work runs (kernels, graph replays, copies) - the union of their intervals;
  utilisation = busy / wall, wall = the class's windows (:mod:`.ranks`).
* idle: wall - busy, made of the gaps between busy stretches. For a gap ``[g0, g1)`` let ``L`` be the
  earliest launch-call start among the work that starts at or after ``g1`` (the runtime call that
  issued it, joined by correlation id):
  - host wait = ``[g0, min(L, g1))``: no launch was pending, the GPU waited for the CPU to issue one
    (a gap after a synchronize is of this kind: the CPU issues nothing until the GPU drained);
  - kernel wait = ``[max(L, g0), g1)``: a launch was already issued and the GPU had not started it
    (launch latency, a stream or event dependency);
  - other = the whole gap when the work after it has no launch call in the trace (no runtime table,
    a lost correlation): the split cannot be told.
  HTA instead calls a gap kernel wait only below a fixed 30 ns and the rest of the issued-launch gaps
  "other"; here every gap with a known launch is split by when the launch was issued.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from mixdiag.diagnosis.breakdown.intervals import Segments, measure
from mixdiag.diagnosis.breakdown.ranks import RankView

UTILISATION_COLUMNS = ["instance", "rank", "step_class", "steps", "wall_s", "busy_s", "utilisation", "idle_s",
                       "host_wait_s", "kernel_wait_s", "other_idle_s"]


def idle_segments(rv: RankView) -> tuple[Segments, Segments, Segments]:
    """(host wait, kernel wait, other) segments of one device (see the module doc)."""
    b = rv.busy
    z = np.zeros(0, dtype=np.int64)
    if len(b.start) < 2:
        return Segments(z, z), Segments(z, z), Segments(z, z)
    g0, g1 = b.end[:-1], b.start[1:]
    # earliest known launch among the work starting at or after each gap's end (suffix minimum)
    big = np.iinfo(np.int64).max
    lk = np.where(rv.launch_known, rv.launch, big)
    suffix = np.minimum.accumulate(lk[::-1])[::-1]
    nxt = np.searchsorted(rv.start, g1, side="left")
    pending = suffix[nxt]
    known = rv.launch_known[nxt] | (pending <= g0)
    cut = np.clip(pending, g0, g1)
    host = Segments(g0[known], cut[known])
    kern = Segments(cut[known], g1[known])
    other = Segments(g0[~known], g1[~known])
    return host, kern, other


def utilisation(views: list[RankView], class_names: tuple[str, ...]) -> pd.DataFrame:
    """One row per rank and class with steps: wall, busy, utilisation and the idle split (seconds)."""
    rows = []
    for rv in views:
        wall = (rv.win_hi - rv.win_lo).astype("float64")
        busy = measure(rv.busy, rv.win_lo, rv.win_hi)
        parts = [measure(s, rv.win_lo, rv.win_hi) for s in idle_segments(rv)]
        per = [rv.per_class(v) / 1e9 for v in (wall, busy, *parts)]
        steps = rv.win_member[:-1].sum(axis=0)
        steps[0] = len(rv.win_lo) - 1  # 'all': every step window (its own window is the span)
        for c, name in enumerate(class_names):
            if not rv.has_class[c]:
                continue
            w, bz, h, k, o = (float(p[c]) for p in per)
            rows.append((rv.instance, rv.device, name, int(steps[c]), w, bz, bz / w if w > 0 else np.nan,
                         max(w - bz, 0.0), h, k, o))
    return pd.DataFrame(rows, columns=UTILISATION_COLUMNS)
