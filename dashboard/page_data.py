"""Page data the Timeline and Spike pages hand to the figure builders (:mod:`.figures`).

Plain frozen dataclasses, no Dash: the pages compute them, :mod:`.figures` draws them, so neither
imports the other's module.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import pandas as pd


#: The episode bands of a Timeline view: relative start/end, cause, its share of the episode's excess, how
#: far the episode's median stood over the reference, its excess (token-seconds), rows, and why when unknown.
EPISODE_BAND_COLUMNS = ("t_start_rel_s", "t_end_rel_s", "median_latency_s", "cause", "share", "ratio", "excess_s",
                        "rows", "why")


def no_episodes() -> pd.DataFrame:
    """An empty episode-bands frame (the columns of :data:`EPISODE_BAND_COLUMNS`)."""
    return pd.DataFrame({c: pd.Series([], dtype=object if c in ("cause", "why") else "float64")
                         for c in EPISODE_BAND_COLUMNS})


@dataclass(frozen=True)
class TimelineView:
    """One instance's panels on a relative clock (seconds since ``t0_s``), sorted by time."""

    instance: str
    t0_s: float
    itl: pd.DataFrame      # t_rel_s, itl_s  (per output event, or per interval for coarse sources)
    itl_label: str         # what the ITL panel shows, for its axis title
    spikes: pd.DataFrame   # t_rel_s, itl_s, cause, confidence, instance, step
    steps: pd.DataFrame    # t_rel_s plus the Timeline page's STEP_PANEL_COLUMNS
    sm_quality: str        # measured | estimated | inferred | absent | unlabelled
    has_expert: bool
    has_kv: bool
    episodes: pd.DataFrame = field(default_factory=no_episodes)  # EPISODE_BAND_COLUMNS, by start time
    has_pause: bool = False   # measured host pauses: GC the engine timed (host_pause_s), stops the OS saw (host_stopped_s)

    @property
    def x_extent(self) -> tuple[float, float]:
        """Full x-range of the data (relative seconds)."""
        xs = [f["t_rel_s"] for f in (self.itl, self.spikes, self.steps) if len(f)]
        if not xs:
            return 0.0, 1.0
        return float(min(x.min() for x in xs)), float(max(x.max() for x in xs))


@dataclass(frozen=True)
class SpikeDetail:
    """What the Spike page shows for one spike."""

    spike: dict                # instance, step, t_s, itl_s, baseline_s, cause, confidence
    evidence: pd.DataFrame     # key, value (strings, in the diagnosis' order)
    missing_signals: tuple[str, ...]
    neighbours: pd.DataFrame   # the steps around the spike (diagnosis steps columns)
    measured_s: float
    predicted_s: float         # the predicted height in seconds, NaN when there is no prediction
    predicted_key: str | None  # where the prediction came from: an evidence key, or "ledger"
    measured_x: float = math.nan   # measured height / baseline
    predicted_x: float = math.nan  # predicted height / baseline (mixed over pure-decode step time)
    prediction_basis: str = ""     # one line: what the prediction assumes, or why there is none
