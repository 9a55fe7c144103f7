"""KV transfer overlapping a step on a side stream, and the compute stream's wait on it.

:func:`.evidence.transfers` charges a connector's transfer to the step that *consumes* it (the next step to
start). Engines also load KV while a step runs: vLLM's KV connector API starts the load before the forward
(``start_load_kv``) and the attention of each layer waits for its layer (``wait_for_layer_load``), LMCache and
the P2pNccl connector copy on their own CUDA stream, and the compute stream waits on an event recorded after
the copy (``cudaStreamWaitEvent``). Such a step is slow while the transfer runs beside it. Per step this module
measures, inside the step's GPU span:

* ``kv_overlap_s`` / ``kv_overlap_bytes``: time and bytes (each copy's bytes pro rata to its time inside the
  span) of KV-like items on a non-compute stream: host-to-device or peer copies, transfer kernels
  (NCCL send/recv); issued by any thread;
* ``kv_wait_s``: the compute stream's idle time inside the span while such an item ran - the forward waited.

KV-like: copies in one burst (items closer than ``EPISODE_GAP_NS``) totalling at least ``KV_MIN_BYTES``, or
any peer copy / transfer kernel. NIXL and Mooncake move KV by RDMA with no CUDA row at all: then nothing here
is measured (NaN), and only waits and the connector's log/metric lines can show the transfer.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from mixdiag.collectors.traces.steps.evidence import EPISODE_GAP_NS, P2P

H2D = 1
#: Bytes a burst of host-to-device copies must move to be KV rather than step inputs: one token's KV is
#: 64-160 KiB (Llama-3-8B 128 KiB in bf16; DeepSeek-V3 MLA ~70 KiB), so 1 MiB is the KV of 8-16 tokens,
#: while a step's own input buffers are ~8-24 B per scheduled token (input ids, positions, slot mapping:
#: at most ~200 KiB for a 8192-token budget) - a factor 5 margin on each side.
KV_MIN_BYTES = 1 << 20


def compute_streams(items, on_main) -> np.ndarray:
    """The streams the engine thread's kernels run on (``on_main``: items it launched), else the busiest kernel
    stream - the same choice as the consumer-side rule's (``foreign._transfer_candidates``)."""
    kern = items.what != 2
    own = on_main is not None and bool((kern & on_main).any())
    streams, counts = np.unique(items.stream[kern & on_main if own else kern], return_counts=True)
    return streams if own or not len(streams) else streams[[np.argmax(counts)]]


def side_items(items, compute_streams: np.ndarray) -> np.ndarray:
    """Mask of KV-like items on non-compute streams (see the module doc)."""
    off = ~np.isin(items.stream, compute_streams)
    copy = (items.what == 2) & np.isin(items.kind, (H2D, P2P))
    kern = (items.what == 0) & (items.flags & 8 > 0)  # transfer kernels (NCCL send/recv, connector kernels)
    if ((items.what == 0) & ~off & (items.flags & 16 > 0)).any():
        # an EP engine: its all-to-all can run as NCCL send/recv on a communication stream of its own (two-batch
        # overlap), so a send/recv kernel beside the forward is not known to be KV - only copies count here
        kern &= items.flags & 16 == 0
    cand = np.flatnonzero(off & (copy | kern))
    keep = np.zeros(len(items.start), dtype=bool)
    if not len(cand):
        return keep
    o = cand[np.argsort(items.start[cand], kind="stable")]
    s, e = items.start[o], items.end[o]
    run = np.maximum.accumulate(e)
    burst = np.cumsum(np.concatenate([[True], s[1:] > run[:-1] + EPISODE_GAP_NS])) - 1
    nbytes = np.where(items.what[o] == 2, items.nbytes[o], 0).astype("float64")
    strong = (items.what[o] == 0) | (items.kind[o] == P2P)
    big = np.bincount(burst, nbytes) >= KV_MIN_BYTES
    ok = big | (np.bincount(burst, strong) > 0)
    keep[o[ok[burst]]] = True
    return keep


