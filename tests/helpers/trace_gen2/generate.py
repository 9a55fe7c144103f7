"""``generate()``: shape + seed -> an Nsight SQLite export and its per-(step, rank) truth."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from .engine import Engine
from .kernels import Costs
from .nsys_db import write_export
from .schedule import CAUSES, Schedule, ScheduleConfig, draw_schedule
from .shapes import SHAPES, Shape

#: truth columns, one row per (step, rank); ``causes`` ';'-joined (empty = cause-free)
TRUTH_COLUMNS = ["step", "rank", "pid", "device", "t_start_ns", "t_end_ns", "cpu_start_ns", "decode_rows",
                 "prefill_tokens", "graph_mode", "healthy_ns", "causes", "mixing_tokens", "ep_factor", "hot_rank",
                 "pd_factor", "eager_factor", "host_stall_ns", "cause_rank"]


@dataclass(frozen=True)
class GenConfig:
    """One generated trace: the shape name, the seed and the number of steps."""

    shape: str
    seed: int
    n_steps: int = 800

    def __post_init__(self):
        if self.shape not in SHAPES:
            raise ValueError(f"unknown shape {self.shape!r}; choose from {sorted(SHAPES)}")
        if self.n_steps < 10:
            raise ValueError("n_steps must be >= 10")

    def causes(self) -> tuple[str, ...]:
        """Causes this shape can show: EP needs ranks, PD a PD decode instance."""
        s = SHAPES[self.shape]
        return tuple(c for c in CAUSES if (c != "ep_hotspot" or s.n_ranks > 1) and (c != "pd_transfer" or s.pd != "none"))


@dataclass(frozen=True)
class Generated:
    path: Path
    truth: pd.DataFrame
    schedule: Schedule
    shape: Shape
    utc_offset_s: float  # unix seconds = trace ns / 1e9 + utc_offset_s


def generate(cfg: GenConfig, out: str | Path, schedule: Schedule | None = None) -> Generated:
    """Write ``out`` (SQLite) and return the truth. ``schedule`` overrides the drawn one (tests)."""
    shape = SHAPES[cfg.shape]
    # each shape is its own deployment: its schedule stream is keyed on the shape too
    key = cfg.seed * 16 + list(SHAPES).index(cfg.shape)
    sched = schedule or draw_schedule(key, ScheduleConfig(n_steps=cfg.n_steps, causes=cfg.causes()), shape.n_ranks)
    rng = np.random.default_rng([cfg.seed, 0xD2])
    costs = Costs.draw(rng)
    t0 = int(rng.integers(50, 400)) * 1_000_000_000   # nsys clocks do not start at 0 (formats.md 3.2)
    eng = Engine(shape, costs, sched, rng, t0)
    for n in range(sched.n_steps):
        eng.step(n)
    system_clock = t0 - int(2e9)
    utc = 1_795_000_000_000_000_000 + cfg.seed * 3_600_000_000_000
    write_export(eng.rows, Path(out), pids=[p.pid for p in eng.procs], graph_trace=shape.graph_trace,
                 gpu_metrics_hz=shape.gpu_metrics_hz, utc_epoch_ns=utc, system_clock_ns=system_clock,
                 process_name="python3")
    truth = pd.DataFrame(eng.truth, columns=TRUTH_COLUMNS)
    return Generated(Path(out), truth, sched, shape, (utc - system_clock) / 1e9)
