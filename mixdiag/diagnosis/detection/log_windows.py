"""What a coarse log line's window holds: the prompt chunks a row carries (a measured chunk of at
least ``min_tokens``), the prefill batches logged since the previous decode line (SGLang's Decode
line reports a mean over the forwards since the last one), and the decode passes an interval ran off
the captured graph. Split from signals.py (past 400 lines) by concept; signals re-exports them."""
from __future__ import annotations

import pandas as pd

from mixdiag.diagnosis.labels import equal


def chunk_rows(rows: pd.DataFrame, min_tokens: float) -> pd.Series:
    """Rows that held decodes and a prompt chunk of at least ``min_tokens`` (unknown counts: any
    prefill). A smaller chunk keeps the step below the roofline ridge, about one decode pass
    (``AttributionConfig.chunk_min_tokens``): SGLang's ``#new-token`` of a mixed Prefill line is what
    that forward computed."""
    hp, hd = rows["has_prefill"].astype(bool), rows["has_decode"].astype(bool)
    if "prefill_tokens" not in rows.columns:
        return hp & hd
    tok = pd.to_numeric(rows["prefill_tokens"], errors="coerce")
    return hp & hd & (tok.isna() | (tok >= min_tokens))


def stalled_prefill_rows(rows: pd.DataFrame) -> pd.Series:
    """Prefill-only rows that running decodes waited through. The row's own count of running requests
    decides where it has one: SGLang's Prefill line states ``#running-req``, the running batch at that
    forward (``log_prefill_stats``) - 0 there means no decode was running, whatever rows came before (under
    mixed chunk a running batch is folded into the forward; without it, it waits). Only a row without the
    count falls back to decode rows before it (``decodes_before``)."""
    hp, hd = rows["has_prefill"].astype(bool), rows["has_decode"].astype(bool)
    before = rows["decodes_before"].astype(bool) if "decodes_before" in rows.columns else pd.Series(False, index=rows.index)
    if "running_reqs" not in rows.columns:
        return hp & ~hd & before
    run = pd.to_numeric(rows["running_reqs"], errors="coerce")
    return hp & ~hd & (run.gt(0) | (run.isna() & before))


def prefill_since_last_decode(sig: pd.DataFrame, min_tokens: float = 0.0) -> tuple[pd.Series, pd.Series]:
    """Per row: how many rows since the previous decode-only row held prefill and decode rows
    (mixed forwards) and how many were prefill-only with decodes waiting (running requests or
    decodes before). For a log that prints a decode line every N forwards with the mean step time
    since the last one (SGLang's ``Decode batch`` gen throughput), these are the prefill batches
    inside the window that mean covers."""
    hp, hd = sig["has_prefill"].astype(bool), sig["has_decode"].astype(bool)
    mixed = chunk_rows(sig, min_tokens).astype(int)
    stall = stalled_prefill_rows(sig).astype(int)
    dec = hd & ~hp

    def since(x: pd.Series) -> pd.Series:  # x's rows after the previous decode-only row, up to this one
        c = x.cumsum()
        return (c - c.where(dec).ffill().shift(1).fillna(0)).astype(float)

    return since(mixed), since(stall)


def graph_off_decode_column(rows: pd.DataFrame) -> pd.DataFrame:
    """Interval rows get ``graph_off_decode_steps``: decode-only steps that left the FULL graph,
    i.e. off-FULL dispatches (``graph_piecewise_steps + graph_none_steps``) beyond the interval's
    prefill and mixed steps (per-kind step counts, else the large-step share of all passes). Only
    when the rows carry per-mode counts and one of those, and only from counts of what ran: a row
    whose ``q_graph_mode`` is not ``measured`` (a dispatcher's plan, ``estimated``) gets NaN - a
    planned mode never shows that a decode pass left the graph."""
    iv = equal(rows["granularity"], "interval")
    modes = [c for c in ("graph_full_steps", "graph_piecewise_steps", "graph_none_steps") if c in rows.columns]
    if not iv.any() or len(modes) < 3 or not rows.loc[iv, modes].notna().any().any():
        return rows
    if {"mixed_steps", "prefill_steps"} <= set(rows.columns) and rows.loc[iv, "prefill_steps"].notna().any():
        other = rows.loc[iv, "mixed_steps"].fillna(0) + rows.loc[iv, "prefill_steps"].fillna(0)
    elif "large_step_share" in rows.columns and rows.loc[iv, "large_step_share"].notna().any():
        # SGLang counts passes by mode (decode_/prefill_ x cuda_graph/none) and the collector merges
        # prefill_none into the eager count: the prefill passes (large_step_share of all) come off it
        total = rows.loc[iv, modes].fillna(0).sum(axis=1)
        other = (rows.loc[iv, "large_step_share"].fillna(0) * total).round()
    else:
        return rows
    rows = rows.copy()
    n_off = rows.loc[iv, "graph_piecewise_steps"].fillna(0) + rows.loc[iv, "graph_none_steps"].fillna(0)
    off = (n_off - other).clip(lower=0)
    if "q_graph_mode" in rows.columns:
        q = rows.loc[iv, "q_graph_mode"].fillna("").astype(str)
        off = off.where(q.isin(["", "measured"]))
    rows.loc[iv, "graph_off_decode_steps"] = off
    return rows
