"""The vocabulary of the diagnosis: the causes, what each means, their one palette, verdict wording,
and the signals with the Timeline columns behind each.

This is the only module that defines a cause list or a cause colour. Ground truth
(:mod:`mixdiag.engine.testbed.truth`), attribution, the text and HTML reports, the dashboard's
figures and the exporter all import from here. Standard library only.
"""
from __future__ import annotations

#: The closed set of causes, in display order (docs/contracts.md section 1). ``unknown`` is last.
CAUSES = ("mixing", "prefill_stall", "ep_hotspot", "pd_transfer", "graph_fallback", "kv_pressure",
          "host_stall", "unknown")

#: One line per cause: what it means for the decodes that saw the spike.
MEANINGS = {
    "mixing": "a prefill chunk shared the forward step with the running decodes",
    "prefill_stall": "a prefill-only step ran while decodes were waiting",
    "ep_hotspot": "one expert-parallel rank got most rows; the others waited in the all-to-all",
    "pd_transfer": "prefill/decode KV transfer overlapped or preceded the step",
    "graph_fallback": "a decode-only step missed the captured FULL CUDA graph",
    "kv_pressure": "KV cache ran out: requests were preempted or retracted",
    "host_stall": "the device idled between steps (scheduler, GC, detokenizer)",
    "unknown": "no cause the available signals support",
}

#: Verdict wording: "N of M TPOT spikes ... are caused by <lead>".
VERDICT_LEAD = {
    "mixing": "mixed batching (prefill chunks sharing the step with decodes)",
    "prefill_stall": "prefill-only steps stalling running decodes",
    "ep_hotspot": "expert-parallel hotspots on decode-only steps",
    "pd_transfer": "PD KV transfer overlapping decode steps",
    "graph_fallback": "decode steps falling out of the FULL CUDA graph",
    "kv_pressure": "KV-cache pressure (preemptions)",
    "host_stall": "host stalls (idle gaps between steps)",
    "unknown": "no cause the available signals support (unknown)",
}

#: The one palette (colour-blind-safe Okabe-Ito order, grey = unknown), for every page and report.
CAUSE_COLORS = {"mixing": "#D55E00", "prefill_stall": "#E69F00", "ep_hotspot": "#CC79A7",
                "pd_transfer": "#0072B2", "graph_fallback": "#009E73", "kv_pressure": "#56B4E9",
                "host_stall": "#8B4513", "unknown": "#7F7F7F"}

#: CUDA-graph modes and their colours (FULL = the decode graph replayed whole).
GRAPH_MODE_COLORS = {"FULL": "#009E73", "PIECEWISE": "#E69F00", "NONE": "#D55E00", "unknown": "#BBBBBB"}

#: Signal names used in evidence, ``missing_signals`` and ``meta["signals"]``.
SIGNALS = ("itl", "token_allocation", "graph_mode", "sm_active", "expert_imbalance", "kv_transfer",
           "preemption", "host_time")

#: Timeline columns behind each signal (``host_time`` is the step timestamps themselves).
SIGNAL_COLUMNS = {
    "itl": ("itl_p99_s", "itl_p50_s"),
    "token_allocation": ("prefill_tokens", "decode_rows", "decode_reqs"),
    "graph_mode": ("graph_mode",),
    "sm_active": ("sm_active",),
    "expert_imbalance": ("expert_imbalance",),
    "kv_transfer": ("kv_transfer_bytes", "kv_transfer_s", "kv_overlap_s", "kv_wait_s"),
    "preemption": ("preempted_reqs",),
    "host_time": (),
}


def color(cause: str) -> str:
    """The palette colour of ``cause`` (grey for anything outside the taxonomy)."""
    return CAUSE_COLORS.get(cause, CAUSE_COLORS["unknown"])
