"""Fault schedules drawn from the seed: which causes shape which steps, how long and how hard.

Nothing here is fixed per scenario: start, duration (5-500 steps, log-uniform so short and long
episodes both occur), magnitude, overlaps of two causes and quiet stretches all come from
``numpy.random.default_rng([seed, 0x5C4ED])``. The schedule is drawn before any trace row exists,
so the truth never depends on how rows are written.

Causes a trace can show, and why each is here (basis in docs/analyze.md, "Tier (d2)"):
``mixing`` (long prompt chunks ride with the decodes), ``ep_hotspot`` (one rank's experts get more
tokens), ``pd_transfer`` (KV of a finished remote prefill lands during decode steps),
``graph_fallback`` (decode batch above the largest captured size runs eager), ``host_stall``
(the engine thread is blocked, the GPU runs dry). ``kv_pressure`` is left out: a recompute
preemption shows in a trace only as a later prefill, its truth needs the scheduler's log.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

CAUSES = ("mixing", "ep_hotspot", "pd_transfer", "graph_fallback", "host_stall")
#: magnitude of each cause, its unit, and the drawn range
MAGNITUDE = {
    "mixing": ("prompt chunk tokens", 768.0, 8192.0),        # chunked-prefill budget share of one prompt
    "ep_hotspot": ("hot rank expert-time factor", 2.0, 6.0),  # issue 24: one rank's MoE kernels 2-6x
    "pd_transfer": ("step slowdown factor", 1.6, 3.0),        # decode steps that wait for layer loads
    "graph_fallback": ("eager step-time factor (launch-bound)", 1.3, 3.0),
    "host_stall": ("host stall ms per step", 8.0, 120.0),
}


@dataclass(frozen=True)
class ScheduleConfig:
    """How schedules are drawn. ``causes``: those the shape can show (EP needs >= 2 ranks, PD a PD
    shape); ``episodes``: episodes drawn per 1000 steps; ``overlap_p``: chance an episode is placed
    to overlap the previous one (two causes at once); ``min_quiet``: steps kept fault-free at the start
    (the engines' warm-up) and the shortest quiet stretch between non-overlapping episodes."""

    n_steps: int = 1000
    causes: tuple[str, ...] = CAUSES
    episodes_per_1000: float = 6.0
    duration_min: int = 5
    duration_max: int = 500
    overlap_p: float = 0.3
    min_quiet: int = 20

    def __post_init__(self):
        if self.n_steps < 10:
            raise ValueError("n_steps must be >= 10")
        bad = [c for c in self.causes if c not in CAUSES]
        if bad or not self.causes:
            raise ValueError(f"causes must be a non-empty subset of {CAUSES}, got {self.causes}")
        if not 1 <= self.duration_min <= self.duration_max:
            raise ValueError("need 1 <= duration_min <= duration_max")
        if not 0.0 <= self.overlap_p <= 1.0 or self.episodes_per_1000 <= 0 or self.min_quiet < 0:
            raise ValueError("overlap_p in [0, 1], episodes_per_1000 > 0, min_quiet >= 0")


@dataclass(frozen=True)
class Episode:
    """One cause over steps ``[start, start + duration)``; ``magnitude`` in MAGNITUDE[cause]'s unit;
    ``rank``: the rank the cause sits on (EP's hot rank, the rank holding the prompt chunk, the
    stalled process; -1 = every rank: graph fallback and PD, which DP ranks share)."""

    cause: str
    start: int
    duration: int
    magnitude: float
    rank: int = -1

    def __post_init__(self):
        if self.cause not in CAUSES or self.start < 0 or self.duration < 1 or not np.isfinite(self.magnitude):
            raise ValueError(f"bad episode {self}")

    @property
    def end(self) -> int:
        return self.start + self.duration


@dataclass(frozen=True)
class Schedule:
    """The episodes of one trace of ``n_steps`` steps (drawn from ``seed`` or built by a test)."""

    seed: int
    n_steps: int
    episodes: tuple[Episode, ...]

    def __post_init__(self):
        if self.n_steps < 1 or any(e.end > self.n_steps for e in self.episodes):
            raise ValueError("every episode must end within n_steps")

    def at(self, step: int) -> tuple[Episode, ...]:
        """Episodes active at ``step``."""
        return tuple(e for e in self.episodes if e.start <= step < e.end)


def _duration(rng: np.random.Generator, cfg: ScheduleConfig, room: int) -> int:
    lo, hi = cfg.duration_min, min(cfg.duration_max, max(cfg.duration_min, room))
    return int(np.clip(round(np.exp(rng.uniform(np.log(lo), np.log(hi + 1)))), lo, hi))


def draw_schedule(seed: int, cfg: ScheduleConfig, n_ranks: int = 1) -> Schedule:
    """Episodes in step order. Each episode either starts after a quiet stretch (geometric, mean
    ``1000 / episodes_per_1000`` steps) or, with ``overlap_p``, inside the previous one with another
    cause. Episodes never run past ``n_steps``."""
    rng = np.random.default_rng([seed, 0x5C4ED])
    causes = tuple(c for c in cfg.causes if c != "ep_hotspot" or n_ranks >= 2)
    mean_gap = 1000.0 / cfg.episodes_per_1000
    out: list[Episode] = []
    t = cfg.min_quiet + int(rng.geometric(1.0 / mean_gap))
    while t < cfg.n_steps - cfg.duration_min:
        prev = out[-1] if out else None
        overlap = prev is not None and rng.random() < cfg.overlap_p and len(causes) > 1
        if overlap:
            start = int(rng.integers(prev.start, prev.end))
            cause = str(rng.choice([c for c in causes if c != prev.cause]))
        else:
            start, cause = t, str(rng.choice(causes))
        room = cfg.n_steps - start
        if room < cfg.duration_min:
            break
        dur = _duration(rng, cfg, room)
        unit, lo, hi = MAGNITUDE[cause]
        mag = float(np.exp(rng.uniform(np.log(lo), np.log(hi))))
        per_rank = cause in ("ep_hotspot", "mixing", "host_stall") and n_ranks > 1
        hot = int(rng.integers(0, n_ranks)) if per_rank else -1
        out.append(Episode(cause, start, dur, mag, hot))
        t = max(t, start + dur) + max(cfg.min_quiet, int(rng.geometric(1.0 / mean_gap)))
    return Schedule(seed, cfg.n_steps, tuple(sorted(out, key=lambda e: (e.start, e.cause))))
