"""Episodes inside episodes: a stretch of an episode where another cause carries most of each row's excess is
an episode of that cause too.

Why: an episode is one elevated stretch against the healthy reference, named by the cause that carries most of
its excess (decomposition.py). Faults overlap - a 60-step host stall inside a 300-step graph fallback, a mixing
stream inside an EP hotspot - and the shorter one vanished into the longer one's name, though its rows' own
split (measured evidence per row: the host gap, the prompt tokens of a mixed step, ...) says what slowed them.
A run of rows whose largest cause (at least ``NAME_SHARE`` of the row's excess) is the same other cause, at least
``RegimeConfig.min_rows`` long (gaps of ``merge_gap_rows`` bridged, as for episodes), is reported as an episode of
its own, overlapping its parent; its ``why`` names the parent."""
from __future__ import annotations

import numpy as np

from mixdiag.diagnosis.config import RegimeConfig


def row_causes(parts: np.ndarray, name_share: float) -> np.ndarray:
    """Per row, the index of the cause (a column of ``parts`` but the last, unknown) that carries at least
    ``name_share`` of the row's excess and more than any other; -1 where none does."""
    total = parts.sum(axis=1)
    named = parts[:, :-1]
    best = named.argmax(axis=1) if named.shape[1] else np.zeros(len(parts), dtype=int)
    top = named.max(axis=1) if named.shape[1] else np.zeros(len(parts))
    with np.errstate(invalid="ignore", divide="ignore"):
        ok = (total > 0) & (top >= name_share * total) & (top > 0)
    return np.where(ok, best, -1)


def nested_runs(parts: np.ndarray, a: int, b: int, parent: int, name_share: float,
                cfg: RegimeConfig = RegimeConfig()) -> list[tuple[int, int, int]]:
    """(start, end inclusive, cause index) of the runs inside rows ``a..b`` of ``parts`` (rows x causes +
    unknown, token-seconds) where a cause other than ``parent`` (an index; -1 for an unknown parent) leads
    each row, at least ``cfg.min_rows`` rows long across gaps of at most ``cfg.merge_gap_rows``."""
    lead = row_causes(parts[a:b + 1], name_share)
    out = []
    for k in np.unique(lead):
        if k < 0 or k == parent:
            continue
        idx = np.flatnonzero(lead == k)
        start = prev = int(idx[0])
        for i in idx[1:].tolist() + [None]:
            if i is not None and i - prev - 1 <= cfg.merge_gap_rows:
                prev = i
                continue
            if prev - start + 1 >= cfg.min_rows:
                out.append((a + start, a + prev, int(k)))
            if i is not None:
                start = prev = i
    return sorted(out)
