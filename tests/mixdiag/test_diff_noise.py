"""The diff's noise: a seeded time-block bootstrap, and the beyond-noise rule (mixdiag/diagnosis/diff/noise.py)."""
import math

import numpy as np
import pytest

from mixdiag.diagnosis.diff.noise import NoiseConfig, beyond_noise, quantile_noise, ratio_noise


def test_quantile_noise_is_zero_for_a_constant_and_grows_with_the_spread():
    t = np.arange(1000.0)
    assert quantile_noise(t, np.full(1000, 0.02), 0.99) == 0.0
    rng = np.random.default_rng(1)
    narrow = quantile_noise(t, 0.02 + 0.001 * rng.standard_normal(1000), 0.5)
    wide = quantile_noise(t, 0.02 + 0.010 * rng.standard_normal(1000), 0.5)
    assert 0 < narrow < wide


def test_slow_steps_in_one_stretch_are_noisier_than_the_same_steps_spread_out():
    """The reason for blocks: 20 slow gaps in a row can all fall out of a resample, 20 spread ones cannot."""
    t = np.arange(2000.0)
    clustered = np.full(2000, 0.02)
    clustered[1000:1020] = 0.2
    spread = np.full(2000, 0.02)
    spread[::100] = 0.2
    assert quantile_noise(t, clustered, 0.99) > quantile_noise(t, spread, 0.99)


def test_noise_is_seeded_and_needs_data():
    t, v = np.arange(300.0), np.sin(np.arange(300.0)) + 2
    assert quantile_noise(t, v, 0.99) == quantile_noise(t, v, 0.99)
    assert quantile_noise(t, v, 0.99, NoiseConfig(seed=1)) != quantile_noise(t, v, 0.99, NoiseConfig(seed=2))
    assert math.isnan(quantile_noise(np.array([1.0]), np.array([0.1]), 0.5))


def test_ratio_noise_per_column_and_a_separate_denominator_clock():
    t = np.arange(100.0)
    num = np.c_[np.ones(100), np.where(t < 10, 5.0, 0.0)]  # column 1: all its excess in the first tenth
    hw = ratio_noise(t, num, np.ones(100))
    assert hw[0] == 0.0 and hw[1] > 0  # a constant rate has no noise; a clustered one has
    hw2 = ratio_noise(t[::2], num[::2], np.ones(100), t_den=t)
    assert np.isfinite(hw2).all()
    assert np.isnan(ratio_noise(np.zeros(0), np.zeros((0, 2)), np.zeros(0))).all()


@pytest.mark.parametrize("before, after, nb, na, expected", [
    (1.0, 1.0, math.nan, math.nan, False),   # the same figure: no change whatever the noise
    (1.0, 1.2, 0.1, 0.1, True),              # 0.2 > 0.141
    (1.0, 1.1, 0.1, 0.1, False),             # 0.1 < 0.141
    (1.0, 0.5, 0.3, 0.3, True),
    (1.0, 2.0, math.nan, 0.1, None),         # no noise estimate: cannot say
    (None, 2.0, 0.1, 0.1, None),
])
def test_beyond_noise(before, after, nb, na, expected):
    assert beyond_noise(before, after, nb, na) is expected


def test_config_is_validated():
    with pytest.raises(ValueError):
        NoiseConfig(blocks=1)
