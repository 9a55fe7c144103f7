"""Interval rows: does prefill work per interval go with the ITL excess? A Spearman rank correlation
with a seeded permutation p-value, and the usual level of prefill work it is read against. Split
from :mod:`.signals`.
"""
from __future__ import annotations

import functools

import numpy as np
import pandas as pd

from mixdiag.diagnosis.config import SignalConfig


def rank_relation(work: pd.Series, excess: pd.Series, cfg: SignalConfig) -> dict:
    """Spearman rank correlation of prefill work per interval with the ITL excess, and a one-sided
    permutation p-value (``cfg.relation_perms`` shuffles seeded by ``cfg.relation_seed``: the same input gives
    the same answer). NaN with fewer than ``cfg.relation_min_rows`` intervals or ``cfg.relation_min_work``
    of them holding prefill work."""
    w, e = np.asarray(work, dtype=float), np.asarray(excess, dtype=float)
    m = ~(np.isnan(w) | np.isnan(e))
    w, e = w[m], e[m]
    n_work = int((w > 0).sum())
    # the usual work is what the intervals that did NOT rise held: the half with the least excess (a
    # spike's own work must not set the level it is judged against; under steady mixing most intervals
    # hold some prompt work, and only the ones whose decodes waited on more of it spiked)
    quiet = e <= np.median(e) if len(e) else np.zeros(0, dtype=bool)
    usual = work_usual(w[quiet] if quiet.sum() >= 3 else w)
    # one or two intervals with prefill work are a coincidence, not a relation
    if len(w) < cfg.relation_min_rows or n_work < cfg.relation_min_work or np.ptp(w) == 0 or np.ptp(e) == 0:
        return {"rho": float("nan"), "p_value": float("nan"), "n": int(len(w)), "n_work": n_work} | usual
    rw, re_ = average_ranks(w), average_ranks(e)
    rw, re_ = rw - rw.mean(), re_ - re_.mean()
    den = float(np.sqrt((rw ** 2).sum() * (re_ ** 2).sum()))
    rho = float((rw * re_).sum() / den)
    perm = (rw[_permutations(len(rw), cfg.relation_perms, cfg.relation_seed)] * re_).sum(axis=1) / den
    p = float((1 + (perm >= rho).sum()) / (cfg.relation_perms + 1))
    return {"rho": rho, "p_value": p, "n": int(len(w)), "n_work": n_work} | usual


def work_usual(w: np.ndarray) -> dict:
    """The usual prefill work of an instance's quiet intervals (:func:`rank_relation` passes the half
    with the least ITL excess): median and robust sigma (1.4826 x MAD) of ``w`` (NaN-free). Each interval's own work is read against it (rules/interval_rules.py):
    steady arrivals put prefill work in nearly every interval, so only work above the usual
    explains a spike that the usual intervals did not show."""
    if not len(w):
        return {"work_median": float("nan"), "work_sigma": float("nan")}
    med = float(np.median(w))
    return {"work_median": med, "work_sigma": float(1.4826 * np.median(np.abs(w - med)))}


def counted_work(tokens, itl_rows, starved) -> tuple[np.ndarray, dict]:
    """The prompt-token counter beside a spread work column: per interval its tokens there or in the
    next interval (it counts a prompt when its prefill completes), starved intervals left out, and
    its usual level over the intervals with ITL (``count_median``, ``count_sigma``). A second reading
    of the same prefill: the spread column is an estimate, the counter a count."""
    t = np.asarray(tokens, dtype=float)
    near = work_near(np.where(np.asarray(starved, dtype=bool), np.nan, t), counted_late=True)
    on = np.asarray(itl_rows, dtype=bool) & np.isfinite(t)
    usual = work_usual(t[on])
    return near, {"count_median": usual["work_median"], "count_sigma": usual["work_sigma"]}


def work_near(work: np.ndarray, counted_late: bool) -> np.ndarray:
    """Per interval, the prefill work that ran in it: its own, and with ``counted_late`` (a counter
    that lands a prompt's tokens when its prefill completes - vLLM's prompt counter, arrivals) the
    next interval's too, since the chunks that slowed this interval may be counted there. A column
    that already places the work where it ran (``prefill_work_tokens``) is read as it is. NaN where
    none is known."""
    w = np.asarray(work, dtype=float)
    if not counted_late or not len(w):
        return w.copy()
    with np.errstate(invalid="ignore"):
        return np.fmax(w, np.r_[w[1:], np.nan])


@functools.lru_cache(maxsize=64)
def _permutations(n: int, n_perm: int, seed: int) -> np.ndarray:
    """Row ``i``: the order in which the ``i``-th of ``n_perm`` seeded shuffles puts ``n`` values -
    the same draws as ``rng.permuted(np.tile(x, (n_perm, 1)), axis=1)`` (a shuffle's swaps depend on
    the length only), computed once per length for a fleet of same-length instances."""
    idx = np.random.default_rng(seed).permuted(np.tile(np.arange(n), (n_perm, 1)), axis=1)
    idx.flags.writeable = False
    return idx


def average_ranks(x: np.ndarray) -> np.ndarray:
    """1-based ranks, ties sharing their mean rank (``pd.Series(x).rank()`` for values without NaN)."""
    order = np.argsort(x, kind="stable")
    xs = x[order]
    first = np.r_[True, xs[1:] != xs[:-1]]
    start = np.flatnonzero(first)
    end = np.r_[start[1:], len(x)]  # exclusive
    mean_rank = (start + 1 + end) / 2.0  # mean of start+1 .. end
    out = np.empty(len(x), dtype=float)
    out[order] = np.repeat(mean_rank, end - start)
    return out
