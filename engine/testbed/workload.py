"""Synthetic workloads: groups of requests with arrival processes and length distributions.

A workload is a tuple of :class:`RequestGroup`. Arrival times are in steps (``time_unit = "step"``,
the default: the same seed gives the same batches on any machine) or seconds (``"s"``: arrivals
follow the wall clock, so batch composition depends on how fast the machine is). Prompts are random
token ids from the seed; a group may share a common prefix (``shared_prefix_len``) across its
requests, as a system prompt would.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from mixdiag.engine.config import ConfigError
from mixdiag.engine.core.request import InvalidRequest, SamplingParams

DISTS = ("fixed", "uniform", "lognormal")
ARRIVALS = ("burst", "fixed", "poisson")
TIME_UNITS = ("step", "s")


@dataclass(frozen=True)
class LengthDist:
    """Token-length distribution: fixed ``value``; uniform [low, high]; lognormal(median, sigma) clipped to [low, high]."""

    dist: str = "fixed"
    value: int = 128
    low: int = 1
    high: int = 1024
    median: float = 128.0
    sigma: float = 0.5

    def __post_init__(self):
        if self.dist not in DISTS:
            raise ConfigError(f"length dist must be one of {', '.join(DISTS)}, got {self.dist!r}")
        if self.dist == "fixed" and self.value < 1:
            raise ConfigError(f"fixed length must be >= 1, got {self.value}")
        if self.dist != "fixed" and not 1 <= self.low <= self.high:
            raise ConfigError(f"length bounds must satisfy 1 <= low <= high, got low={self.low} high={self.high}")
        if self.dist == "lognormal" and (self.median <= 0 or self.sigma < 0):
            raise ConfigError("lognormal length needs median > 0 and sigma >= 0")

    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:
        if self.dist == "fixed":
            return np.full(n, self.value, dtype=np.int64)
        if self.dist == "uniform":
            return rng.integers(self.low, self.high + 1, size=n)
        x = rng.lognormal(np.log(self.median), self.sigma, size=n)
        return np.clip(np.rint(x), self.low, self.high).astype(np.int64)

    @property
    def max(self) -> int:
        return self.value if self.dist == "fixed" else self.high


@dataclass(frozen=True)
class RequestGroup:
    """``count`` requests arriving as a ``burst`` at ``start``, every ``interval`` (``fixed``), or
    with exponential gaps of mean ``interval`` (``poisson``)."""

    name: str = "default"
    count: int = 1
    arrival: str = "burst"
    start: float = 0.0
    interval: float = 1.0
    prompt_len: LengthDist = field(default_factory=LengthDist)
    output_len: LengthDist = field(default_factory=lambda: LengthDist(value=32))
    shared_prefix_len: int = 0
    temperature: float = 0.0
    top_p: float = 1.0

    def __post_init__(self):
        if self.count < 0:
            raise ConfigError(f"group {self.name!r}: count must be >= 0")
        if self.arrival not in ARRIVALS:
            raise ConfigError(f"group {self.name!r}: arrival must be one of {', '.join(ARRIVALS)}, got {self.arrival!r}")
        if self.start < 0 or self.interval < 0:
            raise ConfigError(f"group {self.name!r}: start and interval must be >= 0")
        if self.shared_prefix_len < 0:
            raise ConfigError(f"group {self.name!r}: shared_prefix_len must be >= 0")
        try:
            SamplingParams(temperature=self.temperature, top_p=self.top_p)   # validates both
        except InvalidRequest as e:
            raise ConfigError(f"group {self.name!r}: {e}") from None


@dataclass(frozen=True)
class Workload:
    groups: tuple[RequestGroup, ...] = (RequestGroup(),)
    time_unit: str = "step"

    def __post_init__(self):
        if self.time_unit not in TIME_UNITS:
            raise ConfigError(f"workload time_unit must be one of {', '.join(TIME_UNITS)}, got {self.time_unit!r}")


@dataclass(frozen=True)
class WorkItem:
    """One request of a workload: when it arrives (in the workload's time unit) and what it asks."""

    arrival: float
    request_id: str
    prompt: list[int]
    params: SamplingParams
    group: str


def _arrivals(g: RequestGroup, rng: np.random.Generator) -> np.ndarray:
    if g.arrival == "burst":
        return np.full(g.count, g.start)
    if g.arrival == "fixed":
        return g.start + g.interval * np.arange(g.count)
    gaps = rng.exponential(g.interval, size=max(g.count - 1, 0))   # the first request arrives at start
    return g.start + np.concatenate([[0.0], np.cumsum(gaps)])[:g.count]


def generate(workload: Workload, seed: int, vocab_size: int, max_model_len: int) -> list[WorkItem]:
    """The workload's requests, sorted by arrival (ties keep group order). Deterministic in ``seed``."""
    rng = np.random.default_rng(seed)
    items = []
    for gi, g in enumerate(workload.groups):
        arr = _arrivals(g, rng)
        plen = g.prompt_len.sample(rng, g.count)
        olen = g.output_len.sample(rng, g.count)
        prefix = rng.integers(0, vocab_size, size=g.shared_prefix_len).tolist()
        for i in range(g.count):
            n = int(min(max(plen[i], g.shared_prefix_len + 1), max_model_len - 1))
            body = rng.integers(0, vocab_size, size=n - len(prefix)).tolist()
            out = int(min(olen[i], max_model_len - n))
            params = SamplingParams(max_tokens=out, temperature=g.temperature, top_p=g.top_p, ignore_eos=True,
                                    seed=int(rng.integers(0, 2**31)) if g.temperature > 0 else None)
            items.append((float(arr[i]), gi, i, WorkItem(float(arr[i]), f"{g.name}-{i}", prefix + body, params, g.name)))
    items.sort(key=lambda t: t[:3])
    return [t[3] for t in items]
