"""Do TPOT spikes recur in step with prefill work? The rows where prefill work began, and a
binomial test of how many spikes fall next to one against the chance rate (the article's second
signal: spikes whose period matches the prefill chunks' arrivals). Split from :mod:`.signals`.
"""
from __future__ import annotations

import math

import numpy as np
import pandas as pd

from mixdiag.diagnosis.config import SignalConfig


def prefill_events(sig: pd.DataFrame, use_allocation: bool) -> pd.Series:
    """Rows where prefill work began: requests arrived (``arrivals`` > 0), and - only when the
    caller may use it - the token allocation says the row held prefill tokens. Events taken from
    the token counts never corroborate the token counts (the caller decides)."""
    ev = sig["arrivals"].fillna(0).gt(0) if "arrivals" in sig.columns else pd.Series(False, index=sig.index)
    if use_allocation:
        ev |= sig["has_prefill"].astype(bool)
    return ev.astype(bool)


def _binom_sf(k: int, n: int, p: float) -> float:
    """P(X >= k) for X ~ Binomial(n, p), exact, summed in log space (no scipy).

    ``math.comb(n, i) * p ** i`` overflows a float once n passes ~1000 (an hour of spikes), so each
    term is ``exp(log pmf)``: log pmf(k) from ``math.lgamma``, the next ones by the ratio
    pmf(i+1)/pmf(i) = (n-i)/(i+1) * p/(1-p) (a cumulative sum of logs), then log-sum-exp. No normal
    approximation: the exact sum is O(n - k) vectorised, 10^6 terms in milliseconds."""
    if k <= 0:
        return 1.0
    if k > n or p <= 0:
        return 0.0
    if p >= 1:
        return 1.0
    lp, lq = math.log(p), math.log1p(-p)
    head = math.lgamma(n + 1) - math.lgamma(k + 1) - math.lgamma(n - k + 1) + k * lp + (n - k) * lq
    i = np.arange(k, n, dtype="float64")
    logs = head + np.concatenate(([0.0], np.cumsum(np.log((n - i) / (i + 1)) + (lp - lq))))
    top = float(logs.max())
    return float(min(1.0, math.exp(top + math.log(float(np.exp(logs - top).sum())))))


def periodicity(sig: pd.DataFrame, spike_mask: pd.Series, cfg: SignalConfig, events: pd.Series | None = None,
                candidates: pd.Series | None = None) -> dict:
    """Do spikes recur in step with prefill work? A binomial test, not a period ratio.

    ``events`` (default: :func:`prefill_events` without the allocation) marks rows where prefill
    work began. A spike is *near* an event when an event falls on its row or the row before or
    after. Under the null (spikes placed at random among the ``candidates`` rows - decode-visible
    rows by default), a spike is near an event with the chance rate ``p0`` = share of candidate
    rows near one; the test is P(X >= k) for X ~ Binomial(n spikes, p0). ``significant`` when
    that p-value < ``cfg.period_alpha`` and at least ``cfg.period_min_near`` spikes are near events.
    Also reports the median spacing of spikes and events (informational only).
    """
    if events is None:
        events = prefill_events(sig, use_allocation=False)
    events = events.fillna(False).astype(bool)
    near = events | events.shift(1, fill_value=False) | events.shift(-1, fill_value=False)
    cand = candidates.fillna(False).astype(bool) if candidates is not None else pd.Series(True, index=sig.index)
    spikes = spike_mask.fillna(False).astype(bool) & cand
    n, k = int(spikes.sum()), int((spikes & near).sum())
    p0 = float(near[cand].mean()) if cand.any() else float("nan")
    t = sig["t_start_s"]
    return period_stats(int(events.sum()), n, k, p0, t[events].to_numpy(), t[spikes].to_numpy(), cfg) | {"near": near}


def period_stats(n_events: int, n: int, k: int, p0: float, te: np.ndarray, ts: np.ndarray, cfg: SignalConfig) -> dict:
    """:func:`periodicity`'s figures from its counts: ``n`` spikes, ``k`` of them near an event, the
    chance rate ``p0``, event times ``te`` and spike times ``ts``."""
    p = _binom_sf(k, n, p0) if n and np.isfinite(p0) and n_events else float("nan")
    return {"events": n_events, "spikes": n, "near_share": (k / n) if n else float("nan"),
            "chance_share": p0, "p_value": p,
            "significant": bool(np.isfinite(p) and p < cfg.period_alpha and k >= cfg.period_min_near),
            "spike_period_s": float(np.median(np.diff(ts))) if len(ts) >= 3 else float("nan"),
            "prefill_period_s": float(np.median(np.diff(te))) if len(te) >= 3 else float("nan")}
