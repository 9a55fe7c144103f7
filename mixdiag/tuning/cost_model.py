"""Step cost: how long one forward step takes for a given batch shape.

Fitted to the user's per-step rows (``granularity == 'step'`` with ``t_start_s``/``t_end_s``) by
least squares on the features of :class:`StepShape`: a constant, prefill tokens, decode rows, a
"step has prefill" indicator, the prefill chunk's attention work (tokens x the context they attend)
and the decode rows' context. Quality: R² on all steps and MAPE on a held-out fifth.

Two things a mean fit of one setting's steps gets wrong when it predicts another setting:

* **The chunk's own attention triangle.** A chunk of k tokens after c cached ones scores
  k·(c + k/2) query-key pairs with a causal kernel that skips the masked blocks (FlashAttention,
  FlashInfer: vLLM's and SGLang's GPU backends) but k·(c + k) with a dense kernel that scores
  everything and then masks (SDPA with an explicit mask, the reference engine's CPU attention).
  Within the chunk sizes one run used the two differ little; at a chunk 4-8x larger the k² term
  dominates (measured: the k/2 form under-predicted 2048-token chunks of the reference engine by
  1.3-1.4x when fitted on 512-token chunks, the k form by 1.03-1.06x). Both are fitted; the causal
  form is kept only when it fits clearly better (:data:`CAUSAL_MARGIN`), else the dense one
  (``triangle`` in the description).
* **The tail.** Decode-only and prefill steps deviate from their fit differently, and a step
  longer than the ones measured deviates by less of itself: on the reference engine the ratio
  measured/fitted has P90/P99 1.2/2.0 for 2-16 ms steps, 1.3/1.5 for 64-128 ms, 1.13/1.27 for
  128-256 ms and 1.06/1.09 for 256-512 ms steps — what a bounded-length disturbance (a neighbour's
  burst, a GC pause) does, not a uniform slowdown. So the residuals are kept per class (decode-only,
  with prefill) as (ratio, fitted duration) pairs in recorded order, and the replay applies a draw
  as that ratio to a step no longer than the one it was measured on and as the same absolute
  excess to a longer one (:meth:`FittedCost.jittered_s`).

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
#: share of a chunk's own k x k score block an attention kernel computes: causal block skipping, dense
TRIANGLES = (0.5, 1.0)
CLASSES = ("decode", "prefill")   # jitter classes: decode-only steps, steps with a prefill chunk
#: the causal triangle is kept only when it fits the chunked steps this much better than the dense
#: one: at the data's own chunk sizes the two differ by less than the noise (measured on the reference
#: engine: 0.3-4 % apart, either way, run to run), and the dense form never under-predicts a chunk
#: larger than any seen — under-predicting it understates the P99 ITL of the very settings the sweep
#: extrapolates to
CAUSAL_MARGIN = 0.05
#: step sources whose attention kernels skip the masked blocks, so the causal triangle is the prior
#: there (kept unless the dense one fits clearly better, the margin reversed). Basis: vLLM V1's
#: attention backends - FlashAttention and FlashInfer on GPUs, and on CPUs ``cpu_attention_with_kv_cache``
#: (vllm/v1/attention/backends/cpu_attn.py, causal=True), whose scheduler (csrc/cpu/cpu_attn_impl.hpp,
#: ``AttentionScheduler::schedule``) gives each query tile only the KV tiles up to its own position.
#: Within one run's chunk sizes the data barely tell the two apart (real vLLM 0.32 at a 512 budget:
#: median relative error on the chunked steps 0.143 causal vs 0.142 dense), but the dense form
#: charges a 2048-token chunk ~2x the attention work of the causal one.
CAUSAL_KERNEL_SOURCES = frozenset({"vllm-log"})


@dataclass(frozen=True)
class StepShape:
    """What a step computes: token counts, Σ chunk x tokens already cached (``prefill_ctx``),
    Σ chunk² (``prefill_sq``) and Σ decode rows' context (``decode_ctx``)."""

    prefill_tokens: int
    decode_rows: int
    prefill_ctx: float = 0.0
    prefill_sq: float = 0.0
    decode_ctx: float = 0.0

    def features(self, triangle: float = 0.5) -> np.ndarray:
        """The fit's features; the chunk's attention work counts ``triangle`` of its k x k block."""
        attn = self.prefill_ctx + triangle * self.prefill_sq
        return np.array([1.0, self.prefill_tokens, self.decode_rows, 1.0 if self.prefill_tokens else 0.0,
                         attn / 1e6, self.decode_ctx / 1e3])

    @property
    def jitter_class(self) -> int:
        return 1 if self.prefill_tokens else 0


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
    triangle: float = 0.5        # share of a chunk's own k x k attention block the kernel computes
    #: per class (CLASSES), each step's (measured / fitted duration, fitted duration) in recorded
    #: order: the replay applies one per step, so P99s carry the spread the data had
    jitter: tuple[tuple[tuple[float, float], ...], ...] = ((), ())

    def step_s(self, shape: StepShape) -> float:
        """Predicted mean duration of one step (start to end)."""
        return max(self.min_step_s, float(np.dot(self.coef, shape.features(self.triangle))))

    def jittered_s(self, fitted_s: float, ratio: float, measured_on_s: float) -> float:
        """A step of ``fitted_s`` given a residual measured as ``ratio`` on a step fitted at
        ``measured_on_s``: that ratio up to that length, that absolute excess beyond it."""
        return max(self.min_step_s, fitted_s + (ratio - 1.0) * min(fitted_s, measured_on_s))

    def describe(self) -> dict:
        q = {c: [float(np.quantile([r for r, _ in j], p)) for p in (0.5, 0.99)] if len(j) else None
             for c, j in zip(CLASSES, self.jitter)}
        return {"kind": self.kind, "features": list(FEATURES), "coef": list(self.coef), "gap_s": self.gap_s,
                "r2": self.r2, "mape_heldout": self.mape_heldout, "steps": self.n_steps, "context": self.context,
                "triangle": self.triangle, "jitter_ratio_p50_p99": q}


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
    if "elapsed_s" in s and s["elapsed_s"].notna().any():
        # vLLM's iteration lines are stamped once, when logged (t_start = t_end), and carry the
        # step's own measured duration: the step ran for that long up to the stamp
        s = s.copy()
        zero = (s["t_end_s"] <= s["t_start_s"]) & s["elapsed_s"].notna()
        s.loc[zero, "t_start_s"] = s.loc[zero, "t_end_s"] - s.loc[zero, "elapsed_s"]
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
    """Shapes from step rows alone: decode context = KV in use / decode rows; a chunk attends to
    itself plus, after steps the token budget cut (prefill + decode = the largest step), the
    prompt tokens those steps computed — a long prompt's later chunks attend to its earlier ones.

    A step with several prefill requests (``prefill_reqs``, vLLM's "N context requests") is a
    prompt boundary: vLLM V1 schedules the running, partly prefilled request first and new prompts
    after it, and only the last one scheduled can be cut by the budget, so the chain's tail ends
    there and a cut step starts the next prompt's chain. How the step's tokens split between them
    is not logged: each gets an equal share (the tail attends to the chain, the others to
    themselves), and the next chain starts at one share."""
    kv = rows["kv_usage"].fillna(0).to_numpy() if "kv_usage" in rows else np.zeros(len(rows))
    pre, dec = rows["prefill_tokens"].to_numpy(), rows["decode_rows"].to_numpy()
    nreq = rows["prefill_reqs"].fillna(1).to_numpy() if "prefill_reqs" in rows else np.ones(len(rows))
    budget = float((pre + dec).max()) if len(rows) else 0.0
    # Why: fitted as if every chunk started a prompt, the attention term absorbs later chunks'
    # context into a too-large k^2 coefficient (real vLLM, 512-token budget: P99 TTFT +65 % at the
    # run's own setting, since the replay then charges later chunks their real context on top).
    # Why the boundary: chained through it, a second long prompt's chunks were charged its
    # predecessor's 3-6 k tokens of context, and the fitted context cost came out 2.8x too low
    # (real vLLM 0.32, 512 budget: 36 vs 101 ms per M token-pairs; R2 0.84 -> 0.95, P99 ITL of the
    # run's own setting predicted 141 vs 196 ms measured -> 191 ms).
    out, done = [], 0.0
    for p, d, u, n in zip(pre, dec, kv, nreq):
        cut = p > 0 and p + d >= budget
        ctx = float(u * kv_tokens) if d else 0.0
        if n > 1:
            share = float(p) / n
            out.append(StepShape(int(p), int(d), done * share, share * share * n, ctx))
            done = share if cut else 0.0
        else:
            out.append(StepShape(int(p), int(d), done * p, float(p) * p, ctx))
            done = done + p if cut else 0.0
    return out


