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
from mixdiag.diagnosis.detection.regimes import merged_runs


def row_causes(parts: np.ndarray, name_share: float) -> np.ndarray:
    """Per row, the index of the cause (a column of ``parts`` but the last, unknown) that carries at least
    ``name_share`` of the row's excess and more than any other; -1 where none does."""
    total, named = parts.sum(axis=1), parts[:, :-1]
    top = named.max(axis=1)
    return np.where((top > 0) & (top >= name_share * total), named.argmax(axis=1), -1)


def nested_runs(parts: np.ndarray, a: int, b: int, parent: int, name_share: float,
                cfg: RegimeConfig = RegimeConfig()) -> list[tuple[int, int, int]]:
    """(start, end inclusive, cause index) of the runs inside rows ``a..b`` of ``parts`` (rows x causes +
    unknown, token-seconds) where a cause other than column ``parent`` leads each row, at least
    ``cfg.min_rows`` rows long across gaps of at most ``cfg.merge_gap_rows`` (as episodes are)."""
    lead = row_causes(parts[a:b + 1], name_share)
    return sorted((a + s, a + e, int(k)) for k in np.unique(lead) if k >= 0 and k != parent
                  for s, e in merged_runs(lead == k, cfg))
