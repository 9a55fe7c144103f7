"""One side of a diff: what a capture measured, read off its Timeline and its Diagnosis, with the noise
of each figure (:mod:`.noise`).

Nothing here re-diagnoses: ITL quantiles are ``Diagnosis.itl``, the excess by cause is
``Diagnosis.budget`` (budget.py: exact token-time, spike rows charged to their cause, the rest to
``none``) and ``Diagnosis.regimes`` (rules/decomposition.py: every row's excess over the healthy
reference split by evidence, ``unknown`` the remainder), episodes and spike counts are the
diagnosis's. TTFT is the one figure the diagnosis does not compute: first token minus ``arrival_s``
per request (token events, as ``mixdiag tune`` measures it), else the median of interval TTFT
quantiles.

``stream_s`` - the time the measured streams spent between tokens (``token_time_s`` of the budget,
summed over instances) - is the normaliser: excess per stream-second is the share of waiting time
that was excess, comparable between captures of different length or traffic.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from mixdiag.causes import CAUSES
from mixdiag.diagnosis.budget import BUDGET_CAUSES
from mixdiag.diagnosis.diff.noise import NoiseConfig, quantile_noise, ratio_noise
from mixdiag.diagnosis.result import Diagnosis
from mixdiag.diagnosis.rules.decomposition import SPLIT_CAUSES
from mixdiag.schema import Timeline

#: formats whose steps come from device traces (step-class kernel times need one)
TRACE_FORMATS = ("nsys-sqlite", "kineto-json")


@dataclass(frozen=True)
class Figure:
    """One measured value with its noise (half-width of the 95 % block-bootstrap interval; NaN: unknown)."""

    value: float
    noise: float = math.nan


@dataclass(frozen=True)
class CaptureFacts:
    """What one capture (one side of a diff) measured."""

    inputs: tuple[str, ...]
    formats: tuple[str, ...]          # collector formats read
    instances: tuple[str, ...]        # servers (views NAME@... counted once)
    itl_source: str                   # Diagnosis.itl["source"]
    budget_sources: tuple[str, ...]   # per-instance budget unit kinds (token_gaps, step_latency, interval_itl)
    duration_s: float                 # span of the capture's clock
    stream_s: float                   # time streams spent between tokens (the excess normaliser)
    tokens: float                     # decode tokens (gaps) those units cover
    requests: float                   # requests seen (token events; NaN when the capture cannot count them)
    itl_p50_s: Figure
    itl_p99_s: Figure
    ttft_p50_s: Figure
    ttft_p99_s: Figure
    ttft_source: str                  # token_events | interval_quantiles | none
    budget_s: dict[str, float]        # budget excess (stream-seconds) per BUDGET_CAUSES key
    budget_noise: dict[str, float]    # noise of budget_s / stream_s per key, and "total" (every key but none)
    p99_part_s: dict[str, float]      # P99 minus P99 without the cause (one instance with quantiles; else NaN)
    regimes_s: dict[str, float]       # regime decomposition's token-seconds per cause (CAUSES)
    regimes_noise: dict[str, float]   # noise of regimes_s / stream_s per cause, and "total"
    episodes: pd.DataFrame = field(repr=False)  # cause, episodes, excess_s (one row per cause with episodes)
    spikes: dict[str, int] = field(default_factory=dict)
    verdict: str = ""
    partial: tuple[str, ...] = ()     # inputs read only in part (collectors' "partial" flag): analysed, and said so

    @property
    def has_trace(self) -> bool:
        """Whether a device trace is among the inputs (step-class kernel times need one)."""
        return any(f in TRACE_FORMATS for f in self.formats)

    @property
    def budget_total_s(self) -> float:
        return float(sum(self.budget_s.values()))

    @property
    def regimes_total_s(self) -> float:
        return float(sum(self.regimes_s.values()))


def _itl_series(tl: Timeline, d: Diagnosis) -> tuple[np.ndarray, np.ndarray] | None:
    """(times, values) behind the headline ITL quantiles, for their noise."""
    src = d.itl.get("source")
    if src == "token_events" and len(tl.tokens):
        itl = tl.itl()
        return itl["t_s"].to_numpy(dtype=float), itl["itl_s"].to_numpy(dtype=float)
    st = d.steps
    if src == "step_latency" and len(st):
        rows = st[st["granularity"] == "step"]
        dec = rows["has_decode"].fillna(False).astype(bool) if "has_decode" in rows else pd.Series(False, rows.index)
        rows = rows[dec] if dec.any() else rows
        return rows["t_end_s"].to_numpy(dtype=float), rows["latency_s"].to_numpy(dtype=float)
    return None


def _interval_quantile(d: Diagnosis, col: str, cfg: NoiseConfig) -> Figure:
    """Median over intervals of an interval quantile column (what itl_summary reports), with its noise."""
    st = d.steps
    iv = st[st["granularity"] == "interval"] if len(st) and col in st else st.iloc[:0]
    v = iv[col].to_numpy(dtype=float) if len(iv) else np.zeros(0)
    ok = np.isfinite(v)
    if not ok.any():
        return Figure(math.nan)
    t = iv["t_end_s"].to_numpy(dtype=float)[ok]
    return Figure(float(np.median(v[ok])), quantile_noise(t, v[ok], 0.5, cfg))


def _itl(tl: Timeline, d: Diagnosis, cfg: NoiseConfig) -> tuple[Figure, Figure]:
    p50, p99 = d.itl.get("p50_s"), d.itl.get("p99_s")
    p50 = math.nan if p50 is None else float(p50)
    p99 = math.nan if p99 is None else float(p99)
    series = _itl_series(tl, d)
    if series is not None:
        t, v = series
        return Figure(p50, quantile_noise(t, v, 0.5, cfg)), Figure(p99, quantile_noise(t, v, 0.99, cfg))
    if d.itl.get("source") == "interval_quantiles":
        a, b = _interval_quantile(d, "itl_p50_s", cfg), _interval_quantile(d, "itl_p99_s", cfg)
        return Figure(p50, a.noise), Figure(p99, b.noise)
    return Figure(p50), Figure(p99)


def _ttft(tl: Timeline, d: Diagnosis, cfg: NoiseConfig) -> tuple[Figure, Figure, str]:
    tok = tl.tokens
    if len(tok) and "arrival_s" in tok.columns:
        first = tok.sort_values("t_s", kind="stable").groupby(["instance", "request_id"], sort=False).head(1)
        arr = pd.to_numeric(first["arrival_s"], errors="coerce").to_numpy(dtype=float)
        v = first["t_s"].to_numpy(dtype=float) - arr
        ok = np.isfinite(v)
        if ok.any():
            t, v = arr[ok], v[ok]
            return (Figure(float(np.quantile(v, 0.5)), quantile_noise(t, v, 0.5, cfg)),
                    Figure(float(np.quantile(v, 0.99)), quantile_noise(t, v, 0.99, cfg)), "token_events")
    p50, p99 = _interval_quantile(d, "ttft_p50_s", cfg), _interval_quantile(d, "ttft_p99_s", cfg)
    if math.isfinite(p50.value) or math.isfinite(p99.value):
        return p50, p99, "interval_quantiles"
    return Figure(math.nan), Figure(math.nan), "none"


def _budget(d: Diagnosis, cfg: NoiseConfig) -> tuple[dict, dict, dict, float, float]:
    """Excess per budget key, its noise per stream-second, P99 parts, stream-seconds and tokens."""
    excess = {c: float(v) for c, v in d.budget.excess_by_cause().items()}
    insts = d.budget.instances.values()
    stream = float(sum(ib.token_time_s for ib in insts if math.isfinite(ib.token_time_s)))
    tokens = float(sum(ib.n_tokens for ib in insts if math.isfinite(ib.n_tokens)))
    one = list(insts)
    parts = {c: math.nan for c in BUDGET_CAUSES}
    if len(one) == 1 and math.isfinite(one[0].p99_s):
        parts = {c: float(cb.p99_reduction_s) for c, cb in one[0].by_cause.items()}
    u = d.budget.units
    noise = {c: math.nan for c in (*BUDGET_CAUSES, "total")}
    if len(u):
        keys = list(BUDGET_CAUSES)
        code = pd.Categorical(u["cause"], categories=keys).codes
        ex = u["excess_s"].to_numpy(dtype=float)
        num = np.zeros((len(u), len(keys) + 1))
        ok = code >= 0
        num[np.flatnonzero(ok), code[ok]] = ex[ok]
        num[:, -1] = np.where(u["cause"].to_numpy() == "none", 0.0, ex)  # the spikes' excess: none is no cause
        den = u["latency_s"].to_numpy(dtype=float) * u["weight"].to_numpy(dtype=float)
        hw = ratio_noise(u["t_s"].to_numpy(dtype=float), num, den, cfg)
        noise = dict(zip([*keys, "total"], (float(x) for x in hw)))
    return excess, noise, parts, stream, tokens


def _regimes(d: Diagnosis, cfg: NoiseConfig) -> tuple[dict, dict]:
    """Regime token-seconds per cause and their noise per stream-second (denominator: the budget's units)."""
    reg = d.regimes
    total = {c: float(v) for c, v in reg.excess_by_cause().items()}
    noise = {c: math.nan for c in (*CAUSES, "total")}
    ts, parts = [], []
    for inst, (_, p) in sorted(reg.row_parts.items()):
        t = reg.row_t.get(inst)
        if t is not None and len(t) == len(p):
            ts.append(np.asarray(t, dtype=float))
            parts.append(np.asarray(p, dtype=float))
    u = d.budget.units
    if ts and len(u):
        # row_parts columns: the split causes, then unknown (decomposition.SPLIT_CAUSES + ("unknown",))
        names = [*SPLIT_CAUSES, "unknown"]
        p = np.concatenate(parts)
        num = np.c_[p, p.sum(axis=1)]
        den = u["latency_s"].to_numpy(dtype=float) * u["weight"].to_numpy(dtype=float)
        hw = ratio_noise(np.concatenate(ts), num, den, cfg, t_den=u["t_s"].to_numpy(dtype=float))
        noise.update(dict(zip([*names, "total"], (float(x) for x in hw))))
    return total, noise


def _episodes(d: Diagnosis) -> pd.DataFrame:
    ep = d.regimes.episodes
    if not len(ep):
        return pd.DataFrame({"cause": pd.Series(dtype=object), "episodes": pd.Series(dtype="int64"),
                             "excess_s": pd.Series(dtype=float)})
    g = ep.groupby("cause", sort=True)["excess_s"].agg(["count", "sum"]).reset_index()
    return g.rename(columns={"count": "episodes", "sum": "excess_s"})


def _requests(tl: Timeline) -> float:
    tok = tl.tokens
    if not len(tok):
        return math.nan
    return float(tok[["instance", "request_id"]].drop_duplicates().shape[0])


def capture_facts(tl: Timeline, d: Diagnosis, inputs: tuple[str, ...] = (),
                  cfg: NoiseConfig = NoiseConfig()) -> CaptureFacts:
    """The facts of one capture: ``tl`` as loaded, ``d = diagnose(tl)``."""
    span = tl.span() or (math.nan, math.nan)
    itl50, itl99 = _itl(tl, d, cfg)
    tt50, tt99, tsrc = _ttft(tl, d, cfg)
    excess, bnoise, parts, stream, tokens = _budget(d, cfg)
    reg, rnoise = _regimes(d, cfg)
    formats = tuple(sorted({str(s.get("format")) for s in tl.meta.get("sources", []) if s.get("format")}))
    return CaptureFacts(
        inputs=tuple(inputs), formats=formats, instances=tuple(d.headline.instances),
        itl_source=str(d.itl.get("source")),
        budget_sources=tuple(sorted({ib.source for ib in d.budget.instances.values()})),
        duration_s=float(span[1] - span[0]), stream_s=stream, tokens=tokens, requests=_requests(tl),
        itl_p50_s=itl50, itl_p99_s=itl99, ttft_p50_s=tt50, ttft_p99_s=tt99, ttft_source=tsrc,
        budget_s=excess, budget_noise=bnoise, p99_part_s=parts, regimes_s=reg, regimes_noise=rnoise,
        episodes=_episodes(d), spikes=dict(d.by_cause), verdict=d.verdict,
        partial=tuple(str(s.get("path")) for s in tl.meta.get("sources", []) if s.get("partial")))
