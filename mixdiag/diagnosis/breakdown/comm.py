"""Communication time and its overlap with compute, per rank and step class.

comm: time any communication kernel (collective, all-to-all, dispatch/combine: the collector's
``role == "comm"``) runs on the device; compute: time any other kernel runs; overlap: time both run on
the same device at once (HTA's communication-computation overlap: the share of comm time during
which compute also ran, "Communication Computation Overlap" in hta.readthedocs.io). Graph replays
traced as one row (``role == "opaque"``) hide which of the two they hold: they count in neither, and
``opaque_s`` says how much time that is.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from mixdiag.diagnosis.breakdown.intervals import intersect, measure, union
from mixdiag.diagnosis.breakdown.ranks import RankView

COMM_COLUMNS = ["instance", "rank", "step_class", "comm_s", "compute_s", "overlap_s", "overlap_share", "opaque_s"]


def comm_overlap(views: list[RankView], role: np.ndarray, class_names: tuple[str, ...]) -> pd.DataFrame:
    """``role``: the activity frame's role codes (0 compute, 1 comm, 2 copy, 3 opaque), row-aligned."""
    rows = []
    for rv in views:
        r = role[rv.rows]
        if not (r == 1).any():
            continue  # no communication kernel on this device: nothing to say about overlap
        segs = {k: union(rv.start[r == k], rv.end[r == k]) for k in (0, 1, 3)}
        both = intersect(segs[0], segs[1])
        vals = [rv.per_class(measure(s, rv.win_lo, rv.win_hi)) / 1e9 for s in (segs[1], segs[0], both, segs[3])]
        for c, name in enumerate(class_names):
            if not rv.has_class[c]:
                continue
            cm, cp, ov, op = (float(v[c]) for v in vals)
            rows.append((rv.instance, rv.device, name, cm, cp, ov, ov / cm if cm > 0 else np.nan, op))
    return pd.DataFrame(rows, columns=COMM_COLUMNS)
