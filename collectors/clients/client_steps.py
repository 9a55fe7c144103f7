"""Engine steps as the client saw them: token arrivals shared by the in-flight streams -> step rows.

An engine step emits one token to every request it decoded, and the server flushes those chunks
together; so on the client's clock the token events of all streams fall into clusters, one per
step, separated by the step time (plus any host gap before the step). A stall shared by every
in-flight stream at the same moment is therefore an engine step (or the gap before it), not a
network hiccup of one stream. This module turns the client tokens into ``granularity = "step"``
rows (``step_source = "client"``) and numbers the tokens by them, so the diagnosis can charge
client ITLs to steps and fuse those steps with the server's scrape intervals or log on the wall
clock like any other step view.

What the client can tell about a step, all ``inferred``: decode rows (streams that got a token in
it), when each prompt was sent and when its first token came. A prompt's prefill ran in the step
of its first token and, chunked, in the run of slow steps just before it (not before its send
time): its tokens are spread evenly over them; a cluster holding prefill work and decode tokens is ``mixed``, prefill work and
no decode token while streams were in flight is ``prefill``, else ``decode``. On an engine the capture
shows mixing (nearly every first token arrives with the other streams' decode tokens), a cluster of
first tokens alone is one step the client read apart: ``mixed``, its decode rows unknown. The step's start is
the previous cluster's end, so a host gap before a step is inside its latency (the client cannot
split them: ``host_time`` stays absent).

Tolerance: a step starts at a gap above ``cluster_s`` (default 0.5 x the median per-stream gap)
or where a stream gets its next token more than 1 ms after the previous event (one step sends a
stream one chunk; closer chunks came in one read and stay together). On an idle loopback one
step's chunks arrive within ~1 ms; on a busy machine the client's own event loop spreads them
over tens of ms, which the second rule keeps together (docs/serving.md). A cluster of decode tokens
from streams the cluster before it did not serve, a few ms after it, is the rest of that step read
apart and joins it (:func:`_join_fragments`).
"""
from __future__ import annotations

import numpy as np
import pandas as pd

BURST_S = 0.001      # chunks of one stream closer than this came in one read: the client cannot split them
STALL_FACTOR = 3.0
MIXES_SHARE = 0.8    # first tokens arriving with other streams' decode tokens: the engine mixes (_split_mixed_steps)
MIXES_MIN = 5   # a gap this many times the median step gap, shared by all in-flight streams, is a stall


def cluster_tolerance(tokens: pd.DataFrame) -> float:
    """Default clustering tolerance: 0.5 x the median gap between a stream's tokens (one step's time)."""
    gaps = tokens.sort_values(["request_id", "t_s"]).groupby("request_id", sort=False)["t_s"].diff().dropna()
    # chunks of one stream that came in one read (closer than BURST_S) say nothing of the step time:
    # where the server or the client coalesces steps (a busy event loop reads several SSE events at
    # once) half the gaps are such bursts, and counting them collapses the tolerance to microseconds,
    # splitting every step into clusters of single streams
    gaps = gaps[gaps > BURST_S]
    med = float(gaps.median()) if len(gaps) else 0.02
    return max(1e-4, 0.5 * med)


def _boundaries(t: np.ndarray, rid: np.ndarray, tol: float) -> np.ndarray:
    """True where a new step starts: a gap above ``tol`` after the previous event, or a stream that
    already got a token in the current cluster (one step gives a stream one chunk), so a step whose
    chunks reached a busy client spread out stays one step."""
    new = np.empty(len(t), dtype=bool)
    seen: set = set()
    prev = -np.inf
    for i in range(len(t)):
        r = int(rid[i])
        if t[i] - prev > tol or (r in seen and t[i] - prev > BURST_S):
            new[i] = True
            seen = {r}
        else:
            new[i] = False
            seen.add(r)
        prev = t[i]
    return new


