"""Faults that hold most of a capture, on the multi-rank trace shapes of the second generator
(tests/helpers/trace_gen2): a fault covering more than half the steps must not become the norm.

Each case is a hand-written schedule (no drawn seed) on a short export, diagnosed end to end and scored
per step with benchmarks/step_scoring.py. The cases are the tier-(d2) failures they stand for:

* a prompt chunk riding on one SGLang DP-attention rank for two thirds of the steps: that rank uploads
  inputs on most steps, which once read it as a per-step-copying engine whose every step was decode, and
  the waiting ranks' eager steps became their own graph-mode norm (token_inference.GPU_INPUT_SHARE,
  signals.decode_graph_norm);
* an EP hotspot running to the end of the capture while the decode batch drifts into batch strata with no
  healthy row: the skewed steps were their strata's low-side reference (step_view: measured rank skew is
  no reference row);
* an eager (graph fallback) stretch holding three quarters of the steps (decode_graph_norm's FULL share).
"""
from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

from helpers.trace_gen2 import Episode, GenConfig, Schedule, generate
from mixdiag.collectors import load
from mixdiag.diagnosis import diagnose

ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("step_scoring", ROOT / "benchmarks" / "step_scoring.py")
sc = importlib.util.module_from_spec(_spec)
sys.modules["step_scoring"] = sc   # dataclasses look their module up
_spec.loader.exec_module(sc)

N = 240
CASES = {
    # shape, episode, cause scored
    "prompt-on-most-steps": ("4-rank", Episode("mixing", 60, 170, 3000.0, 3), "mixing"),
    "ep-hotspot-to-the-end": ("2-rank", Episode("ep_hotspot", 80, N - 80, 4.0, 1), "ep_hotspot"),
    "eager-most-steps": ("4-rank", Episode("graph_fallback", 40, 185, 2.5, -1), "graph_fallback"),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_a_fault_holding_most_steps_is_still_found_on_every_rank(tmp_path, name):
    shape, ep, cause = CASES[name]
    g = generate(GenConfig(shape, 7, N), tmp_path / f"{name}.sqlite", schedule=Schedule(7, N, (ep,)))
    tv = sc.step_truth(g.truth, g.utc_offset_s)
    d = diagnose(load(str(g.path)))
    placed = sc.place_spikes(d.spikes[d.spikes["granularity"] == "step"], tv)
    r = sc.score_steps(placed, tv, (cause,))
    per = r["per_cause"][cause]
    assert per["truth_visible"] > 0.5 * len(tv)          # the case does hold most steps
    assert per["recall"] >= 0.9, (name, per)
    assert per["precision"] == 1.0, (name, per)
    # every rank: the waiting ranks too (they wait for the prompt / hot rank in the all-to-all)
    named = placed[placed["cause"] == cause].groupby("rank")["step"].nunique()
    assert set(named.index) == set(tv["rank"].unique()), (name, named.to_dict())
    assert r["mixing_fp"] == 0
