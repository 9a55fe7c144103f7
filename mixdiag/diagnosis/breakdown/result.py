"""The breakdown's typed result: one frame per concept (units in the column names) and what limits it."""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from mixdiag.diagnosis.breakdown.comm import COMM_COLUMNS
from mixdiag.diagnosis.breakdown.idle import UTILISATION_COLUMNS
from mixdiag.diagnosis.breakdown.kernels import KERNEL_COLUMNS
from mixdiag.diagnosis.breakdown.memcpy import MEMCPY_COLUMNS
from mixdiag.diagnosis.breakdown.stragglers import STRAGGLER_COLUMNS, SUMMARY_COLUMNS

NO_DEVICE_ACTIVITY = ("no device activity: the inputs hold no GPU kernels, copies or graph replays (a CPU-only "
                      "trace, or sources that are not traces: logs, scrapes, client records)")


def _frame(cols: list[str]) -> pd.DataFrame:
    return pd.DataFrame(columns=cols)


@dataclass(frozen=True)
class Breakdown:
    """Per instance, rank (device id) and step class: ``kernels`` (top kernels), ``utilisation`` (busy,
    idle split), ``comm`` (communication and its overlap with compute), ``memcpy`` (by direction and
    stream), ``stragglers`` (one row per step a rank straggled) and ``straggler_summary``.

    ``status``: ``ok`` or ``no_device_activity``; ``notes``: what limits the numbers (partial data).
    """

    kernels: pd.DataFrame = field(default_factory=lambda: _frame(KERNEL_COLUMNS))
    utilisation: pd.DataFrame = field(default_factory=lambda: _frame(UTILISATION_COLUMNS))
    comm: pd.DataFrame = field(default_factory=lambda: _frame(COMM_COLUMNS))
    memcpy: pd.DataFrame = field(default_factory=lambda: _frame(MEMCPY_COLUMNS))
    stragglers: pd.DataFrame = field(default_factory=lambda: _frame(STRAGGLER_COLUMNS))
    straggler_summary: pd.DataFrame = field(default_factory=lambda: _frame(SUMMARY_COLUMNS))
    status: str = "no_device_activity"
    notes: tuple[str, ...] = (NO_DEVICE_ACTIVITY,)
    partial: bool = False

    @property
    def has_device_activity(self) -> bool:
        return self.status == "ok"

    def to_json(self) -> dict:
        """The ``breakdown`` key of ``mixdiag analyze --json`` (docs/analyze.md)."""
        return {"status": self.status, "partial": self.partial, "notes": list(self.notes),
                **{name: records(getattr(self, name)) for name in
                   ("utilisation", "kernels", "comm", "memcpy", "stragglers", "straggler_summary")}}


def _plain(v):
    if isinstance(v, (np.integer,)):
        return int(v)
    if isinstance(v, (float, np.floating)):
        f = float(v)
        return None if not math.isfinite(f) else float(f"{f:.9g}")  # stable digits for goldens
    if isinstance(v, np.bool_):
        return bool(v)
    return v


def records(df: pd.DataFrame) -> list[dict]:
    """A frame as JSON records: NaN and infinities become null, numbers plain and 9 significant digits."""
    cols = list(df.columns)
    return [{c: _plain(v) for c, v in zip(cols, row)} for row in df.itertuples(index=False, name=None)]
