"""vLLM's ``--cudagraph-metrics`` table counts, per stats window, the batches each runtime mode ran; NONE
only above the largest capture size (``CudagraphDispatcher``). The smallest NONE batch of a window
(``graph_none_min_tokens``, measured) is lent to every scrape interval inside that window (join), and an
interval whose running batch reaches it decoded eager: ``graph_fallback`` unless a large chunk ran."""
from __future__ import annotations

import io

import numpy as np
import pandas as pd
import pytest

from mixdiag.collectors import join_cells
from mixdiag.collectors.logs import vllm_log
from mixdiag.diagnosis import diagnose
from mixdiag.schema import Timeline

STATS = ("INFO 03-01 10:00:{s:02d} [loggers.py:259] Engine 000: Avg prompt throughput: 100.0 tokens/s, "
         "Avg generation throughput: 50.0 tokens/s, Running: 5 reqs, Waiting: 0 reqs, GPU KV cache usage: 10.0%, "
         "Prefix cache hit rate: 0.0%")
HEAD = ["INFO 03-01 10:00:{s:02d} [cuda_graph.py:120] **CUDAGraph Stats:**", "",
        "| Unpadded Tokens | Padded Tokens | Num Paddings | Runtime Mode | Count |",
        "|-----------------|---------------|--------------|--------------|-------|"]


def _log(rows: list[str], mode: str = "FULL_AND_PIECEWISE") -> str:
    setup = [f"INFO 03-01 09:59:59 [cuda_graph.py:90] - Mode: {mode}",
             "INFO 03-01 09:59:59 [cuda_graph.py:90] - Capture sizes: [1, 2, 4, 8, 16, 32]"]
    lines = setup + [STATS.format(s=0)] + [t.format(s=10) for t in HEAD] + rows + [STATS.format(s=10)]
    return "\n".join(lines) + "\n"


@pytest.mark.parametrize("rows, mode, want", [
    (["| 20 | 32 | 12 | FULL | 40 |", "| 40 | 40 | 0 | NONE | 7 |", "| 37 | 37 | 0 | NONE | 3 |"],
     "FULL_AND_PIECEWISE", 37.0),                                          # the smallest eager batch
    (["| 20 | 32 | 12 | FULL | 40 |", "| 300 | 304 | 4 | PIECEWISE | 3 |"], "FULL_AND_PIECEWISE", None),  # none eager
    (["| 20 | 20 | 0 | NONE | 40 |"], "NONE", None),                      # graphs off: no fallback to read
])
def test_smallest_none_batch_of_the_window(rows, mode, want):
    s = vllm_log.read(io.StringIO(_log(rows, mode)), instance="v", year=2025).steps
    got = s["graph_none_min_tokens"].iloc[-1] if "graph_none_min_tokens" in s else np.nan
    assert (np.isnan(got) if want is None else got == want)


def test_join_lends_the_window_value_to_every_interval_inside_it():
    spine = pd.DataFrame({"t_start_s": np.arange(0.0, 20.0), "t_end_s": np.arange(1.0, 21.0)})
    other = pd.DataFrame({"t_start_s": [0.0, 10.0], "t_end_s": [10.0, 20.0], "graph_none_min_tokens": [np.nan, 37.0]})
    got = join_cells.fill_window(spine, other)["graph_none_min_tokens"].to_numpy()
    assert np.isnan(got[:9]).all() and (got[10:19] == 37.0).all()  # rows ending in (10, 20]
    assert np.isnan(got[9])  # ends at 10: the first window's, which ran no batch eager


@pytest.mark.parametrize("running, prefill_work, chunk, cause", [
    (40.0, 0.0, 0.0, "graph_fallback"),      # batch above the smallest eager one, no prompt work
    (40.0, 9000.0, 100.0, "graph_fallback"),  # work far above the usual, but only short prompts
    (40.0, 9000.0, 4000.0, "mixing"),        # a large chunk ran: that explains the spike
    (20.0, 0.0, 0.0, "unknown"),             # batch below it: decoded in a graph
])
def test_interval_with_an_eager_batch(running, prefill_work, chunk, cause):
    rows = [dict(instance="srv", step=i, t_start_s=float(i), t_end_s=i + 1.0, granularity="interval", kind="unknown",
                 prefill_work_tokens=prefill_work if i == 25 else 1000.0 + 10 * (i % 3),
                 running_reqs=running if i == 25 else 20.0, itl_count=300.0, itl_p50_s=0.02, itl_mean_s=0.022,
                 itl_p99_s=0.2 if i == 25 else 0.03, prompt_chunk_ahead_tokens=chunk if i == 25 else 50.0,
                 graph_none_min_tokens=37.0) for i in range(30)]
    got = diagnose(Timeline(pd.DataFrame(rows), None, meta={})).spikes.set_index("step")
    assert got.at[25, "cause"] == cause


def test_the_batch_at_the_intervals_start_counts_too():
    """The gauge of the previous scrape is the batch the interval's first steps ran: a burst that ended
    inside the interval (40 running at its start, 20 at its end) still decoded eager there."""
    rows = [dict(instance="srv", step=i, t_start_s=float(i), t_end_s=i + 1.0, granularity="interval", kind="unknown",
                 prefill_work_tokens=1000.0 + 10 * (i % 3), running_reqs=40.0 if i == 24 else 20.0, itl_count=300.0,
                 itl_p50_s=0.02, itl_mean_s=0.022, itl_p99_s=0.2 if i == 25 else 0.03, prompt_chunk_ahead_tokens=50.0,
                 graph_none_min_tokens=37.0) for i in range(30)]
    got = diagnose(Timeline(pd.DataFrame(rows), None, meta={})).spikes.set_index("step")
    assert got.at[25, "cause"] == "graph_fallback"
    assert got.at[25, "evidence"]["running_reqs"] == 40.0
