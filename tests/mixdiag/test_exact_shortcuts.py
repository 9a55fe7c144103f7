"""Shortcuts the diagnosis takes at a million rows give what the plain numpy call gives, bit for bit: the
P99s of arrays above a common floor (tail_quantile.py, the budget's "P99 without"), and the step positions
of token gaps by table (spikes._count_at_most, np.searchsorted's answer)."""
import numpy as np
import pytest

from mixdiag.diagnosis import tail_quantile
from mixdiag.diagnosis.detection.spikes import _count_at_most
from mixdiag.diagnosis.tail_quantile import FloorQuantile

_RNG = np.random.default_rng(7)
N = 20_000  # above tail_quantile.MIN_VALUES: the selection path


def _gaps(n):
    """Token gaps: a 20 ms decode level, 3 % of them spiking up to ~10x."""
    return 0.02 + 0.001 * _RNG.standard_normal(n) + (_RNG.random(n) < 0.03) * _RNG.exponential(0.1, n)


LATENCIES = {
    "gaps": _gaps(N),
    "gaps stamped in ms (ties)": np.round(_gaps(N), 3),
    "one value": np.full(N, 0.02),
    "few integers": _RNG.integers(0, 4, N).astype(float),
    # the P1 (q = 0.01: interpolated from the upper neighbour) between 0.05 and 0.23, where numpy's two ways
    # of interpolating round apart: the shortcut must take numpy's
    "upper-side interpolation": np.r_[np.zeros(199), 0.05, 0.23, np.ones(N - 201)],
    "small (plain np.quantile)": _gaps(50),
    "one unit": np.array([0.03]),
}


@pytest.mark.parametrize("q", [0.99, 0.5, 0.01, 0.9999])
@pytest.mark.parametrize("name", LATENCIES)
def test_floor_quantile_is_np_quantile(name, q):
    lat = LATENCIES[name]
    n = len(lat)
    # each unit's excess over its reference: the budget's ``own``; the floor removes all of it
    own = np.where(_RNG.random(n) < 0.5, _RNG.random(n) * lat, 0.0)
    floor = lat - own
    fq = FloorQuantile(floor, q)
    assert fq.value == np.quantile(floor, q)
    assert fq.of(lat) == np.quantile(lat, q)
    for share in (0.0, 0.01, 0.3, 1.0):  # the units of one cause lowered to the floor, the rest as measured
        y = np.where(_RNG.random(n) < share, floor, lat)
        assert fq.of(y) == np.quantile(y, q)


def test_floor_quantile_selects_only_the_tail():
    """At the P99 the selection holds the values above the floor's P99 rank, not the array (the point)."""
    lat = LATENCIES["gaps"]
    fq = FloorQuantile(lat - 0.5 * lat * (_RNG.random(N) < 0.02), 0.99)
    assert not fq.plain and (lat >= fq.cut).sum() < 0.05 * N
    assert tail_quantile.MIN_VALUES < N


def _ids(kind):
    if kind == "dense":
        return np.arange(100, 1100)
    if kind == "dense floats":
        return np.arange(100, 1100).astype(float)
    if kind == "repeated ids":
        return np.sort(_RNG.integers(0, 300, 1000))
    if kind == "gaps in the numbering":
        return np.unique(_RNG.integers(0, 2000, 1000))
    if kind == "sparse (binary search)":
        return np.sort(_RNG.choice(10**7, 1000, replace=False))
    if kind == "not integers (binary search)":
        return np.sort(_RNG.random(1000) * 1000)
    if kind == "unsorted (binary search)":
        return _RNG.permutation(1000)
    raise KeyError(kind)


@pytest.mark.parametrize("kind", ["dense", "dense floats", "repeated ids", "gaps in the numbering",
                                  "sparse (binary search)", "not integers (binary search)", "unsorted (binary search)"])
def test_count_at_most_is_searchsorted(kind):
    ids = _ids(kind)
    x = np.concatenate([_RNG.integers(-50, 2100, 4000).astype(float), _RNG.random(1000) * 2000 - 20,
                        [-np.inf, np.inf, 99.0, 100.0, 1099.0, 1100.0, 100.5, -0.5]])
    assert np.array_equal(_count_at_most(ids, x), np.searchsorted(ids, x, side="right"))
    x[3] = np.nan  # a missing step sorts last, as searchsorted puts it
    assert np.array_equal(_count_at_most(ids, x), np.searchsorted(ids, x, side="right"))


@pytest.mark.parametrize("values", [
    ["r3", "r10", "r1", None, "r2", np.nan, "r10"],  # missing ids: -1, as pandas
    [5, "5", 2.0, 2, "a"],                           # mixed types: pandas' own fallback order
])
def test_group_codes_of_objects_are_pandas_sorted_codes(values):
    """spikes._group_codes of a label column of objects (factorised by object, then its few values sorted)
    gives the codes of pd.factorize(sort=True)."""
    from mixdiag.diagnosis.detection.spikes import _group_codes
    import pandas as pd
    a = np.empty(6000, dtype=object)
    a[:] = [values[i] for i in _RNG.integers(0, len(values), 6000)]
    s = pd.Series(a, dtype=object)
    assert np.array_equal(_group_codes(s), pd.factorize(s, sort=True)[0])
