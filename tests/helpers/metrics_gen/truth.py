"""Truth as the generator knows it: per step, per time unit (a scrape interval or a log-stamp
second) and per log line: the causes present, their magnitude, the ITL excess each added, and
whether it is visible (VISIBLE_SHARE, TAIL_FACTOR)."""
from __future__ import annotations

import numpy as np
import pandas as pd

from .schedule import CAUSES

#: a cause is *visible* in a unit when the ITL excess it added is at least this share of the unit's
#: healthy token-time (its mean ITL rises >= 10 %); recall counts visible units only
VISIBLE_SHARE = 0.10
#: ... or when one of its steps gave an output an ITL >= this many times the step's healthy
#: latency (a tail sample that moves a histogram's upper buckets, e.g. a preempted request's resume)
TAIL_FACTOR = 2.0


def steps_frame(steps) -> pd.DataFrame:
    rows = []
    for s in steps:
        row = {"step": s.idx, "t_start_s": s.t_start, "t_end_s": s.t_end, "gap_s": s.gap_s,
               "ctx_tokens": s.ctx_tokens, "gen_reqs": s.gen_reqs, "eager": s.eager, "running": s.running,
               "waiting": s.waiting, "preempted": s.preempted, "healthy_s": s.healthy_s,
               "tokens_out": len(s.itl) + len(s.ttft), "itl_count": len(s.itl), "prompt_done": s.prompt_done,
               "max_itl_s": max(s.itl) if s.itl else 0.0, "causes": ";".join(sorted(s.causes))}
        for c in CAUSES:
            row[f"mag_{c}"] = s.causes.get(c, np.nan)
            row[f"excess_{c}"] = s.excess.get(c, 0.0)
        rows.append(row)
    return pd.DataFrame(rows)


def units(steps: pd.DataFrame, edges) -> pd.DataFrame:
    """One row per unit (edges[k], edges[k+1]]: the steps ending in it, per cause present /
    magnitude (max) / excess (token-seconds) / visible."""
    edges = np.asarray(sorted(edges), dtype=float)
    k = np.searchsorted(edges, steps["t_end_s"].to_numpy(), side="left") - 1
    healthy = steps["healthy_s"].to_numpy() * np.maximum(steps["gen_reqs"].to_numpy(), 1)
    out = pd.DataFrame({"unit": np.arange(len(edges) - 1), "t0_s": edges[:-1], "t1_s": edges[1:]})
    ok = (k >= 0) & (k < len(edges) - 1)
    out["steps"] = np.bincount(k[ok], minlength=len(out))
    out["healthy_token_s"] = np.bincount(k[ok], weights=healthy[ok], minlength=len(out))
    tail = (steps["max_itl_s"] >= TAIL_FACTOR * steps["healthy_s"]).to_numpy()
    present_all = []
    for c in CAUSES:
        has = steps[f"mag_{c}"].notna().to_numpy()
        out[f"present_{c}"] = np.bincount(k[ok], weights=has[ok].astype(float), minlength=len(out)) > 0
        mag = steps[f"mag_{c}"].fillna(-np.inf).to_numpy()
        m = np.full(len(out), -np.inf)
        np.maximum.at(m, k[ok], mag[ok])
        out[f"mag_{c}"] = np.where(np.isfinite(m), m, np.nan)
        out[f"excess_{c}"] = np.bincount(k[ok], weights=steps[f"excess_{c}"].to_numpy()[ok], minlength=len(out))
        tail_c = np.bincount(k[ok], weights=(has & tail)[ok].astype(float), minlength=len(out)) > 0
        out[f"visible_{c}"] = out[f"present_{c}"] & (
            (out[f"excess_{c}"] >= VISIBLE_SHARE * out["healthy_token_s"]) | tail_c)
        present_all.append(np.where(out[f"present_{c}"], c, ""))
    out["causes"] = [";".join(x for x in row if x) for row in zip(*present_all)]
    return out
