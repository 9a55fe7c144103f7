"""Which of one server's inputs is the spine of its step view and of its interval view (collectors/join.py):
the order in which their rows are merged by time."""
from __future__ import annotations

import numpy as np
import pandas as pd

#: a part: (the join's ``Input`` - not imported here, join imports this module - and its rows)
Part = tuple


def resolution(t: pd.Series) -> float:
    """The clock step of a time column: the smallest positive difference between its distinct values."""
    u = np.unique(t.dropna().to_numpy(dtype=float))
    d = np.diff(u)
    d = d[d > 0]
    return float(d.min()) if len(d) else np.inf


def spine_first(parts: list[Part], tokens_first: bool) -> list[Part]:
    """Step parts in spine order (:func:`_step_spine_key`); interval parts with an ITL
    histogram first, then the shortest intervals. A client's clock is that of its reads: the ends of its
    rebuilt steps are finer only where one read was split evenly into the steps it held
    (collectors/clients/client_steps.py), which is no finer measurement."""
    if tokens_first:
        return sorted(parts, key=_step_spine_key)
    return sorted(parts, key=lambda p: (p[1]["itl_count"].isna().all(),
                                        float((p[1]["t_end_s"] - p[1]["t_start_s"]).median())))


#: a part's clock resolves its steps when at least this share of its rows end at a time of their own (a
#: whole-second log stamps tens of steps alike)
RESOLVES_STEPS = 0.9


def _step_spine_key(part: Part) -> tuple:
    """Sort key of a step part for the spine: clocks that resolve their steps first; among those, the
    engine's own step records (log iteration lines on a fine clock, a trace) before steps rebuilt from a
    client's reads - the engine's list of steps is the record, the client's a reconstruction; then the
    finer clock, then the part with token events. Comparing fine clocks alone (a client's microseconds
    against an engine's stamped microseconds) picked the spine by noise: two runs of one traffic flipped."""
    inp, rows = part
    ends = rows["t_end_s"].dropna()
    resolves = len(ends) > 0 and ends.nunique() >= RESOLVES_STEPS * len(ends)
    client = "step_source" in rows and len(rows) > 0 and bool((rows["step_source"] == "client").all())
    return (not resolves, client and resolves, _clock_step(part), -len(inp.timeline.tokens))


def _clock_step(part: Part) -> float:
    """The clock step of a step part's ends; for steps rebuilt from client reads, of the reads alone
    (the ends that are token arrivals), not of the even split of a read into its steps."""
    inp, rows = part
    ends = rows["t_end_s"]
    if len(inp.timeline.tokens) and bool((rows["step_source"] == "client").all()):
        ends = ends[ends.isin(inp.timeline.tokens["t_s"])]
    return resolution(ends)
