"""Scoring a diagnosis against ground truth (``truth.csv``) - for benchmarks and tests only;
``diagnose`` never reads truth.

Ground truth labels every step *shaped* by a cause (every mixed step, every step of an EP-hotspot
window, ...), spike or not. A TPOT spike is what users feel, so recall counts only **visible**
truth steps: steps whose latency (from the per-step reference records) is at least
``visible_ratio`` x the rolling median latency of unlabelled steps around them, or where a
request that sat out steps (a preemption victim) began a wait at least that long.

* a predicted spike covers a window: its own step (matched by instance and step number) or, for
  interval rows and foreign step numbering, the truth steps whose end falls inside
  ``[t_start_s, t_end_s]``; its gold set is the union of their causes;
* **precision** of cause c: predicted-c spikes whose gold set holds c / predicted-c spikes;
* **recall** of cause c: visible truth steps with c that a predicted-c spike covers / visible
  truth steps with c. A step shaped by several causes is right when any one of them is named;
  it then leaves the denominators of its other causes;
* ``unknown`` predictions are counted, never scored as a cause;
* **mixing false-alarm rate**: spikes whose gold set lacks ``mixing`` but that were called mixing,
  over all spikes whose gold set lacks mixing.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from mixdiag.diagnosis.attribution import CAUSES
from mixdiag.diagnosis.pipeline import engine_of
from mixdiag.diagnosis.spikes import charge_itl, itl_events, step_timing

SCORED = tuple(c for c in CAUSES if c != "unknown")


@dataclass(frozen=True)
class EvalConfig:
    visible_ratio: float = 1.5
    window_steps: int = 41


def visible_truth(steps: pd.DataFrame, truth: pd.DataFrame, cfg: EvalConfig = EvalConfig(),
                  tokens: pd.DataFrame | None = None) -> pd.DataFrame:
    """Truth rows joined with their step's time and latency, plus ``visible`` (bool).

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
    parts = []
    for inst, g in st.groupby("instance", sort=False):
        g = g.sort_values("step")
        clean = g["latency_s"].where(~g["labelled"] & (g["decode_rows"].fillna(0) > 0))
        med = clean.rolling(cfg.window_steps, center=True, min_periods=1).median().ffill().bfill()
        if med.isna().all():
            med = pd.Series(float(g["latency_s"].median()), index=g.index)
        parts.append(g.assign(clean_median_s=med))
    st = pd.concat(parts) if parts else st.assign(clean_median_s=pd.Series(dtype=float))
    t = truth.merge(st[["instance", "step", "t_start_s", "t_end_s", "latency_s", "stall_max_s", "clean_median_s"]],
                    on=["instance", "step"], how="left")
    thr = cfg.visible_ratio * t["clean_median_s"]
    t["visible"] = (t["latency_s"] >= thr) | (t["stall_max_s"].fillna(0) >= thr)
    return t


def score(spikes: pd.DataFrame, truth_v: pd.DataFrame, by_step: bool = True) -> dict:
    """Precision/recall/F1 per cause, macro-F1, mixing false-alarm rate (see module doc).

    ``spikes``: a Diagnosis' spikes frame. ``truth_v``: :func:`visible_truth`. ``by_step``: match
    step spikes to truth by (instance, step); otherwise (and always for interval rows) by time.
    """
    causes_at = truth_v.groupby(["instance", "step"])["cause"].agg(set).to_dict()
    tv = truth_v.drop_duplicates(["instance", "step"]).sort_values("t_end_s")
    vis_keys = set(map(tuple, truth_v.loc[truth_v["visible"], ["instance", "step"]].itertuples(index=False)))
    covered: dict[tuple, set] = {}  # visible truth step -> causes predicted over it
    pred_ok = {c: 0 for c in CAUSES}
    pred_n = {c: 0 for c in CAUSES}
    non_mix = mix_alarm = unlabelled = 0
    for p in spikes.itertuples(index=False):
        inst = engine_of(p.instance)  # engine0@scrapes is a view of engine0
        if by_step and getattr(p, "granularity", "step") == "step":
            keys = [(inst, int(p.step))]
        else:
            m = (tv["t_end_s"] >= p.t_start_s) & (tv["t_end_s"] <= p.t_end_s + 1e-9)
            if (tv["instance"] == inst).any():
                m &= tv["instance"] == inst
            keys = list(map(tuple, tv.loc[m, ["instance", "step"]].itertuples(index=False)))
        gold = set().union(*[causes_at.get(k, set()) for k in keys]) if keys else set()
        pred_n[p.cause] += 1
        if p.cause in gold:
            pred_ok[p.cause] += 1
        if not gold:
            unlabelled += 1
        if "mixing" not in gold:
            non_mix += 1
            mix_alarm += p.cause == "mixing"
        for k in keys:
            if k in vis_keys:
                covered.setdefault(k, set()).add(p.cause)
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
    per = {}
    for c in SCORED:
        prec = pred_ok[c] / pred_n[c] if pred_n[c] else None
        rec = rec_hit[c] / rec_n[c] if rec_n[c] else None
        f1 = (2 * prec * rec / (prec + rec) if prec is not None and rec is not None and prec + rec > 0
              else (0.0 if (prec is not None or rec is not None) else None))
        per[c] = {"precision": prec, "recall": rec, "f1": f1, "predicted": pred_n[c], "truth_visible": rec_n[c]}
    f1s = [v["f1"] for v in per.values() if v["f1"] is not None]
    detected = sum(1 for k in vis_keys if k in covered)
    return {"per_cause": per, "macro_f1": float(np.mean(f1s)) if f1s else None,
            "unknown_predicted": pred_n["unknown"], "spikes": int(len(spikes)),
            "spikes_without_truth": unlabelled, "visible_truth_steps": len(vis_keys),
            "visible_truth_detected": detected,
            "mixing_false_alarm_rate": (mix_alarm / non_mix) if non_mix else 0.0,
            "non_mixing_spikes": non_mix}