def _union(s: np.ndarray, e: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Disjoint sorted intervals covering [s, e)."""
    if not len(s):
        return s, e
    o = np.argsort(s, kind="stable")
    s, e = s[o], e[o]
    run = np.maximum.accumulate(e)
    head = np.concatenate([[True], s[1:] > run[:-1]])
    idx = np.flatnonzero(head)
    return s[idx], np.maximum.reduceat(run, idx)


def _covered(a0: np.ndarray, a1: np.ndarray, t0: np.ndarray, t1: np.ndarray) -> np.ndarray:
    """For each window [t0, t1): time covered by the disjoint sorted intervals [a0, a1)."""
    cum = np.concatenate([[0.0], np.cumsum((a1 - a0).astype("float64"))])

    def before(t):  # covered time before t
        k = np.searchsorted(a0, t, side="right")  # intervals starting at or before t
        inside = np.clip(t - a0[np.maximum(k - 1, 0)], 0, (a1 - a0)[np.maximum(k - 1, 0)])
        return cum[np.maximum(k - 1, 0)] + np.where(k > 0, inside, 0.0)
    return np.clip(before(t1) - before(t0), 0, None)


def kv_overlap(steps: pd.DataFrame, items, compute_streams: np.ndarray) -> None:
    """Fill ``kv_overlap_s``, ``kv_overlap_bytes`` and ``kv_wait_s`` on one process's ``steps``
    (``gpu_start_ns``/``gpu_end_ns``) from its ``items``; NaN on every step when no KV-like item exists."""
    n = len(steps)
    side = side_items(items, compute_streams)
    if not n or not side.any():
        for c in ("kv_overlap_s", "kv_overlap_bytes", "kv_wait_s"):
            steps[c] = np.nan
        return
    t0 = steps["gpu_start_ns"].to_numpy(dtype="float64")
    t1 = steps["gpu_end_ns"].to_numpy(dtype="float64")
    xs, xe = items.start[side].astype("float64"), items.end[side].astype("float64")
    u0, u1 = _union(xs, xe)
    steps["kv_overlap_s"] = _covered(u0, u1, t0, t1) / 1e9
    # bytes: each copy's bytes times the share of its duration inside the span
    copies = items.what[side] == 2
    cs, ce, cb = xs[copies], xe[copies], items.nbytes[side][copies].astype("float64")
    if len(cs):
        o = np.argsort(cs, kind="stable")
        cs, ce, cb = cs[o], ce[o], cb[o]
        rate = cb / np.maximum(ce - cs, 1.0)
        nb = np.zeros(n)
        # a step overlaps only copies starting before its end; copies last ~ms, a short scan per step
        hi = np.searchsorted(cs, t1, side="left")
        lo = np.searchsorted(np.maximum.accumulate(ce), t0, side="right")
        for i in np.flatnonzero(hi > lo):
            sl = slice(lo[i], hi[i])
            nb[i] = float(np.sum(np.clip(np.minimum(ce[sl], t1[i]) - np.maximum(cs[sl], t0[i]), 0, None) * rate[sl]))
        steps["kv_overlap_bytes"] = np.where(steps["kv_overlap_s"] > 0, nb, 0.0)
    else:
        steps["kv_overlap_bytes"] = np.where(steps["kv_overlap_s"] > 0, np.nan, 0.0)
    # compute-stream idle inside the span while the transfer ran
    comp = np.isin(items.stream, compute_streams)
    b0, b1 = _union(items.start[comp].astype("float64"), items.end[comp].astype("float64"))
    wait = np.zeros(n)
    for i in np.flatnonzero(steps["kv_overlap_s"].to_numpy() > 0):  # only steps a transfer overlaps
        a = (u1 > t0[i]) & (u0 < t1[i])
        x0, x1 = np.clip(u0[a], t0[i], t1[i]), np.clip(u1[a], t0[i], t1[i])
        wait[i] = float(np.sum(x1 - x0)) - float(np.sum(_covered(b0, b1, x0, x1)))
    steps["kv_wait_s"] = np.clip(wait, 0, None) / 1e9
