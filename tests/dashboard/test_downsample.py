"""Min/max-per-bucket downsampling keeps every spike and dip visible at 200 000 points."""
import numpy as np
import pytest

from mixdiag.dashboard.downsample import bucket_first_of_each, minmax_indices, window

N = 200_000


@pytest.fixture(scope="module")
def series():
    rng = np.random.default_rng(1)
    x = np.cumsum(rng.uniform(0.01, 0.03, N))
    y = 0.02 + 0.001 * rng.standard_normal(N)
    spikes = np.arange(50) * 3_999 + 17  # farther apart than a bucket (200 points) at 2000 points
    y[spikes] = 0.1 + rng.random(50)
    return x, y, spikes


def test_all_points_when_few():
    x = np.arange(10.0)
    assert minmax_indices(x, x ** 2, max_points=10).tolist() == list(range(10))


def test_200k_points_keep_every_spike_and_the_global_min(series):
    x, y, spikes = series
    idx = minmax_indices(x, y, max_points=2000)
    assert len(idx) <= 2000
    assert np.all(np.diff(idx) > 0)  # sorted, unique
    assert set(spikes.tolist()) <= set(idx.tolist())
    assert int(np.argmin(y)) in idx


@pytest.mark.parametrize("n_buckets", [10, 137, 1000])
def test_each_bucket_max_and_min_is_kept(series, n_buckets):
    x, y, _ = series
    idx = set(minmax_indices(x, y, max_points=2 * n_buckets).tolist())
    edges = x[0] + (x[-1] - x[0]) * np.arange(n_buckets + 1) / n_buckets
    b = np.minimum(np.searchsorted(edges, x, side="right") - 1, n_buckets - 1)
    for k in range(n_buckets):
        members = np.flatnonzero(b == k)
        if len(members):
            assert members[np.argmax(y[members])] in idx
            assert members[np.argmin(y[members])] in idx


def test_zoom_resamples_the_visible_window(series):
    x, y, spikes = series
    s = int(spikes[0])
    lo, hi = x[max(s - 5000, 0)], x[min(s + 5000, N - 1)]
    idx = minmax_indices(x, y, max_points=400, x_range=(hi, lo))  # reversed range is accepted
    assert s in idx and len(idx) <= 400
    inside = x[idx[1:-1]]
    assert inside.min() >= lo and inside.max() <= hi  # only the end neighbours lie outside


def test_window_adds_one_neighbour_each_side():
    x = np.arange(100.0)
    assert window(x, (10.5, 20.5)) == (10, 22)
    assert window(x, None) == (0, 100)
    assert window(x, (-50, 500)) == (0, 100)


def test_nan_is_never_chosen_over_a_number():
    x = np.arange(10_000.0)
    y = np.ones(10_000)
    y[::2] = np.nan
    idx = minmax_indices(x, y, max_points=100)
    assert np.isfinite(y[idx]).all()


@pytest.mark.parametrize("x,y,mp", [(np.arange(5.0), np.arange(4.0), 10), (np.arange(5.0), np.arange(5.0), 1)])
def test_bad_input_raises(x, y, mp):
    with pytest.raises(ValueError):
        minmax_indices(x, y, max_points=mp)


def test_categorical_bucket_keeps_a_rare_mode():
    x = np.arange(N, dtype=float)
    mode = np.array(["FULL"] * N, dtype=object)
    mode[123_457] = "NONE"
    idx = bucket_first_of_each(x, mode, max_points=300)
    assert len(idx) <= 300 + 3
    assert 123_457 in idx
    assert set(mode[idx]) == {"FULL", "NONE"}
