"""How much a capture's figures would move on a re-run of the same traffic: a time-block bootstrap.

Basis: token gaps are not independent samples - every decode request waits through the same slow
step, and slow steps come in runs (a long prompt's chunks, a fault window) - so an i.i.d. bootstrap or
a binomial interval of a quantile would be far too narrow. The capture is cut into ``blocks``
consecutive, equally long time blocks (whole slow runs stay inside one block), the blocks are
resampled with replacement ``resamples`` times (seeded: the same input always gets the same noise),
and the statistic is recomputed on each resample. ``halfwidth`` is half the central 95 % interval of
those resamples. Two captures differ beyond noise when their difference exceeds the two sides'
half-widths combined in quadrature (:func:`beyond_noise`).

Shapes: ``t`` (n,) times on the capture's clock; ``values`` (n,) for quantiles; ``numerators`` (n, k)
and ``denominator`` (n,) for ratios of sums (excess per stream-second, one column per cause).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

#: at most this many values enter a quantile bootstrap (an evenly spaced subsample beyond it: a day of tokens
#: would otherwise cost resamples x n)
MAX_VALUES = 200_000


@dataclass(frozen=True)
class NoiseConfig:
    """The bootstrap's setting (module doc)."""

    blocks: int = 20         # consecutive time blocks the capture is cut into
    resamples: int = 200     # bootstrap resamples
    seed: int = 0            # the resampling is seeded: same input, same noise
    level: float = 0.95      # central interval whose half-width is the noise

    def __post_init__(self):
        if self.blocks < 2 or self.resamples < 10 or not 0.5 < self.level < 1:
            raise ValueError("NoiseConfig: blocks >= 2, resamples >= 10, 0.5 < level < 1")


def _block_of(t: np.ndarray, blocks: int) -> np.ndarray:
    """Block index (0..blocks-1) of each time; equal-length blocks over the span."""
    if not len(t):
        return np.zeros(0, dtype=np.int64)
    lo, hi = float(np.nanmin(t)), float(np.nanmax(t))
    if not hi > lo:
        return np.zeros(len(t), dtype=np.int64)
    return np.clip(((t - lo) / (hi - lo) * blocks).astype(np.int64), 0, blocks - 1)


def _counts(cfg: NoiseConfig) -> np.ndarray:
    """(resamples, blocks) how often each block is drawn in each resample."""
    rng = np.random.default_rng(cfg.seed)
    draws = rng.integers(0, cfg.blocks, size=(cfg.resamples, cfg.blocks))
    out = np.zeros((cfg.resamples, cfg.blocks))
    np.add.at(out, (np.repeat(np.arange(cfg.resamples), cfg.blocks), draws.ravel()), 1.0)
    return out


def _halfwidth(samples: np.ndarray, level: float) -> float:
    s = samples[np.isfinite(samples)]
    if len(s) < 10:
        return math.nan
    a = (1 - level) / 2
    lo, hi = np.quantile(s, [a, 1 - a])
    return float(hi - lo) / 2


def quantile_noise(t: np.ndarray, values: np.ndarray, q: float, cfg: NoiseConfig = NoiseConfig()) -> float:
    """Half-width of the bootstrap interval of the ``q`` quantile of ``values`` (NaN with < 2 blocks' data)."""
    t = np.asarray(t, dtype=float)
    v = np.asarray(values, dtype=float)
    ok = np.isfinite(t) & np.isfinite(v)
    t, v = t[ok], v[ok]
    if len(v) > MAX_VALUES:
        pick = np.linspace(0, len(v) - 1, MAX_VALUES).astype(np.int64)
        t, v = t[pick], v[pick]
    if len(v) < 2:
        return math.nan
    block = _block_of(t, cfg.blocks)
    order = np.argsort(v, kind="stable")
    v, block = v[order], block[order]
    counts = _counts(cfg)
    out = np.empty(cfg.resamples)
    for r in range(cfg.resamples):  # weighted quantile: each value weighs as often as its block was drawn
        cw = np.cumsum(counts[r][block])
        total = cw[-1]
        out[r] = v[min(int(np.searchsorted(cw, q * total, side="left")), len(v) - 1)] if total > 0 else np.nan
    return _halfwidth(out, cfg.level)


def ratio_noise(t: np.ndarray, numerators: np.ndarray, denominator: np.ndarray,
                cfg: NoiseConfig = NoiseConfig(), t_den: np.ndarray | None = None) -> np.ndarray:
    """Half-width per column of sum(numerator) / sum(denominator) (k,), NaN where undefined.

    ``t_den`` gives the denominator its own times when it comes from other rows than the numerators
    (both are binned into the same blocks of the joint span)."""
    num = np.asarray(numerators, dtype=float)
    num = num[:, None] if num.ndim == 1 else num
    t = np.asarray(t, dtype=float)
    td = t if t_den is None else np.asarray(t_den, dtype=float)
    den = np.asarray(denominator, dtype=float)
    k = num.shape[1]
    if not len(td) or not len(t):
        return np.full(k, math.nan)
    lo = float(np.nanmin(np.r_[t, td]))
    hi = float(np.nanmax(np.r_[t, td]))
    span = np.array([lo, hi])
    bn = _block_of(np.r_[t, span], cfg.blocks)[: len(t)]
    bd = _block_of(np.r_[td, span], cfg.blocks)[: len(td)]
    num = np.nan_to_num(num)
    num_b = np.stack([np.bincount(bn, weights=num[:, j], minlength=cfg.blocks) for j in range(k)], axis=1)
    den_b = np.bincount(bd, weights=np.nan_to_num(den), minlength=cfg.blocks)
    counts = _counts(cfg)
    d = counts @ den_b
    with np.errstate(invalid="ignore", divide="ignore"):
        ratios = (counts @ num_b) / d[:, None]
    ratios[d <= 0] = np.nan
    return np.array([_halfwidth(ratios[:, j], cfg.level) for j in range(k)])


def beyond_noise(before: float, after: float, noise_before: float, noise_after: float) -> bool | None:
    """True when ``after - before`` exceeds both sides' noise in quadrature; None when a value or its noise
    is unknown (the comparison cannot say)."""
    if before is not None and after is not None and before == after:
        return False  # the same figure: no change whatever the noise
    vals = (before, after, noise_before, noise_after)
    if any(v is None or not math.isfinite(v) for v in vals):
        return None
    return abs(after - before) > math.hypot(noise_before, noise_after)
