"""Foreign-engine steps (:mod:`.foreign`) -> the steps frame's columns and signal levels.

Shared by the Nsight and Kineto collectors so both formats say the same thing about the same work.
"""
from __future__ import annotations

import numpy as np
import pandas as pd


def finish(s: pd.DataFrame, graph_known: bool) -> pd.DataFrame:
    """Steps of a foreign engine in the steps frame's columns (seconds, shares, quality flags)."""
    s = s.copy()
    s["granularity"] = "step"
    if not graph_known:
        s["graph_mode"] = "unknown"
        s["graph_replayed"] = np.nan
    else:
        s["graph_replayed"] = (s["graph_launches"] > 0).astype("float64")
    s["q_graph_mode"] = np.where(s["graph_mode"] == "unknown", "", "measured")
    span = (s["gpu_end_ns"] - s["gpu_start_ns"]) / 1e9
    s["forward_s"] = span
    s["gpu_kernel_s"] = s["gpu_kernel_ns"] / 1e9
    s["comm_s"] = s["comm_ns"] / 1e9
    s["comm_share"] = (s["comm_s"] / span.where(span > 0)).clip(0, 1)
    s["q_expert_imbalance"] = np.where(s["rank_skew"].notna(), "inferred", "")
    kv_seen = s["kv_transfer_s"].notna()
    if "kv_overlap_s" in s:  # a side-stream transfer inside the span counts as KV evidence too
        kv_seen |= s["kv_overlap_s"].notna()
    s["q_kv_transfer"] = np.where(kv_seen, "inferred", "")
    s["decode_reqs"] = s["decode_rows"]
    return s


def signals(steps: pd.DataFrame, graph_known: bool) -> dict[str, str]:
    """Signal levels one instance's foreign steps support (``inferred`` only where a value exists)."""
    inferred_kind = bool((steps["q_token_allocation"] == "inferred").any())
    out = {key: "inferred" if inferred_kind else "absent"
           for key in ("kind", "token_allocation", "prefill_tokens", "decode_rows")}
    out["graph_mode"] = "measured" if graph_known else "absent"
    kv = steps["kv_transfer_s"].notna().any() or ("kv_overlap_s" in steps and steps["kv_overlap_s"].notna().any())
    out["kv_transfer"] = "inferred" if kv else "absent"
    skew = steps["rank_skew"].notna().any() or ("rank_sm_skew" in steps and steps["rank_sm_skew"].notna().any())
    out["expert_imbalance"] = "inferred" if skew else "absent"
    out["comm"] = "inferred" if steps["comm_s"].gt(0).any() else "absent"
    return out


#: Steps-frame columns a foreign-engine step can fill (trace collectors keep those present).
COLUMNS = ["instance", "step", "t_start_s", "t_end_s", "granularity", "kind", "prefill_tokens", "decode_reqs",
           "decode_rows", "graph_mode", "graph_replayed", "sm_active", "forward_s", "kv_transfer_s",
           "kv_transfer_bytes", "gpu_kernels", "gpu_kernel_s", "graph_launches", "step_source", "comm_s",
           "comm_share", "rank_skew", "rank_sm_skew", "rank_comm_spread", "kv_overlap_s", "kv_overlap_bytes", "kv_wait_s",
           "device_idle_before_s", "q_token_allocation", "q_graph_mode",
           "q_expert_imbalance", "q_kv_transfer", "q_sm_active"]
