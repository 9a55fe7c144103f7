"""Fault schedules drawn from a seed: episodes of one cause each, with start, duration, magnitude.

Distribution (docs/analyze.md, "Tier (e2)"): quiet stretches geometric (mean ``quiet_mean`` steps,
at least ``quiet_min``; the first ``lead_in`` steps are quiet so a healthy reference exists),
durations log-uniform in [``dur_min``, ``dur_max``] steps, with probability ``p_overlap`` the next
episode starts inside the previous one with another cause (two causes at once), magnitudes
log-uniform in the cause's range (units in ``MAGNITUDE_UNITS``).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

CAUSES = ("mixing", "host_stall", "graph_fallback", "kv_pressure", "pd_transfer", "ep_hotspot")
#: what a magnitude means per cause (the simulator reads it so)
MAGNITUDE_UNITS = {
    "mixing": "prompt tokens per long request (chunked at the token budget)",
    "host_stall": "engine idle seconds before each step",
    "graph_fallback": "eager step time / graph step time",
    "kv_pressure": "preemptions per step (probability)",
    "pd_transfer": "step time factor while KV is written by the connector",
    "ep_hotspot": "step time factor of the hot rank (max/mean expert load)",
}
DEFAULT_RANGES = {
    "mixing": (2048.0, 16384.0),
    "host_stall": (0.008, 0.25),
    "graph_fallback": (1.3, 3.0),
    "kv_pressure": (0.05, 0.4),
    "pd_transfer": (1.6, 3.0),
    "ep_hotspot": (1.5, 4.0),
}


@dataclass(frozen=True)
class ScheduleConfig:
    """Bounds of a drawn schedule; validated on construction."""

    n_steps: int = 2000
    causes: tuple[str, ...] = CAUSES
    dur_min: int = 5
    dur_max: int = 500
    quiet_mean: float = 120.0
    quiet_min: int = 20
    lead_in: int = 60
    p_overlap: float = 0.3
    ranges: tuple[tuple[str, float, float], ...] = field(
        default_factory=lambda: tuple((c, *DEFAULT_RANGES[c]) for c in CAUSES))

    def __post_init__(self):
        if self.n_steps < self.lead_in + self.dur_min:
            raise ValueError("n_steps too small for one episode after the lead-in")
        if not 1 <= self.dur_min <= self.dur_max:
            raise ValueError("need 1 <= dur_min <= dur_max")
        if not self.causes or any(c not in CAUSES for c in self.causes):
            raise ValueError(f"causes must be a non-empty subset of {CAUSES}")
        if not 0.0 <= self.p_overlap < 1.0 or self.quiet_mean < 1 or self.quiet_min < 0:
            raise ValueError("bad quiet/overlap settings")
        for c, lo, hi in self.ranges:
            if not 0 < lo <= hi:
                raise ValueError(f"bad magnitude range for {c}")

    def range_of(self, cause: str) -> tuple[float, float]:
        for c, lo, hi in self.ranges:
            if c == cause:
                return lo, hi
        raise KeyError(cause)


@dataclass(frozen=True)
class Episode:
    """Steps [start, end) carry ``cause`` at ``magnitude``."""

    cause: str
    start: int
    end: int
    magnitude: float

    @property
    def duration(self) -> int:
        return self.end - self.start


def _loguniform(rng: np.random.Generator, lo: float, hi: float) -> float:
    return float(math.exp(rng.uniform(math.log(lo), math.log(hi))))


def draw_schedule(seed: int, cfg: ScheduleConfig = ScheduleConfig()) -> tuple[Episode, ...]:
    """Episodes for one trace; deterministic in ``seed``."""
    rng = np.random.default_rng([seed, 0xE2E2])
    eps: list[Episode] = []
    t = cfg.lead_in
    prev: Episode | None = None
    while t < cfg.n_steps - cfg.dur_min:
        if prev is not None and rng.random() < cfg.p_overlap and len(cfg.causes) > 1:
            # overlap: start inside the previous episode, another cause
            start = int(rng.integers(prev.start, max(prev.start + 1, prev.end)))
            cause = str(rng.choice([c for c in cfg.causes if c != prev.cause]))
        else:
            start = t
            cause = str(rng.choice(cfg.causes))
        dur = int(round(_loguniform(rng, cfg.dur_min, cfg.dur_max)))
        end = min(start + max(dur, cfg.dur_min), cfg.n_steps)
        if end - start < cfg.dur_min:
            break
        ep = Episode(cause, start, end, _loguniform(rng, *cfg.range_of(cause)))
        eps.append(ep)
        prev = ep
        quiet = max(cfg.quiet_min, int(rng.geometric(1.0 / cfg.quiet_mean)))
        t = max(t, end) + quiet
    return tuple(eps)
