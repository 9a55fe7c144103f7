"""prom_aggregate's pieces without a server: the fast matrix parser, PromQL ``or``, the target x
step grid (``sum by`` of bucket series), PromQL's quantile arithmetic, the iteration-token reading."""
from __future__ import annotations

import json
import math

import numpy as np
import pytest

from mixdiag.collectors.prometheus import prom_aggregate as agg
from mixdiag.collectors.prometheus.dialect_columns import dialect_columns
from mixdiag.collectors.prometheus.prom_common import bucket_quantile


def _body(series: list[dict]) -> bytes:
    doc = {"status": "success", "data": {"resultType": "matrix", "result": series}}
    return json.dumps(doc, separators=(",", ":")).encode()


SERIES = [{"metric": {"instance": "a:1", "le": "+Inf", "odd": 'q"u}o{te]]},{"metric":,"values":[['},
           "values": [[10, "1"], [25.5, "NaN"]]},
          {"metric": {}, "values": [[10, "+Inf"], [25.5, "-Inf"], [40, "0.1234567890123456789"]]},
          {"metric": {"instance": "b:1"}, "values": [[1796108190, "1550.1033333333332"]]}]


def test_parse_matrix_reads_what_json_reads():
    got = agg.parse_matrix(_body(SERIES))
    assert got is not None and [m for m, _, _ in got] == [s["metric"] for s in SERIES]
    for (_, t, v), s in zip(got, SERIES):
        want = np.array([[float(a), float(b)] for a, b in s["values"]])
        np.testing.assert_array_equal(t, want[:, 0])
        np.testing.assert_array_equal(v, want[:, 1])  # NaN == NaN here, same doubles elsewhere
    assert agg.parse_matrix(_body([])) == []


@pytest.mark.parametrize("raw", [
    b'{"status":"error","errorType":"bad_data","error":"parse error"}',
    _body([{"metric": {"x": "1"}, "values": [[1, "2"]]}])[:-1] + b',"warnings":["a]]b"]}',  # text after the data
    _body([{"metric": {"x": "1"}, "histograms": [[1, {"count": "2"}]]}]),  # a native histogram
    _body([{"metric": {"x": "1"}, "values": [[1, "abc"]]}]),  # a value that is no number
])
def test_parse_matrix_leaves_anything_else_to_json(raw):
    assert agg.parse_matrix(raw) is None


def test_either_is_promql_or():
    t = np.array([1.0, 2.0, 3.0])
    a = [("x", {"instance": "x", "le": "1"}, t[:2], np.array([1.0, 2.0]))]
    b = [("x", {"instance": "x", "le": "1"}, t, np.array([7.0, 8.0, 9.0])),
         ("y", {"instance": "y", "le": "1"}, t, np.array([4.0, 5.0, 6.0]))]
    out = agg.either(a, b)
    assert [(k, list(ts), list(vs)) for k, _, ts, vs in out] == [
        ("x", [1.0, 2.0], [1.0, 2.0]), ("x", [3.0], [9.0]), ("y", [1.0, 2.0, 3.0], [4.0, 5.0, 6.0])]
    assert agg.either([], b) is b and agg.either(a, []) is a


def test_grid_sums_bucket_series_per_target_and_bound():
    g = agg._Grid(["x", "y"], np.array([10.0, 20.0]))
    ans = [("x", {"le": "1"}, np.array([10.0, 20.0]), np.array([1.0, 2.0])),
           ("x", {"le": "1.0", "model": "m2"}, np.array([20.0]), np.array([5.0])),
           ("x", {"le": "+Inf"}, np.array([10.0, 20.0]), np.array([3.0, 9.0])),
           ("y", {"le": "oops"}, np.array([10.0]), np.array([1.0])),
           ("z", {"le": "1"}, np.array([10.0]), np.array([1.0]))]  # a target without rows: left out
    upper, val, has = g.buckets(ans)
    assert list(upper) == [1.0, math.inf]
    np.testing.assert_array_equal(val[0], [[1.0, 3.0], [7.0, 9.0]])
    assert np.isnan(val[1]).all() and has.tolist() == [[True, True], [True, False]]