def _join_fragments(t: np.ndarray, rid: np.ndarray, first: np.ndarray, new: np.ndarray, within_s: float) -> np.ndarray:
    """``new`` without the boundaries that split one engine step's decode chunks in two reads.

    A step sends every running stream one chunk at once; a busy client (or the server's flush) can
    read them apart, a few ms from each other, and the gap rule of :func:`_boundaries` then opens a
    cluster for the late ones. Such a fragment holds decode tokens only of streams the cluster before
    did not get one: a real next step decodes every running stream again (vLLM V1 and SGLang decode
    each running request every step), so it shares streams with the step before. A boundary is
    dropped when the cluster after it and the cluster it closes both hold decode tokens, share no
    stream, and the later starts within ``within_s`` of the earlier's last event. First tokens alone
    never join (a prefill-only step gives tokens to new requests only: SGLang without mixed chunk;
    :func:`_split_mixed_steps` decides those). Measured on the real-vLLM testbed: a 248 ms chunk step
    read as 1 + 3 streams 6 ms apart broke the run of slow steps a prompt's prefill is spread over."""
    out = new.copy()
    members: set = set()
    last_t, decoding = -np.inf, False
    starts = np.flatnonzero(new)
    ends = np.r_[starts[1:], len(t)]
    for a, b in zip(starts, ends):
        reqs = set(rid[a:b].tolist())
        dec = bool((~first[a:b]).any())
        if decoding and dec and not (reqs & members) and t[a] - last_t <= within_s:
            out[a] = False
            members |= reqs
        else:
            members, decoding = reqs, dec
        last_t = t[b - 1]
    return out


def _expand_bursts(tok: pd.DataFrame, cid: np.ndarray, ends: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Split each read cluster into the engine steps it must have held: (step per token event,
    end time per step).

    One engine step gives a stream at most one chunk (vLLM V1 and SGLang stream one delta per
    request per step, docs/serving.md), so a cluster in which a stream got ``k`` chunks in one read
    spans at least ``k`` steps: the server or the client's event loop coalesced them. Counted as one
    step, its gap reads as a ``k``-fold slow step (measured on the real-vLLM testbed: on a busy
    client, decode clusters reach 3.5x their median at the 90th percentile while vLLM's own
    iterations stay within 1.5x). The ``k`` steps share the cluster's gap evenly (the client cannot
    time them apart: inferred), and a stream's ``i``-th chunk of the read goes to the ``i``-th step.
    ``cid``: cluster per token event (sorted by time); ``ends``: each cluster's first arrival."""
    n = len(ends)
    rank = tok.groupby([cid, tok["request_id"].to_numpy()], sort=False).cumcount().to_numpy()
    k = np.ones(n, dtype=np.int64)
    np.maximum.at(k, cid, rank + 1)
    if (k == 1).all():
        return cid, ends
    first = np.r_[0, np.cumsum(k)[:-1]]                 # the first expanded step of each cluster
    prev_end = np.r_[ends[0] - (float(np.median(np.diff(ends))) if n > 1 else 0.0), ends[:-1]]
    sub = np.arange(int(k.sum())) - np.repeat(first, k)  # position inside its cluster
    kk = np.repeat(k, k)
    # the last step of a read ends exactly at the read (its first arrival): the client's own clock
    new_ends = np.where(sub + 1 == kk, np.repeat(ends, k),
                        np.repeat(prev_end, k) + (sub + 1) / kk * np.repeat(ends - prev_end, k))
    return first[cid] + rank, new_ends


def _split_mixed_steps(firsts: np.ndarray, decode_reqs: np.ndarray, inflight: np.ndarray) -> np.ndarray:
    """Clusters of first tokens alone, while other streams were in flight, on an engine the capture
    shows mixing: those are steps whose other chunks the client read apart, not prefill-only steps.

    Measured on the capture itself: the share of first tokens that arrived, while other streams were
    in flight, in a cluster holding those streams' decode tokens. An engine that mixes prefills into
    decode steps (vLLM V1 schedules running requests first and fills the token budget with prompt
    chunks - ``vllm/v1/core/sched/scheduler.py``; SGLang with ``--enable-mixed-chunk``) gives nearly
    all of them (97 % on the real-vLLM testbed); SGLang without mixed chunk runs a prefill batch alone,
    so its first tokens arrive without decode tokens (share ~0) and a decode stream really waited.
    ``MIXES_SHARE`` sits between the two; fewer than ``MIXES_MIN`` such first tokens decide nothing."""
    busy = (firsts > 0) & (inflight > firsts)
    if busy.sum() < MIXES_MIN or (decode_reqs[busy] > 0).mean() < MIXES_SHARE:
        return np.zeros(len(firsts), dtype=bool)
    return busy & (decode_reqs <= 0)


