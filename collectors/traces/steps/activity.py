"""The trace-format independent input of foreign-engine step reconstruction: column arrays of GPU
items, runtime calls and ranges (filled by ``nsys/activity.py`` and ``kineto/activity.py``)."""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pandas as pd

LAUNCH, GRAPH_LAUNCH, MEMCPY, SYNC = 0, 1, 2, 3
H2D, D2H = 1, 2


@dataclass
class Items:
    """GPU work items of one export. ``what``: 0 kernel, 1 graph row, 2 copy. Copies carry
    ``nbytes``/``kind``; kernels ``flags`` (bit 1 prefill family, 2 decode family, 4 comm, 8
    transfer kernel, 16 EP exchange) and ``graph`` (1 when replayed from a CUDA graph, node-level trace)."""

    grp: np.ndarray
    start: np.ndarray
    end: np.ndarray
    dev: np.ndarray
    stream: np.ndarray
    corr: np.ndarray
    what: np.ndarray
    nbytes: np.ndarray
    kind: np.ndarray
    flags: np.ndarray
    graph: np.ndarray


@dataclass
class Calls:
    """Runtime calls: ``what`` is LAUNCH, GRAPH_LAUNCH, MEMCPY or SYNC."""

    grp: np.ndarray
    tid: np.ndarray
    start: np.ndarray
    end: np.ndarray
    corr: np.ndarray
    what: np.ndarray


@dataclass
class Activity:
    items: Items
    calls: Calls | None
    ranges: pd.DataFrame            # grp, tid, start, end, name (step and transfer ranges only)
    notes: list[str] = field(default_factory=list)
    #: per item: index into ``names`` (kernels; -1 for others), kept for the device-activity frame
    item_name: np.ndarray | None = None
    names: dict | None = None       # name index -> kernel name
    #: per item, written by :func:`reconstruct`: the step (of its group, as numbered in the result), -1 none
    item_step: np.ndarray | None = None