def test_promql_quantile_matches_histogram_quantile_rules():
    rng = np.random.default_rng(0)
    upper = np.array([0.01, 0.025, 0.05, 0.1, 0.5, math.inf])
    counts = np.cumsum(rng.integers(0, 50, size=(200, len(upper))), axis=1).astype(float)
    counts[::7, -1] = counts[::7, -2]  # the top of the rank in the +Inf bucket's edge
    counts[3] = 0.0  # no observation: NaN
    counts[5, 2] = counts[5, 3] + 10  # not monotonic: PromQL fixes it upwards
    for q in (0.5, 0.9, 0.99):
        got = agg.promql_quantile(q, upper, counts)
        want = [bucket_quantile(q, upper, np.maximum.accumulate(c)) for c in counts]
        np.testing.assert_allclose(got, want, rtol=1e-12, equal_nan=True)
    inf_only = np.array([[0.0, 0.0, 0.0, 0.0, 0.0, 5.0]])  # every observation above the last bound
    assert agg.promql_quantile(0.5, upper, inf_only)[0] == 0.5
    assert np.isnan(agg.promql_quantile(0.5, upper[:-1], counts[:1, :-1])[0])  # no +Inf bucket


@pytest.mark.parametrize("with_before", [False, True], ids=["cur-running", "prev-and-cur-running"])
def test_iteration_columns_equal_dialect_columns_row_by_row(with_before):
    rng = np.random.default_rng(1)
    upper = np.array([1.0, 8.0, 16.0, 32.0, 64.0, 128.0, math.inf])
    n = 300
    inc = np.cumsum(rng.integers(0, 20, size=(n, len(upper))), axis=1).astype(float)
    inc[rng.random(n) < 0.3, 4:6] = 0.0  # no step larger than the batch
    inc[::11, 2] = np.nan  # a bucket without a sample at that step
    inc[::13, -1] = np.nan  # no +Inf bucket: no reading
    inc[::17] = 0.0  # no iterations
    has = rng.random(n) < 0.9
    frame = {"kind": np.where(rng.random(n) < 0.2, "idle", "unknown").astype(object),
             "running_reqs": np.where(rng.random(n) < 0.1, np.nan, rng.integers(0, 70, n).astype(float)),
             "output_tokens": np.where(rng.random(n) < 0.2, 0.0, 100.0)}
    # the running gauge at the interval's start (the previous evaluation); dialect_columns reads it
    # from the previous scrape
    before = np.where(rng.random(n) < 0.2, np.nan, rng.integers(0, 70, n).astype(float)) if with_before else None
    out = agg._iteration_columns(upper, inc, has, frame, before)
    name = next(iter(agg.AGG_BUCKETS))
    for r in range(n):
        row = {k: frame[k][r] for k in frame}
        used: dict = {}
        if has[r]:
            view = {name: {(("le", agg._le(u)),): v for u, v in zip(upper, inc[r]) if not np.isnan(v)}}
            prev = ({"vllm:num_requests_running": {(): float(before[r])}}
                    if with_before and np.isfinite(before[r]) else {})
            want = dialect_columns(prev, view, row, used)
        else:
            want = {}
        assert out["kind"][r] == want.get("kind", row["kind"]), r
        assert out["q_token_allocation"][r] == want.get("q_token_allocation"), r
        s = want.get("large_step_share", math.nan)
        assert (math.isnan(s) and math.isnan(out["large_step_share"][r])) or out["large_step_share"][r] == s, r
        assert bool(out["used_kind"][r]) == ("kind" in used), r


def test_tail_floor_matches_the_scrape_reader():
    """The aggregated path's slowest-token floor is the timed-scrape reader's (prom_intervals)."""
    import math

    from mixdiag.collectors.prometheus.prom_common import bucket_tail_floor
    upper = np.array([0.1, 1.0, math.inf])
    inc = np.array([[99.0, 100.0, 100.0],      # one token in (0.1, 1.0]
                    [99.0, 99.0, 100.0],       # one in +Inf
                    [100.0, 100.0, 100.0],     # all fast
                    [0.0, 0.0, 0.0],           # no token
                    [np.nan, 100.0, 100.0]])   # a bucket absent at that step
    got = bucket_tail_floor(upper, inc)
    np.testing.assert_array_equal(got[:3], [0.1, 1.0, 0.0])
    assert np.isnan(got[3]) and np.isnan(got[4])
