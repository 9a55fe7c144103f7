"""diagnose(jobs=N): instance groups in worker processes give the serial Diagnosis, field by field."""
from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from mixdiag.diagnosis import diagnose
from mixdiag.diagnosis.parallel import MIN_INSTANCES, diagnose_parallel, groups, merge_budgets, splittable
from mixdiag.diagnosis import DiagnosisConfig
from mixdiag.schema import Timeline


def _fleet(n_inst: int = 24, n_rows: int = 40, seed: int = 0) -> Timeline:
    """Interval rows as the Prometheus fleet path builds them; every 4th instance has prefill
    bursts (ITL P99 x3 every 5th interval)."""
    rng = np.random.default_rng(seed)
    rows = []
    for i in range(n_inst):
        burst = i % 4 == 0
        for k in range(n_rows):
            slow = burst and k % 5 == 0
            p50 = 0.02 * (1 + rng.uniform(-0.05, 0.05))
            rows.append({"instance": f"vllm-{i:03d}:8000", "t_start_s": 1000.0 + 15 * k, "t_end_s": 1015.0 + 15 * k,
                         "granularity": "interval", "step": k, "kind": "unknown",
                         "prefill_tokens": 24576.0 if slow else 200.0 + rng.integers(0, 50),
                         "output_tokens": 1500.0, "itl_count": 1500.0, "running_reqs": 32.0, "waiting_reqs": 1.0,
                         "itl_p50_s": p50 * (3 if slow else 1), "itl_p99_s": p50 * (3.2 if slow else 1.3),
                         "itl_mean_s": p50 * (3 if slow else 1.05)})
    insts = sorted({r["instance"] for r in rows})
    meta = {"source": "test", "clock": "unix", "signals": {i: {} for i in insts}}
    return Timeline(steps=pd.DataFrame(rows), series=None, meta=meta)


def test_parallel_equals_serial():
    tl = _fleet()
    a, b = diagnose(tl), diagnose(tl, jobs=2)
    assert sum(a.by_cause.values()) > 0  # the bursts are found: the comparison is not of two empty results
    pd.testing.assert_frame_equal(a.spikes, b.spikes)
    pd.testing.assert_frame_equal(a.steps, b.steps)
    pd.testing.assert_frame_equal(a.budget.units, b.budget.units)
    assert (a.by_cause, a.verdict, a.headline, a.itl) == (b.by_cause, b.verdict, b.headline, b.itl)
    assert list(a.budget.instances) == list(b.budget.instances)
    assert json.dumps(a.to_json(), sort_keys=False, default=str) == json.dumps(b.to_json(), sort_keys=False, default=str)


def test_parallel_names_mixing_on_burst_instances_only():
    d = diagnose(_fleet(), jobs=2)
    burst = d.spikes["instance"].str.slice(5, 8).astype(int) % 4 == 0
    assert len(d.spikes) and burst.all() and (d.spikes["cause"] == "mixing").all()


@pytest.mark.parametrize("n, k, sizes", [(10, 3, [4, 3, 3]), (2, 5, [1, 1]), (8, 1, [8])])
def test_groups_are_contiguous_and_cover(n, k, sizes):
    insts = [f"i{j:02d}" for j in range(n)]
    g = groups(insts, k)
    assert [len(x) for x in g] == sizes and sum(g, []) == insts


def test_not_split_when_instances_share_evidence_or_are_few():
    tl = _fleet()
    steps = tl.steps.copy()
    steps.loc[steps.index[:5], "granularity"] = "step"  # a step view may fuse with intervals of its engine
    mixed = Timeline(steps=steps, series=None, meta=tl.meta)
    assert splittable(tl) and not splittable(mixed)
    assert diagnose_parallel(mixed, DiagnosisConfig(), 2) is None
    assert diagnose_parallel(_fleet(n_inst=MIN_INSTANCES - 1), DiagnosisConfig(), 2) is None
    assert diagnose_parallel(tl, DiagnosisConfig(), 1) is None


def test_merge_budgets_of_nothing_is_empty():
    assert merge_budgets([]).instances == {} and not len(merge_budgets([]).units)


@pytest.mark.parametrize("load, want", [(0.2, 2), (1.3, 1), (5.0, 1)])
def test_default_jobs_leaves_busy_cpus_alone(monkeypatch, load, want):
    import os

    from mixdiag.diagnosis import parallel

    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1}, raising=False)
    monkeypatch.setattr(os, "getloadavg", lambda: (load, load, load))
    assert parallel.default_jobs() == want
