"""dialect_columns.iteration_floor / prefill_work.chunk_ahead: vLLM's ``iteration_tokens_total`` records a
prompt at the step of its first token, the last chunk carrying the whole prompt (formats.md §1.1), so an
interval's chunks show up at the latest one prefill time later; and the interval mixing rule names
mixing from prefill work only where such an iteration exceeded the decode batch by a chunk."""
import math

import numpy as np
import pandas as pd
import pytest

from mixdiag.collectors.prometheus.dialect_columns import iteration_floor
from mixdiag.collectors.prometheus.prefill_work import chunk_ahead
from mixdiag.diagnosis import diagnose
from mixdiag.schema import Timeline

LE = np.array([1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384, math.inf], dtype=float)


def _cum(**by_le):
    """cumulative counts of observations put in the bucket with upper edge ``le_<bound>``"""
    inc = np.zeros(len(LE))
    for k, v in by_le.items():
        inc[list(LE).index(float(k[3:]) if k != "le_inf" else math.inf)] += v
    return np.cumsum(inc)


@pytest.mark.parametrize("buckets, floor", [
    ({"le_32": 40}, 16.0),                      # decode steps of 20-32 requests
    ({"le_32": 40, "le_128": 2}, 64.0),         # plus two short prompts' last chunks
    ({"le_32": 40, "le_4096": 1}, 2048.0),      # a 3000-token prompt finished
    ({"le_1": 3}, 0.0),                         # the first bucket: at least 0
    ({"le_inf": 1}, 16384.0),                   # above the ladder
])
def test_floor_is_the_lower_edge_of_the_largest_bucket_observed(buckets, floor):
    assert iteration_floor(LE, _cum(**buckets)) == floor


def test_no_observation_has_no_floor():
    assert math.isnan(iteration_floor(LE, _cum()))


T0 = [0.0, 1.0, 2.0, 3.0, 4.0]
T1 = [1.0, 2.0, 3.0, 4.0, 5.0]


@pytest.mark.parametrize("floor, running, lag, want", [
    # a 4096-token iteration in [3, 4] with a 2 s prefill: intervals ending at 2, 3, 4 reach it
    ([16, 16, 16, 4096, 16], [20] * 5, 2.0, [0, 4076, 4076, 4076, 0]),
    # no prefill time: one interval ahead (the window the late prompt counter is read over)
    ([16, 16, 16, 4096, 16], [20] * 5, None, [0, 0, 4076, 4076, 0]),
    # short prompts only: at most 128 - 20 tokens beyond the batch anywhere
    ([64, 128, 64, 128, 16], [20] * 5, 3.0, [108, 108, 108, 108, 0]),
    # the batch before the interval counts (requests that finished in it still decoded)
    ([16, 32, 16, 16, 16], [20, 40, 20, 20, 20], None, [0, 0, 0, 0, 0]),
])
def test_chunk_ahead_reads_the_largest_iteration_up_to_one_prefill_time_later(floor, running, lag, want):
    assert chunk_ahead(T0, T1, floor, running, lag) == pytest.approx(want)


def test_an_interval_without_a_reading_ahead_stays_unknown():
    got = chunk_ahead(T0, T1, [16, math.nan, 16, 16, 16], [20] * 5, None)
    assert math.isnan(got[0]) and math.isnan(got[1]) and got[2] == 0


@pytest.mark.parametrize("chunk, cause", [(None, "mixing"), (3000.0, "mixing"), (100.0, "unknown")])
def test_prefill_work_names_mixing_only_with_a_chunk_beyond_the_batch(chunk, cause):
    """The same interval with work far above the usual: mixing unless the iteration histogram showed
    only short prompts in and after it (then unknown, with the reason)."""
    rows = [dict(instance="srv", step=i, t_start_s=float(i), t_end_s=i + 1.0, granularity="interval",
                 kind="unknown", prefill_work_tokens=9000.0 if i == 25 else 1000.0 + 10 * (i % 3),
                 running_reqs=32.0, itl_count=300.0, itl_p50_s=0.02, itl_mean_s=0.022,
                 itl_p99_s=0.2 if i == 25 else 0.03, prompt_chunk_ahead_tokens=chunk if i == 25 else 50.0)
            for i in range(30)]
    frame = pd.DataFrame(rows)
    if chunk is None:
        frame["prompt_chunk_ahead_tokens"] = np.nan
    d = diagnose(Timeline(frame, None, meta={}))
    got = d.spikes.set_index("step")
    assert got.at[25, "cause"] == cause
    if cause == "unknown":
        assert "short prompts" in got.at[25, "evidence"]["reason"]


def _prefill_view(counts: dict[str, float]) -> dict:
    return {"vllm:request_prefill_time_seconds_bucket": {(("engine", "0"), ("le", le)): v for le, v in counts.items()}}


@pytest.mark.parametrize("before, after, want", [
    ({"0.3": 5, "0.5": 5, "2.0": 5, "+Inf": 5}, {"0.3": 9, "0.5": 9, "2.0": 10, "+Inf": 10}, 2.0),
    ({"0.3": 5, "0.5": 5, "2.0": 5, "+Inf": 5}, {"0.3": 9, "0.5": 9, "2.0": 9, "+Inf": 9}, 0.3),
    ({"0.3": 0, "0.5": 0, "2.0": 0, "+Inf": 0}, {"0.3": 0, "0.5": 0, "2.0": 0, "+Inf": 1}, 4.0),
    ({"0.3": 0, "+Inf": 0}, {"0.3": 0, "+Inf": 0}, None),
])
def test_longest_prefill_is_the_highest_bucket_observed_over_the_capture(before, after, want):
    from mixdiag.collectors.prometheus.prefill_work import longest_prefill_s
    pairs = [(_prefill_view(before), {}), ({}, _prefill_view(after))]
    assert longest_prefill_s(pairs) == want
