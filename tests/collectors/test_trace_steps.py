"""Step messages, graph-mode rule and gap splitting shared by the trace collectors."""
import numpy as np
import pandas as pd
import pytest

from mixdiag.collectors.traces.steps.reconstruct import (attach_step_stats, graph_counts, graph_mode, graph_modes,
                                            is_engine_step_range, parse_step_message, parse_step_messages,
                                            leading_phases, parse_step_stats, split_on_gaps)


@pytest.mark.parametrize("text,step,kind,pre,rows,graph,extra", [
    ("step 3 kind=mixed prefill_tokens=512 decode_reqs=7 decode_rows=14 graph=PIECEWISE", 3, "mixed", 512, 14,
     "PIECEWISE", {}),
    ("step 4 kind=decode prefill_tokens=0 decode_reqs=2 decode_rows=2 graph=FULL spec=1 dp=0", 4, "decode", 0, 2,
     "FULL", {"spec": "1", "dp": "0"}),
    ("step 5 graph=full kind=prefill", 5, "prefill", None, None, "FULL", {}),       # order and case drift
    ("step 6 kind=weird prefill_tokens=x graph=MAYBE", 6, "unknown", None, None, "unknown", {}),
    ("  step 7", 7, "unknown", None, None, "unknown", {}),
])
def test_parse_step_message(text, step, kind, pre, rows, graph, extra):
    m = parse_step_message(text)
    assert (m.step, m.kind, m.prefill_tokens, m.decode_rows, m.graph, m.extra) == (step, kind, pre, rows, graph, extra)


@pytest.mark.parametrize("text", [None, "", "step", "steps 3", "step x kind=decode", "schedule", "stepping 1"])
def test_not_a_step_message(text):
    assert parse_step_message(text) is None
    assert np.isnan(parse_step_messages([text])["step"].iloc[0])


def test_vectorised_parse_matches_the_scalar_one():
    texts = ["step 3 kind=mixed prefill_tokens=512 decode_reqs=7 decode_rows=14 graph=PIECEWISE",
             "step 4 kind=decode prefill_tokens=0 decode_reqs=2 decode_rows=2 graph=FULL spec=1 dp=0",
             "step 5 graph=full kind=prefill", "step 6 kind=weird prefill_tokens=x graph=MAYBE", "  step 7",
             "step 8 kind=idle prefill_tokens=12, decode_rows=3"]
    many = parse_step_messages(texts)
    for i, t in enumerate(texts):
        one, row = parse_step_message(t), many.iloc[i]
        assert (row["step"], row["kind"], row["graph"]) == (one.step, one.kind, one.graph)
        for f in ("prefill_tokens", "decode_reqs", "decode_rows"):
            v = getattr(one, f)
            assert (np.isnan(row[f]) and v is None) or row[f] == v, (t, f)


@pytest.mark.parametrize("launches,between,mode", [(0, 0, "NONE"), (0, 5, "NONE"), (1, 0, "FULL"), (3, 0, "FULL"),
                                                   (2, 1, "PIECEWISE")])
def test_graph_mode_rule(launches, between, mode):
    assert graph_mode(launches, between) == mode
    assert graph_modes([launches, 1], [between, 0]).tolist() == [mode, "FULL"]


def test_split_on_gaps_uses_running_max_of_ends():
    start = np.array([0, 1, 2, 20, 21, 40])
    end = np.array([15, 2, 3, 22, 23, 41])   # the long first item hides the 3..2 "gap"
    assert split_on_gaps(start, end, 4).tolist() == [0, 0, 0, 1, 1, 2]
    assert split_on_gaps(np.array([]), np.array([]), 1).tolist() == []


def test_graph_counts_distinct_launches_and_eager_between():
    step = np.array([0, 0, 0, 0, 1, 1, 1])
    start = np.array([0., 1., 2., 3., 10., 11., 12.])
    key = np.array([5, 5, -1, 6, -1, 7, -1])  # step 0: launch 5 (two kernels), eager, launch 6
    launches, between = graph_counts(step, start, key, 2)
    assert launches.tolist() == [2, 1] and between.tolist() == [1, 0]


def test_engine_step_range_names():
    assert is_engine_step_range("execute_model") and not is_engine_step_range("aten::mm")


