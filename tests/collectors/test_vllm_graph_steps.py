"""collectors/logs/vllm_graph_steps.py: Iteration steps take the runtime mode the window's
--cudagraph-metrics table counted for their token count, and only where that count ran in one mode."""
import io

import numpy as np
import pytest

from mixdiag.collectors.logs import vllm_log

IT = ("(EngineCore_DP0 pid=1) INFO 11-06 21:21:{s:02d} [core.py:349] Iteration({n}): {c} context requests, "
      "{ct} context tokens, {g} generation requests, {g} generation tokens, iteration elapsed time: 30.00 ms\n")
TABLE = ("(APIServer pid=2) INFO 11-06 21:21:{s:02d} [cuda_graph.py:120] **CUDAGraph Config Settings:**\n\n"
         "- Mode: FULL_AND_PIECEWISE\n- Capture sizes: [1, 2, 4, 8, 16, 24, 32, 40, 48]\n\n**CUDAGraph Stats:**\n\n"
         "| Unpadded Tokens | Padded Tokens | Num Paddings | Runtime Mode | Count |\n|---|---|---|---|---|\n"
         "| 17 | 24 | 7 | FULL | 20 |\n| 71 | 71 | 0 | NONE | 10 |\n| 30 | 32 | 2 | FULL | 3 |\n| 30 | 32 | 2 | PIECEWISE | 1 |\n\n")

# (generation tokens, context tokens, mode the step gets, replayed)
CASES = [
    (17, 0, "FULL", 1.0),       # a uniform decode the table counted FULL
    (71, 0, "NONE", 0.0),       # above the largest capture size: the table counted it run eager
    (20, 10, "unknown", None),  # 30 tokens ran FULL and PIECEWISE in this window: which one is not said
    (5, 0, "unknown", None),    # a count the table does not list
]


def _log(after_table: bool = False) -> str:
    lines = [IT.format(s=1 + i, n=i, c=int(ct > 0), ct=ct, g=g) for i, (g, ct, _, _) in enumerate(CASES)]
    text = "".join(lines) + TABLE.format(s=9)
    if after_table:  # steps after the last table: no window covers them
        text += IT.format(s=12, n=9, c=0, ct=0, g=71)
    return text


@pytest.mark.parametrize("i,case", list(enumerate(CASES)))
def test_step_mode_from_the_window_table(i, case):
    _, _, want, replayed = case
    st = vllm_log.read(io.StringIO(_log()), year=2026).steps
    row = st[st["granularity"] == "step"].sort_values("step").iloc[i]
    assert row["graph_mode"] == want
    if replayed is None:
        assert row.get("q_graph_mode") != "measured"
    else:
        assert row["graph_replayed"] == replayed and row["q_graph_mode"] == "measured"


def test_steps_outside_every_table_window_get_no_mode():
    st = vllm_log.read(io.StringIO(_log(after_table=True)), year=2026).steps
    last = st[st["granularity"] == "step"].sort_values("step").iloc[-1]
    assert last["graph_mode"] == "unknown" and (last.get("q_graph_mode") != "measured" or np.isnan(last["graph_replayed"]))
