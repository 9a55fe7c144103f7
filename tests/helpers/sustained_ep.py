"""A sustained EP hotspot in a graph-level Nsight export, from the foreign-trace simulator's engine model.

The simulator's planner draws hotspots of 1-4 steps; real ones last minutes (a skewed expert stays hot while
its traffic lasts - DeepEP / vLLM EPLB docs: expert load imbalance, rebalanced only every
``eplb_step_interval`` steps). Here one rank's expert GEMMs run longer for ``hot`` steps in a row while every
decode step replays its FULL graph (DeepEP low-latency dispatch/combine inside the graph), so with
``--cuda-graph-trace=graph`` no kernel of the forward is visible: only each GPU's SMs Active samples
(``GPU_METRICS``) and the ranks' step spans are. Engine behaviour and sources:
docs/foreign-trace-simulator.md (EP all-to-all, EP hotspot, DP-attention ranks, GPU metrics).
"""
from __future__ import annotations

import dataclasses

import numpy as np

from helpers.foreign_trace.engines import ENGINES, comm_sm_shares, draw_costs
from helpers.foreign_trace.nsys_writer import write_nsys
from helpers.foreign_trace.planner import StepPlan
from helpers.foreign_trace.timeline import Simulator
from helpers.foreign_trace.truth import frame


def write(path, *, n_ranks=2, n_steps=160, hot=range(50, 120), hot_rank=1, seed=3, graph_trace="graph",
          gpu_metrics_hz=1000):
    """Write the export; returns the truth frame (one row per step and rank)."""
    spec = ENGINES["ep2"]
    if n_ranks != spec.n_ranks:
        spec = dataclasses.replace(spec, n_ranks=n_ranks,
                                   process_names=tuple(f"VLLM::Worker_DP{i}" for i in range(n_ranks)))
    rng = np.random.default_rng(seed)
    cost = draw_costs(spec, rng)
    sim = Simulator(spec, cost, rng, graph_trace, True)
    sim.comm_sm = comm_sm_shares(spec, np.random.default_rng([seed, 0x5E]))
    sim.track_sm = gpu_metrics_hz > 0
    rows = (cost.rows_lo + cost.rows_hi) // 2
    for i in range(n_steps):
        rr = [rows] * n_ranks
        sim.step(StepPlan(i, "ep_hotspot", 0, rr, hot_rank=hot_rank) if i in hot else StepPlan(i, "none", 0, rr))
    tr = sim.finish()
    write_nsys(tr, path, graph_trace=graph_trace, process_names=spec.process_names, gpu_metrics_hz=gpu_metrics_hz,
               sm_fill=float(rng.uniform(0.6, 0.95)))
    return frame(tr.truth)
