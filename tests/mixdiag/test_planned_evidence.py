"""Issue 24 item 3: nothing planned is evidence.

A graph mode planned from the batch shape, or SM activity from a cost model, is ``estimated``; an
``inferred`` one is derived from other rows. Neither may raise any cause's confidence: two timelines
identical except the quality tag must not differ in the estimated/inferred one's favour on any
spike. Graph fallback without a measured graph mode comes only from the measured cost of the
batch shape (detection/shape_cost.py), never from the planned mode.
"""
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from mixdiag.diagnosis import diagnose
from mixdiag.schema import Timeline

sys.path.insert(0, str(Path(__file__).parent))
from diag_cases import build  # noqa: E402
from test_partial_evidence import script  # noqa: E402


def _script_view(tag: str | None, alloc: str) -> Timeline:
    """The partial-evidence script with counts, graph mode and SM activity; graph mode and SM tagged
    ``tag`` (None: the source had neither)."""
    s = script()
    kind = np.where(s["prefill"] > 0, "mixed", "decode")
    graph, sm = (s["graph"], s["sm"]) if tag else ("unknown", np.nan)
    steps = pd.DataFrame(dict(instance="srv", step=s["step"], t_start_s=s["t_start_s"], t_end_s=s["t_end_s"],
                              granularity="step", kind=kind, prefill_tokens=s["prefill"], decode_rows=s["decode"],
                              decode_reqs=s["decode"], graph_mode=graph, sm_active=sm,
                              q_token_allocation=alloc, q_graph_mode=tag or "", q_sm_active=tag or ""))
    return Timeline(steps, None, meta={"signals": {"srv": {}}})


def _cases_view(tag: str | None) -> Timeline:
    """diag_cases' one-fault-per-step stream (tokens measured) with graph mode and SM tagged ``tag``
    (None: the source had neither)."""
    tl = build(drop=() if tag else ("graph_mode", "sm_active"))
    return Timeline(tl.steps.assign(q_graph_mode=tag or "", q_sm_active=tag or ""), tl.tokens, meta={"source": "test"})


VIEWS = {"script-measured-counts": lambda tag: _script_view(tag, "measured"),
         "script-inferred-counts": lambda tag: _script_view(tag, "inferred"),
         "one-fault-per-step": _cases_view}


def _conf(tl: Timeline) -> dict:
    d = diagnose(tl)
    return dict(zip(d.spikes["step"], zip(d.spikes["cause"], d.spikes["confidence"])))


@pytest.mark.parametrize("view", list(VIEWS))
@pytest.mark.parametrize("tag", ["estimated", "inferred"])
def test_an_unmeasured_graph_mode_or_sm_value_raises_no_confidence(view, tag):
    # the graph modes and SM values of these views agree with the truth, so measured they support
    # it; tagged estimated/inferred they must add nothing - on no spike may they score higher
    measured, weak = _conf(VIEWS[view]("measured")), _conf(VIEWS[view](tag))
    assert weak, "the view must have spikes"
    higher = {s: (measured.get(s), c) for s, c in weak.items() if s in measured and c[1] > measured[s][1]}
    assert not higher, higher
    # nor above the same stream without those signals at all (what they add is nothing)
    without = _conf(VIEWS[view](None))
    higher = {s: (without.get(s), c) for s, c in weak.items() if s in without and c[1] > without[s][1]}
    assert not higher, higher
    # and the two unmeasured tags are read alike, spike by spike
    other = _conf(VIEWS[view]("inferred" if tag == "estimated" else "estimated"))
    assert weak == other


def test_measured_graph_mode_and_sm_do_raise_it():
    # the check above can fail: measured corroborators lift mixing above its uncorroborated level
    measured, est = _conf(_script_view("measured", "inferred")), _conf(_script_view("estimated", "inferred"))
    lifted = [s for s, (c, v) in measured.items() if c == "mixing" and s in est and v > est[s][1]]
    assert len(lifted) >= 5


# ---- the CPU graph miss: planned modes, measured cost ------------------------------------------

SLOW = {n for a in range(30, 260, 40) for n in range(a, a + 5)}   # decode batch 17: eager, 2.4x
MIXED = {a - 1 for a in range(30, 260, 40)}                        # the short arrival's prefill