def fit(rows: pd.DataFrame, shapes: list[StepShape], context: str, seed: int = 0,
        causal_kernel: bool = False) -> FittedCost:
    """Fit step durations on ``shapes`` (one per row); MAPE on a held-out fifth.

    Relative least squares with non-negative coefficients (a cost per token/row/context cannot be
    negative, and a negative one extrapolates to nonsense at other chunk sizes); steps far slower
    than their fit (a neighbour's CPU burst, a GC pause) are trimmed once and refitted — they
    come back as jitter. Each attention triangle of :data:`TRIANGLES` is fitted; the one with the
    lower relative squared error is kept.
    """
    if len(rows) < 8:
        raise UserError(f"only {len(rows)} per-step rows with durations: too few to fit a step-cost model")
    y = (rows["t_end_s"] - rows["t_start_s"]).to_numpy()
    # the triangles differ only on steps with a chunk: judged there, by the median relative error
    # (robust to the neighbour's bursts that own a squared loss)
    chunked = np.array([s.prefill_tokens > 0 for s in shapes])
    judged = chunked if chunked.any() else np.ones(len(y), dtype=bool)
    fits = {}
    for tri in TRIANGLES:
        X = np.stack([s.features(tri) for s in shapes])
        coef = _robust(X, y)
        fits[tri] = (float(np.median(np.abs(np.maximum(X @ coef, y.min()) / y - 1.0)[judged])), X, coef)
    causal, dense = fits[TRIANGLES[0]], fits[TRIANGLES[-1]]
    if causal_kernel:   # the engine's kernel skips masked blocks (CAUSAL_KERNEL_SOURCES): dense must beat it clearly
        tri = TRIANGLES[-1] if dense[0] < (1.0 - CAUSAL_MARGIN) * causal[0] else TRIANGLES[0]
    else:
        tri = TRIANGLES[0] if causal[0] < (1.0 - CAUSAL_MARGIN) * dense[0] else TRIANGLES[-1]
    _, X, coef = fits[tri]
    rng = np.random.default_rng(seed)
    test = rng.random(len(y)) < 0.2
    if test.all() or not test.any():
        test = np.arange(len(y)) % 5 == 0
    coef_tr = _robust(X[~test], y[~test])
    pred_te = np.maximum(X[test] @ coef_tr, y.min())
    mape = float(np.mean(np.abs(pred_te - y[test]) / y[test]))
    pred = np.maximum(X @ coef, y.min())
    ss = float(((y - y.mean()) ** 2).sum())
    r2 = 1.0 - float(((y - pred) ** 2).sum()) / ss if ss > 0 else math.nan
    ratio = y / pred
    cls = np.array([s.jitter_class for s in shapes])
    jitter = []
    for c in range(len(CLASSES)):
        r, f = ratio[cls == c], pred[cls == c]
        if len(r):   # one-off outliers would own the P99 of a short replay
            r = np.clip(r, *np.quantile(r, [0.01, 0.99]))
        jitter.append(tuple((float(a), float(b)) for a, b in zip(r, f)))
    if not jitter[0] or not jitter[1]:   # a class the data lacks borrows the other's spread
        jitter = [jitter[0] or jitter[1]] * 2
    return FittedCost(tuple(float(c) for c in coef), host_gap(rows), float(y.min()), r2, mape, len(y), context,
                      triangle=tri, jitter=tuple(jitter))


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
