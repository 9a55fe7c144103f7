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

Engines that keep their inputs on the GPU (SGLang: ``prepare_for_decode`` reuses the output ids as
input ids, ``out_cache_loc`` comes from the GPU allocator, ``seq_lens`` is bumped in place;
``prepare_for_extend`` uploads the new prompt ids) copy nothing per decode step, so no per-copy line can
be fitted. When most steps carry no H2D bytes (:func:`_gpu_inputs`): a step without input copies holds no
prompt tokens (prompt ids start on the host - the tokenizer runs there - and must cross once), a step with
them does; its prompt tokens stay unknown (NaN: the element size of the uploaded ids is not in the trace).

Kernel families come from :mod:`.kernel_names`: decode-only attention -> decode; prefill and decode
attention in one step -> mixed (vLLM's FlashInfer backend runs both wrappers on one batch); prefill
attention alone -> prefill only where the trace shows the engine splits its attention by phase (some
step ran both), else unknown (FlashAttention varlen runs one kernel for prefill and decode rows).
"""
from __future__ import annotations

import numpy as np
import pandas as pd

MIN_DISTINCT_D2H = 5
MIN_DECODE_STEPS = 5


#: A trace whose steps carry no H2D bytes at least this often keeps its inputs on the GPU. An engine that
#: builds its inputs on the host copies them every step (vLLM ``gpu_model_runner._prepare_inputs``:
#: input ids, positions, query_start_loc, seq_lens, slot_mapping ``copy_to_gpu`` per step), so it shows no
#: step without H2D bytes; an engine that keeps them on the GPU (SGLang ``prepare_for_decode``) copies
#: nothing on every decode-only step. With DP attention the rank holding a long prompt uploads its chunks
#: on every step of a long episode - more than half the capture when the episode is long (measured: a
#: 427-step chunked prompt in 800 steps of the tier-d2 4-rank trace, 53 % of steps with copies) - so
#: half was too strict: 0.1 keeps a GPU-input rank whose prompts ride on up to 90 % of its steps, and is
#: still far above the 0 % of a per-step-copying engine (a few steps whose boundary the reader misplaced).
GPU_INPUT_SHARE = 0.1


def _families_only(s: pd.DataFrame) -> pd.DataFrame:
    pf, df = s["prefill_family"].to_numpy(), s["decode_family"].to_numpy()
    split = bool((pf & df).any())   # the engine runs prefill and decode attention as separate kernels
    kind = np.where(df & ~pf, "decode", np.where(pf & df, "mixed", np.where(pf & split, "prefill", "unknown")))
    kind = kind.astype(object)
    return pd.DataFrame({"prefill_tokens": np.where(kind == "decode", 0.0, np.nan), "decode_rows": np.nan,
                         "kind": kind, "q_token_allocation": np.where(kind != "unknown", "inferred", "")},
                        index=s.index)


def _phase_flag(pf: np.ndarray, regular: np.ndarray) -> np.ndarray:
    """The prefill-family flag where it can mark prompt steps, else all False. Decode steps are the bulk of
    serving (the calibration's premise), so a flag on most regular steps does not mark prompts: FlashAttention-2's
    split-KV kernel stays causal for any batch whose longest query exceeds one token (spec-decode verification
    rows; kernel_names.py), and then every step reads as prefill-family. Only copies can tell those steps apart."""
    if regular.any() and pf[regular].mean() >= 0.5:
        return np.zeros(len(pf), dtype=bool)
    return pf


def _requests(s: pd.DataFrame) -> np.ndarray:
    """Sampled requests per step from the D2H sizes (NaN where the unit cannot be calibrated)."""
    d2h = s["d2h_bytes"].to_numpy().astype(np.int64)
    nz = d2h[d2h > 0]
    if len(np.unique(nz)) < MIN_DISTINCT_D2H:
        return np.full(len(s), np.nan)
    unit = int(np.gcd.reduce(nz))
    reqs = d2h / unit
    if unit < 1 or np.median(reqs[d2h > 0]) > 65536:
        return np.full(len(s), np.nan)
    return np.where(d2h > 0, reqs, np.nan)


def _gpu_inputs(s: pd.DataFrame, out: pd.DataFrame) -> pd.DataFrame | None:
    """Kinds of an engine whose decode steps copy no inputs (see the module docstring); None when
    the trace is not one (most steps carry input copies, none ever does, or no step copies sampled ids
    back in sizes that calibrate a request count)."""
    h2d = s["h2d_bytes"].to_numpy()
    if not len(h2d) or (h2d == 0).mean() < GPU_INPUT_SHARE or not (h2d > 0).any():
        return None
    reqs = _requests(s)
    if np.isnan(reqs).all():   # no sampled-id copy per step: nothing says these are an LLM engine's steps
        return None
    pf, df = s["prefill_family"].to_numpy(), s["decode_family"].to_numpy()
    prompt = (h2d > 0) | pf
    # decode rows riding along: the step samples (nearly) the whole running batch, not only new prompts
    # ... on either side: the running batch seen before the prompt steps (_running_batch) or by the first
    # decode-only step after them (the decodes that rode along are still running then). A batch that shrank
    # sharply meanwhile (an oversized decode batch drained) would otherwise read every ridden step after it
    # as prefill-only; a prefill-only step samples only the prompts it finishes, far below either side
    nxt = pd.Series(np.where(~prompt, reqs, np.nan)).bfill().shift(-1).to_numpy()
    dec_reqs = np.fmin(_running_batch(reqs, prompt), nxt)
    with np.errstate(invalid="ignore"):
        rides = (df & pf) | (reqs >= 0.5 * dec_reqs)
    known = ~np.isnan(reqs) & ~np.isnan(dec_reqs)
    kind = np.where(~prompt, "decode", np.where(df & pf, "mixed",
                    np.where(known, np.where(rides, "mixed", "prefill"), out["kind"].to_numpy())))
    rows = np.where(kind == "decode", reqs, np.where(kind == "mixed", np.maximum(reqs - 1, 0),
                                                     np.where(kind == "prefill", 0.0, np.nan)))
    return pd.DataFrame({"prefill_tokens": np.where(kind == "decode", 0.0, np.nan), "decode_rows": rows,
                         "kind": kind.astype(object),
                         "q_token_allocation": np.where(kind != "unknown", "inferred", "")}, index=s.index)


def _running_batch(reqs: np.ndarray, prompt: np.ndarray) -> np.ndarray:
    """Per step, the running batch it is compared with: the sampled requests of the latest earlier step that
    sampled the running batch - a decode-only step, or a prompt step whose decodes rode along (>= half that
    batch). The batch changes by a few requests a step (requests join and finish), so the latest such step is
    the reference; a decode-only step far back is not, once a long prompt has ridden with the decodes for
    hundreds of steps (SGLang DP attention: the rank holding a long chunked prompt runs mixed steps while its
    running batch drifts). Prompt steps only are walked in order (decode-only steps set it directly)."""
    n = len(reqs)
    out = np.full(n, np.nan)
    last_val, last_i = np.nan, -1
    decode_i = np.flatnonzero(~prompt & ~np.isnan(reqs))
    pos = 0
    for i in np.flatnonzero(prompt):
        while pos < len(decode_i) and decode_i[pos] < i:   # the latest decode-only step before i
            if decode_i[pos] > last_i:
                last_val, last_i = reqs[decode_i[pos]], decode_i[pos]
            pos += 1
        out[i] = last_val
        if not np.isnan(reqs[i]) and not np.isnan(last_val) and reqs[i] >= 0.5 * last_val:
            last_val, last_i = reqs[i], i
    return out


def infer_tokens(s: pd.DataFrame, hs: np.ndarray, ordinal: np.ndarray, hb: np.ndarray) -> pd.DataFrame:
    """Per step (rows of ``s``): prefill_tokens, decode_rows, kind, q_token_allocation.

    ``s`` has h2d_bytes, d2h_bytes, h2d_copies, prefill_family, decode_family; ``hs``/``ordinal``/
    ``hb`` are each H2D copy's step, position inside its step and bytes.
    """
    out = _families_only(s)
    gpu = _gpu_inputs(s, out)
    if gpu is not None:
        return gpu
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
    pf = _phase_flag(s["prefill_family"].to_numpy(), regular)
    cal = regular & (np.abs(lr - mode) < 0.1) & ~pf
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
