"""Tier (g)'s strict scoring rule (mixdiag/vllm_testbed/scoring.py) on a hand-built run directory:
no server. Each case pins one clause of the rule in docs/analyze.md."""
from __future__ import annotations

import pytest

from mixdiag.vllm_testbed import scoring
from mixdiag.vllm_testbed.injectors import TruthRow
from mixdiag.vllm_testbed.truth import write_faults

T0 = 1796141800.0


def _iter(t: float, ctx_tok: int, gen_reqs: int, ms: float = 100.0, n: int = 1) -> str:
    return (f"{t:.6f} Engine 000: Iteration({n}): {1 if ctx_tok else 0} context requests, {ctx_tok} context tokens, "
            f"{gen_reqs} generation requests, {gen_reqs} generation tokens, iteration elapsed time: {ms:.2f} ms, "
            f"CPU KV cache usage: 1.0%\n")


@pytest.fixture
def run(tmp_path):
    (tmp_path / "truth").mkdir()
    (tmp_path / "scrapes").mkdir()
    (tmp_path / "truth" / "iterations.log").write_text(
        _iter(T0 + 1.0, 506, 6)            # big chunk mixed with decodes: a mixing unit at ~[0.85, 1.0]
        + _iter(T0 + 2.0, 506, 0)          # prefill-only: nobody decoding, no unit
        + _iter(T0 + 3.0, 200, 6)          # mixed, but below 256 prompt tokens: no unit
        + _iter(T0 + 4.0, 0, 8, ms=10)     # decode
        + _iter(T0 + 5.4, 0, 8, ms=10)     # decodes resumed after the stall at T0+5.0..5.3: it held them
        + _iter(T0 + 9.5, 300, 0))         # a lone prompt after the stall at T0+9.0..9.2: nobody waited
    write_faults([TruthRow(T0 + 5.0, T0 + 5.3, "host_stall", "SIGSTOP"),
                  TruthRow(T0 + 9.0, T0 + 9.2, "host_stall", "gc pause: 1 full collection(s)"),
                  TruthRow(T0, T0 + 10, "kv_pressure", "whole run")], tmp_path / "truth" / "faults.csv")
    for i, total in enumerate((0, 0, 3, 3)):   # the counter rises in (T0+7, T0+8] only
        (tmp_path / "scrapes" / f"{T0 + 6 + i:.3f}.prom").write_text(
            f'vllm:num_preemptions_total{{engine="0",model_name="m"}} {total}.0\n')
    return tmp_path


def test_truth_units_follow_the_rule(run):
    units = scoring.truth_units(run)
    assert [u.cause for u in units] == ["mixing", "host_stall", "kv_pressure"]
    mix, stall, kv = units
    assert mix.t1_s == pytest.approx(T0 + 1.0) and mix.t0_s == pytest.approx(T0 + 1.0 - 0.1 - scoring.LOG_LAG_S)
    assert (stall.t0_s, stall.t1_s) == (T0 + 5.0, T0 + 5.3)
    # the whole-run kv_pressure row of faults.csv is not a unit: only intervals with preemptions are
    assert (kv.t0_s, kv.t1_s) == (T0 + 7.0, T0 + 8.0)


def test_calls_are_right_only_where_their_cause_happened(run):
    units = scoring.truth_units(run)
    calls = scoring.judge([
        (T0 + 0.5, T0 + 1.5, "mixing"),       # an interval holding the big mixed step: right
        (T0 + 1.9, T0 + 2.05, "mixing"),      # a prefill-only step: wrong
        (T0 + 2.9, T0 + 3.05, "mixing"),      # a small mixed step: wrong
        (T0 + 5.25, T0 + 5.4, "host_stall"),  # an ITL gap ending after the stall: right
        (T0 + 0.5, T0 + 1.5, "host_stall"),   # no stall there: wrong
        (T0 + 7.2, T0 + 7.3, "kv_pressure"),  # inside the preemption interval: right
        (T0 + 3.5, T0 + 3.6, "kv_pressure"),  # whole-run fault row, but no preemption: wrong
        (T0 + 4.0, T0 + 4.1, "prefill_stall"),  # not a cause this testbed injects: wrong
        (T0 + 0.9, T0 + 1.0, "unknown"),      # neither
    ], units)
    assert [c.right for c in calls] == [True, False, False, True, False, True, False, False, None]
    t = scoring.tally(calls, units)
    assert t["mixing"] == {"called": 3, "right": 1, "units": 1, "found": 1}
    assert t["prefill_stall"] == {"called": 1, "right": 0, "units": 0, "found": 0}
    assert "unknown" not in t
    p, r, f = scoring.prf(t["mixing"])
    assert (p, r) == (pytest.approx(1 / 3), 1.0) and f == pytest.approx(0.5)
    # a cause named but never true drags macro-F1 down (F1 0 on it)
    assert scoring.macro_f1(t) == pytest.approx((0.5 + 2 / 3 + 2 / 3 + 0.0) / 4)


def test_a_wrong_call_does_not_count_as_found_and_missed_units_lower_recall(run):
    units = scoring.truth_units(run)
    t = scoring.tally(scoring.judge([(T0 + 8.5, T0 + 9.0, "kv_pressure")], units), units)
    assert t["kv_pressure"] == {"called": 1, "right": 0, "units": 1, "found": 0}
    assert t["mixing"]["found"] == 0 and scoring.prf(t["mixing"]) == (None, 0.0, 0.0)
    merged = scoring.merge(t, t)
    assert merged["kv_pressure"] == {"called": 2, "right": 0, "units": 2, "found": 0}
