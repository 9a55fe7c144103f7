"""Strict per-step scoring against a generator's per-(step, rank) truth (tiers d and d2).

Rules (docs/analyze.md, "Tier (d2)"):
* a spike belongs to one truth step: on its rank (the instance's ``:pid<N>``, else the only rank),
  the first truth step whose end is at or after the spike row's midpoint (a host stall's idle gap
  lies before the step it delays). It is **right** only when its cause is among that step's true
  causes - no window, no neighbour. ``unknown`` is counted, never right or wrong;
* **recall** of c: visible truth steps with c (latency >= ``visible_ratio`` x the step's healthy
  latency) that a spike naming c sits on / visible truth steps with c. A step with two true causes
  is found when either is named, and then leaves the other cause's denominator;
* **mixing false positives**: spikes called mixing on steps without mixing / spikes on steps
  without mixing;
* **episodes**: a truth stretch (one schedule episode of >= ``episode_min_steps`` steps) is found
  when result episodes naming its cause, on its rank's instance, cover >= ``episode_cover`` of its
  time span; episode precision = named result episodes overlapping a schedule episode of their cause
  (of any length: an episode found on a true 12-step fault is right, though only stretches of
  ``episode_min_steps`` or more must be found) / named result episodes.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np
import pandas as pd


@dataclass(frozen=True)
class StepScoring:
    visible_ratio: float = 1.5
    episode_min_steps: int = 20
    episode_cover: float = 0.5

    def __post_init__(self):
        if self.visible_ratio <= 0 or self.episode_min_steps < 1 or not 0 < self.episode_cover <= 1:
            raise ValueError("visible_ratio > 0, episode_min_steps >= 1, episode_cover in (0, 1]")


def step_truth(truth: pd.DataFrame, offset_s: float, cfg: StepScoring = StepScoring()) -> pd.DataFrame:
    """Truth rows on the unix clock with ``latency_s`` (previous step's end to this end, per rank),
    ``causes`` as a frozenset and ``visible``."""
    t = truth.sort_values(["rank", "step"]).copy()
    t["t_start_s"] = t["t_start_ns"] / 1e9 + offset_s
    t["t_end_s"] = t["t_end_ns"] / 1e9 + offset_s
    t["latency_s"] = t.groupby("rank")["t_end_s"].diff().fillna(t["t_end_s"] - t["t_start_s"])
    t["causes"] = t["causes"].fillna("").map(lambda s: frozenset(c for c in str(s).split(";") if c))
    t["visible"] = (t["causes"].map(len) > 0) & (t["latency_s"] >= cfg.visible_ratio * t["healthy_ns"] / 1e9)
    return t.reset_index(drop=True)


def rank_of(instance: str, pids: dict[int, int]) -> int | None:
    """The truth rank an instance is a view of (``...:pid<N>``), or the only rank."""
    m = re.search(r"pid(\d+)", str(instance))
    if m and int(m.group(1)) in pids:
        return pids[int(m.group(1))]
    return next(iter(pids.values())) if len(pids) == 1 else None


def place_spikes(spikes: pd.DataFrame, truth: pd.DataFrame) -> pd.DataFrame:
    """Each spike with its (rank, step) and that step's true causes (``gold``) and ``right``."""
    pids = dict(truth.drop_duplicates("pid")[["pid", "rank"]].itertuples(index=False))
    out = []
    for p in spikes.itertuples(index=False):
        r = rank_of(p.instance, pids)
        g = truth[truth["rank"] == (r if r is not None else truth["rank"].min())]
        ends = g["t_end_s"].to_numpy()
        mid = (p.t_start_s + p.t_end_s) / 2
        i = int(np.clip(np.searchsorted(ends, mid - 1e-9), 0, len(g) - 1))
        row = g.iloc[i]
        gold = row["causes"]
        out.append({"instance": p.instance, "rank": int(row["rank"]), "step": int(row["step"]), "cause": p.cause,
                    "confidence": float(p.confidence), "gold": gold, "right": p.cause in gold})
    return pd.DataFrame(out, columns=["instance", "rank", "step", "cause", "confidence", "gold", "right"])


def score_steps(placed: pd.DataFrame, truth: pd.DataFrame, causes: tuple[str, ...]) -> dict:
    """Per-cause precision / recall / F1, macro-F1 over ``causes``, mixing false-positive rate."""
    named: dict[tuple, set] = {}
    for p in placed.itertuples(index=False):
        named.setdefault((p.rank, p.step), set()).add(p.cause)
    hit = {c: 0 for c in causes}
    den = {c: 0 for c in causes}
    for row in truth[truth["visible"]].itertuples(index=False):
        true = set(row.causes) & set(causes)
        got = named.get((row.rank, row.step), set()) & true
        for c in true:
            if got and c not in got:
                continue
            den[c] += 1
            hit[c] += c in got
    per = {}
    for c in causes:
        called = placed[placed["cause"] == c]
        prec = float(called["right"].mean()) if len(called) else None
        rec = hit[c] / den[c] if den[c] else None
        f1 = (2 * prec * rec / (prec + rec) if prec is not None and rec is not None and prec + rec > 0
              else (0.0 if prec is not None or rec is not None else None))
        per[c] = {"precision": prec, "recall": rec, "f1": f1, "called": int(len(called)), "truth_visible": den[c]}
    f1s = [v["f1"] for v in per.values() if v["f1"] is not None]
    no_mix = placed[~placed["gold"].map(lambda g: "mixing" in g)] if len(placed) else placed
    fp = int((no_mix["cause"] == "mixing").sum()) if len(no_mix) else 0
    return {"per_cause": per, "macro_f1": float(np.mean(f1s)) if f1s else None,
            "spikes": int(len(placed)), "unknown": int((placed["cause"] == "unknown").sum()) if len(placed) else 0,
            "mixing_fp": fp, "non_mixing_spikes": int(len(no_mix)),
            "mixing_fp_rate": fp / len(no_mix) if len(no_mix) else 0.0}


def _covered(intervals: list[tuple[float, float]], lo: float, hi: float) -> float:
    """Length of [lo, hi] covered by the union of ``intervals``."""
    tot, cur = 0.0, lo
    for a, b in sorted(intervals):
        a, b = max(a, cur), min(b, hi)
        if b > a:
            tot += b - a
            cur = b
    return tot


def score_episodes(episodes: pd.DataFrame, schedule_eps, truth: pd.DataFrame, causes: tuple[str, ...],
                   cfg: StepScoring = StepScoring()) -> dict:
    """Recall of sustained truth stretches and precision of named result episodes (module doc)."""
    pids = dict(truth.drop_duplicates("pid")[["pid", "rank"]].itertuples(index=False))
    res = episodes.copy() if episodes is not None else pd.DataFrame(columns=["instance", "t_start_s", "t_end_s", "cause"])
    res["rank"] = [rank_of(i, pids) for i in res["instance"]] if len(res) else []
    stretches, spans = [], []
    for e in schedule_eps:
        if e.cause not in causes:
            continue
        ranks = [e.rank] if e.rank >= 0 else sorted(truth["rank"].unique())
        g = truth[truth["rank"].isin(ranks) & truth["step"].between(e.start, e.end - 1)]
        if not len(g):
            continue
        span = (e.cause, set(ranks), float(g["t_start_s"].min()), float(g["t_end_s"].max()))
        spans.append(span)
        if e.duration >= cfg.episode_min_steps:
            stretches.append(span)
    found = {c: [0, 0] for c in causes}
    for cause, ranks, lo, hi in stretches:
        mine = res[(res["cause"] == cause) & res["rank"].isin(ranks | {None})]
        cov = _covered(list(zip(mine["t_start_s"], mine["t_end_s"])), lo, hi) / max(hi - lo, 1e-12)
        found[cause][1] += 1
        found[cause][0] += cov >= cfg.episode_cover
    named = res[res["cause"].isin(causes)] if len(res) else res
    ok = 0
    for r in named.itertuples(index=False):
        ok += any(c == r.cause and r.t_start_s < hi and r.t_end_s > lo for c, _, lo, hi in spans)
    return {"stretches": {c: {"found": v[0], "of": v[1]} for c, v in found.items()},
            "recall": (sum(v[0] for v in found.values()) / sum(v[1] for v in found.values())
                       if sum(v[1] for v in found.values()) else None),
            "named_episodes": int(len(named)), "precision": ok / len(named) if len(named) else None,
            "episodes_total": int(len(res))}