def _graph_miss(planned_for_slow: str, slow: set = SLOW) -> Timeline:
    """Engine-record-shaped steps (graph mode planned, ``estimated``): 16 decodes at 20 ms; a short
    request joins (a mixed step, planned NONE) and keeps the batch at 17 for 5 steps, of which those
    in ``slow`` cost 2.4x; ``planned_for_slow`` is the mode the plan claims for the 17-row steps."""
    rng = np.random.default_rng(3)
    rows, toks, t = [], [], 0.0
    for n in range(300):
        dur = 0.020 * (1 + 0.03 * rng.standard_normal())
        r = dict(instance="engine0", step=n, granularity="step", kind="decode", prefill_tokens=0.0,
                 prefill_reqs=0.0, decode_reqs=16.0, graph_mode="FULL", graph_replayed=0.0,
                 kv_transfer_bytes=0.0, kv_transfer_s=0.0, preempted_reqs=0.0, kv_usage=0.4,
                 q_graph_mode="estimated")
        if n in MIXED:
            # a prompt chunk large enough to slow a step (>= chunk_min_tokens; a smaller one names no mixing)
            r.update(kind="mixed", prefill_tokens=300.0, prefill_reqs=1.0, graph_mode="NONE")
            dur *= 2.6
        elif n in SLOW:
            r.update(decode_reqs=17.0, graph_mode=planned_for_slow)
            dur *= 2.4 if n in slow else 1.0
        r["decode_rows"] = r["decode_reqs"]
        t += 0.0005
        r.update(t_start_s=t, t_end_s=t + dur)
        t += dur
        rows.append(r)
        toks += [dict(instance="engine0", request_id=f"r{q}", t_s=t, n_tokens=1, step=float(n))
                 for q in range(int(r["decode_reqs"]))]
    sig = {"engine0": {"graph_mode": "estimated", "token_allocation": "measured"}}
    return Timeline(pd.DataFrame(rows), pd.DataFrame(toks), meta={"source": "test", "signals": sig})


def test_graph_miss_fallback_comes_from_measured_cost_not_the_plan():
    d = diagnose(_graph_miss("NONE"))
    sp = d.spikes.set_index("step")
    slow = sp.loc[sp.index.isin(SLOW)]
    assert len(slow) >= 0.9 * len(SLOW)
    assert (slow["cause"] == "graph_fallback").all()
    ev = slow["evidence"].iloc[0]
    assert ev["shape_cost_x"] > 2.0 and ev["shape_ref_reqs"] == 16.0
    assert ev["signal_quality"]["graph_mode"] == "estimated"
    # the same steps with the plan claiming FULL: the measured cost names the same cause
    flipped = diagnose(_graph_miss("FULL")).spikes.set_index("step")
    assert flipped.loc[slow.index, "cause"].tolist() == slow["cause"].tolist()


def test_a_planned_eager_mode_without_its_cost_is_no_fallback():
    # the plan says NONE for every 17-row step, but only the first of each run is slow: the size
    # costs what 17 rows cost (no jump), so those spikes have no graph-fallback evidence
    first = {min(n for n in SLOW if a <= n < a + 5) for a in range(30, 260, 40)}
    d = diagnose(_graph_miss("NONE", slow=first))
    sp = d.spikes[d.spikes["step"].isin(first)]
    assert len(sp) >= len(first) - 1
    assert not (sp["cause"] == "graph_fallback").any(), sp[["step", "cause", "confidence"]]


def test_planned_none_on_mixed_steps_does_not_corroborate_mixing():
    d = diagnose(_graph_miss("NONE"))
    mix = d.spikes[d.spikes["step"].isin(MIXED)]
    assert len(mix) and (mix["cause"] == "mixing").all()
    # measured counts alone: 0.8 (plus at most the periodicity's 0.07); nothing from the planned NONE
    # ("left FULL" is not claimed)
    assert all(e.get("graph_left_full") is None for e in mix["evidence"])
    assert (mix["confidence"] <= 0.8 + 0.07).all()


@pytest.mark.parametrize("view", list(VIEWS))
def test_an_unmeasured_graph_mode_or_sm_value_moves_no_excess_between_causes(view):
    # the split of excess by cause (rules/decomposition.py) and the episodes' causes read the same
    # signals: tagged estimated, a graph mode or SM value must split excess exactly as if absent
    est, without = diagnose(VIEWS[view]("estimated")), diagnose(VIEWS[view](None))
    a, b = est.regimes.excess_by_cause(), without.regimes.excess_by_cause()
    assert a == pytest.approx(b), (a, b)
    assert list(est.regimes.episodes["cause"]) == list(without.regimes.episodes["cause"])
    # measured, the same values do move it (the check can fail)
    if view == "one-fault-per-step":
        measured = diagnose(VIEWS[view]("measured")).regimes.excess_by_cause()
        assert measured["graph_fallback"] > a["graph_fallback"]
