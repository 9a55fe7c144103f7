"""Drive an engine through a workload, and summarise the run (what ``summary.json`` holds).

Requests are added when their arrival comes due: on the step counter (``time_unit = "step"``) or
on the wall clock since the run started (``"s"``). When the engine runs dry before the next arrival,
the run jumps to it (step time) or sleeps until it (wall time); no idle steps are recorded.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from mixdiag.engine.core.engine import Engine
from mixdiag.engine.core.records import StepRecord
from mixdiag.engine.testbed.workload import WorkItem


@dataclass
class WorkloadResult:
    records: list[StepRecord]
    submitted: list[str]                     # request ids added, in order
    arrival_s: dict[str, float] = field(default_factory=dict)
    truncated: bool = False                  # max_steps ended the run with work left
    wall_s: float = 0.0


def run_workload(engine: Engine, items: list[WorkItem], *, time_unit: str = "step", max_steps: int = 1000,
                 progress=None, submit: Callable[..., str] | None = None) -> WorkloadResult:
    """Feed ``items`` (sorted by arrival) into ``engine`` and step until done or ``max_steps``.

    ``submit`` replaces ``engine.add_request`` (a fault injector routes some requests elsewhere).
    """
    submit = submit or engine.add_request
    res = WorkloadResult(records=[], submitted=[])
    pending = list(items)
    clock0, step = time.time(), 0
    offset = 0.0          # step time skipped while idle
    t_begin = time.perf_counter()
    while (pending or engine.has_unfinished()) and len(res.records) < max_steps:
        now = step + offset if time_unit == "step" else time.time() - clock0
        if not engine.has_unfinished() and pending and pending[0].arrival > now:
            if time_unit == "step":
                offset += pending[0].arrival - now
                now = pending[0].arrival
            else:
                time.sleep(min(pending[0].arrival - now, 5.0))
                continue
        while pending and pending[0].arrival <= now:
            it = pending.pop(0)
            submit(it.prompt, it.params, request_id=it.request_id)
            res.submitted.append(it.request_id)
            res.arrival_s[it.request_id] = engine.request(it.request_id).arrival_s
        res.records.append(engine.step())
        step += 1
        if progress is not None:
            progress.update(1)
    res.truncated = bool(pending or engine.has_unfinished())
    res.wall_s = time.perf_counter() - t_begin
    return res


def _q(values, q: float) -> float | None:
    return float(np.quantile(values, q)) if len(values) else None


def summarize(engine: Engine, res: WorkloadResult, timeline) -> dict:
    """Steps by kind, graph modes, ITL and TTFT quantiles, throughput, preemptions, stalls, wall time."""
    steps = timeline.steps
    itl = timeline.itl()["itl_s"].to_numpy()
    ttft = []
    for rid in res.submitted:
        req = engine.request(rid)
        if req.first_token_s is not None:
            ttft.append(req.first_token_s - res.arrival_s[rid])
    out_tokens = int(sum(r.output_tokens for r in res.records))
    span = (res.records[-1].t_end_s - res.records[0].t_start_s) if res.records else 0.0
    finished = sum(1 for rid in res.submitted if engine.request(rid).status.finished)
    return {
        "steps": len(res.records),
        "steps_by_kind": {k: int((steps["kind"] == k).sum()) for k in ("prefill", "decode", "mixed", "idle")},
        "graph_modes": {m: int((steps["graph_mode"] == m).sum()) for m in ("FULL", "PIECEWISE", "NONE")},
        "requests": {"submitted": len(res.submitted), "finished": finished, "truncated_run": res.truncated},
        "output_tokens": out_tokens,
        "output_tokens_per_s": out_tokens / span if span > 0 else None,
        "itl_s": {"p50": _q(itl, 0.5), "p90": _q(itl, 0.9), "p99": _q(itl, 0.99),
                  "max": float(itl.max()) if len(itl) else None, "count": int(len(itl))},
        "ttft_s": {"p50": _q(ttft, 0.5), "p99": _q(ttft, 0.99), "count": len(ttft)},
        "preemptions": int(sum(r.preempted_reqs for r in res.records)),
        "decode_stall_steps": int(sum(1 for r in res.records if r.stalled_decode_reqs)),
        "forward_s": float(sum(r.forward_s for r in res.records)),
        "host_s": float(sum(r.schedule_s + r.prepare_s + r.sample_s for r in res.records)),
        "wall_s": res.wall_s,
    }
