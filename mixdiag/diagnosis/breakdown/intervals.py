"""Interval arithmetic on one device's timeline, vectorised: unions, intersections, and the measure of a
set of disjoint segments inside query windows (a cumulative function read with ``searchsorted``).

Segments are ``(start, end)`` int64 ns arrays, sorted by start and disjoint unless said otherwise.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Segments:
    """Disjoint segments sorted by start (ns); ``cum[i]`` = total length of segments ``< i``."""

    start: np.ndarray
    end: np.ndarray

    @property
    def cum(self) -> np.ndarray:
        return np.concatenate([[0], np.cumsum(self.end - self.start)])

    def total(self) -> int:
        return int((self.end - self.start).sum())


def union(start: np.ndarray, end: np.ndarray) -> Segments:
    """The union of intervals given sorted by start: runs where the running max end never drops
    below the next start merge into one segment."""
    if not len(start):
        return Segments(np.zeros(0, np.int64), np.zeros(0, np.int64))
    run = np.maximum.accumulate(end)
    head = np.ones(len(start), dtype=bool)
    head[1:] = start[1:] > run[:-1]
    heads = np.flatnonzero(head)
    tails = np.append(heads[1:] - 1, len(start) - 1)
    return Segments(start[heads], run[tails])


def intersect(a: Segments, b: Segments) -> Segments:
    """Where both segment sets cover time (a sweep over their boundaries: depth 2 = both)."""
    if not len(a.start) or not len(b.start):
        return Segments(np.zeros(0, np.int64), np.zeros(0, np.int64))
    t = np.concatenate([a.start, a.end, b.start, b.end])
    d = np.concatenate([np.ones(len(a.start)), -np.ones(len(a.end)), np.ones(len(b.start)), -np.ones(len(b.end))])
    o = np.lexsort((d, t))  # at equal times the ends (-1) first: touching segments do not overlap
    t, depth = t[o], np.cumsum(d[o])
    enter = np.flatnonzero(depth == 2)
    s, e = t[enter], t[np.minimum(enter + 1, len(t) - 1)]
    keep = e > s
    return Segments(s[keep], e[keep])


def measure(seg: Segments, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """Length of ``seg`` inside each window ``[lo, hi]`` (ns, float64)."""
    if not len(seg.start) or not len(lo):
        return np.zeros(len(lo))
    cum = seg.cum

    def upto(t):
        k = np.searchsorted(seg.start, t, side="right") - 1
        kk = np.maximum(k, 0)
        part = np.clip(t - seg.start[kk], 0, seg.end[kk] - seg.start[kk])
        return np.where(k >= 0, cum[kk] + part, 0).astype("float64")

    return np.maximum(upto(hi) - upto(lo), 0.0)
