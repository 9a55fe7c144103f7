"""Step cost: how long one forward step takes for a given batch shape.

Fitted to the user's per-step rows (``granularity == 'step'`` with ``t_start_s``/``t_end_s``) by
least squares on the features of :class:`StepShape`: a constant, prefill tokens, decode rows, a
"step has prefill" indicator, the prefill chunk's attention work (tokens x the context they attend)
and the decode rows' context. Quality: R² on all steps and MAPE on a held-out fifth.

The context features are exact when the replay of the current setting reproduces the recorded
step sequence (:func:`mixdiag.tuning.replay.align`); otherwise they are estimated from the step
row alone (chunk attends only to itself, decode context from ``kv_usage``) and the fit says so.

Without per-step durations the fallback is the shape ledger + roofline device model
(:mod:`mixdiag.ledger`): a prediction for the deployment named by ``--model``/``--device``, not a
fit to the user's data.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pandas as pd

from mixdiag.errors import UserError

FEATURES = ("const", "prefill_tokens", "decode_rows", "has_prefill", "prefill_attn_ktok2", "decode_ctx_ktok")


@dataclass(frozen=True)
class StepShape:
    """What a step computes. ``prefill_attn`` = Σ chunk tokens x (tokens already cached + half the chunk)."""

    prefill_tokens: int
    decode_rows: int
    prefill_attn: float = 0.0
    decode_ctx: float = 0.0

    def features(self) -> np.ndarray:
        return np.array([1.0, self.prefill_tokens, self.decode_rows, 1.0 if self.prefill_tokens else 0.0,
                         self.prefill_attn / 1e6, self.decode_ctx / 1e3])


@dataclass(frozen=True)
class FittedCost:
    """A linear step-cost model and the host gap between steps, with its fit quality."""

    coef: tuple[float, ...]
    gap_s: float                 # host time from one step's end to the next one's start (median)
    min_step_s: float            # floor: no prediction below the fastest step seen
    r2: float
    mape_heldout: float
    n_steps: int
    context: str                 # "exact (aligned replay)" | "estimated from step rows"
    kind: str = "fitted"
    #: measured minus fitted duration of every step (s): the replay adds one draw per step,
    #: so P99s carry the jitter the data had (a mean fit alone would predict no tail)
    jitter: tuple[float, ...] = ()

    def step_s(self, shape: StepShape) -> float:
        """Predicted mean duration of one step (start to end)."""
        return max(self.min_step_s, float(np.dot(self.coef, shape.features())))

    def describe(self) -> dict:
        j = np.asarray(self.jitter) if self.jitter else np.zeros(1)
        return {"kind": self.kind, "features": list(FEATURES), "coef": list(self.coef), "gap_s": self.gap_s,
                "r2": self.r2, "mape_heldout": self.mape_heldout, "steps": self.n_steps, "context": self.context,
                "jitter_s_p50_p99": [float(np.quantile(j, 0.5)), float(np.quantile(j, 0.99))]}


@dataclass(frozen=True)
class LedgerCost:
    """Fallback: the shape ledger's bytes and FLOPs on a roofline device model (not fitted)."""

    model: object                # mixdiag.ledger.shapes.LedgerModel
    device: object               # mixdiag.ledger.device_model.DeviceModel
    context_len: int = 4096
    gap_s: float = 0.0
    kind: str = "ledger"

    def step_s(self, shape: StepShape) -> float:
        from mixdiag.ledger.device_model import _step_time
        from mixdiag.ledger.shapes import BatchShape

        ctx = int(shape.decode_ctx / shape.decode_rows) if shape.decode_rows else self.context_len
        bs = BatchShape(prefill_tokens=int(shape.prefill_tokens), decode_reqs=int(shape.decode_rows),
                        context_len=max(ctx, 1))
        rows = shape.prefill_tokens + shape.decode_rows
        return _step_time(self.model, self.device, rows, shape.decode_rows, shape.prefill_tokens, bs)["time_s"]

    def describe(self) -> dict:
        return {"kind": self.kind, "model": self.model.name, "device": self.device.name, "gap_s": self.gap_s,
                "r2": None, "mape_heldout": None,
                "note": "no per-step durations in the input: step costs come from the shape ledger + roofline "
                        "device model for this model/device, not from your data"}


