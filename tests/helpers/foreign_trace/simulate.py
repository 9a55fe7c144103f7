"""``simulate()``: one call from engine name and seed to a trace file and its ground truth."""
from __future__ import annotations

from dataclasses import asdict
from pathlib import Path

import numpy as np

from .engines import ENGINES, comm_sm_shares, draw_costs
from .kineto_writer import write_kineto
from .nsys_writer import write_nsys
from .planner import plan_steps, validate_faults
from .timeline import Simulator
from .truth import Truth, frame



def simulate(engine: str = "vllm", seed: int = 0, n_steps: int = 400, faults=None, nvtx: bool = True,
             graph_trace: str = "graph", fmt: str = "nsys", out: str | Path = "trace.sqlite",
             gpu_metrics_hz: int = 0, scale: int | None = None) -> Truth:
    """Simulate ``n_steps`` steps of ``engine`` and write them to ``out`` as ``fmt`` (nsys | kineto).

    ``faults``: fault names to inject (None = the engine's defaults, () = none). ``graph_trace``
    mirrors ``nsys --cuda-graph-trace`` (graph | node). ``gpu_metrics_hz`` > 0 adds SMs Active
    samples. ``scale`` = target kernel rows (benchmarks): overrides ``n_steps``.
    """
    if engine not in ENGINES:
        raise ValueError(f"unknown engine {engine!r}; choose from {sorted(ENGINES)}")
    if graph_trace not in ("graph", "node"):
        raise ValueError("graph_trace must be 'graph' or 'node'")
    if fmt not in ("nsys", "kineto"):
        raise ValueError("fmt must be 'nsys' or 'kineto'")
    spec = ENGINES[engine]
    rng = np.random.default_rng(seed)
    cost = draw_costs(spec, rng)
    if n_steps < 1:
        raise ValueError("n_steps must be >= 1")
    faults = validate_faults(spec, faults)
    if fmt == "kineto":
        graph_trace = "node"  # Kineto has no graph-level mode: replayed kernels appear one by one
    sim = Simulator(spec, cost, rng, graph_trace, nvtx)
    # drawn from a generator of its own: GPU metrics never shift the draws the truth depends on
    sim.comm_sm = comm_sm_shares(spec, np.random.default_rng([seed, 0x5E]))
    sim.track_sm = fmt == "nsys" and gpu_metrics_hz > 0
    done = 0
    while True:  # with ``scale``, keep adding batches of steps until the kernel table is that large
        for p in plan_steps(spec, cost, rng, n_steps, faults):
            p.step += done
            sim.step(p)
        done += n_steps
        if not scale or len(sim.trace.kernels) >= scale:
            break
    trace = sim.finish()
    out = Path(out)
    if fmt == "nsys":
        paths = (write_nsys(trace, out, graph_trace=graph_trace, process_names=spec.process_names,
                            gpu_metrics_hz=gpu_metrics_hz, sm_fill=float(rng.uniform(0.6, 0.95))),)
    else:
        paths = tuple(write_kineto(trace, out, process_names=spec.process_names))
    meta = dict(engine=engine, seed=seed, fmt=fmt, graph_trace=graph_trace, nvtx=nvtx, faults=faults,
                pids=trace.pids, t0_ns=trace.t0, kernel_rows=len(trace.kernels), cost=asdict(cost),
                comm_sm=dict(sim.comm_sm))
    return Truth(steps=frame(trace.truth), paths=paths, meta=meta)
