"""Step messages, graph-mode rule and gap splitting shared by the trace collectors."""
import numpy as np
import pytest

from mixdiag.collectors.trace_steps import (graph_counts, graph_mode, graph_modes, is_engine_step_range,
                                            parse_step_message, parse_step_messages, split_on_gaps)


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
