"""Scoring a diagnosis against ground truth - for benchmarks and tests only; ``diagnose`` never
reads truth.

Ground truth labels every step *shaped* by a cause (every mixed step, every step of an EP-hotspot
window, ...), spike or not. A TPOT spike is what users feel, so recall counts only **visible**
truth steps: steps whose latency is at least ``visible_ratio`` x the rolling median latency of
cause-free steps around them (or, for the reference engine, where a request that sat out steps - a
preemption victim - began a wait at least that long). Truth comes from the reference engine's
``truth.csv`` + per-step records (:func:`visible_truth`) or from the foreign-trace simulator's
per-step truth (:func:`foreign_truth`).

* a predicted spike covers a window: its own step (matched by instance and step number), widened by
  ``tolerance`` steps either side, or, for interval rows, the truth steps whose end falls inside
  ``[t_start_s, t_end_s]``; its **gold set** is the union of their causes. Foreign step numbering is
  first mapped onto truth's by time (:func:`map_to_truth_steps`);
* a spike is **right** when its cause is in its gold set. A spike on cause-free steps (empty gold
  set) is wrong for the cause it names (a precision loss); called ``unknown`` it is counted, never
  scored;
* **precision** of cause c: right predicted-c spikes / predicted-c spikes;
* **recall** of cause c: visible truth steps with c that a predicted-c spike covers / visible
  truth steps with c. Truth steps that did not spike (not visible) are neither hits nor misses. A
  step shaped by several causes is right when any one of them is named; it then leaves the
  denominators of its other causes;
* **mixing false-alarm rate**: spikes whose gold set lacks ``mixing`` but that were called mixing,
  over all spikes whose gold set lacks mixing (cause-free spikes included);
* **confusion**: truth cause x called cause per spike (truth ``none`` = cause-free window; the truth
  cause is the called one when right, else the spike's own step's cause), plus ``(missed)`` for
  visible truth steps no spike covers;
* **calibration**: non-``unknown`` spikes binned by confidence, with the share that is right.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from mixdiag.causes import CAUSES
from mixdiag.diagnosis.detection.spikes import charge_itl, itl_events, step_timing

SCORED = tuple(c for c in CAUSES if c != "unknown")
CALIBRATION_BINS = ((0.0, 0.5), (0.5, 0.8), (0.8, 1.0))
MISSED = "(missed)"


@dataclass(frozen=True)
class EvalConfig:
    visible_ratio: float = 1.5
    window_steps: int = 41

    def __post_init__(self):
        if self.visible_ratio <= 0 or self.window_steps < 1:
            raise ValueError("visible_ratio must be > 0 and window_steps >= 1")


def _engine(instance: str) -> str:
    """``engine0@scrapes`` is a view of ``engine0`` (the collectors' naming of clashing inputs)."""
    return str(instance).split("@", 1)[0]


def _mark_visible(st: pd.DataFrame, cfg: EvalConfig) -> pd.DataFrame:
    """``clean_median_s`` (rolling median latency of unlabelled decode steps) and ``visible``."""
    parts = []
    for _, g in st.groupby("instance", sort=False):
        g = g.sort_values("step")
        clean = g["latency_s"].where(~g["labelled"] & (g["decode_rows"].fillna(0) > 0))
        med = clean.rolling(cfg.window_steps, center=True, min_periods=1).median().ffill().bfill()
        if med.isna().all():
            med = pd.Series(float(g["latency_s"].median()), index=g.index)
        parts.append(g.assign(clean_median_s=med))
    return pd.concat(parts) if parts else st.assign(clean_median_s=pd.Series(dtype=float))


def visible_truth(steps: pd.DataFrame, truth: pd.DataFrame, cfg: EvalConfig = EvalConfig(),
                  tokens: pd.DataFrame | None = None) -> pd.DataFrame:
    """Truth rows (``truth.csv``) joined with their step's time and latency, plus ``visible``.

    With ``tokens``, a step is also visible when a request that sat out steps began its long wait
    there (a preemption is felt by its victims, not by the step's duration).
    """
    st = step_timing(steps[steps["granularity"] == "step"])
    st["stall_max_s"] = np.nan
    if tokens is not None and len(tokens):
        for inst, g in st.groupby("instance", sort=False):
            g = g.sort_values("step")
            ch = charge_itl(g, itl_events(tokens[tokens["instance"] == inst]))
            st.loc[g.index, "stall_max_s"] = ch["stall_max_s"].to_numpy()
    labelled = set(zip(truth["instance"], truth["step"].astype(int)))
    st["labelled"] = [(i, int(s)) in labelled for i, s in zip(st["instance"], st["step"])]
    st = _mark_visible(st, cfg)
    t = truth.merge(st[["instance", "step", "t_start_s", "t_end_s", "latency_s", "stall_max_s", "clean_median_s"]],
                    on=["instance", "step"], how="left")
    thr = cfg.visible_ratio * t["clean_median_s"]
    t["visible"] = (t["latency_s"] >= thr) | (t["stall_max_s"].fillna(0) >= thr)
    return t


def foreign_truth(sim_steps: pd.DataFrame, offset_s: float, instance: str = "sim",
                  cfg: EvalConfig = EvalConfig()) -> pd.DataFrame:
    """The foreign-trace simulator's per-(step, rank) truth as one row per step (all steps; cause
    ``none`` for cause-free ones), on the unix clock (``offset_s`` + trace ns / 1e9).

    A step's felt latency is the time from the previous step's end to its end (what a decoding
    request waits for its token, host stalls and scheduling gaps included); ``visible`` as in
    :func:`visible_truth`. Ranks of one step are one row: span over ranks, causes united.
    """
    g = sim_steps.groupby("step", sort=True)
    st = pd.DataFrame({"t_start_s": g["t_start_ns"].min() / 1e9 + offset_s,
                       "t_end_s": g["t_end_ns"].max() / 1e9 + offset_s,
                       "decode_rows": g["decode_rows"].max(),
                       "causes": g["cause"].agg(lambda c: sorted(set(c) - {"none"}))}).reset_index()
    st["instance"] = instance
    st["latency_s"] = st["t_end_s"].diff().fillna(st["t_end_s"] - st["t_start_s"])
    st["labelled"] = st["causes"].str.len() > 0
    st["stall_max_s"] = np.nan
    st = _mark_visible(st, cfg)
    st["visible"] = st["labelled"] & (st["latency_s"] >= cfg.visible_ratio * st["clean_median_s"])
    st = st.explode("causes").rename(columns={"causes": "cause"})
    st["cause"] = st["cause"].fillna("none")
    return st.drop(columns=["labelled"]).reset_index(drop=True)


def map_to_truth_steps(spikes: pd.DataFrame, truth_v: pd.DataFrame) -> pd.DataFrame:
    """Step spikes renumbered in truth's steps by time (a foreign collector numbers steps its own
    way): each gets the truth step whose end is the first at or after the spike's midpoint (a host
    stall's idle gap lies before the step it delays), and truth's instance when truth has one."""
    tv = truth_v.drop_duplicates(["instance", "step"]).sort_values("t_end_s")
    out = spikes.copy()
    is_step = out["granularity"] == "step"
    if not is_step.any() or tv.empty:
        return out
    insts = tv["instance"].unique()
    mid = ((out.loc[is_step, "t_start_s"] + out.loc[is_step, "t_end_s"]) / 2).to_numpy()
    ends = tv["t_end_s"].to_numpy()
    idx = np.clip(np.searchsorted(ends, mid - 1e-9), 0, len(tv) - 1)
    out.loc[is_step, "step"] = tv["step"].to_numpy()[idx]
    if len(insts) == 1:
        out["instance"] = insts[0]
    return out


def judge(spikes: pd.DataFrame, truth_v: pd.DataFrame, by_step: bool = True, tolerance: int = 0,
          step_window_s: float | None = None) -> pd.DataFrame:
    """One row per spike: ``cause``, ``confidence``, ``gold`` (set), ``truth_cause``, ``right``, and
    ``keys`` (the truth steps it covers). See the module doc for the matching rules.

    ``step_window_s``: step rows whose numbering is not the engine's and whose time is known only
    to a log stamp's resolution (SGLang lines: whole seconds, no step number) are matched by time,
    covering the truth steps that end within ``[t_start_s, max(t_end_s, t_start_s + step_window_s)]``."""
    labelled = truth_v[truth_v["cause"].isin(SCORED)]
    causes_at = labelled.groupby(["instance", "step"])["cause"].agg(set).to_dict()
    tv = truth_v.drop_duplicates(["instance", "step"]).sort_values("t_end_s")
    rows = []
    for p in spikes.itertuples(index=False):
        inst = _engine(p.instance)
        is_step = getattr(p, "granularity", "step") == "step"
        if by_step and is_step and step_window_s is None:
            own = (inst, int(p.step))
            keys = [(inst, int(p.step) + k) for k in range(-tolerance, tolerance + 1)]
        else:
            t_end = max(p.t_end_s, p.t_start_s + step_window_s) if is_step and step_window_s else p.t_end_s
            m = (tv["t_end_s"] >= p.t_start_s) & (tv["t_end_s"] <= t_end + 1e-9)
            if (tv["instance"] == inst).any():
                m &= tv["instance"] == inst
            keys = list(map(tuple, tv.loc[m, ["instance", "step"]].itertuples(index=False)))
            own = None
        gold = set().union(*[causes_at.get(k, set()) for k in keys]) if keys else set()
        right = p.cause in gold
        own_causes = sorted(causes_at.get(own, set())) if own else []
        truth_cause = p.cause if right else (own_causes[0] if own_causes else (sorted(gold)[0] if gold else "none"))
        conf = getattr(p, "confidence", np.nan)
        rows.append({"instance": p.instance, "cause": p.cause, "confidence": float(conf) if conf is not None else np.nan,
                     "gold": gold, "truth_cause": truth_cause, "right": right, "keys": keys})
    cols = ["instance", "cause", "confidence", "gold", "truth_cause", "right", "keys"]
    return pd.DataFrame(rows, columns=cols)


def score_judged(judged: pd.DataFrame, truth_v: pd.DataFrame, causes: tuple[str, ...] | None = None) -> dict:
    """Precision/recall/F1 per cause, macro-F1 (over ``causes``, default every scored cause with a
    prediction or a visible truth step), mixing false-alarm rate, confusion (module doc)."""
    labelled = truth_v[truth_v["cause"].isin(SCORED)]
    causes_at = labelled.groupby(["instance", "step"])["cause"].agg(set).to_dict()
    vis_keys = set(map(tuple, labelled.loc[labelled["visible"].fillna(False).astype(bool),
                                          ["instance", "step"]].itertuples(index=False)))
    covered: dict[tuple, set] = {}
    pred_ok = {c: 0 for c in CAUSES}
    pred_n = {c: 0 for c in CAUSES}
    confusion: dict[str, dict[str, int]] = {}
    for p in judged.itertuples(index=False):
        pred_n[p.cause] += 1
        pred_ok[p.cause] += bool(p.right)
        row = confusion.setdefault(p.truth_cause, {})
        row[p.cause] = row.get(p.cause, 0) + 1
        for k in p.keys:
            if k in vis_keys:
                covered.setdefault(k, set()).add(p.cause)
    non_mix = int((~judged["gold"].map(lambda g: "mixing" in g)).sum()) if len(judged) else 0
    mix_alarm = int(((judged["cause"] == "mixing") & ~judged["gold"].map(lambda g: "mixing" in g)).sum()) \
        if len(judged) else 0
    rec_hit = {c: 0 for c in SCORED}
    rec_n = {c: 0 for c in SCORED}
    for k in vis_keys:
        true = causes_at.get(k, set())
        named = covered.get(k, set()) & true
        for c in true & set(SCORED):
            if named and c not in named:
                continue  # another true cause of this step was named: right, and not a miss of c
            rec_n[c] += 1
            rec_hit[c] += c in named
        if k not in covered:
            row = confusion.setdefault(sorted(true)[0], {})
            row[MISSED] = row.get(MISSED, 0) + 1
    per = {}
    for c in SCORED:
        prec = pred_ok[c] / pred_n[c] if pred_n[c] else None
        rec = rec_hit[c] / rec_n[c] if rec_n[c] else None
        f1 = (2 * prec * rec / (prec + rec) if prec is not None and rec is not None and prec + rec > 0
              else (0.0 if (prec is not None or rec is not None) else None))
        per[c] = {"precision": prec, "recall": rec, "f1": f1, "predicted": pred_n[c], "truth_visible": rec_n[c]}
    pool = causes if causes is not None else SCORED
    f1s = [per[c]["f1"] for c in pool if per[c]["f1"] is not None]
    return {"per_cause": per, "macro_f1": float(np.mean(f1s)) if f1s else None,
            "macro_f1_causes": [c for c in pool if per[c]["f1"] is not None],
            "unknown_predicted": pred_n["unknown"], "spikes": int(len(judged)),
            "spikes_without_truth": int((judged["gold"].map(len) == 0).sum()) if len(judged) else 0,
            "visible_truth_steps": len(vis_keys), "visible_truth_detected": sum(1 for k in vis_keys if k in covered),
            "mixing_false_alarm_rate": (mix_alarm / non_mix) if non_mix else 0.0,
            "non_mixing_spikes": non_mix, "confusion": confusion}


def score(spikes: pd.DataFrame, truth_v: pd.DataFrame, by_step: bool = True, tolerance: int = 0,
          causes: tuple[str, ...] | None = None) -> dict:
    """:func:`judge` then :func:`score_judged`. ``spikes``: a Diagnosis' spikes frame. ``truth_v``:
    :func:`visible_truth` or :func:`foreign_truth`. ``by_step``: match step spikes to truth by
    (instance, step) +- ``tolerance``; otherwise (and always for interval rows) by time."""
    return score_judged(judge(spikes, truth_v, by_step, tolerance), truth_v, causes)


def calibration(judged: pd.DataFrame, bins=CALIBRATION_BINS) -> list[dict]:
    """Non-``unknown`` spikes per confidence bin ``[lo, hi)`` (the last bin closed): count and the
    share that is right (None when empty)."""
    j = judged[(judged["cause"] != "unknown") & judged["confidence"].notna()]
    out = []
    for i, (lo, hi) in enumerate(bins):
        last = i == len(bins) - 1
        m = (j["confidence"] >= lo) & ((j["confidence"] <= hi) if last else (j["confidence"] < hi))
        n = int(m.sum())
        out.append({"bin": f"[{lo:g},{hi:g}{']' if last else ')'}", "count": n,
                    "accuracy": float(j.loc[m, "right"].mean()) if n else None})
    return out
