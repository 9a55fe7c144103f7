"""Copy volume and bandwidth per rank, step class, direction (H2D, D2H, D2D, P2P, other) and stream.

``bandwidth_gb_per_s`` = bytes / the copies' summed device time / 1e9: the rate the copies achieved
while they ran (Nsight's ``cuda_gpu_mem_size_sum`` / ``cuda_gpu_mem_time_sum`` pair), not bytes over
the wall time.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from mixdiag.diagnosis.breakdown.ranks import RankView

MEMCPY_COLUMNS = ["instance", "rank", "step_class", "direction", "stream", "copies", "bytes", "time_s",
                  "bandwidth_gb_per_s"]


def copies(views: list[RankView], member: np.ndarray, is_copy: np.ndarray, direction: np.ndarray,
           stream: np.ndarray, nbytes: np.ndarray, class_names: tuple[str, ...]) -> pd.DataFrame:
    """``direction``: the copy-kind label per activity row; the rest row-aligned with the activity."""
    frames = []
    for rv in views:
        sel = is_copy[rv.rows]
        if not sel.any():
            continue
        rows = rv.rows[sel]
        srow = rv.step_row[sel]
        base = pd.DataFrame({"direction": direction[rows], "stream": stream[rows], "bytes": nbytes[rows],
                             "dur": (rv.end - rv.start)[sel]})
        for c, cname in enumerate(class_names):
            if not rv.win_member[:, c].any():
                continue
            m = np.ones(len(rows), dtype=bool) if c == 0 else (srow >= 0) & member[np.maximum(srow, 0), c]
            if not m.any():
                continue
            g = base[m].groupby(["direction", "stream"], sort=True, observed=True).agg(
                copies=("bytes", "size"), bytes=("bytes", "sum"), dur=("dur", "sum")).reset_index()
            g.insert(0, "step_class", cname)
            g.insert(0, "rank", rv.device)
            g.insert(0, "instance", rv.instance)
            frames.append(g)
    if not frames:
        return pd.DataFrame(columns=MEMCPY_COLUMNS)
    out = pd.concat(frames, ignore_index=True)
    out["time_s"] = out.pop("dur") / 1e9
    out["bandwidth_gb_per_s"] = np.where(out["time_s"] > 0, out["bytes"] / out["time_s"].where(out["time_s"] > 0) / 1e9,
                                         np.nan)
    out["direction"] = out["direction"].astype(str)
    return out[MEMCPY_COLUMNS]