def step_rows(steps: pd.DataFrame | None) -> pd.DataFrame:
    """The per-step rows with a duration and a token allocation (empty if none)."""
    if steps is None or not len(steps):
        return pd.DataFrame()
    s = steps[(steps["granularity"] == "step") & (steps["kind"] != "idle")]
    s = s[s["prefill_tokens"].notna() & s["decode_rows"].notna() & (s["t_end_s"] > s["t_start_s"])]
    return s.sort_values("t_start_s", kind="stable").reset_index(drop=True)


def host_gap(rows: pd.DataFrame) -> float:
    """Median host time between consecutive busy steps (idle jumps excluded)."""
    gap = (rows["t_start_s"].shift(-1) - rows["t_end_s"]).dropna()
    gap = gap[gap >= 0]
    if not len(gap):
        return 0.0
    med = float(gap.median())
    return float(gap[gap <= 10 * med + 1e-4].median())


def estimated_shapes(rows: pd.DataFrame, kv_tokens: int) -> list[StepShape]:
    """Shapes from step rows alone: a chunk attends to itself, decode context = KV in use / decode rows."""
    kv = rows["kv_usage"].fillna(0).to_numpy() if "kv_usage" in rows else np.zeros(len(rows))
    out = []
    for p, d, u in zip(rows["prefill_tokens"].to_numpy(), rows["decode_rows"].to_numpy(), kv):
        out.append(StepShape(int(p), int(d), p * p / 2.0, float(u * kv_tokens) if d else 0.0))
    return out


def fit(rows: pd.DataFrame, shapes: list[StepShape], context: str, seed: int = 0) -> FittedCost:
    """Fit step durations on ``shapes`` (one per row); MAPE on a held-out fifth.

    Relative least squares with non-negative coefficients (a cost per token/row/context cannot be
    negative, and a negative one extrapolates to nonsense at other chunk sizes); steps far slower
    than their fit (a neighbour's CPU burst, a GC pause) are trimmed once and refitted — they
    come back as jitter.
    """
    if len(rows) < 8:
        raise UserError(f"only {len(rows)} per-step rows with durations: too few to fit a step-cost model")
    y = (rows["t_end_s"] - rows["t_start_s"]).to_numpy()
    X = np.stack([s.features() for s in shapes])
    rng = np.random.default_rng(seed)
    test = rng.random(len(y)) < 0.2
    if test.all() or not test.any():
        test = np.arange(len(y)) % 5 == 0
    coef_tr = _robust(X[~test], y[~test])
    pred_te = np.maximum(X[test] @ coef_tr, y.min())
    mape = float(np.mean(np.abs(pred_te - y[test]) / y[test]))
    coef = _robust(X, y)
    pred = np.maximum(X @ coef, y.min())
    ss = float(((y - y.mean()) ** 2).sum())
    r2 = 1.0 - float(((y - pred) ** 2).sum()) / ss if ss > 0 else math.nan
    jitter = y - pred   # additive: a neighbour's burst or a GC pause costs seconds, whatever the shape
    # one-off outliers would own the P99 of a short replay
    jitter = np.clip(jitter, *np.quantile(jitter, [0.01, 0.99]))
    return FittedCost(tuple(float(c) for c in coef), host_gap(rows), float(y.min()), r2, mape, len(y), context,
                      jitter=tuple(float(j) for j in jitter))


def _robust(X: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Non-negative relative fit, then once more without the steps > 3 MADs slower than it."""
    coef = _nonneg(X, y)
    r = y / np.maximum(X @ coef, y.min())
    med = np.median(r)
    keep = r <= med + 3 * max(np.median(np.abs(r - med)), 1e-3)
    return _nonneg(X[keep], y[keep]) if keep.sum() >= X.shape[1] + 2 and not keep.all() else coef


def _nonneg(X: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Least squares of relative error with coefficients >= 0: drop the most negative feature until none is."""
    Xw, yw = X / y[:, None], np.ones_like(y)
    # columns that never vary (no prefill in the data, say) get a zero coefficient, not noise
    active = [0] + [j for j in range(1, X.shape[1]) if X[:, j].std() > 0]
    while True:
        c = np.linalg.lstsq(Xw[:, active], yw, rcond=None)[0]
        if (c >= 0).all() or len(active) == 1:
            coef = np.zeros(X.shape[1])
            coef[active] = np.maximum(c, 0)
            return coef
        active.pop(int(np.argmin(c)))
