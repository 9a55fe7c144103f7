"""Ground truth of a simulated trace: one row per (step, rank), plus the deployment's magnitudes."""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

CAUSES = ("mixing", "prefill_stall", "ep_hotspot", "pd_transfer", "graph_fallback", "kv_pressure", "host_stall", "none")
COLUMNS = ("step", "rank", "pid", "device", "t_start_ns", "t_end_ns", "cpu_start_ns", "kind", "prefill_tokens",
           "decode_rows", "waiting_decodes", "graph_mode", "cause", "hot_rank", "graph_launches", "kernel_launches",
           "h2d_bytes", "d2h_bytes", "sampled_rows", "kv_transfer_bytes", "host_stall_ns")


@dataclass(frozen=True)
class Truth:
    """What the simulator did: ``steps`` (ns times on the trace's own clock), output ``paths``, ``meta``.

    ``t_start_ns``/``t_end_ns`` span the step's GPU work (first input copy to the sampled-id copy);
    ``cpu_start_ns`` is when the engine thread began scheduling it, so a host stall lies between them.
    """

    steps: pd.DataFrame
    paths: tuple[Path, ...]
    meta: dict = field(default_factory=dict)

    def __post_init__(self):
        missing = [c for c in COLUMNS if c not in self.steps.columns]
        if missing:
            raise ValueError(f"truth lacks columns {missing}")
        bad = set(self.steps["cause"]) - set(CAUSES)
        if bad:
            raise ValueError(f"unknown causes {sorted(bad)}")

    @property
    def path(self) -> Path:
        return self.paths[0]


def frame(rows: list[dict]) -> pd.DataFrame:
    """Truth rows as a typed frame in :data:`COLUMNS` order."""
    df = pd.DataFrame(rows, columns=list(COLUMNS))
    return df.sort_values(["step", "rank"], kind="stable").reset_index(drop=True)
