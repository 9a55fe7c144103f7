"""The runtime graph mode of vLLM ``Iteration(N)`` steps, from the ``--cudagraph-metrics`` table of the
same window (vLLM 0.32: ``**CUDAGraph Stats:**`` rows ``| unpadded | padded | paddings | mode | count |``,
printed with the periodic stats; formats.md §1.2).

The table counts, per stats window, the batches the ``CudagraphDispatcher`` actually dispatched in each
runtime mode, keyed by their unpadded token count - what ran, not a plan. An Iteration line states its
step's tokens (context + generation tokens). A step of the window whose token count the table lists
under exactly one mode ran in that mode: measured by the engine, joined on the token count. A count
listed under two modes (a uniform decode and a mixed batch of one size) says nothing about which was
which, and the step is left alone. Steps stamped in the table's own second may belong to either
window (whole-second stamps), so a window is ``(previous table, this table)`` exclusive of both.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

SERIES = "vllm_log:cudagraph_steps"
_REPLAYED = {"FULL": 1.0, "PIECEWISE": 1.0, "NONE": 0.0}


def _labels(s: str) -> dict[str, str]:
    return dict(kv.split("=", 1) for kv in s.split(",") if "=" in kv)


def step_graph_modes(steps: pd.DataFrame, series: list[dict], iterating: set) -> pd.DataFrame:
    """``steps`` (Iteration rows of the engines in ``iterating``) with ``graph_mode``, ``graph_replayed``
    and ``q_graph_mode`` = measured where the window's table lists the step's token count under one
    mode (module doc); the frame unchanged when no table row applies."""
    tables: dict[tuple, dict[int, set]] = {}
    for x in series:
        if x["name"] != SERIES or x["instance"] not in iterating or not x["value"] > 0:
            continue
        lab = _labels(x["labels"])
        try:
            u = int(lab["unpadded_tokens"])
        except (KeyError, ValueError):
            continue
        tables.setdefault((x["instance"], float(x["t_s"])), {}).setdefault(u, set()).add(lab.get("mode", ""))
    if not tables or not len(steps) or "prefill_tokens" not in steps or "decode_rows" not in steps:
        return steps
    tokens = (pd.to_numeric(steps["prefill_tokens"], errors="coerce").fillna(0)
              + pd.to_numeric(steps["decode_rows"], errors="coerce")).to_numpy(dtype=float)
    t_end = pd.to_numeric(steps["t_end_s"], errors="coerce").to_numpy(dtype=float)
    inst = steps["instance"].to_numpy(dtype=object)
    mode = np.full(len(steps), None, dtype=object)
    for key in {k for k, _ in tables}:
        prev = -np.inf
        for t in sorted(tt for k, tt in tables if k == key):
            win = np.flatnonzero((inst == key) & (t_end > prev) & (t_end < t) & np.isfinite(tokens))
            table = tables[(key, t)]
            for i in win:
                ran = table.get(int(tokens[i]))
                if ran is not None and len(ran) == 1:
                    mode[i] = next(iter(ran))
            prev = t
    hit = np.array([m in _REPLAYED for m in mode], dtype=bool)
    return write_modes(steps, hit, mode, "measured")


def write_modes(steps: pd.DataFrame, hit: np.ndarray, mode: np.ndarray, quality) -> pd.DataFrame:
    """A copy of ``steps`` with ``graph_mode`` = ``mode``, ``graph_replayed`` and ``q_graph_mode`` = ``quality``
    (one value, or one per row) on the rows of ``hit``; ``steps`` itself when no row is hit."""
    if not hit.any():
        return steps
    steps = steps.copy()
    for col, default in (("graph_mode", "unknown"), ("graph_replayed", np.nan), ("q_graph_mode", None)):
        if col not in steps:
            steps[col] = default
    steps["graph_mode"] = steps["graph_mode"].astype(object)
    steps["q_graph_mode"] = steps["q_graph_mode"].astype(object)
    steps.loc[hit, "graph_mode"] = mode[hit]
    steps.loc[hit, "graph_replayed"] = [_REPLAYED[m] for m in mode[hit]]
    steps.loc[hit, "q_graph_mode"] = quality if isinstance(quality, str) else quality[hit]
    return steps
