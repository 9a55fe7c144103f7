"""Two captures side by side: what moved, beyond noise, and which cause moved it.

Rules (docs/diff.md):

* **Noise.** A figure moved only when the difference exceeds both sides' block-bootstrap half-widths in
  quadrature (:mod:`.noise`); otherwise it is ``no change``. Where a side has no noise estimate the
  verdict is ``unknown``, never a change by default. Identical figures are always ``no change``.
* **Normalising.** Excess is compared per stream-second (excess / the time streams spent between
  tokens), so a longer capture or more traffic does not read as more excess. When the two sides'
  stream-seconds differ by more than ``NORMALISE_X`` the table's AFTER seconds are the AFTER rate times
  BEFORE's stream-seconds (and the diff says so); otherwise the raw seconds.
* **Which cause.** Each cause's share of the change of the causes' total excess (a share above 100 %: other
  causes moved the other way). The cause named as having moved the total is the one whose own change is
  beyond noise and largest in the total's direction; with none beyond noise, the largest share when the
  total itself moved beyond noise; else none is named. The total's own verdict is always shown beside it. The budget (budget.py) charges spikes' excess to causes and
  sub-threshold latency to ``none``; ``none`` is no cause and stays out of the total (its row is shown).
  The regime decomposition (rules/decomposition.py) splits every row's excess by evidence, ``unknown``
  the remainder: its total includes ``unknown``.
* **Comparable.** Different views (ITL from token events on one side, from step latency or interval
  quantiles on the other), different budget units, or different server counts measure different things:
  the diff still shows both, and says they are not comparable. Spans differing more than
  ``DURATION_X`` or traffic rates more than ``RATE_X`` are caveats.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pandas as pd

from mixdiag.causes import CAUSES
from mixdiag.diagnosis.budget import BUDGET_CAUSES
from mixdiag.diagnosis.diff.capture import CaptureFacts, Figure
from mixdiag.diagnosis.diff.noise import NoiseConfig, beyond_noise
from mixdiag.diagnosis.diff.prediction import PredictionCheck

#: stream-seconds differing by more than this share: excess compared per stream-second
NORMALISE_X = 0.10
#: capture spans differing by more than this factor: a caveat (the longer one saw more of its traffic's phases)
DURATION_X = 1.5
#: decode-token or request rates differing by more than this factor: a caveat (load shapes latency)
RATE_X = 1.25
#: how the noise is estimated, in words (shown with every diff)
NOISE_BASIS = (f"noise: half-width of the 95 % interval of a time-block bootstrap ({NoiseConfig().blocks} consecutive "
               f"blocks, {NoiseConfig().resamples} seeded resamples) per side; a difference beyond both sides' noise "
               "in quadrature moved, else 'no change'")
METRIC_COLUMNS = ["metric", "unit", "before", "after", "change", "change_pct", "noise", "verdict"]
CAUSE_COLUMNS = ["cause", "spikes_before", "spikes_after", "before_s", "after_s", "after_raw_s", "per_stream_before",
                 "per_stream_after", "noise_per_stream", "change_pct", "verdict", "share_of_change", "p99_part_before_s",
                 "p99_part_after_s"]
EPISODE_COLUMNS = ["cause", "episodes_before", "episodes_after", "excess_before_s", "excess_after_s"]


@dataclass(frozen=True)
class CauseMove:
    """The cause that carried the largest part of a moved total (``share`` of its change)."""

    table: str          # budget | regimes
    cause: str
    before_s: float
    after_s: float      # AFTER at BEFORE's stream-seconds when the diff is normalised
    change_pct: float
    share: float        # of the total's change (fall or rise)
    total_before_s: float
    total_after_s: float
    total_verdict: str  # the total's own verdict: down | up | no change | unknown
    verdict: str = ""   # the cause's own change: down | up | no change | unknown


@dataclass(frozen=True)
class P99Move:
    """The cause whose part of P99 ITL (P99 minus P99 without it: budget.py's ``p99_reduction_s``) moved most,
    in the direction P99 moved."""

    cause: str
    before_s: float
    after_s: float


@dataclass(frozen=True)
class Diff:
    """BEFORE and AFTER side by side (frames, columns above) with what moved."""

    before: CaptureFacts
    after: CaptureFacts
    metrics: pd.DataFrame
    budget: pd.DataFrame
    regimes: pd.DataFrame
    episodes: pd.DataFrame
    caveats: tuple[str, ...]
    comparable: bool
    normalised: bool
    moved_by: CauseMove | None          # from the budget (spike excess)
    moved_by_regimes: CauseMove | None  # from the regime decomposition
    p99_moved_by: P99Move | None = None  # when P99 ITL moved beyond noise and both sides have P99 parts
    kernels: pd.DataFrame | None = None  # kernels.kernel_diff(), when both sides have a breakdown
    kernels_note: str = ""
    prediction: PredictionCheck | None = None  # when BEFORE was tuned (mixdiag tune --save)

    @property
    def measurable(self) -> bool:
        """False when neither side measures any compared figure (every verdict ``n/a``)."""
        verdicts = list(self.metrics["verdict"]) + list(self.budget["verdict"]) + list(self.regimes["verdict"])
        return any(v != "n/a" for v in verdicts)

    @property
    def no_change(self) -> bool:
        """True when no metric and no cause moved beyond noise."""
        verdicts = list(self.metrics["verdict"]) + list(self.budget["verdict"]) + list(self.regimes["verdict"])
        return not any(v in ("up", "down") for v in verdicts)


def _verdict(before: float, after: float, nb: float, na: float) -> str:
    if any(v is None or not math.isfinite(v) for v in (before, after)):
        return "n/a"
    moved = beyond_noise(before, after, nb, na)
    if moved is None:
        return "unknown"
    return "no change" if not moved else ("down" if after < before else "up")


def _metric(name: str, unit: str, b: Figure, a: Figure) -> dict:
    change = a.value - b.value
    pct = 100 * change / b.value if b.value and math.isfinite(b.value) else math.nan
    noise = math.hypot(b.noise, a.noise) if math.isfinite(b.noise) and math.isfinite(a.noise) else math.nan
    return {"metric": name, "unit": unit, "before": b.value, "after": a.value, "change": change, "change_pct": pct,
            "noise": noise, "verdict": _verdict(b.value, a.value, b.noise, a.noise)}


def _rate(v: float, stream: float) -> float:
    return v / stream if stream > 0 else math.nan


def _cause_table(keys, before: dict, after: dict, nb: dict, na: dict, sb: float, sa: float, normalised: bool,
                 spikes_b: dict, spikes_a: dict, parts_b: dict | None, parts_a: dict | None,
                 total_keys) -> tuple[pd.DataFrame, CauseMove | None]:
    rows = []
    for c in [*keys, "total"]:
        vb = sum(before.get(k, 0.0) for k in total_keys) if c == "total" else before.get(c, 0.0)
        va = sum(after.get(k, 0.0) for k in total_keys) if c == "total" else after.get(c, 0.0)
        rb, ra = _rate(vb, sb), _rate(va, sa)
        shown = ra * sb if normalised and math.isfinite(ra) else va
        nkey = "total" if c == "total" else c
        noise = math.hypot(nb.get(nkey, math.nan), na.get(nkey, math.nan))
        rows.append({"cause": c, "spikes_before": int(sum(spikes_b.get(k, 0) for k in CAUSES)) if c == "total"
                     else int(spikes_b.get(c, 0)),
                     "spikes_after": int(sum(spikes_a.get(k, 0) for k in CAUSES)) if c == "total" else int(spikes_a.get(c, 0)),
                     "before_s": vb, "after_s": shown, "after_raw_s": va, "per_stream_before": rb, "per_stream_after": ra,
                     "noise_per_stream": noise, "change_pct": 100 * (shown - vb) / vb if vb > 0 else math.nan,
                     "verdict": _verdict(rb, ra, nb.get(nkey, math.nan), na.get(nkey, math.nan)),
                     "p99_part_before_s": (parts_b or {}).get(c, math.nan), "p99_part_after_s": (parts_a or {}).get(c, math.nan)})
    t = pd.DataFrame(rows, columns=CAUSE_COLUMNS)
    tot = t.iloc[-1]
    delta_total = tot["after_s"] - tot["before_s"]
    named = t["cause"].isin(list(total_keys))
    if delta_total != 0:
        t["share_of_change"] = np.where(named, (t["after_s"] - t["before_s"]) / delta_total, np.nan)
        t.loc[t["cause"] == "total", "share_of_change"] = 1.0
    best = _mover(t[named], delta_total, str(tot["verdict"]))
    if best is None:
        return t, None
    return t, CauseMove(table="", cause=str(best["cause"]), before_s=float(best["before_s"]), after_s=float(best["after_s"]),
                        change_pct=float(best["change_pct"]), share=float(best["share_of_change"]),
                        total_before_s=float(tot["before_s"]), total_after_s=float(tot["after_s"]),
                        total_verdict=str(tot["verdict"]), verdict=str(best["verdict"]))


def _mover(named: pd.DataFrame, delta_total: float, total_verdict: str):
    """The cause that moved the total: among causes that moved beyond noise themselves, the largest move in
    the total's direction (else the largest move); with none beyond noise, the largest share of a total that
    moved beyond noise; else None."""
    if delta_total == 0:
        return None
    delta = named["after_s"] - named["before_s"]
    own = named[named["verdict"].isin(["up", "down"])]
    if len(own):
        same = own[np.sign(delta[own.index]) == np.sign(delta_total)]
        pick = same if len(same) else own
        return pick.loc[delta[pick.index].abs().idxmax()]
    if total_verdict in ("up", "down"):
        return named.loc[named["share_of_change"].idxmax()]
    return None


def _p99_mover(metrics: pd.DataFrame, budget: pd.DataFrame) -> P99Move | None:
    """Which cause's part of P99 moved most in P99's direction (None unless P99 moved beyond noise)."""
    row = metrics.set_index("metric").loc["itl_p99_s"]
    if row["verdict"] not in ("up", "down"):
        return None
    t = budget[~budget["cause"].isin(["total", "none"])]
    t = t[np.isfinite(t["p99_part_before_s"]) & np.isfinite(t["p99_part_after_s"])]
    if not len(t):
        return None
    d = (t["p99_part_after_s"] - t["p99_part_before_s"]) * (1 if row["verdict"] == "up" else -1)
    best = t.loc[d.idxmax()]
    if not d.max() > 0:
        return None
    return P99Move(str(best["cause"]), float(best["p99_part_before_s"]), float(best["p99_part_after_s"]))


def _episodes(b: CaptureFacts, a: CaptureFacts) -> pd.DataFrame:
    eb = b.episodes.set_index("cause") if len(b.episodes) else pd.DataFrame(columns=["episodes", "excess_s"])
    ea = a.episodes.set_index("cause") if len(a.episodes) else pd.DataFrame(columns=["episodes", "excess_s"])
    causes = sorted(set(eb.index) | set(ea.index), key=lambda c: (list(CAUSES).index(c) if c in CAUSES else 99, c))
    rows = [{"cause": c, "episodes_before": int(eb["episodes"].get(c, 0)), "episodes_after": int(ea["episodes"].get(c, 0)),
             "excess_before_s": float(eb["excess_s"].get(c, 0.0)), "excess_after_s": float(ea["excess_s"].get(c, 0.0))}
            for c in causes]
    return pd.DataFrame(rows, columns=EPISODE_COLUMNS)


def _ratio(x: float, y: float) -> float:
    return x / y if y > 0 and math.isfinite(x) and math.isfinite(y) else math.nan


def _caveats(b: CaptureFacts, a: CaptureFacts) -> tuple[list[str], bool]:
    out, comparable = [], True
    for name, f in (("BEFORE", b), ("AFTER", a)):
        if f.partial:
            out.append(f"{name} is partial ({', '.join(f.partial)} read only in part): analysed as read")
    if b.itl_source != a.itl_source:
        comparable = False
        out.append(f"different views: ITL from {b.itl_source} before, from {a.itl_source} after - the quantiles "
                   "measure different things")
    if b.budget_sources != a.budget_sources:
        comparable = False
        out.append(f"different budget units: {', '.join(b.budget_sources) or 'none'} before, "
                   f"{', '.join(a.budget_sources) or 'none'} after")
    if len(b.instances) != len(a.instances):
        comparable = False
        out.append(f"different servers: {len(b.instances)} before ({', '.join(b.instances)}), "
                   f"{len(a.instances)} after ({', '.join(a.instances)})")
    d = _ratio(max(a.duration_s, b.duration_s), min(a.duration_s, b.duration_s))
    if math.isfinite(d) and d > DURATION_X:
        out.append(f"durations differ {d:.1f}x ({b.duration_s:.1f} s before, {a.duration_s:.1f} s after): excess is "
                   "compared per stream-second")
    for what, vb, va in (("decode-token rate", _ratio(b.tokens, b.duration_s), _ratio(a.tokens, a.duration_s)),
                         ("request rate", _ratio(b.requests, b.duration_s), _ratio(a.requests, a.duration_s))):
        r = _ratio(max(va, vb), min(va, vb))
        if math.isfinite(r) and r > RATE_X:
            out.append(f"{what} differs {r:.2f}x ({vb:.2f}/s before, {va:.2f}/s after): latency depends on load, so "
                       "part of any change may be the traffic, not the setting")
    return out, comparable


def diff(before: CaptureFacts, after: CaptureFacts, *, kernels: pd.DataFrame | None = None, kernels_note: str = "",
         prediction: PredictionCheck | None = None) -> Diff:
    """BEFORE and AFTER compared (module doc); ``kernels``/``prediction`` computed by the caller."""
    metrics = pd.DataFrame([_metric("itl_p50_s", "s", before.itl_p50_s, after.itl_p50_s),
                            _metric("itl_p99_s", "s", before.itl_p99_s, after.itl_p99_s),
                            _metric("ttft_p50_s", "s", before.ttft_p50_s, after.ttft_p50_s),
                            _metric("ttft_p99_s", "s", before.ttft_p99_s, after.ttft_p99_s)], columns=METRIC_COLUMNS)
    sb, sa = before.stream_s, after.stream_s
    normalised = bool(sb > 0 and sa > 0 and abs(sa / sb - 1) > NORMALISE_X)
    spiked = [c for c in BUDGET_CAUSES if c != "none"]
    budget, move_b = _cause_table(BUDGET_CAUSES, before.budget_s, after.budget_s, before.budget_noise,
                                     after.budget_noise, sb, sa, normalised, before.spikes, after.spikes,
                                     before.p99_part_s, after.p99_part_s, spiked)
    regimes, move_r = _cause_table(CAUSES, before.regimes_s, after.regimes_s, before.regimes_noise,
                                      after.regimes_noise, sb, sa, normalised, before.spikes, after.spikes,
                                      None, None, CAUSES)
    if move_b is not None:
        move_b = CauseMove(**{**vars(move_b), "table": "budget"})
    if move_r is not None:
        move_r = CauseMove(**{**vars(move_r), "table": "regimes"})
    caveats, comparable = _caveats(before, after)
    p99_move = _p99_mover(metrics, budget)
    if not (sb > 0 and sa > 0):
        caveats.append("a side has no measured stream time: excess cannot be normalised")
    return Diff(before=before, after=after, metrics=metrics, budget=budget, regimes=regimes,
                episodes=_episodes(before, after), caveats=tuple(caveats), comparable=comparable,
                normalised=normalised, moved_by=move_b, moved_by_regimes=move_r, p99_moved_by=p99_move, kernels=kernels,
                kernels_note=kernels_note, prediction=prediction)


def finite(v) -> bool:
    """A present, finite number (for renderers)."""
    return v is not None and isinstance(v, (int, float, np.floating)) and math.isfinite(float(v))
