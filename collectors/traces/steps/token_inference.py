"""Token allocation of foreign engines' steps from their copy sizes, calibrated on the trace itself.

Engines copy their input buffers to the GPU every step: some grow with the scheduled tokens
(input ids, positions, slot mapping), some with the requests (query start offsets, sequence
lengths); and they copy the sampled ids back, one per sampled request. Nothing here is a constant
of some engine:

1. bytes per sampled request = the greatest common divisor of the steps' D2H sizes (needs at
   least 5 distinct sizes), so ``requests = d2h / unit``;
2. decode-only steps = the mode of ``h2d_bytes / requests`` among steps with the usual number of
   H2D copies (decode steps dominate serving; their ratio is constant while prefill raises it);
3. per copy position, a line ``bytes = slope * requests + intercept`` fitted on those decode steps;
4. in every other step a copy far above its line is token-proportional:
   ``tokens = (bytes - intercept) / slope`` (median over such copies); prefill rows are present
   when tokens exceed requests, or - where copies cannot tell - when a prefill-family attention
   kernel ran (FlashAttention varlen, FlashInfer prefill, extend attention).

One prefill request per step is assumed when splitting requests into decode rows (chunked
prefill schedules one partial prompt per step). Steps the calibration cannot read keep NaN counts.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

MIN_DISTINCT_D2H = 5
MIN_DECODE_STEPS = 5


def _families_only(s: pd.DataFrame) -> pd.DataFrame:
    pf, df = s["prefill_family"].to_numpy(), s["decode_family"].to_numpy()
    kind = np.where(df & ~pf, "decode", "unknown").astype(object)
    return pd.DataFrame({"prefill_tokens": np.where(kind == "decode", 0.0, np.nan), "decode_rows": np.nan,
                         "kind": kind, "q_token_allocation": np.where(kind == "decode", "inferred", "")},
                        index=s.index)


def infer_tokens(s: pd.DataFrame, hs: np.ndarray, ordinal: np.ndarray, hb: np.ndarray) -> pd.DataFrame:
    """Per step (rows of ``s``): prefill_tokens, decode_rows, kind, q_token_allocation.

    ``s`` has h2d_bytes, d2h_bytes, h2d_copies, prefill_family, decode_family; ``hs``/``ordinal``/
    ``hb`` are each H2D copy's step, position inside its step and bytes.
    """
    out = _families_only(s)
    n = len(s)
    d2h = s["d2h_bytes"].to_numpy().astype(np.int64)
    nz = d2h[d2h > 0]
    if len(np.unique(nz)) < MIN_DISTINCT_D2H:
        return out
    unit = int(np.gcd.reduce(nz))
    reqs = d2h / unit
    if unit < 1 or np.median(reqs[d2h > 0]) > 65536:
        return out
    copies = s["h2d_copies"].to_numpy()
    vals, cnt = np.unique(copies[copies > 0], return_counts=True)
    if not len(vals):
        return out
    n_ord = int(vals[np.argmax(cnt)])
    regular = (copies == n_ord) & (reqs > 0)
    with np.errstate(invalid="ignore", divide="ignore"):
        lr = np.log(s["h2d_bytes"].to_numpy() / np.where(reqs > 0, reqs, np.nan))
    if regular.sum() < MIN_DECODE_STEPS:
        return out
    hist, edges = np.histogram(lr[regular], bins=max(10, int(np.ptp(lr[regular]) / 0.05) + 1))
    k = int(np.argmax(hist))
    mode = (edges[k] + edges[k + 1]) / 2
    cal = regular & (np.abs(lr - mode) < 0.1) & ~s["prefill_family"].to_numpy()
    if cal.sum() < max(MIN_DECODE_STEPS, 0.1 * regular.sum()):
        return out
    B = np.zeros((n, n_ord))
    m = regular[hs] & (ordinal < n_ord)
    B[hs[m], ordinal[m]] = hb[m]
    slope, icpt, tol = np.zeros(n_ord), np.zeros(n_ord), np.zeros(n_ord)
    x = reqs[cal]
    for j in range(n_ord):  # a handful of copy positions, not a loop over rows
        y = B[cal, j]
        if np.ptp(x) > 0:
            slope[j], icpt[j] = np.polyfit(x, y, 1)
        else:
            slope[j] = np.mean(y / x)
        tol[j] = max(3 * slope[j], 4 * np.std(y - slope[j] * x - icpt[j]))
    expected = slope[None, :] * reqs[:, None] + icpt[None, :]
    token = (B - expected > np.maximum(tol[None, :], 0.02 * expected)) & (slope[None, :] > 0)
    with np.errstate(invalid="ignore", divide="ignore"):
        est = np.where(token, (B - icpt[None, :]) / np.where(slope > 0, slope, np.nan)[None, :], np.nan)
    any_tok = token.any(axis=1)
    tokens = np.full(n, np.nan)
    if any_tok.any():
        tokens[any_tok] = np.nanmedian(est[any_tok], axis=1)
    pf = s["prefill_family"].to_numpy()
    has_prefill = np.where(regular, any_tok, pf)
    decode_rows = np.where(has_prefill, np.maximum(reqs - 1, 0), reqs)
    prefill = np.where(any_tok, np.round(tokens - decode_rows), np.where(has_prefill, np.nan, 0.0))
    kind = np.where(has_prefill, np.where(decode_rows > 0, "mixed", "prefill"), "decode").astype(object)
    ok = regular | (reqs > 0)
    out.loc[ok, "kind"] = kind[ok]
    out.loc[ok, "decode_rows"] = decode_rows[ok]
    out.loc[ok, "prefill_tokens"] = np.maximum(prefill[ok], 0)
    out.loc[ok, "q_token_allocation"] = "inferred"
    return out