def client_steps(tokens: pd.DataFrame, instance: str, cluster_s: float | None = None
                 ) -> tuple[pd.DataFrame, pd.DataFrame, dict]:
    """(steps, tokens with ``step`` filled, stall summary) for one client's tokens (sorted any way)."""
    if tokens.empty:
        return pd.DataFrame(), tokens, {"steps": 0, "stalls": 0}
    tol = cluster_tolerance(tokens) if cluster_s is None else float(cluster_s)
    tok = tokens.sort_values("t_s", kind="stable").reset_index(drop=True)
    t = tok["t_s"].to_numpy(dtype="float64")
    rid = pd.factorize(tok["request_id"])[0]
    first = tok["is_first"].fillna(0).to_numpy() > 0
    # fragments of one step read apart lie within a couple of per-stream step gaps (tol is half of one)
    new = _join_fragments(t, rid, first, _boundaries(t, rid, tol), 4.0 * tol)
    cid, ends = _expand_bursts(tok, np.cumsum(new) - 1, t[new])
    tok["step"] = cid.astype("float64")
    n = len(ends)  # the clusters; a burst expanded into sub-steps can leave the last token in an earlier one
    gaps = np.diff(ends)
    med = float(np.median(gaps)) if len(gaps) else 0.0
    starts = np.r_[ends[0] - med, ends[:-1]]
    ntok = tok["n_tokens"].to_numpy(dtype="float64")
    decode_reqs = np.bincount(cid, weights=(~first).astype(float), minlength=n)
    out_tokens = np.bincount(cid, weights=ntok, minlength=n)
    firsts = np.bincount(cid, weights=first.astype(float), minlength=n)
    prefill = np.zeros(n)
    prefill_reqs = np.zeros(n)
    # a prompt's prefill ran in the step that sent its first token and, chunked, in the slow steps
    # right before it (back to its send time): its tokens are spread evenly over that run
    slow = (ends - starts) > 1.5 * med if med > 0 else np.zeros(n, dtype=bool)
    fr = tok[first & tok["arrival_s"].notna()]
    for sent, plen, k in zip(fr["arrival_s"].to_numpy(), fr["prompt_tokens"].to_numpy(), fr["step"].to_numpy()):
        k = int(k)
        floor = min(int(np.searchsorted(ends, sent, side="right")), k)
        lo = k
        while lo - 1 >= floor and slow[lo - 1]:
            lo -= 1
        if np.isfinite(plen) and plen > 0:
            prefill[lo:k + 1] += plen / (k + 1 - lo)
        prefill_reqs[lo:k + 1] += 1
    # streams in flight at each cluster: between their first and last token
    by_req = tok.groupby("request_id", sort=False)["step"].agg(["min", "max"]).to_numpy(dtype=int)
    inflight = np.zeros(n + 1)
    np.add.at(inflight, by_req[:, 0], 1)
    np.add.at(inflight, by_req[:, 1] + 1, -1)
    inflight = np.cumsum(inflight)[:n]
    kind = np.where(prefill_reqs > 0, np.where(decode_reqs > 0, "mixed", "prefill"), "decode")
    split = _split_mixed_steps(firsts, decode_reqs, inflight)
    kind[split] = "mixed"
    decode_reqs = np.where(split, np.nan, decode_reqs)  # decodes ran in it (the engine mixes); how many, unknown
    steps = pd.DataFrame({
        "instance": instance, "step": np.arange(n, dtype="int64"), "t_start_s": starts, "t_end_s": ends,
        "granularity": "step", "kind": kind, "prefill_tokens": prefill, "prefill_reqs": prefill_reqs,
        "decode_reqs": decode_reqs, "decode_rows": decode_reqs, "output_tokens": out_tokens,
        "running_reqs": inflight, "arrivals": firsts, "step_source": "client", "q_token_allocation": "inferred"})
    # stall events: long gaps every stream in flight across them shared (its previous token in the
    # cluster before, its next in this one) - an engine-wide event
    shared = np.zeros(n, dtype=bool)
    if n > 1 and med > 0:
        prev = tok.groupby("request_id", sort=False)["step"].shift(1)
        cont = (prev == tok["step"] - 1).to_numpy()
        crossed = np.bincount(cid, weights=cont.astype(float), minlength=n)
        long = np.r_[False, gaps > STALL_FACTOR * med]
        shared = long & (crossed >= np.r_[0.0, inflight[:-1]] - prefill_reqs) & (crossed > 0)
    stalls = {"steps": n, "cluster_s": tol, "median_step_s": med, "stalls": int(shared.sum()),
              "stall_times_s": [round(float(x), 6) for x in ends[shared]][:1000]}
    tok = tok.sort_values(["request_id", "t_s"], kind="stable").reset_index(drop=True)
    return steps, tok, stalls
