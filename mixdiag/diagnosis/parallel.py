"""Diagnose a fleet in worker processes: groups of instances that share no evidence are detected,
attributed and budgeted apart, and the parts merged into the one Diagnosis the serial run gives.

Instances share evidence only through step views (a log fused with scrapes of the same engine,
EP ranks coupled by their collectives), so only inputs made of interval rows alone (Prometheus,
scrape directories: the fleet case) are split; anything else runs serially. Workers are forked, so
the Timeline is not pickled to them; each returns its part (signal frames, spike records, budgets).
"""
from __future__ import annotations

import math
import multiprocessing as mp
import os

import pandas as pd

from mixdiag.diagnosis.budget import Budget, budget_of
from mixdiag.diagnosis.config import DiagnosisConfig
from mixdiag.diagnosis.part import Part, diagnose_part
from mixdiag.diagnosis.result import Diagnosis, finish, spike_frame
from mixdiag.schema import Timeline

#: Fewer instances than this: worker start-up costs more than it saves.
MIN_INSTANCES = 16
#: Groups per worker. One: a group of interval-only instances is diagnosed in one pass
#: (detection/interval_batch.py) whose cost is a fixed part plus the same small cost per instance, so equal
#: groups take equal time and more groups would only repeat the fixed part.
GROUPS_PER_JOB = 1

_STATE: dict = {}  # the Timeline and config, inherited by forked workers


def default_jobs() -> int:
    """The CPUs this process may run on that other work leaves idle (CPUs minus the 1-minute load
    average, at least 1): a worker on a busy CPU adds its start-up and the merge and saves nothing.
    Measured on a shared 2-core machine at load ~5, a 500-target fleet: 2 workers took 0.8-1.4 s
    longer than 1 (each worker got a third of a CPU)."""
    try:
        cpus = max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not Linux
        cpus = max(1, os.cpu_count() or 1)
    try:
        busy = os.getloadavg()[0]
    except (AttributeError, OSError):  # no load average (Windows)
        return cpus
    return max(1, min(cpus, cpus - math.floor(busy)))


def splittable(timeline: Timeline) -> bool:
    """Whether instances can be diagnosed apart: interval rows only (no step view to fuse with)."""
    st = timeline.steps
    return bool(len(st)) and bool((st["granularity"].to_numpy() == "interval").all())


def groups(insts: list[str], n: int) -> list[list[str]]:
    """``insts`` in ``n`` contiguous groups of near-equal size (contiguous: the merged frames keep
    the serial order)."""
    n = max(1, min(n, len(insts)))
    size, extra = divmod(len(insts), n)
    out, i = [], 0
    for g in range(n):
        j = i + size + (1 if g < extra else 0)
        out.append(insts[i:j])
        i = j
    return out


def _work(insts: list[str]):
    tl, cfg = _STATE["timeline"], _STATE["config"]
    part = diagnose_part(tl, cfg, insts)
    steps = pd.concat(part.frames, ignore_index=True) if part.frames else None
    budget = budget_of(tl.tokens, steps, spike_frame(part.spikes), part.itl) if steps is not None else Budget()
    return part, budget


def merge_budgets(budgets: list[Budget]) -> Budget:
    """One Budget from those of disjoint, ordered instance groups (as budget_of over all of them)."""
    insts = {}
    for b in budgets:
        insts.update(b.instances)
    units = [b.units for b in budgets if len(b.units)]
    if not units:
        return Budget(instances=dict(sorted(insts.items())))
    return Budget(instances=dict(sorted(insts.items())), units=pd.concat(units, ignore_index=True))


def diagnose_parallel(timeline: Timeline, cfg: DiagnosisConfig, jobs: int) -> Diagnosis | None:
    """The Diagnosis of ``timeline`` from ``jobs`` worker processes, or None when the input is not
    worth splitting or cannot be (the caller then runs serially)."""
    insts = timeline.instances
    if jobs <= 1 or len(insts) < MIN_INSTANCES or not splittable(timeline) \
            or "fork" not in mp.get_all_start_methods():
        return None
    parts = groups(insts, jobs * GROUPS_PER_JOB)
    _STATE.update(timeline=timeline, config=cfg)
    try:
        with mp.get_context("fork").Pool(min(jobs, len(parts))) as pool:
            results = pool.map(_work, parts, chunksize=1)
    finally:
        _STATE.clear()
    merged = Part(frames=[], spikes=[], instances={}, not_llm=[])
    for part, _ in results:
        merged.frames += part.frames
        merged.spikes += part.spikes
        merged.instances.update(part.instances)
        merged.not_llm += part.not_llm
    return finish(timeline, cfg, merged, merge_budgets([b for _, b in results]))