@pytest.mark.parametrize("text,step,imb,pre,kvb,ranks", [
    ("step_stats 4 preempted_reqs=1 kv_transfer_bytes=64512 expert_imbalance=2 per_rank_tokens=0,24",
     4, 2.0, 1.0, 64512.0, "0,24"),
    ("step_stats 5 preempted_reqs=0 kv_transfer_bytes=0", 5, np.nan, 0.0, 0.0, None),          # no EP
    ("step_stats 6 kv_transfer_bytes=7 expert_imbalance=1.5e0 extra=x preempted_reqs=2", 6, 1.5, 2.0, 7.0, None),
    ("step_stats 7 preempted_reqs=x expert_imbalance=", 7, np.nan, np.nan, np.nan, None),     # malformed -> NaN
    ("step 7 kind=decode", np.nan, np.nan, np.nan, np.nan, None),                               # a step range
    ("step_stats", np.nan, np.nan, np.nan, np.nan, None),
])
def test_parse_step_stats(text, step, imb, pre, kvb, ranks):
    r = parse_step_stats([text]).iloc[0]
    np.testing.assert_equal([r["step"], r["expert_imbalance"], r["preempted_reqs"], r["kv_transfer_bytes"]],
                            [step, imb, pre, kvb])
    assert r["per_rank_tokens"] == ranks


def test_attach_step_stats_by_step_number_and_kv_ranges_to_the_next_step():
    steps = pd.DataFrame({"group": ["p"] * 3, "tid": ["t"] * 3, "step": [0, 1, 2],
                          "t0": [10.0, 30.0, 50.0], "t1": [20.0, 40.0, 60.0]})
    stats = pd.DataFrame({"group": ["p"] * 6, "tid": ["t"] * 6, "text": [
        "kv_transfer", "step_stats 0 preempted_reqs=0 kv_transfer_bytes=100 expert_imbalance=3",
        "kv_transfer", "step_stats 1 preempted_reqs=2 kv_transfer_bytes=0 expert_imbalance=1",
        "kv_transfer", "step_stats 9 preempted_reqs=5 kv_transfer_bytes=0"],     # step 9: no such step
        "t0": [2.0, 21.0, 25.0, 41.0, 45.0, 61.0], "t1": [7.0, 22.0, 28.0, 42.0, 49.0, 62.0]})
    out, fields = attach_step_stats(steps, stats, "tid", "t0", "t1")
    assert fields == {"expert_imbalance", "preempted_reqs", "kv_transfer_bytes"}
    np.testing.assert_equal(out["expert_imbalance"].to_numpy(), [3.0, 1.0, np.nan])
    np.testing.assert_equal(out["preempted_reqs"].to_numpy(), [0.0, 2.0, np.nan])
    # step 0 received bytes: its kv_transfer range counts; step 1's range only polled; step 2 has no stats.
    np.testing.assert_equal(out["kv_transfer_dur"].to_numpy(), [5.0, 0.0, np.nan])


def test_attach_step_stats_without_stats_leaves_nan_and_no_fields():
    steps = pd.DataFrame({"group": ["p"], "tid": ["t"], "step": [0], "t0": [0.0], "t1": [1.0]})
    out, fields = attach_step_stats(steps, pd.DataFrame(columns=["group", "tid", "text", "t0", "t1"]),
                                    "tid", "t0", "t1")
    assert fields == set() and out["expert_imbalance"].isna().all() and out["preempted_reqs"].isna().all()


def test_leading_phases_start_a_step_at_its_own_kv_transfer_and_schedule():
    steps = pd.DataFrame({"group": ["p"] * 3, "tid": ["t"] * 3, "step": [0, 1, 2],
                          "t0": [10.0, 30.0, 50.0], "t1": [20.0, 40.0, 60.0]})
    phases = pd.DataFrame({"group": ["p"] * 6, "tid": ["t"] * 5 + ["other"], "text": [
        "kv_transfer", "schedule",      # step 0: transfer then schedule
        "schedule",                     # step 1: schedule only
        "kv_transfer",                  # before step 2 but not followed by a schedule: not step 2's lead
        "schedule",                     # inside step 1's range (a nested one): belongs to no later step
        "schedule"],                    # another thread
        "t0": [2.0, 8.0, 25.0, 43.0, 35.0, 45.0], "t1": [7.0, 9.0, 28.0, 44.0, 36.0, 49.0]})
    start, sched = leading_phases(steps, phases, "tid", "t0", "t1")
    np.testing.assert_equal(start, [2.0, 25.0, 50.0])
    np.testing.assert_equal(sched, [1.0, 3.0, np.nan])
