"""Strict interval scoring of tier (e2) (docs/analyze.md, "Tier (e2)"): a spike's call is judged
only against the truth of its own window, never a neighbour's.

- A spike's window is [t_start_s, t_end_s]; a zero-length window on a whole second (a log stamp:
  vLLM and SGLang print whole seconds) is that stamp's second [s, s + 1).
- The truth of a window: the causes of the generator's steps that end inside it.
- A call is right when its cause is among them; ``unknown`` is counted, never right or wrong; a
  cause the generator never makes (``prefill_stall``, ...) is always wrong.
- Recall: over the view's units (scrape intervals; stamp seconds for a log-only view) where a cause
  is *visible* (its ITL excess >= VISIBLE_SHARE of the unit's healthy token-time, from the
  generator's truth); found when a right call of that cause overlaps the unit.
- Mixing false positives: mixing calls on windows without mixing / calls on windows without mixing.
- Episodes: a schedule episode of >= EPISODE_MIN_STEPS steps is found when result episodes naming
  its cause cover >= EPISODE_COVER of its time span; episode precision = named result episodes that
  overlap a schedule episode of their cause (of any length) / named result episodes.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

UNKNOWN = "unknown"
EPISODE_MIN_STEPS = 20
EPISODE_COVER = 0.5


def window(t0: float, t1: float) -> tuple[float, float]:
    """A spike's own window; a log stamp's zero-length window is its whole second."""
    if t1 - t0 < 1e-9 and abs(t0 - round(t0)) < 1e-6:
        return float(round(t0)), float(round(t0)) + 1.0
    return float(t0), float(t1)


def judge(spikes: pd.DataFrame, steps: pd.DataFrame) -> pd.DataFrame:
    """Each spike with its window, the true causes of that window and whether its call is right
    (None for unknown). ``steps``: the generator's truth/steps.csv (t_end_s, causes)."""
    ends = steps["t_end_s"].to_numpy()
    order = np.argsort(ends)
    ends = ends[order]
    causes = steps["causes"].fillna("").astype(str).to_numpy()[order]
    rows = []
    for t0, t1, cause in zip(spikes["t_start_s"], spikes["t_end_s"], spikes["cause"]):
        w0, w1 = window(float(t0), float(t1))
        lo, hi = np.searchsorted(ends, w0, side="left"), np.searchsorted(ends, w1, side="right")
        gold = sorted({c for s in causes[lo:hi] for c in s.split(";") if c})
        right = None if cause == UNKNOWN else cause in gold
        rows.append({"w0": w0, "w1": w1, "cause": str(cause), "gold": ";".join(gold), "right": right})
    return pd.DataFrame(rows, columns=["w0", "w1", "cause", "gold", "right"])


def score(judged: pd.DataFrame, units: pd.DataFrame, causes: tuple[str, ...]) -> dict:
    """Per cause P/R/F1, macro-F1 (over ``causes`` and any other cause named), mixing FP rate.
    ``units``: the generator's units (t0_s, t1_s, visible_<cause>) of the view's grid."""
    named = sorted({c for c in judged["cause"] if c != UNKNOWN} - set(causes))
    per = {}
    for c in list(causes) + named:
        mine = judged[judged["cause"] == c]
        right = mine[mine["right"] == True]  # noqa: E712 (object column)
        col = f"visible_{c}"
        vis = units[units[col]] if col in units else units.iloc[0:0]
        found = sum(bool(((right["w0"] < u1) & (right["w1"] > u0)).any()) for u0, u1 in zip(vis["t0_s"], vis["t1_s"]))
        p = len(right) / len(mine) if len(mine) else None
        r = found / len(vis) if len(vis) else None
        if p is None and r is None:
            f = None
        else:
            f = 2 * p * r / (p + r) if p is not None and r is not None and p + r > 0 else 0.0
        per[c] = {"precision": p, "recall": r, "f1": f, "called": int(len(mine)), "right": int(len(right)),
                  "visible_units": int(len(vis)), "found": int(found)}
    f1s = [v["f1"] for v in per.values() if v["f1"] is not None]
    no_mix = judged[~judged["gold"].str.split(";").map(lambda g: "mixing" in g)] if len(judged) else judged
    fp = int((no_mix["cause"] == "mixing").sum()) if len(no_mix) else 0
    return {"per_cause": per, "macro_f1": float(np.mean(f1s)) if f1s else None, "spikes": int(len(judged)),
            "unknown": int((judged["cause"] == UNKNOWN).sum()) if len(judged) else 0,
            "mixing_fp": fp, "non_mixing_spikes": int(len(no_mix)),
            "mixing_fp_rate": fp / len(no_mix) if len(no_mix) else 0.0}


def _covered(spans, lo: float, hi: float) -> float:
    tot, cur = 0.0, lo
    for a, b in sorted(spans):
        a, b = max(a, cur), min(b, hi)
        if b > a:
            tot += b - a
            cur = b
    return tot


def score_episodes(result_eps: pd.DataFrame, schedule: pd.DataFrame, steps: pd.DataFrame) -> dict:
    """Per cause: truth stretches found / truth stretches (module doc)."""
    st = steps.set_index("step")
    out: dict[str, dict[str, int]] = {}
    for e in schedule.itertuples(index=False):
        if e.end - e.start < EPISODE_MIN_STEPS:
            continue
        lo, hi = float(st.loc[e.start, "t_start_s"]), float(st.loc[e.end - 1, "t_end_s"])
        mine = result_eps[result_eps["cause"] == e.cause] if len(result_eps) else result_eps
        cov = _covered(list(zip(mine["t_start_s"], mine["t_end_s"])) if len(mine) else [], lo, hi) / max(hi - lo, 1e-9)
        d = out.setdefault(e.cause, {"found": 0, "of": 0})
        d["of"] += 1
        d["found"] += int(cov >= EPISODE_COVER)
    return out


def episode_precision(result_eps: pd.DataFrame, schedule: pd.DataFrame, steps: pd.DataFrame) -> dict:
    """{"named": result episodes naming a cause, "right": those overlapping a schedule episode of that cause}."""
    named = result_eps[result_eps["cause"] != UNKNOWN] if len(result_eps) else result_eps
    if not len(named):
        return {"named": 0, "right": 0}
    st = steps.set_index("step")
    spans = [(e.cause, float(st.loc[e.start, "t_start_s"]), float(st.loc[e.end - 1, "t_end_s"]))
             for e in schedule.itertuples(index=False) if e.end > e.start]
    right = sum(any(c == r.cause and r.t_start_s < hi and r.t_end_s > lo for c, lo, hi in spans)
                for r in named.itertuples(index=False))
    return {"named": int(len(named)), "right": int(right)}
